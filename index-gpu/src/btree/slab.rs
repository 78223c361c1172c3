//! The node slab: nodes are carved from large chunks of the heap rather than allocated one by
//! one, because the general allocator puts an 8-byte header before each block (so a 512-byte
//! node would neither be 64-byte aligned nor pack densely), and because a later GPU mirror
//! wants the nodes in few contiguous ranges it can copy wholesale.
//!
//! A chunk is one allocation of [`NODES_PER_CHUNK`] nodes plus alignment slack; the descriptor
//! keeps a cursor into the current chunk. Chunks are allocated through the transaction, so an
//! aborted insert gives its nodes back with everything else.
//!
//! Nodes that `remove` merges away are never given back to the heap allocator (they sit inside
//! a chunk): they go on the tree's free list instead, a stack threaded through the freed
//! nodes' first words, and [`alloc_node`] takes from it before carving new ones. So a tree
//! that shrinks and grows again stays inside the slab ranges the GPU mirror already copies.

use super::layout::{NODE_ALIGN, NODE_SIZE};
use super::meta::{FREE_HEAD_OFF, HANDED_OUT_OFF, NODE_COUNT_OFF, SLAB_CURSOR_OFF, SLAB_END_OFF};
use crate::heap::HeapWrite;
use tusk_txn::TxnError;

/// Nodes per slab chunk: 64 KiB of nodes, a few pages per allocation.
pub const NODES_PER_CHUNK: u64 = 128;

/// Hands out one zeroed, 64-byte-aligned node of the tree whose descriptor is at `meta`: a
/// freed one if there is any, else a fresh one from the current chunk.
pub fn alloc_node<H: HeapWrite>(heap: &mut H, meta: u64) -> Result<u64, TxnError> {
    let node = match heap.load(meta + FREE_HEAD_OFF)? {
        0 => carve(heap, meta)?,
        free => {
            let next = heap.load(free)?;
            heap.store(meta + FREE_HEAD_OFF, next)?;
            // Callers rely on a zeroed node (reserved header words, unused slots).
            for w in (0..NODE_SIZE).step_by(8) {
                heap.store(free + w, 0)?;
            }
            free
        }
    };
    let nodes = heap.load(meta + NODE_COUNT_OFF)?;
    heap.store(meta + NODE_COUNT_OFF, nodes + 1)?;
    Ok(node)
}

/// A never-used node from the current chunk, or from a new chunk when it is spent.
fn carve<H: HeapWrite>(heap: &mut H, meta: u64) -> Result<u64, TxnError> {
    let mut cursor = heap.load(meta + SLAB_CURSOR_OFF)?;
    let end = heap.load(meta + SLAB_END_OFF)?;
    if cursor == 0 || cursor + NODE_SIZE > end {
        let chunk = heap.alloc(NODES_PER_CHUNK * NODE_SIZE + NODE_ALIGN)?;
        cursor = chunk.next_multiple_of(NODE_ALIGN);
        heap.store(meta + SLAB_END_OFF, cursor + NODES_PER_CHUNK * NODE_SIZE)?;
    }
    heap.store(meta + SLAB_CURSOR_OFF, cursor + NODE_SIZE)?;
    let handed = heap.load(meta + HANDED_OUT_OFF)?;
    heap.store(meta + HANDED_OUT_OFF, handed + 1)?;
    Ok(cursor)
}

/// Puts `node`, no longer reachable from the tree, on the free list.
pub fn free_node<H: HeapWrite>(heap: &mut H, meta: u64, node: u64) -> Result<(), TxnError> {
    debug_assert!(node != 0 && node.is_multiple_of(NODE_ALIGN));
    let head = heap.load(meta + FREE_HEAD_OFF)?;
    heap.store(node, head)?;
    heap.store(meta + FREE_HEAD_OFF, node)?;
    let nodes = heap.load(meta + NODE_COUNT_OFF)?;
    debug_assert!(nodes > 1, "the root is never freed without a replacement");
    heap.store(meta + NODE_COUNT_OFF, nodes - 1)
}
