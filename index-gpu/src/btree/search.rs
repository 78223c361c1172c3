//! Descent from the root to a leaf, Lehman–Yao style: at every node, first move right while
//! the key is at or beyond the node's high key, then follow the child covering the key.

use super::layout::{self, Header};
use crate::heap::HeapRead;
use tusk_txn::TxnError;

/// Descends from `root` to the leaf that holds (or would hold) `key`, returning it with its
/// header. When `path` is given, it receives the internal node visited on each level, root
/// first: where a split of the level below inserts its separator.
pub fn descend<H: HeapRead>(heap: &mut H, root: u64, key: u64, mut path: Option<&mut Vec<u64>>) -> Result<(u64, Header), TxnError> {
    let mut node = root;
    heap.prefetch(node, layout::NODE_SIZE);
    loop {
        let mut h = layout::read_header(heap, node)?;
        while h.must_move_right(key) {
            node = h.right;
            heap.prefetch(node, layout::NODE_SIZE);
            h = layout::read_header(heap, node)?;
        }
        if h.is_leaf() {
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

/// The value stored under `key`, if any.
pub fn get<H: HeapRead>(heap: &mut H, root: u64, key: u64) -> Result<Option<u64>, TxnError> {
    let (leaf, h) = descend(heap, root, key, None)?;
    let (i, hit) = layout::search(heap, leaf, h.count, key)?;
    if hit {
        Ok(Some(layout::value(heap, leaf, i)?))
    } else {
        Ok(None)
    }
}
