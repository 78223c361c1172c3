//! Batched updates of the ART: upserts and removes of byte keys, applied in key order.
//!
//! A batch is sorted by key (stably, so operations on one key apply in batch order and the
//! last one wins), then applied operation by operation through `insert` and `remove`. In key
//! order, consecutive operations share the upper part of their paths: an upsert starts at the
//! deepest slot of the previous upsert's path that lies within the two keys' common prefix
//! (`insert::insert_from`), not at the root, so a node above is visited once per run of
//! operations under it; the nodes it does visit are still in cache (and, in a large
//! transaction running in place, already locked). A remove may collapse nodes on its path, so
//! the operation after one starts at the root. Every key is
//! checked before anything changes, so a batch with a key too long changes nothing. The
//! result and the outcome counts equal applying the operations one by one in batch order.

use super::{insert, leaf, remove, MAX_KEY_LEN};
use crate::btree::BatchOutcome;
use crate::heap::HeapWrite;
use crate::IndexError;

/// One operation of an ART batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'k> {
    /// Sets `key` to `value`, inserting it if absent.
    Upsert { key: &'k [u8], value: u64 },
    /// Removes `key` if present.
    Remove { key: &'k [u8] },
}

impl<'k> Op<'k> {
    /// An upsert of `value`, or a remove when it is `None` (a change as a log of changes
    /// records it).
    pub fn new(key: &'k [u8], value: Option<u64>) -> Op<'k> {
        match value {
            Some(value) => Op::Upsert { key, value },
            None => Op::Remove { key },
        }
    }

    pub fn key(&self) -> &'k [u8] {
        match *self {
            Op::Upsert { key, .. } | Op::Remove { key } => key,
        }
    }
}

/// Operations whose key bytes are fetched ahead of the one applied.
const KEY_PREFETCH_AHEAD: usize = 8;

/// Applies `ops` to the tree described at `meta` (see the module doc).
pub fn apply_batch<H: HeapWrite>(heap: &mut H, meta: u64, ops: &[Op<'_>]) -> Result<BatchOutcome, IndexError> {
    if let Some(op) = ops.iter().find(|op| op.key().len() > MAX_KEY_LEN) {
        return Err(IndexError::KeyTooLong { len: op.key().len(), max: MAX_KEY_LEN });
    }
    // Sorted by (first 8 key bytes, whole key, position): the prefix word decides most
    // comparisons without touching the keys, the position keeps one key's operations in
    // batch order.
    let mut order: Vec<(u64, usize)> = ops.iter().enumerate().map(|(i, op)| (prefix_word(op.key()), i)).collect();
    order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| ops[a.1].key().cmp(ops[b.1].key())).then(a.1.cmp(&b.1)));
    // Gathered in key order: the loop below reads them in order, where a load from `ops` per
    // operation waited on a miss (a third of the batch's time); the gather's random loads,
    // independent of each other, overlap.
    let sorted: Vec<Op<'_>> = order.iter().map(|&(_, i)| ops[i]).collect();
    drop(order);
    let mut out = BatchOutcome::default();
    // The last upsert's path, and its key.
    let mut path: Vec<(u64, usize)> = Vec::new();
    let mut last: &[u8] = &[];
    for (k, &op) in sorted.iter().enumerate() {
        // The caller's key bytes lie anywhere: fetched a few operations ahead.
        if let Some(ahead) = sorted.get(k + KEY_PREFETCH_AHEAD) {
            tusk_storage::region::prefetch_lines(&ahead.key()[..ahead.key().len().min(64)]);
        }
        match op {
            Op::Upsert { key, value } => {
                let common = last.iter().zip(key).take_while(|(a, b)| a == b).count();
                while path.last().is_some_and(|&(_, depth)| depth > common) {
                    path.pop();
                }
                match insert::insert_from(heap, meta, key, value, &mut path)? {
                    Some(_) => out.updated += 1,
                    None => out.inserted += 1,
                }
                last = key;
            }
            Op::Remove { key } => {
                path.clear();
                match remove::remove(heap, meta, key)? {
                    Some(_) => out.removed += 1,
                    None => out.absent += 1,
                }
            }
        }
    }
    Ok(out)
}

/// The first 8 bytes of `key` as a big-endian word, zero-padded: ordered as the keys are
/// (where two words are equal, the keys may still differ). The leaf's stored key word,
/// byte-swapped.
fn prefix_word(key: &[u8]) -> u64 {
    leaf::key_word(key, 0).swap_bytes()
}
