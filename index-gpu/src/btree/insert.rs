//! Upsert with node splits. A full node splits into two halves: the left keeps its place and
//! takes the right half's first key as its high key and the new node as its right link (the
//! Lehman–Yao half-split), then the separator goes up to the parent, splitting it in turn if
//! full; a split root grows the tree by one level. The whole insert runs in one transaction,
//! so other transactions never see a half-split; the links are there for lock-free readers.
//!
//! The descent's internal nodes may have been peeked (`search.rs`), so before a separator
//! goes into one, the node is read through the transaction and must prove it is the parent
//! level's node for the separator (this tree's, of that level, low key at most the
//! separator); one that does not is found again by a tracked descent. Likewise the node at
//! the top of a peeked path grows the tree only if it is the root the transaction reads.

use super::layout::{self, Fences, Header, CAPACITY};
use super::meta::ROOT_OFF;
use super::path::Path;
use super::{meta, search, slab};
use crate::heap::HeapWrite;
use tusk_txn::TxnError;

/// Sets `key` to `value` in the tree described at `meta`; returns the value it replaced.
pub fn insert<H: HeapWrite>(heap: &mut H, meta: u64, key: u64, value: u64) -> Result<Option<u64>, TxnError> {
    update(heap, meta, key, |_| value)
}

/// Sets `key` to `value(old)`, `old` being its value or `None`, in one descent (a
/// read-modify-write: `get` then `insert` descends twice); returns `old`.
pub fn update<H: HeapWrite>(heap: &mut H, meta: u64, key: u64, value: impl FnOnce(Option<u64>) -> u64) -> Result<Option<u64>, TxnError> {
    let mut path = Path::new();
    let (leaf, h) = search::descend_tree(heap, meta, key, Some(&mut path))?;
    let (i, hit) = layout::search(heap, leaf, h.count, key)?;
    if hit {
        let old = layout::value(heap, leaf, i)?;
        heap.store(layout::value_off(leaf, i), value(Some(old)))?;
        return Ok(Some(old));
    }
    insert_entry(heap, meta, leaf, h, i, key, value(None), &mut path, Posting::Deferrable)?;
    // Counted last: the leaf's entries above are read while the write set is still empty,
    // the transaction's fast path (whole lines validated at once, no write-set lookups).
    meta::add_keys(heap, meta, 1)?;
    Ok(None)
}

/// Where a split of an internal node sends its separator (see `posts.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Posting {
    /// To the commit, where the heap keeps [`super::posts::PendingPosts`] (a transaction, a
    /// fenced tree).
    Deferrable,
    /// Into the parent now (the commit's own posts).
    Now,
}

/// Inserts (k, v) at slot `i` of `node`, splitting upwards along `path` as needed. `path`
/// holds an internal node per level above `node`, root first, each covering `node`'s range
/// or lying to the left of the one that does on its level (a descent to a leaf left of
/// `node`): the separator moves right to its node as a reader would, and that node takes the
/// level's place in `path`, so a batch that goes on to the right (splitting leaf after leaf
/// without a new descent) starts there next time instead of walking the level again from the
/// descent's node (a 64 M-key batch into an empty tree walked ever longer and never ended).
#[allow(clippy::too_many_arguments)]
pub(super) fn insert_entry<H: HeapWrite>(heap: &mut H, meta: u64, mut node: u64, mut h: Header, mut i: usize, mut k: u64, mut v: u64, path: &mut [u64], posting: Posting) -> Result<(), TxnError> {
    let mut level = path.len();
    // Asked at the first split only: most inserts end in `shift_in`.
    let mut peeked = None;
    loop {
        if h.count < CAPACITY {
            return shift_in(heap, node, h, i, k, v);
        }
        let peeked = match peeked {
            Some(p) => p,
            None => *peeked.insert(search::peeks(heap, meta)?),
        };
        let (right, separator) = split(heap, meta, node, h, i, k, v)?;
        if peeked && posting == Posting::Deferrable && !h.is_leaf() && defer_post(heap, meta, h.level, separator, right)? {
            return Ok(());
        }
        // The level of `path` the parent takes the place of (none above the path's top).
        let mut path_level = None;
        let on_path = match level.checked_sub(1) {
            Some(above) => {
                (level, path_level) = (above, Some(above));
                let ph = layout::read_header(heap, path[level])?;
                (!peeked || proves_parent(&ph, meta, h.level, separator)).then_some((path[level], ph))
            }
            None if !peeked => return grow_root(heap, meta, node, h.level, separator, right),
            None => None,
        };
        let (mut parent, mut ph) = match on_path {
            Some(found) => found,
            None => {
                // A peeked path's node was not the parent, or the path ended: the node may be
                // the root (which the peeks may not have seen grow or shrink), else a tracked
                // descent finds its parent.
                let root = search::root(heap, meta)?;
                if root == node {
                    return grow_root(heap, meta, node, h.level, separator, right);
                }
                let (parent, ph) = search::descend_to(heap, root, separator, h.level + 1, None)?;
                assert_eq!(ph.level, h.level + 1, "the tree at {meta} has no level above {} under root {root}", h.level);
                (parent, ph)
            }
        };
        // A reader-side rule applied to the writer too: the separator belongs to the
        // parent level's node whose range covers it.
        while ph.must_move_right(separator) {
            parent = ph.right;
            ph = layout::read_header(heap, parent)?;
        }
        if let Some(l) = path_level {
            path[l] = parent;
        }
        i = layout::lower_bound(heap, parent, ph.count, separator)?;
        (node, h, k, v) = (parent, ph, separator, right);
    }
}

/// Leaves the separator of `right`, split off a node of `level`, to the commit (`posts.rs`).
/// Where the level's pending separators are at their cap, posts every pending separator of
/// the tree first, top level first, and then leaves this one. Posting it at once instead
/// found no parent where the level's top node was the root and its growth was pending too.
/// False where the heap keeps none (outside a transaction).
fn defer_post<H: HeapWrite>(heap: &mut H, meta: u64, level: u32, separator: u64, right: u64) -> Result<bool, TxnError> {
    if heap.defer_post(meta, level, separator, right) {
        return Ok(true);
    }
    if heap.pending_posts(meta).is_none_or(|p| p.is_empty()) {
        return Ok(false);
    }
    heap.finish_posts(meta)?;
    Ok(heap.defer_post(meta, level, separator, right))
}

/// Whether `ph`, read through the transaction, is a node of the tree at `meta` one level
/// above `level` whose range may hold `separator` (its right siblings' ranges follow).
pub(super) fn proves_parent(ph: &Header, meta: u64, level: u32, separator: u64) -> bool {
    ph.owner == meta && ph.level == level + 1 && ph.low_key <= separator
}

/// Inserts (k, v) at slot `i` of `node`, which has room: the entries from `i` on are read
/// as two runs of words and written back one slot up, behind the new entry, as two runs.
fn shift_in<H: HeapWrite>(heap: &mut H, node: u64, h: Header, i: usize, k: u64, v: u64) -> Result<(), TxnError> {
    let n = h.count - i;
    let (mut keys, mut values) = ([0u64; CAPACITY], [0u64; CAPACITY]);
    (keys[0], values[0]) = (k, v);
    heap.load_words(layout::key_off(node, i), &mut keys[1..=n])?;
    heap.load_words(layout::value_off(node, i), &mut values[1..=n])?;
    heap.store_words(layout::key_off(node, i), &keys[..=n])?;
    heap.store_words(layout::value_off(node, i), &values[..=n])?;
    layout::write_level_count(heap, node, h.level, h.count + 1)
}

/// Splits the full `node` while inserting (k, v) at slot `i`: of the CAPACITY + 1 entries the
/// left keeps the lower half and a new right sibling takes the upper (or, for an append to the
/// rightmost leaf, the left keeps all it had and the new entry starts the right). Returns the
/// new node and its first key, the separator.
fn split<H: HeapWrite>(heap: &mut H, meta: u64, node: u64, h: Header, i: usize, k: u64, v: u64) -> Result<(u64, u64), TxnError> {
    let total = CAPACITY + 1;
    // An append past the last key of the rightmost leaf — an ascending run of inserts — keeps
    // the leaf full and starts the new rightmost leaf with the new entry alone, so sequential
    // inserts leave full leaves instead of half-full ones. Only the rightmost leaf may hold
    // fewer than MIN_FILL entries this way (check.rs allows it; remove.rs repairs it with
    // its left sibling, under the same parent, like any underfull leaf).
    let append = i == CAPACITY && h.is_leaf() && h.right == 0;
    let left_n = if append { CAPACITY } else { total / 2 };
    let right_n = total - left_n;
    let right = slab::alloc_node(heap, meta)?;
    if i < left_n {
        // The new entry stays left: the left's last old entries move right to make room.
        layout::move_entries(heap, node, left_n - 1, right, 0, right_n)?;
        layout::move_entries(heap, node, i, node, i + 1, left_n - 1 - i)?;
        layout::write_entry(heap, node, i, k, v)?;
    } else {
        let before = i - left_n;
        layout::move_entries(heap, node, left_n, right, 0, before)?;
        layout::write_entry(heap, right, before, k, v)?;
        layout::move_entries(heap, node, i, right, before + 1, CAPACITY - i)?;
    }
    let separator = layout::key(heap, right, 0)?;
    layout::write_header(heap, right, h.level, right_n, h.high_key, h.right, Fences { low_key: separator, owner: meta })?;
    layout::write_level_count(heap, node, h.level, left_n)?;
    layout::write_bound(heap, node, Some(separator), right)?;
    Ok((right, separator))
}

/// The root split: a new root one level up holds the two halves.
pub(super) fn grow_root<H: HeapWrite>(heap: &mut H, meta: u64, left: u64, level: u32, separator: u64, right: u64) -> Result<(), TxnError> {
    let root = slab::alloc_node(heap, meta)?;
    // keys[0] = 0: the root is the leftmost node of its level, its low bound the smallest key.
    layout::write_entry(heap, root, 0, 0, left)?;
    layout::write_entry(heap, root, 1, separator, right)?;
    layout::write_header(heap, root, level + 1, 2, None, 0, Fences { low_key: 0, owner: meta })?;
    heap.store(meta + ROOT_OFF, root)
}
