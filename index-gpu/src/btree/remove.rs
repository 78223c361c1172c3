//! Removal with underflow repair. A node left with fewer than MIN_FILL entries (the root
//! excepted) is repaired with a sibling under the same parent:
//! - **redistribute** when the sibling has entries to spare: entries move across so both halves
//!   end up even, and the separator in the parent and the left node's high key change together;
//! - **merge** otherwise: the right node of the pair is always merged into the left one, so the
//!   left takes the right's entries *and* its high key and right link (they stay a pair, and
//!   the sibling chain just skips the freed node); the parent loses the right node's entry,
//!   which may underflow the parent in turn.
//!
//! Because the left node of a pair always survives, an internal node's slot 0 is never removed:
//! keys\[0\] stays the node's low bound (0 for the leftmost node of a level, see `layout.rs`).
//! Entries move between internal nodes whole, (low bound, child) pairs, so the moved keys stay
//! their children's low bounds on either side, and the new separator is simply the right
//! node's new keys\[0\]. An internal root left with one child is freed and the child becomes the
//! root (the tree shrinks a level); an empty tree keeps its leaf root.
//!
//! Like insert, the whole removal runs in one transaction; freed nodes go to the slab's free
//! list (`slab.rs`).

use super::layout::{self, Header, MIN_FILL};
use super::meta::ROOT_OFF;
use super::path::Path;
use super::{meta, search, slab};
use crate::heap::HeapWrite;
use tusk_txn::TxnError;

/// Removes `key` from the tree described at `meta`; returns the value it had.
pub fn remove<H: HeapWrite>(heap: &mut H, meta: u64, key: u64) -> Result<Option<u64>, TxnError> {
    // A repair finds a node's entry in its parent: every separator must be there (`posts.rs`).
    heap.finish_posts(meta)?;
    let root = heap.load(meta + ROOT_OFF)?;
    let mut path = Path::new();
    let (leaf, h) = search::descend(heap, root, key, Some(&mut path))?;
    let i = layout::lower_bound(heap, leaf, h.count, key)?;
    if i == h.count || layout::key(heap, leaf, i)? != key {
        return Ok(None);
    }
    let old = layout::value(heap, leaf, i)?;
    meta::add_keys(heap, meta, -1)?;
    let h = remove_slot(heap, leaf, h, i)?;
    repair(heap, meta, leaf, h, key, path)?;
    Ok(Some(old))
}

/// Removes entry `i` of `node`; returns the updated header.
pub(crate) fn remove_slot<H: HeapWrite>(heap: &mut H, node: u64, mut h: Header, i: usize) -> Result<Header, TxnError> {
    debug_assert!(i < h.count);
    layout::move_entries(heap, node, i + 1, node, i, h.count - i - 1)?;
    h.count -= 1;
    layout::write_level_count(heap, node, h.level, h.count)?;
    Ok(h)
}

/// Restores the fill invariant upwards from `node` (header `h`), which just lost an entry.
/// `key` lies in `node`'s range (so in every ancestor's) and locates it in its parent; `path`
/// holds the ancestors, root first.
fn repair<H: HeapWrite>(heap: &mut H, meta: u64, mut node: u64, mut h: Header, key: u64, mut path: Path) -> Result<(), TxnError> {
    loop {
        let Some(parent) = path.pop() else {
            return shrink_root(heap, meta, node, h);
        };
        if h.count >= MIN_FILL {
            return Ok(());
        }
        let ph = layout::read_header(heap, parent)?;
        // A non-root internal node has ≥ MIN_FILL children, the root ≥ 2: a sibling exists.
        assert!(ph.count >= 2, "internal node {parent} with {} children", ph.count);
        let slot = layout::child_slot(heap, parent, ph.count, key)?;
        assert_eq!(layout::value(heap, parent, slot)?, node, "path does not lead to node {node}");
        // The pair (left, right) = (slot-1, slot), or (0, 1) for the first child.
        let right_slot = slot.max(1);
        let left = layout::value(heap, parent, right_slot - 1)?;
        let right = layout::value(heap, parent, right_slot)?;
        let lh = layout::read_header(heap, left)?;
        let rh = layout::read_header(heap, right)?;
        debug_assert_eq!(lh.right, right);
        if lh.count + rh.count >= 2 * MIN_FILL {
            return redistribute(heap, parent, right_slot, left, lh, right, rh);
        }
        merge(heap, meta, left, lh, right, rh)?;
        h = remove_slot(heap, parent, ph, right_slot)?;
        node = parent;
    }
}

/// Evens out two siblings, one of them underfull, whose entries fill both to MIN_FILL.
fn redistribute<H: HeapWrite>(heap: &mut H, parent: u64, right_slot: usize, left: u64, lh: Header, right: u64, rh: Header) -> Result<(), TxnError> {
    let total = lh.count + rh.count;
    let left_n = total / 2;
    let right_n = total - left_n;
    debug_assert!(left_n >= MIN_FILL && right_n >= MIN_FILL);
    if lh.count > left_n {
        // Left to right: make room at the front of the right node, then move the left's tail.
        let moved = lh.count - left_n;
        layout::move_entries(heap, right, 0, right, moved, rh.count)?;
        layout::move_entries(heap, left, left_n, right, 0, moved)?;
    } else {
        // Right to left: append the right's head to the left node, then close the gap.
        let moved = rh.count - right_n;
        layout::move_entries(heap, right, 0, left, lh.count, moved)?;
        layout::move_entries(heap, right, moved, right, 0, right_n)?;
    }
    layout::write_level_count(heap, left, lh.level, left_n)?;
    layout::write_level_count(heap, right, rh.level, right_n)?;
    let separator = layout::key(heap, right, 0)?;
    layout::write_bound(heap, left, Some(separator), right)?;
    heap.store(right + layout::LOW_KEY_OFF, separator)?;
    heap.store(layout::key_off(parent, right_slot), separator)
}

/// Merges `right` into its left sibling `left` and frees it; the caller removes its entry from
/// the parent.
fn merge<H: HeapWrite>(heap: &mut H, meta: u64, left: u64, lh: Header, right: u64, rh: Header) -> Result<(), TxnError> {
    let total = lh.count + rh.count;
    assert!(total <= layout::CAPACITY, "merge of {} + {} entries", lh.count, rh.count);
    layout::move_entries(heap, right, 0, left, lh.count, rh.count)?;
    layout::write_level_count(heap, left, lh.level, total)?;
    layout::write_bound(heap, left, rh.high_key, rh.right)?;
    slab::free_node(heap, meta, right)
}

/// The root `node` just lost an entry: an internal root with one child hands the root over to
/// that child (repeatedly, though one level is all a single removal can free).
fn shrink_root<H: HeapWrite>(heap: &mut H, meta: u64, mut node: u64, mut h: Header) -> Result<(), TxnError> {
    while !h.is_leaf() && h.count == 1 {
        let child = layout::value(heap, node, 0)?;
        heap.store(meta + ROOT_OFF, child)?;
        slab::free_node(heap, meta, node)?;
        node = child;
        h = layout::read_header(heap, node)?;
    }
    Ok(())
}
