//! Descent from the root to a leaf, Lehman–Yao style: at every node, first move right while
//! the key is at or beyond the node's high key, then follow the child covering the key.
//!
//! In a transaction, a descent of a fenced tree (`meta.rs`) reads the descriptor's root and
//! the internal nodes with [`HeapRead::peek_words`]: they join neither the read set nor, for
//! a transaction running in place, its locks. So a large transaction holds only the leaves it
//! touches, and commits elsewhere in the tree (a split that rewrites the root, say) cannot
//! invalidate it. What a peek returns may be stale or torn; the descent only has to end at
//! the right leaf, and a leaf proves that itself: it is read through the transaction, and a
//! leaf of this tree (owner) whose `[low key, high key)` holds the key is the key's leaf
//! (`layout.rs`). The move right along the leaf level is read through the transaction too,
//! as before. Where a peek finds nonsense (an offset outside the heap, levels that do not
//! step down, a walk longer than [`MAX_PEEKED_STEPS`]) or the leaf does not prove itself,
//! the descent starts again, every read through the transaction.

use super::layout::{self, Header, HEADER_WORDS};
use super::meta::{self, FENCED_OFF, ROOT_OFF};
use super::path::{Path, MAX_LEVELS};
use crate::heap::HeapRead;
use tusk_txn::TxnError;

/// Longest walk of an optimistic descent, moves right included, before it gives up on its
/// peeks: beyond any real descent (levels times the siblings concurrent splits add, and a
/// level's nodes a transaction in place has split off with their separators waiting for its
/// commit, at most [`super::posts::MAX_PENDING_PER_LEVEL`]), so only a cycle of torn offsets
/// reaches it.
pub const MAX_PEEKED_STEPS: usize = 1024;

/// Keys whose descents [`get_many`] runs side by side. Each descent in flight keeps one node
/// (8 cache lines) on its way from memory; 16 of them stay within what a core can have
/// outstanding while filling the gaps between one descent's dependent misses.
pub const LOOKUP_GROUP: usize = 16;

/// Where one step of a descent ended.
enum Step {
    /// `key` belongs to this leaf.
    Leaf(u64, Header),
    /// Go on to this child (already prefetched).
    Child(u64),
}

/// One level of a descent: moves right from `node` as far as `key` requires, then either
/// stops at the leaf or picks the child covering `key` and starts fetching it.
#[inline]
fn step<H: HeapRead>(heap: &mut H, mut node: u64, key: u64, path: Option<&mut Path>) -> Result<Step, TxnError> {
    let mut h = layout::read_header(heap, node)?;
    while h.must_move_right(key) {
        node = h.right;
        heap.prefetch(node, layout::NODE_SIZE);
        h = layout::read_header(heap, node)?;
    }
    if h.is_leaf() {
        return Ok(Step::Leaf(node, h));
    }
    if let Some(p) = path {
        p.push(node);
    }
    let slot = layout::child_slot(heap, node, h.count, key)?;
    let child = layout::value(heap, node, slot)?;
    heap.prefetch(child, layout::NODE_SIZE);
    Ok(Step::Child(child))
}

/// Descends from `root` to the leaf that holds (or would hold) `key`, returning it with its
/// header. When `path` is given, it receives the internal node visited on each level, root
/// first: where a split of the level below inserts its separator.
pub fn descend<H: HeapRead>(heap: &mut H, root: u64, key: u64, mut path: Option<&mut Path>) -> Result<(u64, Header), TxnError> {
    let mut node = root;
    heap.prefetch(node, layout::NODE_SIZE);
    loop {
        match step(heap, node, key, path.as_deref_mut())? {
            Step::Leaf(leaf, h) => return Ok((leaf, h)),
            Step::Child(child) => node = child,
        }
    }
}

/// [`descend`], stopping at the node of `level` (0: the leaf) whose range holds `key`.
pub fn descend_to<H: HeapRead>(heap: &mut H, root: u64, key: u64, level: u32, mut path: Option<&mut Path>) -> Result<(u64, Header), TxnError> {
    let mut node = root;
    heap.prefetch(node, layout::NODE_SIZE);
    loop {
        let mut h = layout::read_header(heap, node)?;
        while h.must_move_right(key) {
            node = h.right;
            h = layout::read_header(heap, node)?;
        }
        if h.level <= level {
            return Ok((node, h));
        }
        if let Some(p) = path.as_deref_mut() {
            p.push(node);
        }
        let slot = layout::child_slot(heap, node, h.count, key)?;
        node = layout::value(heap, node, slot)?;
        heap.prefetch(node, layout::NODE_SIZE);
    }
}

/// The descriptor's root and whether the tree is fenced, peeked: what an optimistic descent
/// starts from (`None`: the tree's descents read through the transaction).
fn peeked_start<H: HeapRead>(heap: &mut H, meta: u64) -> Result<Option<u64>, TxnError> {
    const _: () = assert!(ROOT_OFF == 8 && FENCED_OFF == 24);
    if !heap.tracks_reads() {
        return Ok(None);
    }
    let mut words = [0u64; 4];
    if !heap.peek_words(meta, &mut words)? || words[3] != meta::FENCED {
        return Ok(None);
    }
    Ok(Some(words[1]))
}

/// Whether descents of the tree at `meta` in `heap` are optimistic, their paths peeked.
pub fn peeks<H: HeapRead>(heap: &mut H, meta: u64) -> Result<bool, TxnError> {
    Ok(peeked_start(heap, meta)?.is_some())
}

/// The tree's root, read through the transaction.
pub fn root<H: HeapRead>(heap: &mut H, meta: u64) -> Result<u64, TxnError> {
    heap.load(meta + ROOT_OFF)
}

/// Descends the tree at `meta` to the leaf that holds (or would hold) `key`: optimistically
/// where the tree is fenced and the heap tracks reads (see the module docs), else as
/// [`descend`] from the root. `path`, when given, receives a node per internal level, root
/// first; after an optimistic descent these were peeked, so whoever writes to one validates
/// it first (`insert.rs`).
pub fn descend_tree<H: HeapRead>(heap: &mut H, meta: u64, key: u64, mut path: Option<&mut Path>) -> Result<(u64, Header), TxnError> {
    if let Some(root) = peeked_start(heap, meta)? {
        let from = path.as_deref().map_or(0, |p| p.len());
        match peeked_leaf(heap, meta, root, key, path.as_deref_mut())? {
            Some(found) => return Ok(found),
            None => {
                if let Some(p) = path.as_deref_mut() {
                    p.truncate(from);
                }
            }
        }
    }
    let root = root(heap, meta)?;
    descend(heap, root, key, path)
}

/// A node's header, peeked; `None` where it would leave the heap.
fn peek_header<H: HeapRead>(heap: &mut H, node: u64) -> Result<Option<Header>, TxnError> {
    let mut words = [0u64; HEADER_WORDS];
    if !node.is_multiple_of(layout::NODE_ALIGN) || !heap.peek_words(node, &mut words)? {
        return Ok(None);
    }
    Ok(Some(Header::decode(words)))
}

/// Whether a header read through the transaction proves `node` is the leaf for `key` of the
/// tree at `meta`, up to moves right (its high key is checked by the caller's walk).
fn proves_leaf(h: &Header, meta: u64, key: u64) -> bool {
    h.level == 0 && h.owner == meta && h.low_key <= key
}

/// Where one peeked step of an optimistic descent ended.
enum Peeked {
    /// Go on to this child (already prefetched), of this level.
    Child(u64, u32),
    /// The peeks say this node is the key's leaf (to be proven through the transaction).
    Leaf(u64),
    /// The peeks make no sense: start again, tracked.
    Lost,
}

/// One level of an optimistic descent, peeked: moves right from `node` (of `level`, `None`
/// for the root) as far as `key` requires, then picks the child covering `key`.
fn peeked_step<H: HeapRead>(heap: &mut H, meta: u64, mut node: u64, key: u64, mut level: Option<u32>, path: Option<&mut Path>) -> Result<Peeked, TxnError> {
    for _ in 0..MAX_PEEKED_STEPS {
        let Some(h) = peek_header(heap, node)? else { return Ok(Peeked::Lost) };
        // A level beyond any tree's is a torn peek, and would overflow the path.
        let deeper_than_any = h.level as usize > MAX_LEVELS;
        if level.is_some_and(|l| l != h.level) || deeper_than_any || h.owner != meta || h.count > layout::CAPACITY {
            return Ok(Peeked::Lost);
        }
        if h.level == 0 {
            return Ok(Peeked::Leaf(node));
        }
        if h.must_move_right(key) {
            // A node this transaction split off beyond this one and has not posted yet is
            // nearer than the walk (`posts.rs`).
            let pending = heap.pending_posts(meta).and_then(|p| p.nearest(h.level, key));
            let beyond = pending.filter(|&(separator, _)| h.high_key.is_some_and(|high| separator >= high));
            (node, level) = (beyond.map_or(h.right, |(_, n)| n), Some(h.level));
            continue;
        }
        let mut keys = [0u64; layout::CAPACITY];
        if h.count == 0 || !heap.peek_words(layout::key_off(node, 0), &mut keys[..h.count])? {
            return Ok(Peeked::Lost);
        }
        let slot = keys[..h.count].iter().filter(|&&k| k <= key).count().saturating_sub(1);
        let mut child = [0u64];
        if !heap.peek_words(layout::value_off(node, slot), &mut child)? {
            return Ok(Peeked::Lost);
        }
        if let Some(p) = path {
            p.push(node);
        }
        heap.prefetch(child[0], layout::NODE_SIZE);
        return Ok(Peeked::Child(child[0], h.level - 1));
    }
    Ok(Peeked::Lost)
}

/// The node of `level` whose range holds `key` (up to moves right), found by peeks from the
/// peeked root, `path` receiving the node of each level above it, root first: for a caller
/// that proves the node through the transaction before it writes to it, as a split proves a
/// peeked parent (`insert.rs`). `None` where the tree's descents do not peek, the peeks make
/// no sense, or the tree has no such level.
pub fn peeked_node_on_level<H: HeapRead>(heap: &mut H, meta: u64, key: u64, level: u32, path: &mut Path) -> Result<Option<u64>, TxnError> {
    let Some(root) = peeked_start(heap, meta)? else { return Ok(None) };
    let (mut node, mut at) = (root, None);
    for _ in 0..MAX_PEEKED_STEPS {
        let Some(h) = peek_header(heap, node)? else { return Ok(None) };
        if h.level == level && at.is_none_or(|l| l == level) {
            return Ok(Some(node));
        }
        match peeked_step(heap, meta, node, key, at, Some(path))? {
            Peeked::Child(child, l) if l >= level => (node, at) = (child, Some(l)),
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// One optimistic descent: the internal levels peeked, the leaf read and proven through the
/// transaction, then the leaf level walked right through it. `None`: start again, tracked.
fn peeked_leaf<H: HeapRead>(heap: &mut H, meta: u64, root: u64, key: u64, mut path: Option<&mut Path>) -> Result<Option<(u64, Header)>, TxnError> {
    let (mut node, mut level) = (root, None);
    for _ in 0..MAX_PEEKED_STEPS {
        match peeked_step(heap, meta, node, key, level, path.as_deref_mut())? {
            Peeked::Child(child, l) => (node, level) = (child, Some(l)),
            Peeked::Leaf(leaf) => return tracked_leaf(heap, meta, leaf, key),
            Peeked::Lost => return Ok(None),
        }
    }
    Ok(None)
}

/// The end of an optimistic descent at `node`, which the peeks took for the leaf of `key`:
/// its header through the transaction, proven, then the move right as any descent makes.
fn tracked_leaf<H: HeapRead>(heap: &mut H, meta: u64, mut node: u64, key: u64) -> Result<Option<(u64, Header)>, TxnError> {
    let mut h = layout::read_header(heap, node)?;
    if !proves_leaf(&h, meta, key) {
        return Ok(None);
    }
    while h.must_move_right(key) {
        node = h.right;
        h = layout::read_header(heap, node)?;
    }
    Ok(Some((node, h)))
}

/// The value stored under `key` in `leaf`, if any.
fn leaf_value<H: HeapRead>(heap: &mut H, leaf: u64, h: &Header, key: u64) -> Result<Option<u64>, TxnError> {
    let (i, hit) = layout::search(heap, leaf, h.count, key)?;
    if hit {
        Ok(Some(layout::value(heap, leaf, i)?))
    } else {
        Ok(None)
    }
}

/// The value stored under `key`, if any.
pub fn get<H: HeapRead>(heap: &mut H, meta: u64, key: u64) -> Result<Option<u64>, TxnError> {
    let (leaf, h) = descend_tree(heap, meta, key, None)?;
    leaf_value(heap, leaf, &h, key)
}

/// The values stored under `keys`, written to `out` in the same order. The descents of up to
/// [`LOOKUP_GROUP`] keys advance together, one level per pass: each node read waits on a
/// miss started a whole pass earlier, so the misses of the group overlap instead of
/// following one another as `get` after `get` does. The same reads as `get`, in another order.
pub fn get_many<H: HeapRead>(heap: &mut H, meta: u64, keys: &[u64], out: &mut [Option<u64>]) -> Result<(), TxnError> {
    assert_eq!(keys.len(), out.len(), "one answer per key");
    let peeked = peeked_start(heap, meta)?;
    let root = match peeked {
        Some(root) => root,
        None => root(heap, meta)?,
    };
    heap.prefetch(root, layout::NODE_SIZE);
    for (keys, out) in keys.chunks(LOOKUP_GROUP).zip(out.chunks_mut(LOOKUP_GROUP)) {
        let mut nodes = [root; LOOKUP_GROUP];
        let mut levels = [None; LOOKUP_GROUP];
        let mut pending = [true; LOOKUP_GROUP];
        let mut left = keys.len();
        while left > 0 {
            for (i, &key) in keys.iter().enumerate() {
                if !pending[i] {
                    continue;
                }
                let leaf = if peeked.is_some() {
                    match peeked_step(heap, meta, nodes[i], key, levels[i], None)? {
                        Peeked::Child(child, level) => {
                            (nodes[i], levels[i]) = (child, Some(level));
                            continue;
                        }
                        Peeked::Leaf(leaf) => tracked_leaf(heap, meta, leaf, key)?,
                        Peeked::Lost => None,
                    }
                } else {
                    match step(heap, nodes[i], key, None)? {
                        Step::Child(child) => {
                            nodes[i] = child;
                            continue;
                        }
                        Step::Leaf(leaf, h) => Some((leaf, h)),
                    }
                };
                let (leaf, h) = match leaf {
                    Some(found) => found,
                    None => {
                        let root = self::root(heap, meta)?;
                        descend(heap, root, key, None)?
                    }
                };
                out[i] = leaf_value(heap, leaf, &h, key)?;
                pending[i] = false;
                left -= 1;
            }
        }
    }
    Ok(())
}
