//! Versioned stripe locks. Each 64-byte line of the heap maps to one lock word:
//! bit 0 = locked, bits 1.. = the LSN of the last transaction that wrote the line.
//! Lines map to words by `(offset / 64) mod count`, so distant lines may share a word
//! (a false conflict, never a missed one).

use std::sync::atomic::Ordering;

use tusk_storage::region::AtomicWords;
use tusk_storage::StorageError;

/// Bytes covered by one stripe.
pub const STRIPE_BYTES: u64 = 64;

pub struct Stripes {
    words: AtomicWords,
    mask: u64,
}

#[inline]
pub fn is_locked(word: u64) -> bool {
    word & 1 == 1
}

#[inline]
pub fn version(word: u64) -> u64 {
    word >> 1
}

impl Stripes {
    /// `2^log2` lock words.
    pub fn new(log2: u32) -> Result<Stripes, StorageError> {
        let count = 1u64 << log2;
        Ok(Stripes { words: AtomicWords::new(count)?, mask: count - 1 })
    }

    /// Hints the CPU to fetch the lock word guarding `heap_offset`.
    #[inline]
    pub fn prefetch(&self, heap_offset: u64) {
        self.words.prefetch(self.index_of(heap_offset) as u64);
    }

    #[inline]
    pub fn index_of(&self, heap_offset: u64) -> u32 {
        ((heap_offset / STRIPE_BYTES) & self.mask) as u32
    }

    #[inline]
    pub fn load(&self, index: u32) -> u64 {
        self.words.get(index as u64).load(Ordering::Acquire)
    }

    /// Re-reads a word after the data it guards (seqlock style): the data loads are ordered
    /// before this load by the fence.
    #[inline]
    pub fn recheck(&self, index: u32) -> u64 {
        crate::sync::fence(Ordering::Acquire);
        self.words.get(index as u64).load(Ordering::Relaxed)
    }

    /// Tries to lock a word that currently reads `seen` (unlocked).
    #[inline]
    pub fn try_lock(&self, index: u32, seen: u64) -> bool {
        debug_assert!(!is_locked(seen));
        let locked = self.words.get(index as u64).compare_exchange(seen, seen | 1, Ordering::Acquire, Ordering::Relaxed).is_ok();
        if locked {
            // The seqlock writer's fence: a reader whose (relaxed) data load sees a store the
            // holder makes under this lock must then see the lock bit in `recheck` (its
            // acquire fence pairs with this one). Without it the C++/Rust memory model lets
            // a reader take new data with the old, unlocked version (found by the loom model
            // `readers_see_whole_commits`; weakly ordered CPUs can do it). A compiler-only
            // barrier on x86.
            crate::sync::fence(Ordering::Release);
        }
        locked
    }

    /// Unlocks, publishing the data written under the lock with version `lsn`.
    #[inline]
    pub fn unlock_with(&self, index: u32, lsn: u64) {
        debug_assert!(is_locked(self.words.get(index as u64).load(Ordering::Relaxed)));
        self.words.get(index as u64).store(lsn << 1, Ordering::Release);
    }

    /// Unlocks, restoring the word seen before locking (abort).
    #[inline]
    pub fn unlock_restore(&self, index: u32, seen: u64) {
        self.words.get(index as u64).store(seen, Ordering::Release);
    }

    /// Unlocks a stripe this thread locked, restoring the word it had: the locked word less
    /// the lock bit (`try_lock` sets only that bit, and only the holder changes a locked word).
    #[inline]
    pub fn unlock_unchanged(&self, index: u32) {
        let word = self.words.get(index as u64).load(Ordering::Relaxed);
        debug_assert!(is_locked(word));
        self.unlock_restore(index, word & !1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_share_a_stripe_and_neighbours_do_not() {
        let s = Stripes::new(10).unwrap();
        assert_eq!(s.index_of(0), s.index_of(63));
        assert_ne!(s.index_of(63), s.index_of(64));
        assert_eq!(s.index_of(0), s.index_of(64 * 1024), "wraps after 2^log2 lines");
    }

    #[test]
    fn lock_unlock_publishes_version() {
        let s = Stripes::new(4).unwrap();
        let w = s.load(3);
        assert!(s.try_lock(3, w));
        assert!(is_locked(s.load(3)));
        assert!(!s.try_lock(3, w), "a locked stripe cannot be locked again");
        s.unlock_with(3, 42);
        assert_eq!(version(s.load(3)), 42);
        assert!(!is_locked(s.load(3)));
    }
}
