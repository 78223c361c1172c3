//! A transaction's buffered writes, kept by 64-byte line (the stripe's unit): each entry holds
//! a line's eight words and one byte mask per word. An index insert writes a few runs of
//! adjacent words (a leaf's shifted keys and values, its header, a counter), so it touches a
//! handful of lines however many words it writes: the entries are found by a linear scan
//! while there are at most `INDEX_FROM` of them (behind a one-word filter that answers most
//! misses, and a hint at the line written last), through a hash index above. Commit locks one
//! stripe per entry, writes back and stamps a page per line, and logs runs of whole words
//! straight from the entries.

use rustc_hash::FxHashMap;
use tusk_storage::heap::mask_bits;

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
    1u64 << ((line / LINE_BYTES).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58)
}

#[derive(Default)]
pub struct WriteSet {
    lines: Vec<LineWrite>,
    /// Line offset → entry, kept once there are more than [`INDEX_FROM`] entries.
    index: FxHashMap<u64, u32>,
    /// The union of [`filter_bit`] over the entries: a clear bit means no entry (small sets).
    filter: u64,
    /// The entry written last (a hint: runs of writes stay in one line).
    last: usize,
    /// Whether the entries ascend by line in the order they were made.
    ascending: bool,
    /// The entries in line order, by position in `lines` (made by [`WriteSet::sort`]; the
    /// entries themselves never move, so the index stays valid).
    order: Vec<u32>,
}

/// The entries of a write set in ascending line order.
#[derive(Clone, Copy)]
pub struct Sorted<'a> {
    lines: &'a [LineWrite],
    order: &'a [u32],
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
        &self.lines[self.order[k] as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a LineWrite> + 'a {
        let lines = self.lines;
        self.order.iter().map(move |&i| &lines[i as usize])
    }
}

impl WriteSet {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Number of lines written.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn capacity(&self) -> usize {
        self.lines.capacity()
    }

    pub fn clear(&mut self) {
        self.lines.clear();
        self.index.clear();
        self.filter = 0;
        self.last = 0;
        self.order.clear();
    }

    #[inline]
    fn find(&self, line: u64) -> Option<usize> {
        if let Some(e) = self.lines.get(self.last) {
            if e.line == line {
                return Some(self.last);
            }
        }
        if self.lines.len() <= INDEX_FROM {
            if self.filter & filter_bit(line) == 0 {
                return None;
            }
            self.lines.iter().position(|e| e.line == line)
        } else {
            self.index.get(&line).map(|&i| i as usize)
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
        &mut self.lines[i]
    }

    fn push(&mut self, line: u64) -> usize {
        let n = self.lines.len();
        if n == 0 {
            self.ascending = true;
        } else if self.lines[n - 1].line > line {
            self.ascending = false;
        }
        self.lines.push(LineWrite { line, masks: 0, words: [0; LINE_WORDS] });
        self.filter |= filter_bit(line);
        if n + 1 == INDEX_FROM + 1 {
            self.index.extend(self.lines.iter().enumerate().map(|(i, e)| (e.line, i as u32)));
        } else if n + 1 > INDEX_FROM + 1 {
            self.index.insert(line, n as u32);
        }
        n
    }

    /// The written bytes of the word at `offset` (8-aligned) and their mask, if any.
    #[inline]
    pub fn get(&self, offset: u64) -> Option<(u64, u8)> {
        let e = &self.lines[self.find(offset & !(LINE_BYTES - 1))?];
        let w = ((offset % LINE_BYTES) / 8) as usize;
        let mask = e.mask(w);
        (mask != 0).then_some((e.words[w], mask))
    }

    /// The entry of the line at `line` (a multiple of [`LINE_BYTES`]), if it has one.
    #[inline]
    pub fn line(&self, line: u64) -> Option<&LineWrite> {
        debug_assert!(line.is_multiple_of(LINE_BYTES));
        self.find(line).map(|i| &self.lines[i])
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
        self.order.clear();
        self.order.extend(0..self.lines.len() as u32);
        if !self.ascending {
            let lines = &self.lines;
            self.order.sort_unstable_by_key(|&i| lines[i as usize].line);
        }
    }

    /// The entries in line order as of the last [`WriteSet::sort`] (writes to lines already
    /// written since do show; lines added since do not).
    pub fn sorted(&self) -> Sorted<'_> {
        Sorted { lines: &self.lines, order: &self.order }
    }

    /// The entries in the order they were made.
    pub fn as_slice(&self) -> &[LineWrite] {
        &self.lines
    }

    pub fn iter(&self) -> impl Iterator<Item = &LineWrite> {
        self.lines.iter()
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
