//! The core of group commit, shared by committers, waiters and the background flusher: the
//! durable watermark, the flush slots, and the per-partition rendezvous where waiters sleep.
//! Kept apart from the I/O (a [`Flush`] does that) so that the loom models (below) check
//! exactly this code.
//!
//! The writer is pipelined: each partition has a flush slot (a mutex over its segment file
//! and I/O), and whoever holds it writes that partition's buffered records. A committer that
//! waits for durability leads: if the slot of a partition it waits for is free, it flushes
//! that partition itself (no hand-off to another thread, no wait for other partitions'
//! flushes); if the slot is busy, it sleeps until that flush ends, and then either its record
//! was in it or it leads the next one, which carries every record appended meanwhile (group
//! commit). The background flusher uses the same slots for `Async` commits.
//!
//! No waiter sleeps through the event it waits for: every change a waiter's check looks at
//! (a partition's durable LSN, its pending records, its slot, failure, stop) is followed by a
//! pass through that partition's wake mutex and then a notify, and a waiter checks and falls
//! asleep holding that mutex. A flusher therefore releases the slot *before* it notifies.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::partition::{Partition, Taken};
use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard};
use crate::TxnError;

/// Every LSN ≤ the watermark is durable.
pub struct Watermark {
    durable: AtomicU64,
}

impl Watermark {
    pub fn new(durable: u64) -> Watermark {
        Watermark { durable: AtomicU64::new(durable) }
    }

    pub fn get(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// Recomputes the watermark from the clock and the partitions (see the module docs of
    /// [`super`]). The clock is read first: every LSN it covers was appended in the same
    /// critical section that drew it, so the partitions then show it pending or durable.
    /// Partitions complete independently; each flusher advances after marking its buffer
    /// written, so the last of two concurrent flushers sees both written (each partition's
    /// state is read under its mutex).
    pub fn advance(&self, clock: &AtomicU64, partitions: &[Partition]) {
        let clock = clock.load(Ordering::SeqCst);
        let mut durable = clock;
        for p in partitions {
            if let Some(first) = p.first_pending() {
                durable = durable.min(first - 1);
            }
        }
        self.durable.fetch_max(durable, Ordering::SeqCst);
    }
}

/// Writes one taken buffer of its partition durably (the I/O side of a flush slot).
pub trait Flush {
    /// Ok only once every record of `taken`, and after them the `streamed` one if any, is on
    /// disk.
    fn write(&mut self, taken: &Taken, streamed: Option<&mut dyn Streamed>) -> Result<(), String>;
}

/// A record written as it is encoded, never whole in memory (see
/// [`FlushGroup::flush_streamed`]).
pub trait Streamed {
    /// Its size in bytes.
    fn size(&self) -> usize;
    /// Passes its bytes to `out` in order, in pieces of any size; an error leaves what was
    /// passed on a torn record.
    fn produce(&mut self, out: &mut dyn FnMut(&[u8])) -> Result<(), String>;
}

/// The partitions, their flush slots, the watermark, and why waiting may end without
/// success (log failure, shutdown).
pub struct FlushGroup<S> {
    /// Last LSN drawn (the STM's version clock).
    pub clock: Arc<CachePadded<AtomicU64>>,
    pub partitions: Vec<Partition>,
    /// Per partition: whether its slot is claimed. The claim is a compare-exchange, so a
    /// waiter can test and take a slot while it holds its partition's wake mutex; the slot's
    /// mutex is only locked by the claimant and never waits.
    claimed: Vec<AtomicBool>,
    slots: Vec<Mutex<S>>,
    pub watermark: Watermark,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// Flushing stopped: nothing more becomes durable.
    stopped: AtomicBool,
}

impl<S: Flush> FlushGroup<S> {
    /// One partition per slot; the watermark starts at the clock.
    pub fn new(clock: Arc<CachePadded<AtomicU64>>, slots: Vec<S>) -> FlushGroup<S> {
        let durable = clock.load(Ordering::SeqCst);
        FlushGroup {
            clock,
            partitions: slots.iter().map(|_| Partition::default()).collect(),
            claimed: slots.iter().map(|_| AtomicBool::new(false)).collect(),
            slots: slots.into_iter().map(Mutex::new).collect(),
            watermark: Watermark::new(durable),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            stopped: AtomicBool::new(false),
        }
    }

    /// Draws an LSN and appends its record to `partition` (see [`Partition::append`]).
    pub fn append(&self, partition: usize, waits: bool, encode: impl FnOnce(&mut Vec<u8>, u64)) -> (u64, usize, usize) {
        self.partitions[partition].append(&self.clock, waits, encode)
    }

    /// Flushes `partition` once if its slot is free; returns whether it was.
    pub fn flush(&self, partition: usize) -> bool {
        match self.claim(partition) {
            Some(slot) => {
                self.flush_locked(partition, slot, false);
                true
            }
            None => false,
        }
    }

    /// Takes `partition`'s slot if no one holds it.
    fn claim(&self, partition: usize) -> Option<MutexGuard<'_, S>> {
        self.claimed[partition].compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).ok()?;
        Some(self.slots[partition].lock())
    }

    /// Writes what `partition` has buffered, then releases the slot, advances the watermark
    /// and wakes the partition's waiters, in that order (see the module docs).
    /// Flushes `partition` holding its slot; a leader (`gather`: a committer that waits)
    /// first gives the other waiting committers a moment to append (see [`Partition::gather`]).
    fn flush_locked(&self, partition: usize, mut slot: MutexGuard<'_, S>, gather: bool) {
        let p = &self.partitions[partition];
        if gather {
            p.gather();
        }
        // With nothing taken, the last generation's waiters were woken by its own flush;
        // this flush still hands the lead to a waiter of the next one.
        let mut generation = p.last_generation();
        // After a failure nothing more is written (a later flush would leave a hole behind
        // the failed one); after a stop neither (what a crash would leave).
        if !self.failed.load(Ordering::SeqCst) && !self.is_stopped() {
            if let Some(taken) = p.take() {
                generation = taken.generation;
                let started = std::time::Instant::now();
                match slot.write(&taken, None) {
                    Ok(()) => p.written(taken, started.elapsed()),
                    // The buffer stays in flight: the watermark cannot pass it.
                    Err(why) => self.fail(why),
                }
            }
        }
        self.release(partition, slot, generation);
    }

    /// Frees `partition`'s slot, then advances the watermark and wakes the partition's
    /// waiters of `generation` (see [`Partition::notify_flushed`]), in that order (see the
    /// module docs).
    fn release(&self, partition: usize, slot: MutexGuard<'_, S>, generation: u64) {
        drop(slot);
        self.claimed[partition].store(false, Ordering::SeqCst);
        self.watermark.advance(&self.clock, &self.partitions);
        self.partitions[partition].notify_flushed(generation);
    }

    /// Draws an LSN and writes its record, made by `record` for that LSN, to `partition`
    /// while the record is encoded, in the same flush as the records appended before it:
    /// for a record too large to be held whole. Waits for the partition's slot (its flushes
    /// are short beside this one), then takes the buffer and draws the LSN together under
    /// the partition's mutex, so the LSN is appended as it is drawn (the watermark's rule)
    /// and the partition's LSNs still ascend. Returns the LSN once its record is durable,
    /// or, with the error, once it never will be; no LSN when the log had failed or stopped
    /// before one was drawn.
    pub fn flush_streamed<R: Streamed>(&self, partition: usize, record: impl FnOnce(u64) -> R) -> (Option<u64>, Result<(), TxnError>) {
        let mut slot = loop {
            if let Err(e) = self.check() {
                return (None, Err(e));
            }
            if let Some(slot) = self.claim(partition) {
                break slot;
            }
            crate::sync::nap();
        };
        let p = &self.partitions[partition];
        // After a failure nothing more is written (see `flush_locked`), and the failed buffer
        // may still be in flight here: a flusher fails the group before it frees the slot.
        if let Err(e) = self.check() {
            self.release(partition, slot, p.last_generation());
            return (None, Err(e));
        }
        let taken = p.take_with_lsn(&self.clock);
        let lsn = taken.last;
        let generation = taken.generation;
        let mut record = record(lsn);
        let result = match slot.write(&taken, Some(&mut record)) {
            Ok(()) => {
                p.written(taken, std::time::Duration::ZERO);
                Ok(())
            }
            // The buffer stays in flight: the watermark cannot pass it.
            Err(why) => {
                self.fail(why.clone());
                Err(TxnError::LogFailed(why))
            }
        };
        self.release(partition, slot, generation);
        (Some(lsn), result)
    }

    /// Waits until `partition`'s records up to `lsn` are durable, leading its flushes.
    pub fn wait_partition(&self, partition: usize, lsn: u64) -> Result<(), TxnError> {
        let p = &self.partitions[partition];
        loop {
            if p.durable() >= lsn {
                return Ok(());
            }
            let mut wake = p.lock_wake();
            loop {
                if p.durable() >= lsn {
                    return Ok(());
                }
                self.check()?;
                if let Some(slot) = self.claim(partition) {
                    drop(wake);
                    self.flush_locked(partition, slot, true);
                    break;
                }
                // None: nothing ≤ lsn pending, so the durable check above now passes.
                if let Some(generation) = p.generation_for(lsn) {
                    p.sleep(&mut wake, generation);
                }
            }
        }
    }

    /// Waits until every LSN ≤ `lsn` is durable: leads the flush of any partition holding a
    /// pending LSN ≤ `lsn` whose slot is free; when all such slots are busy, sleeps until
    /// the lowest one's flush ends. When several free partitions hold such LSNs, `kick` asks
    /// the background flusher to take the others, so that they flush side by side.
    pub fn wait_durable(&self, lsn: u64, kick: impl Fn()) -> Result<(), TxnError> {
        loop {
            if self.watermark.get() >= lsn {
                return Ok(());
            }
            self.check()?;
            let blocks = |i: usize| self.partitions[i].first_pending().is_some_and(|f| f <= lsn);
            if (0..self.partitions.len()).filter(|&i| !self.claimed[i].load(Ordering::Relaxed) && blocks(i)).nth(1).is_some() {
                kick();
            }
            let mut lowest: Option<(u64, usize)> = None;
            let mut led = false;
            for i in 0..self.partitions.len() {
                let Some(first) = self.partitions[i].first_pending().filter(|&f| f <= lsn) else { continue };
                if let Some(slot) = self.claim(i) {
                    self.flush_locked(i, slot, true);
                    led = true;
                    break;
                }
                if lowest.is_none_or(|(f, _)| first < f) {
                    lowest = Some((first, i));
                }
            }
            if led {
                continue;
            }
            let Some((_, i)) = lowest else {
                // Nothing ≤ lsn pending: a flusher that cleared the last one may not have
                // advanced the watermark yet.
                self.watermark.advance(&self.clock, &self.partitions);
                continue;
            };
            let p = &self.partitions[i];
            let mut wake = p.lock_wake();
            loop {
                if self.watermark.get() >= lsn {
                    return Ok(());
                }
                self.check()?;
                let Some(generation) = p.generation_for(lsn) else { break };
                if let Some(slot) = self.claim(i) {
                    drop(wake);
                    self.flush_locked(i, slot, true);
                    break;
                }
                p.sleep(&mut wake, generation);
            }
        }
    }

    fn check(&self) -> Result<(), TxnError> {
        if let Some(why) = self.failure() {
            return Err(TxnError::LogFailed(why));
        }
        if self.is_stopped() {
            return Err(TxnError::Closed);
        }
        Ok(())
    }
}

impl<S> FlushGroup<S> {
    /// Records the first failure and wakes every waiter to report it.
    pub fn fail(&self, why: String) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(why);
        }
        self.failed.store(true, Ordering::SeqCst);
        drop(f);
        for p in &self.partitions {
            p.notify_all();
        }
    }

    pub fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().clone()
    }

    /// Flushing stops (close, or abandon as a crash would): wakes every waiter to give up.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for p in &self.partitions {
            p.notify_all();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Runs `f` on every partition's slot in turn, once flushing has stopped.
    pub fn each_slot(&self, mut f: impl FnMut(&mut S) -> Result<(), TxnError>) -> Result<(), TxnError> {
        assert!(self.is_stopped(), "slots are taken in turn only once no flush can claim one");
        self.slots.iter().try_for_each(|slot| f(&mut slot.lock()))
    }
}

/// Loom models of the pipelined group commit (run by .ci/loom): the real [`FlushGroup`],
/// [`Partition`] and [`Watermark`], with a model [`Flush`] standing in for the I/O of
/// `writer.rs` (it marks each LSN of the taken buffer as on disk). Committers lead flushes
/// themselves, as in the store; partitions complete independently.
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::Arc;

use crossbeam_utils::CachePadded;

    use loom::thread;

    use super::*;

    /// LSNs 1..=N, each flagged once a model flush has "written" it.
    struct Disk {
        written: Vec<AtomicBool>,
    }

    impl Disk {
        fn new(n: usize) -> Disk {
            Disk { written: (0..=n).map(|_| AtomicBool::new(false)).collect() }
        }

        /// Every LSN ≤ `lsn` is on disk.
        fn holds_all_through(&self, lsn: u64) -> bool {
            (1..=lsn as usize).all(|l| self.written[l].load(Ordering::SeqCst))
        }
    }

    /// A flush slot writing to the model disk; fails the write of `fail_lsn` if set.
    struct ModelSlot {
        disk: Arc<Disk>,
        fail_lsn: u64,
    }

    impl Flush for ModelSlot {
        fn write(&mut self, taken: &Taken, streamed: Option<&mut dyn Streamed>) -> Result<(), String> {
            let mut bytes = taken.data.clone();
            if let Some(streamed) = streamed {
                streamed.produce(&mut |piece| bytes.extend_from_slice(piece))?;
            }
            let lsns: Vec<u64> = bytes.chunks(8).map(|r| u64::from_le_bytes(r.try_into().unwrap())).collect();
            if lsns.contains(&self.fail_lsn) {
                return Err("disk gone".into());
            }
            for lsn in lsns {
                assert!(lsn >= taken.first && lsn <= taken.last);
                self.disk.written[lsn as usize].store(true, Ordering::SeqCst);
            }
            Ok(())
        }
    }

    struct Log {
        group: FlushGroup<ModelSlot>,
        disk: Arc<Disk>,
    }

    fn log(partitions: usize, records: usize, fail_lsn: u64) -> Arc<Log> {
        let disk = Arc::new(Disk::new(records));
        let slots = (0..partitions).map(|_| ModelSlot { disk: disk.clone(), fail_lsn }).collect();
        Arc::new(Log { group: FlushGroup::new(Arc::new(CachePadded::new(AtomicU64::new(0))), slots), disk })
    }

    /// Appends one record to `partition` (the LSN is the record).
    fn append(log: &Log, partition: usize) -> u64 {
        log.group.append(partition, false, |buf, lsn| buf.extend_from_slice(&lsn.to_le_bytes())).0
    }

    /// The watermark never promises an LSN that is not on disk.
    fn check_watermark(log: &Log) {
        let durable = log.group.watermark.get();
        assert!(log.disk.holds_all_through(durable), "watermark {durable} passed an unwritten LSN");
    }

    /// Sync commit: wait for the global watermark, then check what it promises.
    fn commit_sync(log: &Log, partition: usize) {
        let lsn = append(log, partition);
        log.group.wait_durable(lsn, || {}).unwrap();
        assert!(log.group.watermark.get() >= lsn);
        check_watermark(log);
    }

    /// Partition commit: wait for this partition only.
    fn commit_partition(log: &Log, partition: usize) {
        let lsn = append(log, partition);
        log.group.wait_partition(partition, lsn).unwrap();
        assert!(log.disk.written[lsn as usize].load(Ordering::SeqCst), "partition durable before its record was written");
        check_watermark(log);
    }

    /// A Sync and a Partition committer on two partitions, each leading its own flushes,
    /// and the background flusher's pass over both: whichever partition completes first,
    /// the watermark never passes an unwritten LSN, and no waiter sleeps through the flush
    /// that satisfies it (loom reports a deadlock).
    #[test]
    fn loom_partitions_complete_independently() {
        loom::model(|| {
            let log = log(2, 2, 0);
            let a = { let log = log.clone(); thread::spawn(move || commit_sync(&log, 0)) };
            let b = { let log = log.clone(); thread::spawn(move || commit_partition(&log, 1)) };
            for p in 0..2 {
                log.group.flush(p);
                check_watermark(&log);
            }
            a.join().unwrap();
            b.join().unwrap();
            log.group.watermark.advance(&log.group.clock, &log.group.partitions);
            assert_eq!(log.group.watermark.get(), 2);
        });
    }

    /// Two Partition committers share one partition: a record appended while the leader's
    /// flush is in flight is carried by the next flush, which its committer leads once it
    /// is woken (group commit's hand-off).
    #[test]
    fn loom_group_commit_hands_off_the_lead() {
        loom::model(|| {
            let log = log(1, 2, 0);
            let a = { let log = log.clone(); thread::spawn(move || commit_partition(&log, 0)) };
            let b = { let log = log.clone(); thread::spawn(move || commit_partition(&log, 0)) };
            a.join().unwrap();
            b.join().unwrap();
            assert!(log.disk.holds_all_through(2));
        });
    }

    /// Three Partition committers share one partition while the background flusher passes
    /// over it: a finished flush wakes only its own generation's waiters and one waiter of
    /// the next as leader; every committer returns with its record on disk, and none sleeps
    /// with no flush left to wake it (loom reports a deadlock).
    #[test]
    fn loom_flush_wakes_its_generation_and_one_leader() {
        loom::model(|| {
            let log = log(1, 3, 0);
            let committers: Vec<_> = (0..2)
                .map(|_| {
                    let log = log.clone();
                    thread::spawn(move || commit_partition(&log, 0))
                })
                .collect();
            let flusher = { let log = log.clone(); thread::spawn(move || { log.group.flush(0); }) };
            commit_partition(&log, 0);
            for c in committers {
                c.join().unwrap();
            }
            flusher.join().unwrap();
            assert!(log.disk.holds_all_through(3));
        });
    }

    /// A Sync committer whose record is held back by an older record of another partition,
    /// appended by an Async committer that then flushes its partition as the background
    /// flusher would: the Sync waiter either leads that flush or sleeps until it ends.
    #[test]
    fn loom_sync_waits_for_another_partitions_flush() {
        loom::model(|| {
            let log = log(2, 2, 0);
            let first = append(&log, 1);
            assert_eq!(first, 1);
            let flusher = { let log = log.clone(); thread::spawn(move || { log.group.flush(1); check_watermark(&log); }) };
            commit_sync(&log, 0);
            flusher.join().unwrap();
            assert!(log.disk.holds_all_through(2));
        });
    }

    /// A streamed record of the model: its LSN, produced in two pieces.
    struct ModelRecord(u64);

    impl Streamed for ModelRecord {
        fn size(&self) -> usize {
            8
        }

        fn produce(&mut self, out: &mut dyn FnMut(&[u8])) -> Result<(), String> {
            let bytes = self.0.to_le_bytes();
            out(&bytes[..3]);
            out(&bytes[3..]);
            Ok(())
        }
    }

    /// A streamed record goes to a partition while a Sync committer appends to the same
    /// partition and the background flusher passes over it: the streamer waits for the slot
    /// and writes the buffer's older records with its own, the committer's record (older or
    /// younger) is carried by one flush or the next, and the watermark passes neither LSN
    /// before it is on disk.
    #[test]
    fn loom_a_streamed_record_shares_its_partition() {
        loom::model(|| {
            let log = log(1, 2, 0);
            let streamer = {
                let log = log.clone();
                thread::spawn(move || {
                    let (lsn, result) = log.group.flush_streamed(0, ModelRecord);
                    result.unwrap();
                    let lsn = lsn.unwrap();
                    assert!(log.disk.written[lsn as usize].load(Ordering::SeqCst), "streamed record not on disk");
                    check_watermark(&log);
                })
            };
            let flusher = { let log = log.clone(); thread::spawn(move || { log.group.flush(0); }) };
            commit_sync(&log, 0);
            streamer.join().unwrap();
            flusher.join().unwrap();
            assert!(log.disk.holds_all_through(2));
        });
    }

    /// A streamed record beside a committer whose flush fails: whichever order they take,
    /// both see the failure (the streamer too when the failed buffer is still in flight in
    /// its partition, which it must not take), and neither hangs.
    #[test]
    fn loom_a_streamed_record_after_a_failed_flush_fails_too() {
        loom::model(|| {
            let log = log(1, 2, 1);
            let streamer = {
                let log = log.clone();
                thread::spawn(move || log.group.flush_streamed(0, ModelRecord).1)
            };
            let lsn = append(&log, 0);
            let committed = log.group.wait_partition(0, lsn);
            let streamed = streamer.join().unwrap();
            assert!(committed.is_err() && streamed.is_err(), "{committed:?} {streamed:?}");
            check_watermark(&log);
            assert_eq!(log.group.watermark.get(), 0);
        });
    }

    /// A failed write wakes the waiters with the failure, and the watermark stays below the
    /// failed record even though a later partition's record is on disk.
    #[test]
    fn loom_failed_flush_wakes_waiters_and_holds_the_watermark() {
        loom::model(|| {
            let log = log(2, 2, 1);
            let a = {
                let log = log.clone();
                thread::spawn(move || {
                    let lsn = append(&log, 0);
                    log.group.wait_partition(0, lsn)
                })
            };
            let b = {
                let log = log.clone();
                thread::spawn(move || {
                    let lsn = append(&log, 1);
                    log.group.wait_durable(lsn, || {})
                })
            };
            let ra = a.join().unwrap();
            let rb = b.join().unwrap();
            check_watermark(&log);
            // LSN 1 failed, whichever partition drew it: its waiter fails, and a Sync waiter
            // behind it fails too; the watermark never reaches it.
            assert!(log.group.watermark.get() < 1);
            assert!(ra.is_err() || rb.is_err());
            if let Err(e) = &rb {
                assert!(matches!(e, TxnError::LogFailed(why) if why == "disk gone"), "{e:?}");
            }
        });
    }

    /// A waiter is woken by a shutdown or a failure that happens while it goes to sleep on
    /// a flush another thread holds.
    #[test]
    fn loom_failure_and_stop_wake_waiters() {
        loom::model(|| {
            let log = log(1, 1, 0);
            assert!(log.group.claimed[0].compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok());
            let waiter = {
                let log = log.clone();
                thread::spawn(move || {
                    let lsn = append(&log, 0);
                    log.group.wait_partition(0, lsn)
                })
            };
            let stopper = { let log = log.clone(); thread::spawn(move || log.group.stop()) };
            log.group.fail("disk gone".into());
            stopper.join().unwrap();
            let result = waiter.join().unwrap();
            match result {
                Err(TxnError::LogFailed(why)) => assert_eq!(why, "disk gone"),
                Err(TxnError::Closed) => {}
                other => panic!("waiter returned {other:?} with nothing written"),
            }
        });
    }
}
