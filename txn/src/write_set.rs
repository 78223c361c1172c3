//! A transaction's buffered writes, kept by 64-byte line (the stripe's unit): each entry holds
//! a line's eight words and one byte mask per word. An index insert writes a few runs of
//! adjacent words (a leaf's shifted keys and values, its header, a counter), so it touches a
//! handful of lines however many words it writes: the entries are found by a linear scan
//! while there are at most `INDEX_FROM` of them (behind a one-word filter that answers most
//! misses, and a hint at the line written last), through a compact index above. Commit locks
//! one stripe per entry, writes back and stamps a page per line, and logs runs of whole words
//! straight from the entries.
//!
//! Memory is bounded by the bytes held: entries live in fixed chunks of [`CHUNK`] (no doubling
//! slack, and an entry never moves), and the index holds 4-byte positions, not lines. A set of
//! `n` lines takes at most 1.5 times its `64 n` bytes from [`BOUNDED_FROM`] lines on
//! ([`WriteSet::memory_bytes`]; `tests::memory_stays_within_half_again_the_bytes_held`);
//! commit's line order adds 8 bytes a line while it commits.

use tusk_storage::heap::mask_bits;
use hashbrown::HashTable;
use tusk_storage::line_record::MAX_LINES;

/// A line, the unit of an entry (equal to the stripe's `STRIPE_BYTES`), as the log's line
/// records encode it.
pub use tusk_storage::line_record::{LINE_BYTES, LINE_WORDS};

/// Above this many lines the write set keeps a hash index.
const INDEX_FROM: usize = 16;

/// The buffered writes to one line.
#[derive(Clone, Copy, Debug)]
pub struct LineWrite {
    /// Heap offset of the line (a multiple of [`LINE_BYTES`]).
    pub line: u64,
    /// Byte `w` is the mask of word `w` (bit i = byte i of the word; 0 = word not written).
    pub masks: u64,
    /// The written bytes of each word (unwritten bytes are zero).
    pub words: [u64; LINE_WORDS],
}

impl LineWrite {
    /// The mask of word `w` (0 if not written).
    #[inline]
    pub fn mask(&self, w: usize) -> u8 {
        (self.masks >> (8 * w)) as u8
    }

    /// Whether word `w` is written whole.
    #[inline]
    pub fn is_full(&self, w: usize) -> bool {
        self.mask(w) == 0xFF
    }

    /// Bitmaps of the words written whole and of those written at all (bit w = word w).
    #[inline]
    pub fn word_bits(&self) -> (u8, u8) {
        tusk_storage::line_record::word_bits(self.masks)
    }

    /// The written words: (heap offset, value, mask), ascending.
    pub fn written(&self) -> impl Iterator<Item = (u64, u64, u8)> + '_ {
        (0..LINE_WORDS).filter(|&w| self.mask(w) != 0).map(|w| (self.line + 8 * w as u64, self.words[w], self.mask(w)))
    }

    /// Merges the bytes of `value` selected by `mask` into word `w`.
    #[inline]
    fn merge(&mut self, w: usize, value: u64, mask: u8) {
        if mask == 0xFF {
            self.words[w] = value;
        } else {
            let bits = mask_bits(mask);
            self.words[w] = (self.words[w] & !bits) | (value & bits);
        }
        self.masks |= u64::from(mask) << (8 * w);
    }
}

/// One bit of the small-set filter per line (a multiplicative hash, so that the adjacent
/// lines of a node spread over the word).
#[inline]
fn filter_bit(line: u64) -> u64 {
    1u64 << (line_hash(line) >> 58)
}

#[inline]
fn line_hash(line: u64) -> u64 {
    (line / LINE_BYTES).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Entries per chunk: the small set's scan stays in the first one.
pub const CHUNK: usize = INDEX_FROM;

/// From this many lines on, [`WriteSet::memory_bytes`] is at most 1.5 times the bytes held
/// (below it, one chunk or the index's first table outweighs the few lines held).
pub const BOUNDED_FROM: usize = 300;

/// The entries in the order they were made, in chunks that never move.
#[derive(Default)]
struct Entries {
    /// Boxed, so that a chunk never moves and the list's own doubling costs a pointer a chunk.
    #[allow(clippy::vec_box)]
    chunks: Vec<Box<[LineWrite; CHUNK]>>,
    len: usize,
}

const EMPTY_LINE: LineWrite = LineWrite { line: 0, masks: 0, words: [0; LINE_WORDS] };

impl Entries {
    #[inline]
    fn get(&self, i: usize) -> &LineWrite {
        debug_assert!(i < self.len);
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    #[inline]
    fn get_mut(&mut self, i: usize) -> &mut LineWrite {
        debug_assert!(i < self.len);
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    /// Appends an empty entry for `line`; its position.
    #[inline]
    fn push(&mut self, line: u64) -> usize {
        let i = self.len;
        if i / CHUNK == self.chunks.len() {
            self.add_chunk();
        }
        self.chunks[i / CHUNK][i % CHUNK] = LineWrite { line, ..EMPTY_LINE };
        self.len += 1;
        i
    }

    #[cold]
    fn add_chunk(&mut self) {
        self.chunks.push(Box::new([EMPTY_LINE; CHUNK]));
    }

    fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    fn iter_from(&self, from: usize) -> impl Iterator<Item = &LineWrite> {
        (from..self.len).map(|i| self.get(i))
    }
}

/// Line → entry position: a SwissTable of 4-byte positions (a line is compared in its entry,
/// which the caller reads next anyway). Its buckets double, so it takes 5 bytes a bucket at a
/// load between 7/16 and 7/8: at most 11.5 bytes a line.
#[derive(Default)]
struct LineIndex {
    table: HashTable<u32>,
}

/// The index's hash: the multiplicative hash with its high bits folded down, since the table
/// takes a bucket from the low bits (those of a product depend on the factors' low bits only).
#[inline]
fn index_hash(line: u64) -> u64 {
    let h = line_hash(line);
    h ^ (h >> 29)
}

impl LineIndex {
    #[inline]
    fn find(&self, line: u64, entries: &Entries) -> Option<usize> {
        self.table.find(index_hash(line), |&i| entries.get(i as usize).line == line).map(|&i| i as usize)
    }

    /// Adds entry `i` (its line not in the index yet).
    #[inline(never)]
    fn insert(&mut self, i: usize, entries: &Entries) {
        let position = u32::try_from(i).expect("a write set holds fewer than 2^32 lines");
        self.table.insert_unique(index_hash(entries.get(i).line), position, |&j| index_hash(entries.get(j as usize).line));
    }

    fn memory_bytes(&self) -> usize {
        self.table.allocation_size()
    }
}

/// Low bits of an [`WriteSet::order`] item: the entry's position (below [`MAX_LINES`]).
const POSITION_BITS: u32 = 24;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
const _: () = assert!(MAX_LINES < 1 << POSITION_BITS);

/// No line (not a multiple of [`LINE_BYTES`]).
const NO_LINE: u64 = u64::MAX;

pub struct WriteSet {
    entries: Entries,
    /// Kept once there are more than [`INDEX_FROM`] entries.
    index: LineIndex,
    /// The union of [`filter_bit`] over the entries: a clear bit means no entry (small sets).
    filter: u64,
    /// The entry written last and its line (a hint: runs of writes stay in one line; the line
    /// is kept here so that a miss reads no entry). `NO_LINE` when empty.
    last: usize,
    last_line: u64,
    /// Whether the entries ascend by line in the order they were made.
    ascending: bool,
    /// The entries in line order, as `line number << POSITION_BITS | position` (made by
    /// [`WriteSet::sort`], which sorts these integers themselves; the entries never move, so
    /// the index stays valid). The line number is the line's offset over [`LINE_BYTES`].
    order: Vec<u64>,
}

/// The entries of a write set in ascending line order.
#[derive(Clone, Copy)]
pub struct Sorted<'a> {
    entries: &'a Entries,
    order: &'a [u64],
}

impl<'a> Sorted<'a> {
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The `k`-th entry in line order.
    #[inline]
    pub fn get(&self, k: usize) -> &'a LineWrite {
        self.entries.get((self.order[k] & POSITION_MASK) as usize)
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a LineWrite> + 'a {
        let entries = self.entries;
        self.order.iter().map(move |&k| entries.get((k & POSITION_MASK) as usize))
    }
}

impl Default for WriteSet {
    fn default() -> WriteSet {
        WriteSet {
            entries: Entries::default(),
            index: LineIndex::default(),
            filter: 0,
            last: 0,
            last_line: NO_LINE,
            ascending: true,
            order: Vec::new(),
        }
    }
}

impl WriteSet {
    pub fn is_empty(&self) -> bool {
        self.entries.len == 0
    }

    /// Number of lines written.
    pub fn len(&self) -> usize {
        self.entries.len
    }

    /// Lines the set holds without allocating.
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Bytes allocated for the entries and the index (from capacities).
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.entries.chunks.len() * size_of::<[LineWrite; CHUNK]>()
            + self.entries.chunks.capacity() * size_of::<Box<[LineWrite; CHUNK]>>()
            + self.index.memory_bytes()
    }

    /// Bytes allocated for the line order that [`WriteSet::sort`] makes at commit.
    pub fn order_bytes(&self) -> usize {
        self.order.capacity() * std::mem::size_of::<u64>()
    }

    pub fn clear(&mut self) {
        self.entries.len = 0;
        self.index.table.clear();
        self.filter = 0;
        self.last = 0;
        self.last_line = NO_LINE;
        self.order.clear();
    }

    /// Always inlined, as the set's map was before it was made compact: every load of a
    /// transaction that has written asks it (out of line, 1-key transactions lost 3-5%).
    #[inline(always)]
    fn find(&self, line: u64) -> Option<usize> {
        if self.last_line == line {
            return Some(self.last);
        }
        let n = self.entries.len;
        if n <= INDEX_FROM {
            if self.filter & filter_bit(line) == 0 {
                return None;
            }
            // A small set lies in the first chunk.
            const _: () = assert!(INDEX_FROM <= CHUNK);
            self.entries.chunks[0][..n].iter().position(|e| e.line == line)
        } else {
            self.index.find(line, &self.entries)
        }
    }

    /// The entry for `line`, made (empty) if there is none.
    #[inline]
    fn entry(&mut self, line: u64) -> &mut LineWrite {
        let i = match self.find(line) {
            Some(i) => i,
            None => self.push(line),
        };
        self.last = i;
        self.last_line = line;
        self.entries.get_mut(i)
    }

    fn push(&mut self, line: u64) -> usize {
        let n = self.entries.len;
        if n == 0 {
            self.ascending = true;
        } else if self.entries.get(n - 1).line > line {
            self.ascending = false;
        }
        let i = self.entries.push(line);
        self.filter |= filter_bit(line);
        if n + 1 > INDEX_FROM {
            self.index_new(i);
        }
        i
    }

    /// Indexes the new entry `i`, and the small set's entries with it if it is the first past
    /// [`INDEX_FROM`].
    #[inline(never)]
    fn index_new(&mut self, i: usize) {
        let from = if i == INDEX_FROM { 0 } else { i };
        for j in from..=i {
            self.index.insert(j, &self.entries);
        }
    }

    /// The written bytes of the word at `offset` (8-aligned) and their mask, if any.
    #[inline]
    pub fn get(&self, offset: u64) -> Option<(u64, u8)> {
        let e = self.entries.get(self.find(offset & !(LINE_BYTES - 1))?);
        let w = ((offset % LINE_BYTES) / 8) as usize;
        let mask = e.mask(w);
        (mask != 0).then_some((e.words[w], mask))
    }

    /// The entry of the line at `line` (a multiple of [`LINE_BYTES`]), if it has one.
    #[inline]
    pub fn line(&self, line: u64) -> Option<&LineWrite> {
        debug_assert!(line.is_multiple_of(LINE_BYTES));
        self.find(line).map(|i| self.entries.get(i))
    }

    /// Records a write of the bytes of `value` selected by `mask` (non-zero) to the word at
    /// `offset`. (The caller can tell a new line by [`WriteSet::len`].)
    #[inline]
    pub fn put(&mut self, offset: u64, value: u64, mask: u8) {
        debug_assert!(offset.is_multiple_of(8) && mask != 0);
        let w = ((offset % LINE_BYTES) / 8) as usize;
        self.entry(offset & !(LINE_BYTES - 1)).merge(w, value, mask);
    }

    /// Records writes of whole words: `values[i]` to the word at `offset + 8 i`.
    pub fn put_words(&mut self, offset: u64, values: &[u64]) {
        debug_assert!(offset.is_multiple_of(8));
        let mut i = 0;
        while i < values.len() {
            let at = offset + 8 * i as u64;
            let w = ((at % LINE_BYTES) / 8) as usize;
            let n = (LINE_WORDS - w).min(values.len() - i);
            let e = self.entry(at & !(LINE_BYTES - 1));
            e.words[w..w + n].copy_from_slice(&values[i..i + n]);
            let ones = if n == LINE_WORDS { u64::MAX } else { ((1u64 << (8 * n)) - 1) << (8 * w) };
            e.masks |= ones;
            i += n;
        }
    }

    /// Puts the entries in line order (for lock ordering and run-length logging), as
    /// [`WriteSet::sorted`] then gives them: an order of positions is sorted, not the entries.
    pub fn sort(&mut self) {
        let n = self.entries.len;
        assert!(n <= MAX_LINES, "commit sorts at most a record's lines");
        self.order.clear();
        self.order.reserve_exact(n);
        if self.ascending {
            self.order.extend(0..n as u64);
            return;
        }
        let mut highest = 0;
        self.order.extend(self.entries.iter_from(0).enumerate().map(|(i, e)| {
            highest = highest.max(e.line);
            (e.line / LINE_BYTES) << POSITION_BITS | i as u64
        }));
        if highest / LINE_BYTES < 1 << (64 - POSITION_BITS) {
            self.order.sort_unstable();
        } else {
            // A heap past 2^(58 - POSITION_BITS + 6) bytes: the line number does not fit beside
            // the position, so sort by the entries' lines.
            let entries = &self.entries;
            self.order.sort_unstable_by_key(|&k| entries.get((k & POSITION_MASK) as usize).line);
        }
    }

    /// The entries in line order as of the last [`WriteSet::sort`] (writes to lines already
    /// written since do show; lines added since do not).
    pub fn sorted(&self) -> Sorted<'_> {
        Sorted { entries: &self.entries, order: &self.order }
    }

    /// The entries from the `from`-th on, in the order they were made.
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = &LineWrite> {
        self.entries.iter_from(from)
    }

    /// The entries in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = &LineWrite> {
        self.entries.iter_from(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn merges_masks_and_finds_words_past_the_index_threshold() {
        let mut ws = WriteSet::default();
        for i in 0..100u64 {
            ws.put(i * 64 * 3, i, 0xFF);
        }
        ws.put(10 * 64 * 3, 0xAA00, 0b10);
        assert_eq!(ws.get(10 * 64 * 3), Some((0xAA00 | 10 & !0xFF00, 0xFF)));
        assert_eq!(ws.len(), 100);
        assert!(ws.get(8).is_none());
        assert!(ws.get(64 * 3 * 100).is_none());
        ws.sort();
        let sorted: Vec<u64> = ws.sorted().iter().map(|e| e.line).collect();
        assert!(sorted.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(ws.get(99 * 64 * 3), Some((99, 0xFF)), "index intact after sorting");
    }

    /// Lines spread at random over a large heap, each made once (a permutation's prefix).
    fn random_lines(n: usize, seed: u64) -> Vec<u64> {
        let mut x = seed | 1;
        let mut lines: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lines.swap(i, (x % (i as u64 + 1)) as usize);
        }
        lines.into_iter().map(|l| l * LINE_BYTES).collect()
    }

    #[test]
    fn the_index_finds_every_line_across_its_growths() {
        let lines = random_lines(200_000, 7);
        let mut ws = WriteSet::default();
        for (i, &line) in lines.iter().enumerate() {
            ws.put(line + 8 * (i as u64 % 8), i as u64, 0xFF);
            if i.is_power_of_two() || i % 9_973 == 0 {
                for (j, &seen) in lines[..=i].iter().enumerate().step_by(1 + i / 4096) {
                    assert_eq!(ws.get(seen + 8 * (j as u64 % 8)), Some((j as u64, 0xFF)), "line {j} of {i}");
                }
                assert_eq!(ws.get(lines[i] + LINE_BYTES * 3 * 200_000), None);
            }
        }
        for (j, &line) in lines.iter().enumerate() {
            assert_eq!(ws.get(line + 8 * (j as u64 % 8)), Some((j as u64, 0xFF)));
            assert_eq!(ws.get(line + 8 * ((j as u64 + 1) % 8)), None, "an unwritten word of a written line");
        }
        ws.clear();
        assert!(ws.get(lines[5]).is_none() && ws.is_empty(), "a cleared set holds nothing");
        ws.put(lines[5], 1, 0xFF);
        assert_eq!(ws.get(lines[5]), Some((1, 0xFF)));
    }

    /// Target 5 of the large-transactions work: a write set's memory (its entries and index,
    /// from capacities) is at most 1.5 times the 64 bytes of each line it holds, at every size
    /// from [`BOUNDED_FROM`] lines on. Commit's line order is one u64 a line on top.
    #[test]
    fn memory_stays_within_half_again_the_bytes_held() {
        let n_max = 300_000;
        let lines = random_lines(n_max, 11);
        let mut ws = WriteSet::default();
        let mut worst = (0.0f64, 0);
        let mut last_over = None;
        for (i, &line) in lines.iter().enumerate() {
            ws.put_words(line, &[i as u64; LINE_WORDS]);
            let n = i + 1;
            let held = (n as u64 * LINE_BYTES) as f64;
            let ratio = ws.memory_bytes() as f64 / held;
            if ratio > 1.5 {
                last_over = Some(n);
            }
            if n >= BOUNDED_FROM && ratio > worst.0 {
                worst = (ratio, n);
            }
            if [1, 16, 17, 64, 300, 512, 4096, 4097, 100_000, n_max].contains(&n) {
                ws.sort();
                assert_eq!(ws.order_bytes(), 8 * n, "the line order takes one u64 a line");
                println!("{n:>7} lines: memory / bytes held {ratio:.3}, with commit's line order {:.3}", (ws.memory_bytes() + ws.order_bytes()) as f64 / held);
                ws.order = Vec::new();
            }
        }
        println!("worst from {BOUNDED_FROM} lines on: {:.3} at {} lines; last over 1.5x at {last_over:?} lines", worst.0, worst.1);
        assert!(worst.0 <= 1.5, "memory {:.3}x the bytes held at {} lines", worst.0, worst.1);
    }

    /// Lines past 2^46 bytes (a line number too wide to share a word with its position) sort
    /// by the entries' lines instead, to the same order.
    #[test]
    fn lines_of_a_huge_heap_sort_too() {
        let mut ws = WriteSet::default();
        let lines = random_lines(100, 3);
        for (i, &line) in lines.iter().enumerate() {
            let far = if i % 2 == 0 { 1 << 50 } else { 0 };
            ws.put(far + line, i as u64, 0xFF);
        }
        ws.sort();
        let sorted: Vec<u64> = ws.sorted().iter().map(|e| e.line).collect();
        let mut expected: Vec<u64> = lines.iter().enumerate().map(|(i, &l)| if i % 2 == 0 { (1 << 50) + l } else { l }).collect();
        expected.sort_unstable();
        assert_eq!(sorted, expected);
    }

    #[test]
    fn partial_writes_accumulate() {
        let mut ws = WriteSet::default();
        ws.put(0, 0x11, 0b01);
        ws.put(0, 0x2200, 0b10);
        assert_eq!(ws.get(0), Some((0x2211, 0b11)));
        assert_eq!(ws.get(8), None, "a word of a written line that was not written");
    }

    #[test]
    fn runs_fill_lines() {
        let mut ws = WriteSet::default();
        ws.put_words(40, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(ws.len(), 3, "words 5..8 of line 0, all of line 1, word 0 of line 2");
        ws.sort();
        let lines = ws.sorted();
        assert_eq!(lines.get(0).masks, 0xFFFF_FF00_0000_0000);
        assert_eq!(lines.get(1).masks, u64::MAX);
        assert_eq!(lines.get(2).masks, 0xFF);
        assert_eq!(ws.get(40), Some((1, 0xFF)));
        assert_eq!(ws.get(128), Some((12, 0xFF)));
    }

    proptest! {
        #[test]
        fn word_bits_match_the_masks(masks in any::<u64>(), full in any::<u8>()) {
            // Some masks whole: random bytes rarely are 0xFF.
            let masks = (0..8).fold(masks, |m, w| if full & (1 << w) != 0 { m | 0xFF << (8 * w) } else { m });
            let e = LineWrite { line: 0, masks, words: [0; LINE_WORDS] };
            let expect = (0..LINE_WORDS).fold((0u8, 0u8), |(f, a), w| (f | u8::from(e.mask(w) == 0xFF) << w, a | u8::from(e.mask(w) != 0) << w));
            prop_assert_eq!(e.word_bits(), expect);
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put(u64, u64, u8),
        Words(u64, Vec<u64>),
        Sort,
    }

    fn op(lines: u64) -> impl Strategy<Value = Op> {
        let word = 0..lines * 8;
        prop_oneof![
            4 => (word.clone(), any::<u64>(), 1u8..=255).prop_map(|(w, v, m)| Op::Put(w * 8, v, m)),
            2 => (word, prop::collection::vec(any::<u64>(), 1..20)).prop_map(|(w, vs)| Op::Words(w * 8, vs)),
            1 => Just(Op::Sort),
        ]
    }

    proptest! {
        /// Against a map of words: every read after any sequence of writes and sorts (small
        /// sets scanned, large ones indexed) gives the merged bytes and mask; the sorted
        /// entries ascend, hold exactly the written words and nothing else.
        #[test]
        fn write_set_matches_a_model(ops in prop::collection::vec(op(40), 1..200), spread in 1u64..8) {
            let mut ws = WriteSet::default();
            let mut model: BTreeMap<u64, (u64, u8)> = BTreeMap::new();
            // Spread lines apart (and out of order) so that some runs span non-adjacent lines.
            let at = |off: u64| off * spread;
            let put = |ws: &mut WriteSet, model: &mut BTreeMap<u64, (u64, u8)>, off: u64, v: u64, m: u8| {
                ws.put(off, v, m);
                let e = model.entry(off).or_insert((0, 0));
                let bits = mask_bits(m);
                *e = ((e.0 & !bits) | (v & bits), e.1 | m);
            };
            for op in ops {
                match op {
                    Op::Put(off, v, m) => put(&mut ws, &mut model, at(off), v, m),
                    Op::Words(off, vs) => {
                        if spread == 1 {
                            ws.put_words(off, &vs);
                            for (i, &v) in vs.iter().enumerate() {
                                model.insert(off + 8 * i as u64, (v, 0xFF));
                            }
                        } else {
                            for (i, &v) in vs.iter().enumerate() {
                                put(&mut ws, &mut model, at(off + 8 * i as u64), v, 0xFF);
                            }
                        }
                    }
                    Op::Sort => {
                        ws.sort();
                        let lines: Vec<u64> = ws.sorted().iter().map(|e| e.line).collect();
                        prop_assert!(lines.windows(2).all(|p| p[0] < p[1]));
                        prop_assert_eq!(lines.len(), ws.len());
                    }
                }
                for off in (0..40 * 64 * spread).step_by(8) {
                    prop_assert_eq!(ws.get(off), model.get(&off).copied(), "word {}", off);
                }
            }
            ws.sort();
            let written: Vec<(u64, u64, u8)> = ws.sorted().iter().flat_map(|e| e.written()).collect();
            let expected: Vec<(u64, u64, u8)> = model.iter().map(|(&o, &(v, m))| (o, v, m)).collect();
            prop_assert_eq!(written, expected);
        }
    }
}
