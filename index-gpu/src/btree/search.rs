//! Descent from the root to a leaf, Lehman–Yao style: at every node, first move right while
//! the key is at or beyond the node's high key, then follow the child covering the key.

use super::layout::{self, Header};
use crate::heap::HeapRead;
use tusk_txn::TxnError;

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
fn step<H: HeapRead>(heap: &mut H, mut node: u64, key: u64, path: Option<&mut Vec<u64>>) -> Result<Step, TxnError> {
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
pub fn descend<H: HeapRead>(heap: &mut H, root: u64, key: u64, mut path: Option<&mut Vec<u64>>) -> Result<(u64, Header), TxnError> {
    let mut node = root;
    heap.prefetch(node, layout::NODE_SIZE);
    loop {
        match step(heap, node, key, path.as_deref_mut())? {
            Step::Leaf(leaf, h) => return Ok((leaf, h)),
            Step::Child(child) => node = child,
        }
    }
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
pub fn get<H: HeapRead>(heap: &mut H, root: u64, key: u64) -> Result<Option<u64>, TxnError> {
    let (leaf, h) = descend(heap, root, key, None)?;
    leaf_value(heap, leaf, &h, key)
}

/// The values stored under `keys`, written to `out` in the same order. The descents of up to
/// [`LOOKUP_GROUP`] keys advance together, one level per pass: each node read waits on a
/// miss started a whole pass earlier, so the misses of the group overlap instead of
/// following one another as `get` after `get` does. The same reads as `get`, in another order.
pub fn get_many<H: HeapRead>(heap: &mut H, root: u64, keys: &[u64], out: &mut [Option<u64>]) -> Result<(), TxnError> {
    assert_eq!(keys.len(), out.len(), "one answer per key");
    heap.prefetch(root, layout::NODE_SIZE);
    for (keys, out) in keys.chunks(LOOKUP_GROUP).zip(out.chunks_mut(LOOKUP_GROUP)) {
        let mut nodes = [root; LOOKUP_GROUP];
        let mut pending = [true; LOOKUP_GROUP];
        let mut left = keys.len();
        while left > 0 {
            for (i, &key) in keys.iter().enumerate() {
                if !pending[i] {
                    continue;
                }
                match step(heap, nodes[i], key, None)? {
                    Step::Child(child) => nodes[i] = child,
                    Step::Leaf(leaf, h) => {
                        out[i] = leaf_value(heap, leaf, &h, key)?;
                        pending[i] = false;
                        left -= 1;
                    }
                }
            }
        }
    }
    Ok(())
}
