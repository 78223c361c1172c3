//! One log partition's in-memory side: the buffer committers append to, what a flusher has
//! in flight, and where the waiters for this partition's flushes sleep.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::kept::clear_for_reuse;
use crate::sync::{AtomicU64, HerdCondvar, HerdGuard, HerdMutex, Mutex};

/// Log buffer bytes kept for reuse whatever the records (see [`crate::kept`]). A transaction's
/// record goes into its partition's buffer whole, so a large transaction grows a buffer to its
/// record's size (108 MB for a 1 M-upsert batch; a record past `stream_records_from` streams
/// instead). Such a buffer is kept while records of its size follow, and shrinks back to this
/// once a flush carries under a quarter of it.
pub const MAX_KEPT_BUFFER: usize = 64 << 20;

/// The longest a leader pauses to gather records for its flush (see [`Partition::gather`]).
pub const MAX_GATHER: Duration = Duration::from_micros(250);

/// Each partition on cache lines of its own: partitions sit side by side in a `Vec`, and
/// one thread's appends must not pull in the line another partition's committer holds.
#[derive(Default)]
#[repr(align(128))]
pub struct Partition {
    state: Mutex<State>,
    /// Largest LSN of this partition known durable (its records are appended in LSN order).
    durable: AtomicU64,
    /// Waiters for a flush of this partition sleep here (see [`super::progress`]), on the
    /// condvar of the flush generation that will satisfy them (`gen % 2`): the buffer in
    /// flight is one generation, the active buffer the next, and no third exists while one
    /// is in flight. So a finished flush wakes exactly the waiters it made durable, plus one
    /// waiter of the next generation to lead the next flush, instead of every sleeper (with
    /// many committers per partition the herd of wake-ups cost more than the flush).
    /// std's condvar (see [`crate::sync::HerdCondvar`]): a flush's whole generation wakes at
    /// once, not one after another behind the mutex.
    wake: HerdMutex<()>,
    cond: [HerdCondvar; 2],
    /// Records in the active buffer whose committers wait for their flush: what a leader
    /// gathers for (see [`Partition::gather`]). Written under the state mutex, read without.
    waiting_now: AtomicU64,
}

#[derive(Default)]
struct State {
    active: Vec<u8>,
    /// First and last LSN in `active` (0 when empty).
    active_first: u64,
    active_last: u64,
    /// First LSN of the buffer the writer has in flight (0 when none).
    inflight_first: u64,
    /// Bytes of the buffer in flight (0 when none).
    inflight_bytes: usize,
    /// Buffers taken so far: the generation of the one in flight, or of the last flushed.
    takes: u64,
    /// The buffer the writer last returned, kept for reuse.
    spare: Vec<u8>,
    /// When a buffer was last taken for a flush (by anyone).
    last_take: Option<Instant>,
    /// Records of waiting committers in the buffer last taken.
    last_waiting: u64,
    /// How long the last flush's write took.
    last_write: Duration,
}

impl State {
    /// Puts the active buffer in flight as the next generation, holding LSNs `first..=last`.
    fn take_active(&mut self, first: u64, last: u64, waiting_now: &AtomicU64) -> Taken {
        let spare = std::mem::take(&mut self.spare);
        let data = std::mem::replace(&mut self.active, spare);
        self.takes += 1;
        self.inflight_first = first;
        self.inflight_bytes = data.len();
        self.active_first = 0;
        self.active_last = 0;
        self.last_take = Some(Instant::now());
        self.last_waiting = waiting_now.swap(0, Ordering::Relaxed);
        Taken { data, first, last, generation: self.takes }
    }
}

/// A buffer taken by the writer.
pub struct Taken {
    pub data: Vec<u8>,
    pub first: u64,
    pub last: u64,
    /// The flush generation (see [`Partition::generation_for`]).
    pub generation: u64,
}

impl Partition {
    /// Draws an LSN from `clock` and appends its record, under this partition's mutex; `waits`
    /// says its committer will wait for the record's flush. Returns the LSN, the bytes not yet
    /// durable ahead of the record (the active buffer's and the one in flight's), and the
    /// active buffer's bytes after the append.
    pub fn append(&self, clock: &AtomicU64, waits: bool, encode: impl FnOnce(&mut Vec<u8>, u64)) -> (u64, usize, usize) {
        let mut s = self.state.lock();
        if waits {
            self.waiting_now.fetch_add(1, Ordering::Relaxed);
        }
        let lsn = clock.fetch_add(1, Ordering::SeqCst) + 1;
        let before = s.active.len() + s.inflight_bytes;
        encode(&mut s.active, lsn);
        if s.active_first == 0 {
            s.active_first = lsn;
        }
        debug_assert!(lsn > s.active_last, "LSNs ascend within a partition");
        s.active_last = lsn;
        (lsn, before, s.active.len())
    }

    /// Wakes every waiter of this partition, for a change every waiter must see (failure,
    /// stop). None misses it: a waiter checks its condition and goes to sleep without
    /// releasing the wake mutex between, so once `pass_wake_mutex` returns, every
    /// waiter that checked before the change is on a condvar.
    pub fn notify_all(&self) {
        self.pass_wake_mutex();
        self.cond[0].notify_all();
        self.cond[1].notify_all();
    }

    /// The flush of `generation` ended (or, with the last taken generation, a flush that took
    /// nothing): wakes every waiter of that generation, all of whom it made durable, and one
    /// waiter of the next, which leads the next flush if no one else has. A woken leader that
    /// finds the slot taken sleeps again, and the flush that took the slot then ends by waking
    /// its whole generation, so no waiter is left without a flush to wait for.
    pub fn notify_flushed(&self, generation: u64) {
        self.pass_wake_mutex();
        self.cond[(generation % 2) as usize].notify_all();
        self.cond[((generation + 1) % 2) as usize].notify_one();
    }

    /// Takes and releases the wake mutex, ordering the change just made after every waiter's
    /// check-then-sleep. The notify follows outside the mutex: woken waiters re-take it to
    /// return, and finding it still held by the notifier would make them queue behind it.
    fn pass_wake_mutex(&self) {
        drop(self.wake.lock());
    }

    pub(super) fn lock_wake(&self) -> HerdGuard<'_, ()> {
        self.wake.lock()
    }

    /// Sleeps until the flush of `generation` ends (or a hand-off or failure wakes it).
    pub(super) fn sleep(&self, guard: &mut HerdGuard<'_, ()>, generation: u64) {
        self.cond[(generation % 2) as usize].wait(guard);
    }

    /// The generation of the flush after which every record of this partition with an LSN
    /// ≤ `lsn` is durable: the next buffer's if the active one holds such a record, else the
    /// in-flight one's; `None` when no such record is pending (then `durable()` covers them:
    /// [`Partition::written`] updates both under the state mutex).
    pub fn generation_for(&self, lsn: u64) -> Option<u64> {
        let s = self.state.lock();
        if s.active_first != 0 && s.active_first <= lsn {
            Some(s.takes + 1)
        } else if s.inflight_first != 0 && s.inflight_first <= lsn {
            Some(s.takes)
        } else {
            None
        }
    }

    /// The generation of the last buffer taken.
    pub fn last_generation(&self) -> u64 {
        self.state.lock().takes
    }

    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// When the background flusher is due to flush this partition: `interval` after the
    /// last flush of it by anyone (at once, `now`, if it was never flushed); `None` while
    /// nothing is buffered. A committer that led a flush thereby pushes the next background
    /// flush back, so the two do not queue behind each other, and no record waits longer than
    /// `interval` for some flush to start. `now` is the caller's clock reading: "at once" read
    /// from a clock of its own, taken after the caller's, was never due by the caller's, and
    /// the flusher spun without ever flushing a partition that no one had flushed yet.
    pub fn flush_due(&self, interval: Duration, now: Instant) -> Option<Instant> {
        let s = self.state.lock();
        if s.active.is_empty() {
            return None;
        }
        Some(s.last_take.map_or(now, |t| t + interval))
    }

    /// Lowest LSN of this partition not yet durable, if any.
    pub fn first_pending(&self) -> Option<u64> {
        let s = self.state.lock();
        if s.inflight_first != 0 {
            Some(s.inflight_first)
        } else if s.active_first != 0 {
            Some(s.active_first)
        } else {
            None
        }
    }

    /// Takes the active buffer for writing, unless empty or one is already in flight.
    pub fn take(&self) -> Option<Taken> {
        let mut s = self.state.lock();
        if s.active.is_empty() || s.inflight_first != 0 {
            return None;
        }
        let (first, last) = (s.active_first, s.active_last);
        Some(s.take_active(first, last, &self.waiting_now))
    }

    /// Draws an LSN from `clock` for a record written with the buffer taken here, right
    /// after its records (see [`super::progress::FlushGroup::flush_streamed`]): takes the
    /// buffer, even when empty, as [`Partition::take`] does, with the new LSN as its last.
    /// Only the holder of the partition's slot calls it, so nothing is in flight.
    pub fn take_with_lsn(&self, clock: &AtomicU64) -> Taken {
        let mut s = self.state.lock();
        assert_eq!(s.inflight_first, 0, "the slot's holder takes the buffer");
        let lsn = clock.fetch_add(1, Ordering::SeqCst) + 1;
        debug_assert!(lsn > s.active_last, "LSNs ascend within a partition");
        let first = if s.active_first != 0 { s.active_first } else { lsn };
        s.take_active(first, lsn, &self.waiting_now)
    }

    /// A leader's pause before it takes the buffer, so that one flush carries the records of
    /// every committer that waits on this partition. When a flush ends, its waiters return
    /// together and commit again a few microseconds later; the first to append leads the next
    /// flush and, taking the buffer at once, would carry its own record alone while the
    /// others' wait for the flush after it: flushes would alternate between one record and
    /// the rest, and each commit would wait two flushes. So the leader waits until as many
    /// waiting records are buffered as the last flush carried, for at most a quarter of the
    /// last flush's write (at most [`MAX_GATHER`]); with one committer, never. Returns whether
    /// it paused.
    #[cfg(not(loom))]
    pub fn gather(&self) -> bool {
        let (target, limit) = {
            let s = self.state.lock();
            (s.last_waiting, (s.last_write / 4).min(MAX_GATHER))
        };
        let short = || self.waiting_now.load(Ordering::Relaxed) < target;
        if target < 2 || !short() {
            return false;
        }
        let started = Instant::now();
        while short() && started.elapsed() < limit {
            std::thread::yield_now();
        }
        true
    }

    /// Under loom, no pause: it is a matter of timing, and the models check the protocol.
    #[cfg(loom)]
    pub fn gather(&self) -> bool {
        false
    }

    /// The writer made `taken` durable, its write having taken `took`.
    pub fn written(&self, mut taken: Taken, took: Duration) {
        let mut s = self.state.lock();
        s.last_write = took;
        debug_assert_eq!(s.inflight_first, taken.first);
        s.inflight_first = 0;
        s.inflight_bytes = 0;
        self.durable.fetch_max(taken.last, Ordering::SeqCst);
        clear_for_reuse(&mut taken.data, MAX_KEPT_BUFFER);
        if s.spare.capacity() < taken.data.capacity() {
            s.spare = taken.data;
        }
        // The larger buffer takes the next records: a record of the size just flushed then
        // finds its buffer, and no second buffer of that size grows beside it.
        if s.active.is_empty() && s.active.capacity() < s.spare.capacity() {
            let State { active, spare, .. } = &mut *s;
            std::mem::swap(active, spare);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader pauses only after a flush that carried several waiting committers' records,
    /// and only while fewer of them are buffered again; records of commits that do not wait
    /// count for nothing; the pause ends by the bound when no more come.
    #[test]
    fn a_leader_gathers_as_many_waiting_records_as_the_last_flush_carried() {
        let clock = AtomicU64::new(0);
        let p = Partition::default();
        let append = |waits: bool| p.append(&clock, waits, |buf, _| buf.extend_from_slice(&[0; 8]));
        let flush = |took: Duration| {
            let taken = p.take().expect("records buffered");
            p.written(taken, took);
        };
        append(true);
        flush(Duration::from_millis(1));
        append(true);
        assert!(!p.gather(), "the last flush carried one waiter's record: no pause");
        for _ in 0..2 {
            append(true);
        }
        flush(Duration::from_micros(400));
        append(true);
        let started = Instant::now();
        assert!(p.gather(), "three waiters last time, one now: a pause");
        assert!(started.elapsed() >= Duration::from_micros(100), "the pause lasts a quarter of the last write when no record comes");
        append(true);
        append(true);
        assert!(!p.gather(), "as many waiting records as last time: no pause");
        flush(Duration::from_secs(1));
        for _ in 0..3 {
            append(false);
        }
        flush(Duration::from_secs(1));
        append(true);
        assert!(!p.gather(), "the last flush carried no waiter's record: no pause");
    }

    #[test]
    fn a_flush_pushes_the_next_background_flush_back() {
        let clock = AtomicU64::new(0);
        let p = Partition::default();
        let interval = Duration::from_millis(500);
        assert_eq!(p.flush_due(interval, Instant::now()), None, "nothing buffered");
        p.append(&clock, false, |buf, _| buf.extend_from_slice(&[0; 8]));
        let now = Instant::now();
        assert_eq!(p.flush_due(interval, now), Some(now), "never flushed: due at once");
        let before = Instant::now();
        let taken = p.take().unwrap();
        assert_eq!(p.flush_due(interval, Instant::now()), None, "the buffer went with the flush");
        p.append(&clock, false, |buf, _| buf.extend_from_slice(&[0; 8]));
        let due = p.flush_due(interval, Instant::now()).unwrap();
        assert!(due >= before + interval && due <= Instant::now() + interval, "due one interval after the take");
        p.written(taken, Duration::ZERO);
        assert_eq!(p.flush_due(interval, Instant::now()), Some(due), "finishing the flush does not move it");
    }

    /// What `LogManager::append` throttles on: the bytes not yet durable ahead of a record
    /// (buffered or in flight), not the record's own size.
    #[test]
    fn append_reports_the_bytes_ahead_of_its_record() {
        let clock = AtomicU64::new(0);
        let p = Partition::default();
        let (_, before, after) = p.append(&clock, false, |buf, _| buf.resize(buf.len() + 1000, 0));
        assert_eq!((before, after), (0, 1000), "a large record into an empty buffer has nothing ahead of it");
        let (_, before, after) = p.append(&clock, false, |buf, _| buf.resize(buf.len() + 10, 0));
        assert_eq!((before, after), (1000, 1010));
        let taken = p.take().unwrap();
        let (_, before, after) = p.append(&clock, false, |buf, _| buf.resize(buf.len() + 1000, 0));
        assert_eq!((before, after), (1010, 1000), "the bytes in flight are still ahead until written");
        p.written(taken, Duration::ZERO);
        let (_, before, after) = p.append(&clock, false, |buf, _| buf.resize(buf.len() + 10, 0));
        assert_eq!((before, after), (1000, 1010), "once written, only the active buffer is ahead");
        let taken = p.take().unwrap();
        p.written(taken, Duration::ZERO);
        let (_, before, _) = p.append(&clock, false, |buf, _| buf.resize(buf.len() + 1000, 0));
        assert_eq!(before, 0, "nothing ahead once every flush is done");
    }

    #[test]
    fn pending_tracks_active_and_inflight() {
        let clock = AtomicU64::new(10);
        let p = Partition::default();
        assert_eq!(p.first_pending(), None);
        let (lsn, _, _) = p.append(&clock, false, |buf, _| buf.extend_from_slice(&[0; 8]));
        assert_eq!(lsn, 11);
        assert_eq!(p.first_pending(), Some(11));
        assert_eq!(p.generation_for(11), Some(1), "the active buffer goes with the next take");
        assert_eq!(p.generation_for(10), None);
        let taken = p.take().unwrap();
        assert_eq!(taken.generation, 1);
        assert!(p.take().is_none(), "one buffer in flight at a time");
        let (lsn2, _, _) = p.append(&clock, false, |buf, _| buf.extend_from_slice(&[0; 8]));
        assert_eq!(p.first_pending(), Some(11), "in-flight buffer is older");
        assert_eq!(p.generation_for(11), Some(1), "in flight");
        assert_eq!(p.generation_for(lsn2), Some(2), "behind the buffer in flight");
        p.written(taken, Duration::ZERO);
        assert_eq!(p.durable(), 11);
        assert_eq!(p.generation_for(11), None);
        assert_eq!(p.first_pending(), Some(lsn2));
        assert_eq!(p.last_generation(), 1);
    }

    /// A huge record's buffer is kept for the next record of its size (growing it again
    /// faulted every page in: 15% of a 1 M-upsert batch's time), as the one buffer of that
    /// size, and shrinks to `MAX_KEPT_BUFFER` once a flush carries under a quarter of it.
    #[test]
    fn a_huge_records_buffer_is_kept_until_a_small_flush_uses_it() {
        let clock = AtomicU64::new(0);
        let p = Partition::default();
        // The flushed buffer's capacity, then the active and the spare one's.
        let flush = |bytes: usize| {
            p.append(&clock, false, |buf, _| buf.resize(buf.len() + bytes, 0));
            let taken = p.take().unwrap();
            let cap = taken.data.capacity();
            p.written(taken, Duration::ZERO);
            let s = p.state.lock();
            (cap, s.active.capacity(), s.spare.capacity())
        };
        let (small, active, _) = flush(4096);
        assert_eq!(active, small, "the flushed buffer takes the next records");
        let (huge, active, spare) = flush(MAX_KEPT_BUFFER + 8);
        assert!(huge > MAX_KEPT_BUFFER);
        assert_eq!((active, spare), (huge, 0), "the huge record's buffer is kept, and is the only one");
        let (cap, active, _) = flush(MAX_KEPT_BUFFER + 8);
        assert_eq!((cap, active), (huge, huge), "the next huge record reuses it");
        let (cap, active, spare) = flush(4096);
        assert_eq!(cap, huge, "a small record went into the huge buffer");
        assert_eq!(active.max(spare), MAX_KEPT_BUFFER, "which then shrank");
    }
}
