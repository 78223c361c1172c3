//! Bulk load of an empty tree from ascending keys, bottom-up as in the thesis' Bulk Insert:
//! the leaves are written left to right at a chosen fill, then each level above is built the
//! same way from the (first key, node) pairs of the level below, until a level has one node,
//! the root. Every level gets its high keys and right links as it is written, so the result is
//! exactly a tree that `insert` could have produced, and `check()` holds for it.
//!
//! The input is streamed: a level is written through a `LevelWriter` that holds at most two
//! nodes' worth of entries (it must, to keep the last node from underflowing: the last two
//! nodes are evened out); only the (first key, node) pairs of one level are kept whole.
//!
//! Unsorted input is found only once part of the leaf level is written. The loader then frees
//! what it built and leaves the tree empty and valid before returning
//! [`IndexError::NotSorted`], so a caller that commits anyway commits an empty tree, not a
//! half-built one. (A transaction error, a conflict, leaves the transaction doomed as always:
//! the caller retries or abandons it.)

use super::layout::{self, Fences, CAPACITY, MIN_FILL};
use super::meta::{self, KEY_DELTA, ROOT_OFF};
use super::slab;
use crate::heap::HeapWrite;
use crate::IndexError;
use tusk_txn::TxnError;

/// Entries per node for a requested fill fraction: `fill * CAPACITY` rounded, clamped to
/// `MIN_FILL..=CAPACITY` (a NaN counts as the minimum).
pub fn entries_per_node(fill: f64) -> usize {
    let n = (fill * CAPACITY as f64).round();
    if n.is_nan() {
        MIN_FILL
    } else {
        (n.max(0.0).min(CAPACITY as f64) as usize).clamp(MIN_FILL, CAPACITY)
    }
}

/// Loads `pairs` (strictly ascending keys) into the empty tree described at `meta`; returns
/// the number of keys loaded.
pub fn bulk_load<H: HeapWrite>(heap: &mut H, meta: u64, pairs: impl IntoIterator<Item = (u64, u64)>, fill: f64) -> Result<u64, IndexError> {
    if meta::total(heap, meta, KEY_DELTA)? != 0 {
        return Err(IndexError::NotEmpty);
    }
    let root = heap.load(meta + ROOT_OFF)?;
    let rh = layout::read_header(heap, root)?;
    // No keys means no non-root leaf (it would hold MIN_FILL), so the root is a lone leaf.
    assert!(rh.is_leaf() && rh.count == 0 && rh.right == 0, "empty tree whose root {root} is not an empty leaf");
    let per = entries_per_node(fill);

    // The leaf level, streamed; the existing empty root becomes the first leaf.
    let mut leaves = LevelWriter::new(0, per, root, meta);
    let mut loaded = 0u64;
    let mut last: Option<u64> = None;
    for (k, v) in pairs {
        if last.is_some_and(|p| p >= k) {
            leaves.abandon(heap, meta)?;
            return Err(IndexError::NotSorted { at_index: loaded });
        }
        last = Some(k);
        leaves.push(heap, meta, k, v)?;
        loaded += 1;
    }
    let mut level = leaves.finish(heap, meta)?;

    // Upper levels until one node remains. The leftmost node of a level has low bound 0.
    let mut height = 0u32;
    while level.len() > 1 {
        height += 1;
        level[0].0 = 0;
        let first = slab::alloc_node(heap, meta)?;
        let mut writer = LevelWriter::new(height, per, first, meta);
        for &(k, child) in &level {
            writer.push(heap, meta, k, child)?;
        }
        level = writer.finish(heap, meta)?;
    }
    heap.store(meta + ROOT_OFF, level[0].1)?;
    meta::add_keys(heap, meta, loaded as i64)?;
    Ok(loaded)
}

/// Writes one level left to right, `per` entries a node, evening out the last two nodes.
///
/// Entries are buffered until 2·`per` are pending and one more arrives: then the first `per`
/// are surely not part of the last two nodes' rebalance and are written out, into `cur`, with
/// the next node allocated right away so `cur` gets its right link and high key (the first
/// pending key) at once.
struct LevelWriter {
    level: u32,
    per: usize,
    /// The node the next written entries go to (allocated, empty).
    cur: u64,
    /// `cur`'s fences: its low key (the high key of the node written before it, 0 for the
    /// level's first) and the tree's descriptor.
    fences: Fences,
    pending: Vec<(u64, u64)>,
    /// (first key, node) of every node written so far.
    done: Vec<(u64, u64)>,
}

impl LevelWriter {
    fn new(level: u32, per: usize, first: u64, meta: u64) -> LevelWriter {
        LevelWriter { level, per, cur: first, fences: Fences { low_key: 0, owner: meta }, pending: Vec::with_capacity(2 * per + 1), done: Vec::new() }
    }

    fn push<H: HeapWrite>(&mut self, heap: &mut H, meta: u64, k: u64, v: u64) -> Result<(), TxnError> {
        if self.pending.len() == 2 * self.per {
            let next = slab::alloc_node(heap, meta)?;
            self.write(heap, self.per, Some(next))?;
            self.cur = next;
        }
        self.pending.push((k, v));
        Ok(())
    }

    /// Writes the first `n` pending entries into `cur`, linked to `next` (whose first key is
    /// the first entry left pending) or the rightmost node when `next` is None.
    fn write<H: HeapWrite>(&mut self, heap: &mut H, n: usize, next: Option<u64>) -> Result<(), TxnError> {
        debug_assert!(n <= CAPACITY && n <= self.pending.len());
        let node = self.cur;
        // The keys, the values and the header each as one run of words (a transaction
        // running in place takes each line once, not each word).
        let (mut keys, mut values) = ([0u64; CAPACITY], [0u64; CAPACITY]);
        for (i, &(k, v)) in self.pending[..n].iter().enumerate() {
            (keys[i], values[i]) = (k, v);
        }
        heap.store_words(layout::key_off(node, 0), &keys[..n])?;
        heap.store_words(layout::value_off(node, 0), &values[..n])?;
        match next {
            Some(right) => layout::write_header(heap, node, self.level, n, Some(self.pending[n].0), right, self.fences)?,
            None => layout::write_header(heap, node, self.level, n, None, 0, self.fences)?,
        }
        if next.is_some() {
            self.fences.low_key = self.pending[n].0;
        }
        self.done.push((self.pending[0].0, node));
        self.pending.drain(..n);
        Ok(())
    }

    /// Writes what is pending (one node, or two evened out) and returns the level's
    /// (first key, node) pairs, left to right. An empty leaf level is its one empty node.
    fn finish<H: HeapWrite>(mut self, heap: &mut H, meta: u64) -> Result<Vec<(u64, u64)>, TxnError> {
        let n = self.pending.len();
        if n == 0 {
            debug_assert!(self.done.is_empty() && self.level == 0);
            return Ok(vec![(0, self.cur)]);
        }
        // After a write, more than `per` entries stay pending, so n ≥ MIN_FILL unless this is
        // the level's only node (the root, which may hold fewer).
        debug_assert!(self.done.is_empty() || n > self.per);
        let left = if n <= self.per {
            n
        } else if n - self.per >= MIN_FILL {
            self.per
        } else if n <= CAPACITY {
            n
        } else {
            n.div_ceil(2)
        };
        if left < n {
            let next = slab::alloc_node(heap, meta)?;
            self.write(heap, left, Some(next))?;
            self.cur = next;
        }
        let rest = self.pending.len();
        self.write(heap, rest, None)?;
        Ok(self.done)
    }

    /// Frees the nodes written so far and `cur`, except the first node (the tree's root leaf),
    /// which is reset to an empty rightmost leaf.
    fn abandon<H: HeapWrite>(self, heap: &mut H, meta: u64) -> Result<(), TxnError> {
        let first = self.done.first().map_or(self.cur, |&(_, n)| n);
        for node in self.done.iter().map(|&(_, n)| n).chain(std::iter::once(self.cur)) {
            if node != first {
                slab::free_node(heap, meta, node)?;
            }
        }
        layout::write_level_count(heap, first, 0, 0)?;
        layout::write_bound(heap, first, None, 0)
    }
}
