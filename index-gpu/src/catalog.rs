//! Recognizes the indexes behind heap pointers (named roots) and sizes them, for
//! `tusk inspect` and tests: each kind's descriptor carries a magic word, and its validator
//! walks the whole structure, so a summary is also a full check.

use tusk_storage::HeapPtr;

use crate::heap::HeapRead;
use crate::{Art, BTree, IndexError};

/// What an index behind a pointer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSummary {
    /// "btree" or "art".
    pub kind: &'static str,
    pub keys: u64,
    /// Nodes in use (B-link: 512-byte nodes; ART: inner nodes).
    pub nodes: u64,
    /// Leaves (B-link: leaf nodes; ART: leaves of every size class).
    pub leaves: u64,
    /// Heap bytes of nodes and leaves in use.
    pub bytes: u64,
    /// Levels (B-link) or the deepest leaf's depth (ART).
    pub depth: u64,
}

/// The index at `ptr`, validated and sized; `None` if `ptr` holds no index.
pub fn describe<H: HeapRead>(heap: &mut H, ptr: HeapPtr) -> Option<Result<IndexSummary, IndexError>> {
    if !heap.contains(ptr.offset(), 8) {
        return None;
    }
    if let Ok(tree) = BTree::open(heap, ptr) {
        return Some(tree.check(heap).map(|s| IndexSummary {
            kind: "btree",
            keys: s.keys,
            nodes: s.nodes,
            leaves: s.leaves,
            bytes: s.nodes * crate::btree::layout::NODE_SIZE,
            depth: s.levels as u64,
        }));
    }
    if let Ok(art) = Art::open(heap, ptr) {
        return Some(art.check(heap).map(|s| IndexSummary {
            kind: "art",
            keys: s.keys,
            nodes: s.n4 + s.n16 + s.n48 + s.n256,
            leaves: s.leaves,
            bytes: s.bytes,
            depth: s.depth_max,
        }));
    }
    None
}
