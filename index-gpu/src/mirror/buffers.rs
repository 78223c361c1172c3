//! Batches into the caller's buffers: query and answer memory set up once
//! ([`crate::mirror::Mirror::lookup_buffers`] and its siblings) and reused by every batch, so
//! that a call allocates nothing, packs nothing and decodes nothing. With the CUDA backend the
//! memory is page-locked and has device twins: the keys are copied from it at the bus's rate
//! and the answers straight back into it, overlapped with the kernels (`cuda/into.rs`). With
//! the CPU backend it is ordinary memory the CPU engine answers into.
//!
//! Lookups answer a value and a found bit per key (bit `i % 64` of word `i / 64`); ranges and
//! prefixes a count and a 128-bit sum. Answers belong to the last batch run on the buffers:
//! changing the queries (`set_len`, `*_mut`, `load_*`) drops them, so an answer is never read
//! against the wrong query.

use super::cuda::raw::HostMemory;
use super::cuda::DeviceQueue;

/// What a set of buffers holds queries for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchKind {
    BtreeGet,
    BtreeCountSum,
    /// ART lookups of keys of exactly `key_len` bytes.
    ArtGet { key_len: usize },
}

impl BatchKind {
    /// Input words per query.
    pub(crate) fn in_words(self) -> usize {
        match self {
            BatchKind::BtreeGet => 1,
            BatchKind::BtreeCountSum => 2,
            BatchKind::ArtGet { key_len } => key_len.div_ceil(8),
        }
    }

    /// Answer words per query (lookups: the value; ranges: count, sum low, sum high).
    pub(crate) fn out_words(self) -> usize {
        match self {
            BatchKind::BtreeGet | BatchKind::ArtGet { .. } => 1,
            BatchKind::BtreeCountSum => 3,
        }
    }

    /// Whether the answers carry found bits.
    pub(crate) fn lookups(self) -> bool {
        !matches!(self, BatchKind::BtreeCountSum)
    }
}

/// The memory behind every kind of buffers.
pub(crate) struct BatchMemory {
    pub(crate) kind: BatchKind,
    capacity: usize,
    /// Queries set.
    len: usize,
    /// Queries of the last batch whose answers are in `output` and `found` (0 once the
    /// queries changed since).
    answered: usize,
    pub(crate) input: HostMemory,
    pub(crate) output: HostMemory,
    pub(crate) found: HostMemory,
    /// Each device's twins and streams, for its slice (CUDA backend; empty otherwise).
    pub(crate) device: Vec<DeviceQueue>,
}

impl BatchMemory {
    /// Most queries a batch in this memory holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Words of found bits for `capacity` queries of `kind`.
    pub(crate) fn found_words(kind: BatchKind, capacity: usize) -> usize {
        if kind.lookups() { capacity.div_ceil(64) } else { 0 }
    }

    pub(crate) fn new(kind: BatchKind, capacity: usize, input: HostMemory, output: HostMemory, found: HostMemory, device: Vec<DeviceQueue>) -> BatchMemory {
        assert_eq!(input.words().len(), capacity * kind.in_words(), "input memory for {capacity} queries of {kind:?}");
        assert_eq!(output.words().len(), capacity * kind.out_words(), "answer memory for {capacity} queries of {kind:?}");
        assert_eq!(found.words().len(), Self::found_words(kind, capacity), "found bits for {capacity} queries");
        BatchMemory { kind, capacity, len: 0, answered: 0, input, output, found, device }
    }

    /// Ordinary memory (the CPU backend).
    pub(crate) fn plain(kind: BatchKind, capacity: usize) -> BatchMemory {
        let (i, o, f) = (capacity * kind.in_words(), capacity * kind.out_words(), Self::found_words(kind, capacity));
        BatchMemory::new(kind, capacity, HostMemory::plain(i), HostMemory::plain(o), HostMemory::plain(f), Vec::new())
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn set_len(&mut self, n: usize) {
        assert!(n <= self.capacity, "{n} queries set on buffers for {}", self.capacity);
        self.len = n;
        self.answered = 0;
    }

    /// The input words of the queries set.
    pub(crate) fn input_words(&self) -> &[u64] {
        &self.input.words()[..self.len * self.kind.in_words()]
    }

    fn input_words_mut(&mut self) -> &mut [u64] {
        self.answered = 0;
        let words = self.len * self.kind.in_words();
        &mut self.input.words_mut()[..words]
    }

    /// Records that the answers of the `len` queries set are in place.
    pub(crate) fn mark_answered(&mut self) {
        self.answered = self.len;
    }

    /// Writes lookup answers (CPU engine).
    pub(crate) fn write_lookups(&mut self, answers: &[Option<u64>]) {
        assert!(self.kind.lookups() && answers.len() == self.len, "{} lookup answers for {} queries of {:?}", answers.len(), self.len, self.kind);
        let values = self.output.words_mut();
        for (v, a) in values.iter_mut().zip(answers) {
            *v = a.unwrap_or(0);
        }
        let bits = self.found.words_mut();
        for (w, chunk) in bits.iter_mut().zip(answers.chunks(64)) {
            *w = chunk.iter().enumerate().fold(0u64, |w, (i, a)| w | (a.is_some() as u64) << i);
        }
        self.mark_answered();
    }

    /// Writes count/sum answers (CPU engine).
    pub(crate) fn write_count_sums(&mut self, answers: &[(u64, u128)]) {
        assert!(!self.kind.lookups() && answers.len() == self.len, "{} count/sum answers for {} queries", answers.len(), self.len);
        for (w, &(count, sum)) in self.output.words_mut().chunks_exact_mut(3).zip(answers) {
            w.copy_from_slice(&[count, sum as u64, (sum >> 64) as u64]);
        }
        self.mark_answered();
    }

    fn values(&self) -> &[u64] {
        &self.output.words()[..self.answered * self.kind.out_words()]
    }

    fn found_bits(&self) -> &[u64] {
        &self.found.words()[..self.answered.div_ceil(64)]
    }

    fn found(&self, i: usize) -> bool {
        assert!(i < self.answered, "answer {i} of a batch of {} answers", self.answered);
        self.found.words()[i / 64] >> (i % 64) & 1 == 1
    }

    fn get(&self, i: usize) -> Option<u64> {
        self.found(i).then(|| self.output.words()[i])
    }
}

/// Buffers for batches of B-link lookups ([`crate::mirror::Mirror::btree_get_into`]).
pub struct LookupBuffers {
    pub(crate) mem: BatchMemory,
}

/// Buffers for batches of B-link range counts and sums
/// ([`crate::mirror::Mirror::btree_count_sum_into`]).
pub struct RangeBuffers {
    pub(crate) mem: BatchMemory,
}

/// Buffers for batches of ART lookups of keys of one length
/// ([`crate::mirror::Mirror::art_get_into`]).
pub struct ArtLookupBuffers {
    pub(crate) mem: BatchMemory,
}

/// What every kind of buffers says of its size.
macro_rules! sizes {
    ($t:ty) => {
        impl $t {
            /// Most queries a batch on these buffers holds.
            pub fn capacity(&self) -> usize {
                self.mem.capacity
            }

            /// Queries set for the next batch.
            pub fn len(&self) -> usize {
                self.mem.len
            }

            pub fn is_empty(&self) -> bool {
                self.mem.len == 0
            }

            /// Sets the number of queries of the next batch (the queries keep what they held).
            /// Panics beyond [`Self::capacity`].
            pub fn set_len(&mut self, n: usize) {
                self.mem.set_len(n)
            }
        }
    };
}

/// Lookup answers, for the two kinds of lookup buffers.
macro_rules! lookup_answers {
    ($t:ty) => {
        impl $t {
            /// The last batch's values, one per key (0 where the key is absent: see
            /// [`Self::found`]); empty once the keys changed.
            pub fn values(&self) -> &[u64] {
                self.mem.values()
            }

            /// The last batch's found bits: bit `i % 64` of word `i / 64` is key `i`'s.
            pub fn found_bits(&self) -> &[u64] {
                self.mem.found_bits()
            }

            /// Whether key `i` of the last batch was present.
            pub fn found(&self, i: usize) -> bool {
                self.mem.found(i)
            }

            /// Key `i`'s value, if present.
            pub fn get(&self, i: usize) -> Option<u64> {
                self.mem.get(i)
            }

            /// The last batch's answers in order.
            pub fn answers(&self) -> impl ExactSizeIterator<Item = Option<u64>> + '_ {
                (0..self.mem.answered).map(|i| self.mem.get(i))
            }
        }
    };
}

sizes!(LookupBuffers);
sizes!(RangeBuffers);
sizes!(ArtLookupBuffers);
lookup_answers!(LookupBuffers);
lookup_answers!(ArtLookupBuffers);

impl LookupBuffers {
    /// The keys of the next batch ([`Self::len`] of them), to fill in place.
    pub fn keys_mut(&mut self) -> &mut [u64] {
        self.mem.input_words_mut()
    }

    pub fn keys(&self) -> &[u64] {
        self.mem.input_words()
    }

    /// Sets the next batch to `keys`. Panics beyond [`Self::capacity`].
    pub fn load_keys(&mut self, keys: &[u64]) {
        self.mem.set_len(keys.len());
        self.keys_mut().copy_from_slice(keys);
    }
}

impl RangeBuffers {
    /// The ranges of the next batch as words: `lo` then `hi` (inclusive) per range.
    pub fn range_words_mut(&mut self) -> &mut [u64] {
        self.mem.input_words_mut()
    }

    /// Range `i` of the next batch: the keys in `[lo, hi]` (empty when lo > hi).
    pub fn set_range(&mut self, i: usize, lo: u64, hi: u64) {
        self.range_words_mut()[2 * i..2 * i + 2].copy_from_slice(&[lo, hi]);
    }

    /// Sets the next batch to `ranges`. Panics beyond [`Self::capacity`].
    pub fn load_ranges(&mut self, ranges: &[(u64, u64)]) {
        self.mem.set_len(ranges.len());
        for (w, &(lo, hi)) in self.range_words_mut().chunks_exact_mut(2).zip(ranges) {
            w.copy_from_slice(&[lo, hi]);
        }
    }

    /// Range `i`'s count of keys in the last batch.
    pub fn count(&self, i: usize) -> u64 {
        self.mem.values()[3 * i]
    }

    /// Range `i`'s sum of values in the last batch.
    pub fn sum(&self, i: usize) -> u128 {
        let w = &self.mem.values()[3 * i..3 * i + 3];
        w[1] as u128 | (w[2] as u128) << 64
    }

    /// The last batch's (count, sum) per range, in order.
    pub fn answers(&self) -> impl ExactSizeIterator<Item = (u64, u128)> + '_ {
        (0..self.mem.answered).map(|i| (self.count(i), self.sum(i)))
    }
}

impl ArtLookupBuffers {
    /// The length of every key of these buffers.
    pub fn key_len(&self) -> usize {
        match self.mem.kind {
            BatchKind::ArtGet { key_len } => key_len,
            _ => unreachable!("ART buffers hold ART lookups"),
        }
    }

    /// Key `i` of the next batch. Panics unless it is [`Self::key_len`] bytes.
    pub fn set_key(&mut self, i: usize, key: &[u8]) {
        let len = self.key_len();
        assert_eq!(key.len(), len, "a key of {} bytes in buffers for {len}-byte keys", key.len());
        let stride = 8 * self.mem.kind.in_words();
        self.mem.answered = 0;
        let slot = &mut self.mem.input.bytes_mut()[i * stride..(i + 1) * stride];
        slot[..len].copy_from_slice(key);
        slot[len..].fill(0);
    }

    /// Sets the next batch to `keys`. Panics beyond [`Self::capacity`] or for a key of
    /// another length.
    pub fn load_keys<K: AsRef<[u8]>>(&mut self, keys: &[K]) {
        self.mem.set_len(keys.len());
        for (i, k) in keys.iter().enumerate() {
            self.set_key(i, k.as_ref());
        }
    }

    /// Key `i` of the next batch.
    pub fn key(&self, i: usize) -> &[u8] {
        assert!(i < self.mem.len, "key {i} of {}", self.mem.len);
        let stride = 8 * self.mem.kind.in_words();
        let words = &self.mem.input.words()[i * stride / 8..(i + 1) * stride / 8];
        &HostMemory::word_bytes(words)[..self.key_len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers move to the thread that runs the batch (their device side binds its context
    /// wherever it is used).
    #[test]
    fn buffers_can_move_between_threads() {
        fn send<T: Send>() {}
        send::<LookupBuffers>();
        send::<RangeBuffers>();
        send::<ArtLookupBuffers>();
    }

    #[test]
    fn answers_follow_their_queries() {
        let mut b = LookupBuffers { mem: BatchMemory::plain(BatchKind::BtreeGet, 130) };
        b.load_keys(&(0..130u64).collect::<Vec<_>>());
        assert!(b.values().is_empty(), "no batch ran yet");
        let answers: Vec<Option<u64>> = (0..130u64).map(|k| (k % 3 == 0).then_some(k * 10)).collect();
        b.mem.write_lookups(&answers);
        assert_eq!(b.answers().collect::<Vec<_>>(), answers);
        assert_eq!(b.found_bits().len(), 3);
        assert!(b.found(129) && !b.found(128));
        assert_eq!(b.get(3), Some(30));
        b.keys_mut()[0] = 7;
        assert!(b.values().is_empty() && b.answers().len() == 0, "changed keys drop the answers");
    }

    #[test]
    #[should_panic(expected = "queries set on buffers for")]
    fn more_queries_than_capacity_panic() {
        let mut b = RangeBuffers { mem: BatchMemory::plain(BatchKind::BtreeCountSum, 4) };
        b.load_ranges(&[(0, 1); 5]);
    }

    #[test]
    fn ranges_and_art_keys_lay_out_as_the_kernels_read_them() {
        let mut r = RangeBuffers { mem: BatchMemory::plain(BatchKind::BtreeCountSum, 2) };
        r.load_ranges(&[(1, 2), (5, 3)]);
        assert_eq!(r.mem.input_words(), &[1, 2, 5, 3]);
        r.mem.write_count_sums(&[(2, u64::MAX as u128 + 5), (0, 0)]);
        assert_eq!(r.answers().collect::<Vec<_>>(), [(2, u64::MAX as u128 + 5), (0, 0)]);

        let mut a = ArtLookupBuffers { mem: BatchMemory::plain(BatchKind::ArtGet { key_len: 9 }, 3) };
        a.load_keys(&[*b"abcdefghi", *b"zzzzzzzzz"]);
        assert_eq!(a.mem.input_words().len(), 2 * 2, "9-byte keys take two words each");
        assert_eq!(a.key(1), b"zzzzzzzzz");
        assert_eq!(a.mem.input_words()[1], u64::from_le_bytes(*b"i\0\0\0\0\0\0\0"), "padding zeroed");
    }
}
