//! Heap pages made ready ahead of the allocator.
//!
//! Heap beyond brk is touched for the first time by the transaction that takes it, and a
//! first touch is a page fault that zeroes the page (with transparent huge pages, 2 MiB) on
//! that transaction's thread: a tenth of a B-link batch that splits many leaves went to such
//! faults. So the allocator only reports how far brk has gone ([`Growth::taken`]); once it
//! comes within half of `ahead` bytes of what was made ready, a background thread (the store's
//! `tusk-prefault`) populates the heap up to `ahead` bytes beyond brk. Populating changes no
//! byte (never-used memory is zero either way), so a report by a transaction that later
//! aborts costs only the memory touched early.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crossbeam_channel::Sender;

/// How far the heap is wanted ready, and who makes it so.
#[derive(Default)]
pub struct Growth {
    /// Heap offset up to which pages were asked for (populated, or being populated).
    wanted: AtomicU64,
    /// The populating thread's wake-up, and how far ahead of brk it keeps the heap.
    listener: OnceLock<(Sender<()>, u64)>,
}

impl Growth {
    /// Makes `wake` the populating thread's signal, keeping `ahead` bytes beyond brk ready;
    /// pages below `ready` need nothing. A second listener is refused (false).
    pub fn listen(&self, wake: Sender<()>, ahead: u64, ready: u64) -> bool {
        self.wanted.fetch_max(ready, Ordering::Relaxed);
        self.listener.set((wake, ahead)).is_ok()
    }

    /// brk moved up to `end`.
    #[inline]
    pub fn taken(&self, end: u64) {
        let Some((wake, ahead)) = self.listener.get() else { return };
        if end.saturating_add(ahead / 2) <= self.wanted.load(Ordering::Relaxed) {
            return;
        }
        let target = end.saturating_add(*ahead);
        if self.wanted.fetch_max(target, Ordering::Relaxed) < target {
            // Full: a wake-up is pending, and the thread reads `wanted` when it runs.
            let _ = wake.try_send(());
        }
    }

    /// How far the heap is wanted ready (the populating thread's next goal).
    pub fn wanted(&self) -> u64 {
        self.wanted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_once_brk_nears_what_is_ready() {
        let growth = Growth::default();
        growth.taken(1 << 30);
        assert_eq!(growth.wanted(), 0, "nobody listens: nothing is wanted");
        let (wake, woken) = crossbeam_channel::bounded(1);
        assert!(growth.listen(wake, 64 << 20, 100 << 20));
        growth.taken(10 << 20);
        assert!(woken.try_recv().is_err(), "brk far below what is ready");
        growth.taken(70 << 20);
        assert!(woken.try_recv().is_ok(), "within half of `ahead` of it");
        assert_eq!(growth.wanted(), 134 << 20);
        growth.taken(71 << 20);
        assert!(woken.try_recv().is_err(), "asked for already");
        growth.taken(200 << 20);
        growth.taken(300 << 20);
        assert_eq!(growth.wanted(), 364 << 20, "the latest report wins");
        assert!(woken.try_recv().is_ok());
        assert!(woken.try_recv().is_err(), "one wake-up pending at most");
    }
}
