//! The node slab: nodes are carved from large chunks of the heap rather than allocated one by
//! one, because the general allocator puts an 8-byte header before each block (so a 512-byte
//! node would neither be 64-byte aligned nor pack densely).
//!
//! A chunk is one allocation of [`NODES_PER_CHUNK`] nodes plus alignment slack. Each stripe of
//! the descriptor (`meta.rs`, one per inserting thread) keeps its own cursor into its own
//! chunk, so two threads splitting leaves at the same time neither write a common cursor nor
//! get nodes on a common cache line. Chunks are allocated through the transaction, so an
//! aborted insert gives its nodes back with everything else.
//!
//! Nodes that `remove` merges away are never given back to the heap allocator (they sit inside
//! a chunk): they go on the freeing thread's stripe's free list instead, a stack threaded
//! through the freed nodes' first words, and [`alloc_node`] takes from its own list before
//! carving. When a stripe's chunk is spent, it also adopts another stripe's whole free list,
//! if any, to use before the new chunk (one write to that stripe's free-list line, and only
//! once per chunk, so the owner is rarely disturbed). So a tree that shrinks in one thread and
//! grows in another mostly stays inside the slab ranges the GPU mirror already copies.
//!
//! Every chunk is on its stripe's list: the chunk's first word holds the stripe's previous
//! chunk, the stripe's last-chunk word the newest, its chunk count how many (`meta.rs`). The
//! index-only GPU mirror (`mirror/index_pages.rs`) walks these lists to find the pages that
//! hold nodes; a chunk is a large allocation, so those pages hold nothing else.

use super::layout::{NODE_ALIGN, NODE_SIZE, OWNER_OFF};
use super::meta::{self, CHUNKS, FREE_HEAD, HANDED_OUT, LAST_CHUNK, NODE_DELTA, SLAB_CURSOR, SLAB_END};
use crate::heap::{HeapRead, HeapWrite};
use crate::stripe::{self, STRIPES};
use tusk_txn::TxnError;

/// Nodes per slab chunk: 64 KiB of nodes, a few pages per allocation.
pub const NODES_PER_CHUNK: u64 = 128;
/// Bytes of a chunk's allocation: the link word, alignment slack, the nodes.
pub const CHUNK_BYTES: u64 = 8 + NODE_ALIGN + NODES_PER_CHUNK * NODE_SIZE;

/// The first node of the chunk allocated at `chunk` (after its link word).
pub fn first_node(chunk: u64) -> u64 {
    (chunk + 8).next_multiple_of(NODE_ALIGN)
}

/// The heap bytes of the chunk at `chunk` that its link and nodes use.
pub fn chunk_span(chunk: u64) -> std::ops::Range<u64> {
    chunk..first_node(chunk) + NODES_PER_CHUNK * NODE_SIZE
}

/// Follows `n` links of a chunk list from `chunk` (its newest): the chunks passed, newest
/// first, and the link after them (0 at the list's end); `None` if the list ends sooner.
pub fn walk_chunks<H: HeapRead>(heap: &mut H, mut chunk: u64, n: u64) -> Result<Option<(Vec<u64>, u64)>, TxnError> {
    let mut chunks = Vec::new();
    for _ in 0..n {
        if chunk == 0 {
            return Ok(None);
        }
        chunks.push(chunk);
        chunk = heap.load(chunk)?;
    }
    Ok(Some((chunks, chunk)))
}

/// The chunk list of stripe `s` of the tree at `meta`: (chunks, newest chunk), or `None` if
/// the stripe carved nodes from chunks that are not on it (a tree made before chunk lists).
/// A stripe fills each chunk before it takes the next, so with every chunk listed the nodes
/// it handed out are exactly the full chunks before the newest and the newest's carved part.
pub fn listed_chunks<H: HeapRead>(heap: &mut H, meta: u64, s: u64) -> Result<Option<(u64, u64)>, TxnError> {
    let stripe = meta::stripe(meta, s);
    let (chunks, last) = (heap.load(stripe + CHUNKS)?, heap.load(stripe + LAST_CHUNK)?);
    let handed_out = heap.load(stripe + HANDED_OUT)?;
    if chunks == 0 {
        return Ok((last == 0 && handed_out == 0).then_some((0, 0)));
    }
    let (cursor, end) = (heap.load(stripe + SLAB_CURSOR)?, heap.load(stripe + SLAB_END)?);
    let first = first_node(last);
    let listed = end == first + NODES_PER_CHUNK * NODE_SIZE
        && (first..=end).contains(&cursor)
        && handed_out == NODES_PER_CHUNK * (chunks - 1) + (cursor - first) / NODE_SIZE;
    Ok(listed.then_some((chunks, last)))
}

/// Hands out one zeroed, 64-byte-aligned node of the tree whose descriptor is at `meta`: a
/// freed one if there is any, else a fresh one from the stripe's chunk.
pub fn alloc_node<H: HeapWrite>(heap: &mut H, meta: u64) -> Result<u64, TxnError> {
    let mine = meta::my_stripe(meta);
    let node = match pop_free(heap, mine)? {
        Some(node) => node,
        None => carve(heap, meta, mine)?,
    };
    stripe::add(heap, mine + NODE_DELTA, 1)?;
    Ok(node)
}

/// Takes the first node of the free list of the stripe at `stripe`, zeroed.
fn pop_free<H: HeapWrite>(heap: &mut H, stripe: u64) -> Result<Option<u64>, TxnError> {
    let free = heap.load(stripe + FREE_HEAD)?;
    if free == 0 {
        return Ok(None);
    }
    let next = heap.load(free)?;
    heap.store(stripe + FREE_HEAD, next)?;
    // Callers rely on a zeroed node (reserved header words, unused slots).
    for w in (0..NODE_SIZE).step_by(8) {
        heap.store(free + w, 0)?;
    }
    Ok(Some(free))
}

/// A never-used node from the stripe's chunk, or, when the chunk is spent, a node of another
/// stripe's free list, which this stripe adopts whole (its own list is empty here) along with
/// a new chunk: the adopted nodes go first, the chunk after them. Doing both at once bounds
/// the reads of other stripes' lines to one scan per chunk.
fn carve<H: HeapWrite>(heap: &mut H, meta: u64, mine: u64) -> Result<u64, TxnError> {
    let mut cursor = heap.load(mine + SLAB_CURSOR)?;
    let end = heap.load(mine + SLAB_END)?;
    if cursor == 0 || cursor + NODE_SIZE > end {
        let chunk = heap.alloc(CHUNK_BYTES)?;
        let previous = heap.load(mine + LAST_CHUNK)?;
        heap.store(chunk, previous)?;
        heap.store(mine + LAST_CHUNK, chunk)?;
        stripe::add(heap, mine + CHUNKS, 1)?;
        cursor = first_node(chunk);
        heap.store(mine + SLAB_END, cursor + NODES_PER_CHUNK * NODE_SIZE)?;
        if adopt(heap, meta, mine)? {
            heap.store(mine + SLAB_CURSOR, cursor)?;
            return Ok(pop_free(heap, mine)?.expect("the adopted list is not empty"));
        }
    }
    heap.store(mine + SLAB_CURSOR, cursor + NODE_SIZE)?;
    stripe::add(heap, mine + HANDED_OUT, 1)?;
    Ok(cursor)
}

/// Moves the first non-empty free list of another stripe to `mine` (whose list is empty);
/// returns whether there was one.
fn adopt<H: HeapWrite>(heap: &mut H, meta: u64, mine: u64) -> Result<bool, TxnError> {
    for s in 0..STRIPES {
        let other = meta::stripe(meta, s);
        if other == mine {
            continue;
        }
        // Peeked first: most lists are empty, and reading each through the transaction
        // would put every other stripe's free-list line in its read set (or, running in
        // place, hold it, shutting out that stripe's own frees and reuses until commit).
        let mut peeked = [0u64];
        if heap.peek_words(other + FREE_HEAD, &mut peeked)? && peeked[0] == 0 {
            continue;
        }
        let head = heap.load(other + FREE_HEAD)?;
        if head != 0 {
            heap.store(other + FREE_HEAD, 0)?;
            heap.store(mine + FREE_HEAD, head)?;
            return Ok(true);
        }
    }
    Ok(false)
}

/// Puts `node`, no longer reachable from the tree, on the calling thread's stripe's free list.
pub fn free_node<H: HeapWrite>(heap: &mut H, meta: u64, node: u64) -> Result<(), TxnError> {
    debug_assert!(node != 0 && node.is_multiple_of(NODE_ALIGN));
    let mine = meta::my_stripe(meta);
    let head = heap.load(mine + FREE_HEAD)?;
    heap.store(node, head)?;
    // No longer the tree's: a descent that peeked its way here must not take it for a leaf.
    heap.store(node + OWNER_OFF, 0)?;
    heap.store(mine + FREE_HEAD, node)?;
    stripe::add(heap, mine + NODE_DELTA, -1)
}
