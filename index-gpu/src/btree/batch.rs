//! Batched updates: the CPU-side batch update that the GPU mirror consumes (the mirror
//! is synced by copying the pages dirtied since its last sync, docs/ARCHITECTURE.md, GPU
//! mirror, so a batch should touch few nodes and dirty few pages). A batch is sorted by key, then applied leaf by
//! leaf with one descent per touched leaf instead of one per operation.
//!
//! Per leaf: the leaf's entries are read once, every pending operation whose key is below the
//! leaf's high key is applied to that copy in order, and the changed slots are written back in
//! one pass. An operation that would overflow the leaf (an insert into a full one) or underflow
//! it (a removal from one at MIN_FILL, the root excepted) ends the pass: what was applied so
//! far is written back, that one operation goes through the single-key `insert`/`remove` path
//! (splits, merges, redistribution), and the next operation descends afresh. Structure only
//! changes on that fallback path, so the in-leaf pass never needs to know about it.
//!
//! The sort is stable, so operations on one key apply in batch order (the last one wins), and
//! operations on distinct keys commute: the result, and the outcome counts, equal applying the
//! operations one by one in batch order.

use super::layout::{self, CAPACITY, MIN_FILL};
use super::meta::ROOT_OFF;
use super::{insert, meta, remove, search};
use crate::heap::HeapWrite;
use tusk_txn::TxnError;

/// One operation of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` to `value`, inserting it if absent.
    Upsert { key: u64, value: u64 },
    /// Removes `key` if present.
    Remove { key: u64 },
}

impl Op {
    pub fn key(&self) -> u64 {
        match *self {
            Op::Upsert { key, .. } | Op::Remove { key } => key,
        }
    }
}

/// What a batch did, operation by operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Upserts of absent keys.
    pub inserted: u64,
    /// Upserts of present keys.
    pub updated: u64,
    /// Removals of present keys.
    pub removed: u64,
    /// Removals of absent keys.
    pub absent: u64,
}

/// Applies `ops` to the tree described at `meta` (see the module doc).
pub fn apply_batch<H: HeapWrite>(heap: &mut H, meta: u64, ops: &[Op]) -> Result<BatchOutcome, TxnError> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by_key(|&i| ops[i].key()); // stable: equal keys keep batch order
    let mut out = BatchOutcome::default();
    let mut key_delta = 0i64;
    let mut pos = 0;
    while pos < order.len() {
        let root = heap.load(meta + ROOT_OFF)?;
        let first = ops[order[pos]].key();
        let (leaf, h) = search::descend(heap, root, first, None)?;
        let min = if leaf == root { 0 } else { MIN_FILL };
        let mut entries = Vec::with_capacity(CAPACITY);
        for i in 0..h.count {
            entries.push((layout::key(heap, leaf, i)?, layout::value(heap, leaf, i)?));
        }
        let original = entries.clone();
        let mut fallback = None;
        while pos < order.len() {
            let op = ops[order[pos]];
            if h.must_move_right(op.key()) {
                break;
            }
            let at = entries.binary_search_by_key(&op.key(), |&(k, _)| k);
            match (op, at) {
                (Op::Upsert { value, .. }, Ok(i)) => {
                    entries[i].1 = value;
                    out.updated += 1;
                }
                (Op::Upsert { key, value }, Err(i)) if entries.len() < CAPACITY => {
                    entries.insert(i, (key, value));
                    out.inserted += 1;
                    key_delta += 1;
                }
                (Op::Remove { .. }, Ok(i)) if entries.len() > min => {
                    entries.remove(i);
                    out.removed += 1;
                    key_delta -= 1;
                }
                (Op::Remove { .. }, Err(_)) => out.absent += 1,
                _ => {
                    fallback = Some(op);
                    pos += 1;
                    break;
                }
            }
            pos += 1;
        }
        write_back(heap, leaf, h.level, &original, &entries)?;
        match fallback {
            Some(Op::Upsert { key, value }) => {
                let old = insert::insert(heap, meta, key, value)?;
                debug_assert!(old.is_none());
                out.inserted += 1;
            }
            Some(Op::Remove { key }) => {
                let old = remove::remove(heap, meta, key)?;
                debug_assert!(old.is_some());
                out.removed += 1;
            }
            None => {}
        }
    }
    if key_delta != 0 {
        // The single-key paths keep the count themselves; add what the in-leaf passes did.
        meta::add_keys(heap, meta, key_delta)?;
    }
    Ok(out)
}

/// Writes `entries` into `leaf`, which held `original`: only the slots that changed, and the
/// count if it did, so a batch dirties no more of the node than it must.
fn write_back<H: HeapWrite>(heap: &mut H, leaf: u64, level: u32, original: &[(u64, u64)], entries: &[(u64, u64)]) -> Result<(), TxnError> {
    for (i, &(k, v)) in entries.iter().enumerate() {
        match original.get(i) {
            Some(&(ok, ov)) => {
                if ok != k {
                    heap.store(layout::key_off(leaf, i), k)?;
                }
                if ov != v {
                    heap.store(layout::value_off(leaf, i), v)?;
                }
            }
            None => layout::write_entry(heap, leaf, i, k, v)?,
        }
    }
    if entries.len() != original.len() {
        layout::write_level_count(heap, leaf, level, entries.len())?;
    }
    Ok(())
}
