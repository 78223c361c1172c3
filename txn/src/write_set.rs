//! A transaction's buffered writes: 8-byte words with a byte mask, found by a linear scan
//! while small and through a hash index once larger.

use rustc_hash::FxHashMap;
use tusk_storage::heap::mask_bits;

/// Above this many words the write set keeps a hash index.
const INDEX_FROM: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct WordWrite {
    /// Heap offset of the word (8-aligned).
    pub offset: u64,
    pub value: u64,
    /// Which bytes of `value` are written (bit i = byte i).
    pub mask: u8,
}

#[derive(Default)]
pub struct WriteSet {
    words: Vec<WordWrite>,
    index: FxHashMap<u64, u32>,
}

impl WriteSet {
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn capacity(&self) -> usize {
        self.words.capacity()
    }

    pub fn clear(&mut self) {
        self.words.clear();
        self.index.clear();
    }

    fn position(&self, offset: u64) -> Option<usize> {
        if self.words.len() <= INDEX_FROM {
            self.words.iter().rposition(|w| w.offset == offset)
        } else {
            self.index.get(&offset).map(|&i| i as usize)
        }
    }

    pub fn get(&self, offset: u64) -> Option<WordWrite> {
        self.position(offset).map(|i| self.words[i])
    }

    /// Records a write of the bytes of `value` selected by `mask` to the word at `offset`.
    pub fn put(&mut self, offset: u64, value: u64, mask: u8) {
        debug_assert!(offset % 8 == 0);
        if let Some(i) = self.position(offset) {
            let w = &mut self.words[i];
            let bits = mask_bits(mask);
            w.value = (w.value & !bits) | (value & bits);
            w.mask |= mask;
            return;
        }
        self.words.push(WordWrite { offset, value, mask });
        let n = self.words.len();
        if n == INDEX_FROM + 1 {
            self.index.extend(self.words.iter().enumerate().map(|(i, w)| (w.offset, i as u32)));
        } else if n > INDEX_FROM + 1 {
            self.index.insert(offset, (n - 1) as u32);
        }
    }

    /// The writes sorted by offset (for lock ordering and run-length logging).
    pub fn sorted(&mut self) -> &[WordWrite] {
        self.words.sort_unstable_by_key(|w| w.offset);
        if !self.index.is_empty() {
            self.index.clear();
            self.index.extend(self.words.iter().enumerate().map(|(i, w)| (w.offset, i as u32)));
        }
        &self.words
    }

    /// The writes in their current order (sorted after [`WriteSet::sorted`]).
    pub fn as_slice(&self) -> &[WordWrite] {
        &self.words
    }

    pub fn iter(&self) -> impl Iterator<Item = &WordWrite> {
        self.words.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_masks_and_finds_words_past_the_index_threshold() {
        let mut ws = WriteSet::default();
        for i in 0..100u64 {
            ws.put(i * 8, i, 0xFF);
        }
        ws.put(80, 0xAA00, 0b10);
        let w = ws.get(80).unwrap();
        assert_eq!(w.value, 0xAA00 | 10 & !0xFF00);
        assert_eq!(w.mask, 0xFF);
        assert_eq!(ws.len(), 100);
        assert!(ws.get(800).is_none());
        let sorted: Vec<u64> = ws.sorted().iter().map(|w| w.offset).collect();
        assert!(sorted.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(ws.get(792).unwrap().value, 99, "index rebuilt after sorting");
    }

    #[test]
    fn partial_writes_accumulate() {
        let mut ws = WriteSet::default();
        ws.put(0, 0x11, 0b01);
        ws.put(0, 0x2200, 0b10);
        let w = ws.get(0).unwrap();
        assert_eq!((w.value, w.mask), (0x2211, 0b11));
    }
}
