//! Batched updates: the CPU-side batch update that the GPU mirror consumes (the mirror
//! is synced by copying the pages dirtied since its last sync, docs/ARCHITECTURE.md, GPU
//! mirror, so a batch should touch few nodes and dirty few pages). A batch is sorted by key, then applied leaf by
//! leaf with one descent per touched leaf instead of one per operation, and none where the next
//! touched leaf is the right sibling of the last (a dense batch walks the leaf level).
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
use super::path::Path;
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

/// One leaf's entries while a batch changes them: its keys and values, as read and as changed.
struct LeafEntries {
    keys: [u64; CAPACITY],
    values: [u64; CAPACITY],
    count: usize,
    original_keys: [u64; CAPACITY],
    original_values: [u64; CAPACITY],
    original_count: usize,
}

impl LeafEntries {
    fn new() -> LeafEntries {
        LeafEntries { keys: [0; CAPACITY], values: [0; CAPACITY], count: 0, original_keys: [0; CAPACITY], original_values: [0; CAPACITY], original_count: 0 }
    }

    /// Reads the `count` entries of `leaf`: its keys and its values, one run each.
    fn read<H: HeapWrite>(&mut self, heap: &mut H, leaf: u64, count: usize) -> Result<(), TxnError> {
        heap.load_words(layout::key_off(leaf, 0), &mut self.keys[..count])?;
        heap.load_words(layout::value_off(leaf, 0), &mut self.values[..count])?;
        self.original_keys[..count].copy_from_slice(&self.keys[..count]);
        self.original_values[..count].copy_from_slice(&self.values[..count]);
        (self.count, self.original_count) = (count, count);
        Ok(())
    }

    fn insert(&mut self, i: usize, key: u64, value: u64) {
        debug_assert!(self.count < CAPACITY);
        self.keys.copy_within(i..self.count, i + 1);
        self.values.copy_within(i..self.count, i + 1);
        (self.keys[i], self.values[i]) = (key, value);
        self.count += 1;
    }

    fn remove(&mut self, i: usize) {
        self.keys.copy_within(i + 1..self.count, i);
        self.values.copy_within(i + 1..self.count, i);
        self.count -= 1;
    }

    /// Writes the entries back into `leaf`: only the slots that changed (each run of them as
    /// one write), and the count if it did, so a batch dirties and logs no more of the node
    /// than it must.
    fn write_back<H: HeapWrite>(&self, heap: &mut H, leaf: u64, level: u32) -> Result<(), TxnError> {
        let n = self.count;
        write_changed_runs(heap, layout::key_off(leaf, 0), &self.keys[..n], &self.original_keys[..self.original_count])?;
        write_changed_runs(heap, layout::value_off(leaf, 0), &self.values[..n], &self.original_values[..self.original_count])?;
        if n != self.original_count {
            layout::write_level_count(heap, leaf, level, n)?;
        }
        Ok(())
    }
}

/// Stores the words of `new` that differ from `old` (or lie beyond it) at `base`, each run of
/// neighbouring ones in one `store_words`.
fn write_changed_runs<H: HeapWrite>(heap: &mut H, base: u64, new: &[u64], old: &[u64]) -> Result<(), TxnError> {
    let changed = |i: usize| old.get(i) != Some(&new[i]);
    let mut i = 0;
    while i < new.len() {
        if !changed(i) {
            i += 1;
            continue;
        }
        let mut end = i + 1;
        while end < new.len() && changed(end) {
            end += 1;
        }
        heap.store_words(base + 8 * i as u64, &new[i..end])?;
        i = end;
    }
    Ok(())
}

/// Operations per key-range bucket of a large batch: a batch is sorted and applied one bucket
/// at a time, each freed once applied, so that its sorted copy (16 bytes an operation: a
/// gigabyte for 64 M) shrinks as the tree grows instead of lasting until the end.
pub const OPS_PER_BUCKET: usize = 1 << 18;
/// The most buckets a batch is cut into.
const MAX_BUCKETS: usize = 1024;

/// Cuts `ops` into buckets of ascending, disjoint key ranges (the range from the least key
/// to the greatest in equal parts), each holding (key, position) pairs, with the exact
/// capacity it needs.
fn buckets(ops: &[Op], ops_per_bucket: usize) -> Vec<Vec<(u64, u64)>> {
    let wanted = (ops.len() / ops_per_bucket.max(1)).clamp(1, MAX_BUCKETS).next_power_of_two();
    let (min, max) = ops.iter().fold((u64::MAX, 0), |(lo, hi), op| (lo.min(op.key()), hi.max(op.key())));
    if wanted == 1 || min >= max {
        return vec![ops.iter().enumerate().map(|(i, op)| (op.key(), i as u64)).collect()];
    }
    let range_bits = 64 - (max - min).leading_zeros();
    let shift = range_bits.saturating_sub(wanted.trailing_zeros());
    let bucket = |key: u64| ((key - min) >> shift) as usize;
    let mut counts = vec![0usize; bucket(max) + 1];
    for op in ops {
        counts[bucket(op.key())] += 1;
    }
    let mut out: Vec<Vec<(u64, u64)>> = counts.iter().map(|&n| Vec::with_capacity(n)).collect();
    for (i, op) in ops.iter().enumerate() {
        out[bucket(op.key())].push((op.key(), i as u64));
    }
    out
}

/// Applies `ops` to the tree described at `meta` (see the module doc), sorted and applied
/// in buckets of about `ops_per_bucket` operations ([`OPS_PER_BUCKET`] but in tests).
pub fn apply_batch<H: HeapWrite>(heap: &mut H, meta: u64, ops: &[Op], ops_per_bucket: usize) -> Result<BatchOutcome, TxnError> {
    let mut pass = BatchPass { out: BatchOutcome::default(), key_delta: 0, entries: LeafEntries::new(), path: Path::new(), path_root: 0 };
    for bucket in buckets(ops, ops_per_bucket) {
        pass.apply_sorted(heap, meta, ops, bucket)?;
    }
    if pass.key_delta != 0 {
        // The single-key paths keep the count themselves; add what the in-leaf passes did.
        meta::add_keys(heap, meta, pass.key_delta)?;
    }
    Ok(pass.out)
}

/// What a batch carries from one bucket to the next.
struct BatchPass {
    out: BatchOutcome,
    key_delta: i64,
    entries: LeafEntries,
    /// The internal nodes of the last descent, root first, and the root it started from: a
    /// split of a leaf to the right of that descent's leaf inserts its separator along it
    /// (moving right on each level as readers do), unless the root has changed since.
    path: Path,
    path_root: u64,
}

impl BatchPass {
    /// Applies the operations of one bucket, (key, position in `ops`) pairs.
    fn apply_sorted<H: HeapWrite>(&mut self, heap: &mut H, meta: u64, ops: &[Op], mut order: Vec<(u64, u64)>) -> Result<(), TxnError> {
        // Sorting the pairs keeps operations on one key in batch order, and sorts without
        // chasing each key through `ops`.
        order.sort_unstable();
        // Then each pair's position becomes its operation's value (removes marked in a bitmap),
        // in place: the pass below reads the operations in key order without a load from `ops`
        // that waits on a miss per operation, and the gather's random loads, independent of each
        // other, overlap.
        let mut removes = vec![0u64; order.len().div_ceil(64)];
        for (k, pair) in order.iter_mut().enumerate() {
            match ops[pair.1 as usize] {
                Op::Upsert { value, .. } => pair.1 = value,
                Op::Remove { .. } => removes[k / 64] |= 1 << (k % 64),
            }
        }
        let op_at = |k: usize| {
            let (key, value) = order[k];
            if removes[k / 64] & (1 << (k % 64)) != 0 {
                Op::Remove { key }
            } else {
                Op::Upsert { key, value }
            }
        };
        let BatchPass { out, key_delta, entries: e, path, path_root } = self;
        let mut pos = 0;
        // The leaf the next operation belongs to, when found without a descent.
        let mut next_leaf = None;
        while pos < order.len() {
            let root = heap.load(meta + ROOT_OFF)?;
            let (leaf, h) = match next_leaf.take() {
                Some(found) => found,
                None => {
                    path.clear();
                    *path_root = root;
                    search::descend_tree(heap, meta, order[pos].0, Some(path))?
                }
            };
            if h.right != 0 {
                heap.prefetch(h.right, layout::NODE_SIZE);
            }
            let min = if leaf == root { 0 } else { MIN_FILL };
            e.read(heap, leaf, h.count)?;
            let mut fallback = None;
            while pos < order.len() {
                let op = op_at(pos);
                if h.must_move_right(op.key()) {
                    break;
                }
                let at = e.keys[..e.count].binary_search(&op.key());
                match (op, at) {
                    (Op::Upsert { value, .. }, Ok(i)) => {
                        e.values[i] = value;
                        out.updated += 1;
                    }
                    (Op::Upsert { key, value }, Err(i)) if e.count < CAPACITY => {
                        e.insert(i, key, value);
                        out.inserted += 1;
                        *key_delta += 1;
                    }
                    (Op::Remove { .. }, Ok(i)) if e.count > min => {
                        e.remove(i);
                        out.removed += 1;
                        *key_delta -= 1;
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
            e.write_back(heap, leaf, h.level)?;
            match fallback {
                Some(Op::Upsert { key, value }) if heap.load(meta + ROOT_OFF)? == *path_root => {
                    // The leaf is full (the entries written back): split it here, without the
                    // descent `insert` would make, then go on in whichever half holds the next key.
                    let i = e.keys[..e.count].partition_point(|&k| k < key);
                    let full = layout::Header { count: e.count, ..h };
                    insert::insert_entry(heap, meta, leaf, full, i, key, value, path, insert::Posting::Deferrable)?;
                    *key_delta += 1;
                    out.inserted += 1;
                    if pos < order.len() {
                        let next = order[pos].0;
                        let left = layout::read_header(heap, leaf)?;
                        if !left.must_move_right(next) {
                            next_leaf = Some((leaf, left));
                        } else {
                            let right = layout::read_header(heap, left.right)?;
                            if !right.must_move_right(next) {
                                next_leaf = Some((left.right, right));
                            }
                        }
                    }
                }
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
                None if pos < order.len() => {
                    // The next key lies at or beyond this leaf's high key: in a dense batch, in the
                    // right sibling (one header read instead of a descent from the root).
                    let right = layout::read_header(heap, h.right)?;
                    if !right.must_move_right(order[pos].0) {
                        next_leaf = Some((h.right, right));
                    }
                }
                None => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buckets cover every operation once, hold ascending disjoint key ranges (so equal keys
    /// share one), number at most the power of two asked for, and, for keys spread evenly,
    /// hold about equal shares; a single key or a tiny batch makes one bucket.
    #[test]
    fn buckets_split_the_key_range_in_order() {
        let spread = |n: u64, f: fn(u64) -> u64| (0..n).map(|i| Op::Upsert { key: f(i), value: i }).collect::<Vec<_>>();
        // (ops, whether the keys spread evenly over their range)
        let cases: [(Vec<Op>, bool); 5] = [
            (spread(10_000, |i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), true),
            (spread(10_000, |i| i / 3), true),
            (spread(10_000, |_| 5), false),
            (spread(10_000, |i| if i % 2 == 0 { 0 } else { u64::MAX }), false),
            (spread(100, |i| i), true),
        ];
        for (k, (ops, even)) in cases.iter().enumerate() {
            let got = buckets(ops, 150);
            let wanted = (ops.len() / 150).clamp(1, MAX_BUCKETS).next_power_of_two();
            assert!(!got.is_empty() && got.len() <= wanted, "case {k}: {} buckets for {wanted}", got.len());
            if *even {
                let largest = got.iter().map(Vec::len).max().unwrap();
                assert!(largest <= 2 * ops.len().div_ceil(wanted), "case {k}: a bucket of {largest}");
            }
            let mut seen = vec![false; ops.len()];
            let mut last_key = None;
            for bucket in &got {
                assert_eq!(bucket.capacity(), bucket.len(), "case {k}: exact capacity");
                let lo = bucket.iter().map(|p| p.0).min();
                if let (Some(prev), Some(lo)) = (last_key, lo) {
                    assert!(lo > prev, "case {k}: buckets overlap");
                }
                last_key = bucket.iter().map(|p| p.0).max().or(last_key);
                for &(key, i) in bucket {
                    assert_eq!(ops[i as usize].key(), key);
                    assert!(!std::mem::replace(&mut seen[i as usize], true), "case {k}: op {i} twice");
                }
            }
            assert!(seen.iter().all(|&s| s), "case {k}: every op in a bucket");
        }
        assert_eq!(buckets(&spread(10_000, |_| 5), 150).len(), 1, "one key: one bucket");
    }
}
