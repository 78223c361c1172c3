//! The core of group commit, shared by committers, waiters and the writer thread: the
//! durable watermark, and the rendezvous where waiters sleep until the writer (or a failure,
//! or shutdown) wakes them. Kept apart from the writer's threads and I/O so that the loom
//! models (below) check exactly this code.

use std::sync::atomic::Ordering;

use super::partition::Partition;
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex};
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

/// Where waiters for durability sleep, and why they might never be satisfied (log failure,
/// writer stopped).
pub struct Progress {
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// The writer stopped: nothing more becomes durable.
    stopped: AtomicBool,
    wake: Mutex<()>,
    cond: Condvar,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            stopped: AtomicBool::new(false),
            wake: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// Records the first failure and wakes every waiter to report it.
    pub fn fail(&self, why: String) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(why);
        }
        self.failed.store(true, Ordering::SeqCst);
        drop(f);
        self.notify();
    }

    pub fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().clone()
    }

    /// The writer stopped: wakes every waiter to give up.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Wakes every waiter (under the wake mutex, so no waiter misses it: a waiter checks its
    /// condition and goes to sleep without releasing that mutex in between).
    pub fn notify(&self) {
        let _g = self.wake.lock();
        self.cond.notify_all();
    }

    /// Blocks until `done()` holds, or the log failed or stopped. `kick` asks the writer for
    /// a flush before each sleep.
    pub fn wait_until(&self, done: impl Fn() -> bool, kick: impl Fn()) -> Result<(), TxnError> {
        let mut guard = self.wake.lock();
        loop {
            if done() {
                return Ok(());
            }
            if let Some(why) = self.failure() {
                return Err(TxnError::LogFailed(why));
            }
            if self.is_stopped() {
                return Err(TxnError::Closed);
            }
            kick();
            self.cond.wait(&mut guard);
        }
    }
}

/// Loom models of group commit (run by .ci/loom): the real [`Partition`], [`Watermark`] and
/// [`Progress`], with a model writer thread standing in for the I/O of `writer.rs` (take
/// every partition's buffer, "write" it, mark it written, advance, notify: the order of
/// `Writer::round`).
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::Arc;

    use loom::thread;

    use super::*;
    use crate::log::partition::Partition;

    /// LSNs 1..=N, each flagged once the model writer has "written" it.
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

    struct Log {
        clock: AtomicU64,
        partitions: Vec<Partition>,
        watermark: Watermark,
        progress: Progress,
        disk: Disk,
    }

    fn log(partitions: usize, records: usize) -> Arc<Log> {
        Arc::new(Log {
            clock: AtomicU64::new(0),
            partitions: (0..partitions).map(|_| Partition::default()).collect(),
            watermark: Watermark::new(0),
            progress: Progress::new(),
            disk: Disk::new(records),
        })
    }

    /// Appends one record to `partition` (the LSN is the record).
    fn append(log: &Log, partition: usize) -> u64 {
        log.partitions[partition].append(&log.clock, |buf, lsn| buf.extend_from_slice(&lsn.to_le_bytes())).0
    }

    /// The model writer: rounds until `records` LSNs are durable.
    fn writer(log: &Log, records: u64) {
        loop {
            for p in &log.partitions {
                if let Some(taken) = p.take() {
                    for rec in taken.data.chunks(8) {
                        let lsn = u64::from_le_bytes(rec.try_into().unwrap());
                        assert!(lsn >= taken.first && lsn <= taken.last);
                        log.disk.written[lsn as usize].store(true, Ordering::SeqCst);
                    }
                    p.written(taken);
                }
            }
            log.watermark.advance(&log.clock, &log.partitions);
            let durable = log.watermark.get();
            assert!(log.disk.holds_all_through(durable), "watermark {durable} passed an unwritten LSN");
            log.progress.notify();
            if durable >= records {
                return;
            }
            thread::yield_now();
        }
    }

    /// Sync commit: wait for the global watermark, then check what it promises.
    fn commit_sync(log: &Log, partition: usize) {
        let lsn = append(log, partition);
        log.progress.wait_until(|| log.watermark.get() >= lsn, || {}).unwrap();
        let durable = log.watermark.get();
        assert!(durable >= lsn);
        assert!(log.disk.holds_all_through(durable), "is_stable({durable}) before every lower LSN was written");
    }

    /// Partition commit: wait for this partition only.
    fn commit_partition(log: &Log, partition: usize) {
        let lsn = append(log, partition);
        let p = &log.partitions[partition];
        log.progress.wait_until(|| p.durable() >= lsn, || {}).unwrap();
        assert!(log.disk.written[lsn as usize].load(Ordering::SeqCst), "partition durable before its record was written");
    }

    /// Two committers on two partitions, one Sync and one Partition, and the writer: the
    /// watermark never passes an LSN not yet written (whichever partition flushes first),
    /// and no waiter sleeps through the flush that satisfies it (loom reports a deadlock).
    #[test]
    fn loom_watermark_and_group_commit_wakeups() {
        loom::model(|| {
            let log = log(2, 2);
            let a = { let log = log.clone(); thread::spawn(move || commit_sync(&log, 0)) };
            let b = { let log = log.clone(); thread::spawn(move || commit_partition(&log, 1)) };
            writer(&log, 2);
            a.join().unwrap();
            b.join().unwrap();
            assert_eq!(log.watermark.get(), 2);
        });
    }

    /// Two Sync committers share one partition: one flush may serve both (group commit), a
    /// record appended while the previous buffer is in flight waits for the next round, and
    /// both waiters are woken.
    #[test]
    fn loom_group_commit_on_one_partition() {
        loom::model(|| {
            let log = log(1, 2);
            let a = { let log = log.clone(); thread::spawn(move || commit_sync(&log, 0)) };
            let b = { let log = log.clone(); thread::spawn(move || commit_sync(&log, 0)) };
            writer(&log, 2);
            a.join().unwrap();
            b.join().unwrap();
        });
    }

    /// A waiter is woken by a failure or a shutdown that happens while it goes to sleep.
    #[test]
    fn loom_failure_and_stop_wake_waiters() {
        loom::model(|| {
            let log = log(1, 1);
            let waiter = {
                let log = log.clone();
                thread::spawn(move || {
                    let lsn = append(&log, 0);
                    log.progress.wait_until(|| log.watermark.get() >= lsn, || {})
                })
            };
            let stopper = { let log = log.clone(); thread::spawn(move || log.progress.stop()) };
            log.progress.fail("disk gone".into());
            stopper.join().unwrap();
            match waiter.join().unwrap() {
                Err(TxnError::LogFailed(why)) => assert_eq!(why, "disk gone"),
                Err(TxnError::Closed) => {}
                other => panic!("waiter returned {other:?} with nothing written"),
            }
        });
    }
}
