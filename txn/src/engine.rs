//! What a store shares between its threads: the heap, the stripe locks, the LSN clock,
//! the log, and the dirty epoch.

#[cfg(not(loom))]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use tusk_storage::log_files::SegmentInfo;
use tusk_storage::log_format::{RecordEncoder, RecordHeader};
use tusk_storage::Heap;

use crate::clock_hints::ClockHints;
use crate::in_place::{LockWait, Runs};
use crate::log::{LogConfig, LogManager};
use crate::snapshot::gate::CommitGate;
use crate::stripes::{is_locked, Stripes, STRIPE_BYTES};
use crate::sync::{AtomicBool, AtomicU64};
use crate::growth::Growth;
use crate::TxnError;

/// Longest a chunk copy waits for one stripe while holding others (see `copy_locked`): far
/// longer than a commit's write-back, far shorter than an in-place run's `LOCK_WAIT`.
const COPY_HOLD_AND_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// The first nap of a wait, holding nothing, for a stripe that stayed locked (see
/// `Engine::wait_unlocked`); each later nap is one `STRIPE_NAP_FIRST` longer, up to
/// `STRIPE_NAP_MAX` (the most a waiter oversleeps the stripe's release).
#[cfg(not(loom))]
const STRIPE_NAP_FIRST: std::time::Duration = std::time::Duration::from_micros(20);
#[cfg(not(loom))]
const STRIPE_NAP_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// The log partition every commit that waits for its flush appends to (see
/// [`Engine::partition_for_commit`]); it is also a partition some threads' `Async` commits use.
pub const WAITING_PARTITION: usize = 0;

pub struct EngineConfig {
    /// `2^stripes_log2` stripe locks.
    pub stripes_log2: u32,
    /// `None` runs without durability (`Durability::Off`).
    pub log: Option<LogConfig>,
    /// The log segments already on disk (from recovery).
    pub existing_segments: Vec<SegmentInfo>,
}

pub struct Engine {
    heap: Heap,
    pub(crate) stripes: Stripes,
    /// The last LSN drawn, also the STM's version clock. Every commit writes it and every
    /// begin reads it: on a cache line of its own, so that no other data shares its misses.
    pub(crate) clock: Arc<CachePadded<AtomicU64>>,
    pub(crate) log: Option<LogManager>,
    dirty_epoch: AtomicU64,
    closed: AtomicBool,
    /// Commit write-back passes it; snapshots close it (see [`crate::snapshot::gate`]).
    pub(crate) gate: CommitGate,
    /// The in-place states (their buffers, and the retries waiting for one; see
    /// [`crate::in_place`]).
    pub(crate) in_place: Runs,
    /// How far brk went, for the thread that populates the heap ahead of it.
    growth: Growth,
    /// Per thread slot: whether its next transaction tries clock mode.
    pub(crate) clock_hints: ClockHints,
}

/// Rounds of an optimistic chunk copy (each copies again only the lines that changed)
/// before the copy locks the chunk's stripes. Few under loom, whose state space each round
/// multiplies.
#[cfg(not(loom))]
const OPTIMISTIC_COPY_ROUNDS: usize = 64;
#[cfg(loom)]
const OPTIMISTIC_COPY_ROUNDS: usize = 2;

/// The count of thread slots handed out, which every begin reads (the gate's idle check):
/// on a cache line of its own. Unpadded, the linker put it beside `foldhash`'s global seed
/// counter, which every new hash map state of that crate writes.
#[cfg(not(loom))]
static NEXT_THREAD_SLOT: CachePadded<AtomicUsize> = CachePadded::new(AtomicUsize::new(0));

#[cfg(not(loom))]
thread_local! {
    static THREAD_SLOT: usize = NEXT_THREAD_SLOT.fetch_add(1, Ordering::Relaxed);
}

// Under loom, slots are drawn per execution and per model thread: loom runs a model's threads
// as coroutines on one OS thread and an execution after another, so std's thread-locals and
// statics would hand every model thread the same slot and a count that grows from one
// execution to the next (making the gate's idle check load a different number of counters
// each time: loom stops with "Is the model fully deterministic?").
#[cfg(loom)]
loom::lazy_static! {
    static ref NEXT_THREAD_SLOT: loom::sync::atomic::AtomicUsize = loom::sync::atomic::AtomicUsize::new(0);
}

#[cfg(loom)]
loom::thread_local! {
    static THREAD_SLOT: usize = NEXT_THREAD_SLOT.fetch_add(1, Ordering::Relaxed);
}

impl Engine {
    /// Starts an engine over `heap`, whose state includes every LSN ≤ `last_lsn`.
    pub fn start(config: EngineConfig, heap: Heap, last_lsn: u64) -> Result<Engine, TxnError> {
        let clock = Arc::new(CachePadded::new(AtomicU64::new(last_lsn)));
        let log = match config.log {
            Some(log) => Some(LogManager::start(log, clock.clone(), config.existing_segments)?),
            None => None,
        };
        let in_place = Runs::new(1u64 << config.stripes_log2, heap.capacity());
        Ok(Engine {
            heap,
            stripes: Stripes::new(config.stripes_log2)?,
            clock,
            log,
            dirty_epoch: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            gate: CommitGate::new(),
            in_place,
            growth: Growth::default(),
            clock_hints: ClockHints::new(last_lsn),
        })
    }

    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// Where the allocator reports brk's moves (see [`crate::growth`]).
    pub fn growth(&self) -> &Growth {
        &self.growth
    }

    /// The LSN of the last committed update transaction.
    pub fn last_lsn(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// A read version for a new transaction, and whether the heap holds exactly the commits
    /// up to it right now (no write-back of one of them still running), so the transaction
    /// may read in clock mode (see [`crate::transaction`]). The clock is read first: see
    /// [`CommitGate::is_idle`](crate::snapshot::gate::CommitGate::is_idle).
    pub(crate) fn read_version(&self) -> (u64, bool) {
        let rv = self.last_lsn();
        // A thread takes its slot before its first commit enters the gate, so a slot of a
        // commit the clock covers is below this count (the clock's acquire orders the load).
        let used = NEXT_THREAD_SLOT.load(Ordering::Relaxed);
        (rv, self.gate.is_idle(used))
    }

    /// [`Engine::read_version`] for a transaction that begins: where this thread's begins
    /// keep finding a commit writing back, it begins in stripe mode, reading neither the gate
    /// nor the clock (see [`crate::clock_hints`]).
    #[inline]
    pub(crate) fn begin_version(&self) -> (u64, bool) {
        let slot = self.thread_slot();
        if !self.clock_hints.try_clock_mode(slot) {
            return self.begin_stale(slot);
        }
        let (rv, idle) = self.read_version();
        if !idle {
            self.clock_hints.saw(slot, rv);
        }
        self.clock_hints.begun(slot, idle);
        (rv, idle)
    }

    /// A begin the hint sends to stripe mode: the slot's last clock value as read version.
    #[cold]
    #[inline(never)]
    fn begin_stale(&self, slot: usize) -> (u64, bool) {
        (self.clock_hints.version(slot), false)
    }

    /// Whether no LSN was drawn since `rv`, checked after the caller's heap loads (seqlock
    /// style: a commit draws its LSN, fences, then writes back, so a load that saw one of its
    /// stores makes this see its LSN).
    #[inline]
    pub(crate) fn clock_still(&self, rv: u64) -> bool {
        crate::sync::fence(Ordering::Acquire);
        self.clock.load(Ordering::Relaxed) == rv
    }

    /// Every LSN ≤ this is durable (0 without durability).
    pub fn durable_lsn(&self) -> u64 {
        self.log.as_ref().map_or(0, |l| l.durable_lsn())
    }

    /// Whether `lsn` and every lower LSN are durable; with `wait`, blocks until they are
    /// (returns false at once without durability, or when the log failed).
    pub fn is_stable(&self, lsn: u64, wait: bool) -> bool {
        let Some(log) = &self.log else { return false };
        if log.durable_lsn() >= lsn {
            return true;
        }
        wait && log.wait_durable(lsn).is_ok()
    }

    /// The calling thread's slot (spreads per-thread state such as gate counters).
    pub(crate) fn thread_slot(&self) -> usize {
        THREAD_SLOT.with(|s| *s)
    }

    /// The log partition a commit appends to: a commit that waits for its record's flush
    /// (`waits`: `Sync`, `Partition`) appends to [`WAITING_PARTITION`], whatever its thread, so
    /// that concurrent waiters share one flush; one that does not wait (`Async`) appends to its
    /// thread's partition. On a disk where fdatasyncs of several files side by side cost
    /// several times one, waiters each leading a flush of their own partition did not group:
    /// 16 threads committing `Sync` reached 3.7x one thread on the 16-core device host
    /// (BENCHMARKS.md, "16 cores").
    pub fn partition_for_commit(&self, waits: bool) -> usize {
        if waits {
            WAITING_PARTITION
        } else {
            self.partition_of_current_thread()
        }
    }

    /// The log partition the calling thread appends to when it does not wait.
    pub fn partition_of_current_thread(&self) -> usize {
        let parts = self.log.as_ref().map_or(1, |l| l.partitions());
        THREAD_SLOT.with(|s| *s % parts)
    }

    /// The epoch commit write-back stamps pages with.
    pub fn dirty_epoch(&self) -> u64 {
        self.dirty_epoch.load(Ordering::Acquire)
    }

    /// Starts a new dirty epoch; returns the one that ended. Pages stamped with an epoch ≤ the
    /// returned one were written before the call returned.
    pub fn advance_dirty_epoch(&self) -> u64 {
        self.dirty_epoch.fetch_add(1, Ordering::AcqRel)
    }

    pub fn log_backend_name(&self) -> Option<String> {
        self.log.as_ref().map(|l| l.backend_name())
    }

    pub fn log_partitions(&self) -> usize {
        self.log.as_ref().map_or(0, |l| l.partitions())
    }

    pub(crate) fn check_open(&self) -> Result<(), TxnError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(TxnError::Closed);
        }
        if let Some(why) = self.log.as_ref().and_then(|l| l.failure()) {
            return Err(TxnError::LogFailed(why));
        }
        Ok(())
    }

    /// Appends a recovery marker (LSNs in `(from, to]` resolved) and waits until it is
    /// durable. The clock must stand at `to`, so the marker takes LSN `to + 1`.
    pub fn append_marker(&self, from: u64, to: u64) -> Result<u64, TxnError> {
        assert_eq!(self.last_lsn(), to, "a marker directly follows the LSNs it resolves");
        let Some(log) = &self.log else { return Ok(self.clock.fetch_add(1, Ordering::SeqCst) + 1) };
        let (lsn, _) = log.append(0, true, |buf, lsn| {
            RecordEncoder::begin(buf, RecordHeader { lsn, partition: 0, flags: 0, void: Some((from, to)) }).finish(buf);
        });
        log.wait_durable(lsn)?;
        Ok(lsn)
    }

    /// Copies `out.len()` bytes at `off` consistently with all transactions and returns the
    /// LSN that orders the copy: it holds every write of LSNs below and none above (Hathi's
    /// chunk copy). The LSN is drawn and logged as an empty record, so it is gapless like
    /// any other. Writers are not held up: the copy is optimistic (seqlock style) and falls
    /// back to locking the range's stripes only after a few copies raced with writers.
    pub fn copy_consistent(&self, off: u64, out: &mut [u8]) -> Result<u64, TxnError> {
        self.check_open()?;
        let lines = (out.len() as u64).div_ceil(STRIPE_BYTES) as usize;
        let stripes: Vec<u32> = (0..lines as u64).map(|i| self.stripes.index_of(off + i * STRIPE_BYTES)).collect();
        match self.copy_optimistic(off, out, &stripes) {
            Some(lsn) => Ok(lsn),
            None => Ok(self.copy_locked(off, out, stripes)),
        }
    }

    /// The optimistic copy, in rounds: note the stripe words of the lines to copy, copy those
    /// lines, draw an LSN, then check every line's stripe word against the one noted before
    /// its copy; the lines whose word changed (or was locked) are copied again in the next
    /// round. When a check finds no change the copy is consistent at that round's LSN: each
    /// line's word stayed the same from before its copy until after the LSN was drawn, so a
    /// transaction reflected in the line had unlocked its stripe (and taken its LSN) before,
    /// and one not reflected locks the stripe only after the check — after the LSN, which
    /// comes from one read-modify-write counter. A busy chunk thus costs a copy of its busy
    /// lines per round instead of a whole copy per try. `None`: still changing after
    /// [`OPTIMISTIC_COPY_ROUNDS`].
    fn copy_optimistic(&self, off: u64, out: &mut [u8], stripes: &[u32]) -> Option<u64> {
        let line = STRIPE_BYTES as usize;
        let mut seen = vec![0u64; stripes.len()];
        let mut todo: Vec<usize> = (0..stripes.len()).collect();
        for _ in 0..OPTIMISTIC_COPY_ROUNDS {
            for &i in &todo {
                seen[i] = self.stripes.load(stripes[i]);
            }
            // Runs of neighbouring lines go as one copy (the first round: the whole range).
            let mut k = 0;
            while k < todo.len() {
                let mut end = k + 1;
                while end < todo.len() && todo[end] == todo[end - 1] + 1 {
                    end += 1;
                }
                let from = todo[k] * line;
                let to = (todo[end - 1] * line + line).min(out.len());
                self.heap.read_bytes(off + from as u64, &mut out[from..to]);
                k = end;
            }
            let lsn = self.draw_empty_lsn();
            // A wasted LSN (a line changed) is harmless: its empty record is logged all the same.
            todo.clear();
            todo.extend((0..stripes.len()).filter(|&i| is_locked(seen[i]) || self.stripes.recheck(stripes[i]) != seen[i]));
            if todo.is_empty() {
                return Some(lsn);
            }
        }
        None
    }

    /// The copy under the range's stripe locks (writers of the range wait or retry).
    fn copy_locked(&self, off: u64, out: &mut [u8], mut stripes: Vec<u32>) -> u64 {
        // Sorted: commits lock stripes in ascending order too, so they and this copy never
        // deadlock, and a commit holds its stripes for microseconds. An in-place run holds
        // its stripes to its end and takes them in any order: a copy that waited for one of
        // them while holding others could hold a stripe the run needs, and the run would
        // give up after `LOCK_WAIT` and start over (a 64 M-key load losing all its work to a
        // checkpoint). So a stripe still locked after `COPY_HOLD_AND_WAIT` makes the copy
        // let go of every stripe it holds and wait for that one holding none.
        stripes.sort_unstable();
        stripes.dedup();
        let mut seen = Vec::with_capacity(stripes.len());
        'acquire: loop {
            seen.clear();
            for &s in &stripes {
                let mut wait = LockWait::with_limit(COPY_HOLD_AND_WAIT);
                loop {
                    let w = self.stripes.load(s);
                    if !is_locked(w) && self.stripes.try_lock(s, w) {
                        seen.push(w);
                        break;
                    }
                    if !wait.again() {
                        for (&held, &w) in stripes.iter().zip(&seen) {
                            self.stripes.unlock_restore(held, w);
                        }
                        // Held past `COPY_HOLD_AND_WAIT`: most likely by an in-place run, to
                        // its end (seconds).
                        self.wait_unlocked(s, None);
                        continue 'acquire;
                    }
                }
            }
            break;
        }
        self.heap.read_bytes(off, out);
        let lsn = self.draw_empty_lsn();
        // Nothing was written: the stripes keep their versions, so no reader is disturbed.
        for (&s, &w) in stripes.iter().zip(&seen) {
            self.stripes.unlock_restore(s, w);
        }
        lsn
    }

    /// Waits, holding nothing, until stripe `s` is unlocked (false once `limit` has passed): for a
    /// stripe that stayed locked past a short spin, most likely held by an in-place run to its
    /// end (seconds). Yielding in a loop kept a core busy that the run and the log writer share
    /// on small machines; naps growing to `STRIPE_NAP_MAX` leave it to them.
    pub(crate) fn wait_unlocked(&self, s: u32, limit: Option<std::time::Duration>) -> bool {
        #[cfg(not(loom))]
        let (mut naps, since) = (0u32, std::time::Instant::now());
        #[cfg(loom)]
        let _ = limit;
        while is_locked(self.stripes.load(s)) {
            crate::sync::spin_loop();
            #[cfg(not(loom))]
            {
                if limit.is_some_and(|limit| since.elapsed() > limit) {
                    return false;
                }
                naps += 1;
                std::thread::sleep(STRIPE_NAP_FIRST.saturating_mul(naps).min(STRIPE_NAP_MAX));
            }
        }
        true
    }

    /// Takes the next LSN for a record without writes (logged when durability is on).
    pub(crate) fn draw_empty_lsn(&self) -> u64 {
        match &self.log {
            Some(log) => {
                let partition = self.partition_of_current_thread();
                log.append(partition, false, |buf, lsn| {
                    RecordEncoder::begin(buf, RecordHeader { lsn, partition: partition as u32, flags: 0, void: None }).finish(buf);
                })
                .0
            }
            None => self.clock.fetch_add(1, Ordering::SeqCst) + 1,
        }
    }

    /// The log, when durability is on.
    pub fn log(&self) -> Option<&LogManager> {
        self.log.as_ref()
    }

    /// Flushes the log and stops its writer; later commits fail with `Closed`.
    pub fn close(&self) -> Result<(), TxnError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match &self.log {
            Some(log) => log.close(),
            None => Ok(()),
        }
    }

    /// Stops the log writer without flushing: the on-disk state a crash would leave.
    pub fn abandon(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(log) = &self.log {
            log.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transaction::Commit;

    const SPAN: u64 = 64 << 10;

    fn engine() -> Engine {
        let config = EngineConfig { stripes_log2: 12, log: None, existing_segments: Vec::new() };
        Engine::start(config, Heap::new(1 << 20).unwrap(), 0).unwrap()
    }

    /// One writer keeps setting three words far apart in the range to the same counter while
    /// `copy` runs; every copy must show one committed state, exactly the one its LSN orders:
    /// the counter of the last commit with a lower LSN.
    fn copies_are_consistent_at_their_lsn(copy: impl Fn(&Engine, &mut [u8]) -> u64) {
        let engine = engine();
        let words = [0, SPAN / 2 + 8, SPAN - 8];
        let stop = AtomicBool::new(false);
        let progress = AtomicU64::new(0);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut commits = Vec::new();
                for k in 1u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let lsn = loop {
                        let mut tx = engine.begin();
                        let stored = words.iter().try_for_each(|&w| tx.store(w, k));
                        // A locked copy holds the stripes for a moment: retry like `transact` does.
                        match stored.and_then(|()| tx.commit(Commit::Async)) {
                            Ok(lsn) => break lsn.unwrap(),
                            Err(TxnError::Conflict) => continue,
                            Err(e) => panic!("commit failed: {e}"),
                        }
                    };
                    commits.push((lsn, k));
                    progress.store(k, Ordering::Relaxed);
                }
                commits
            });
            // Stops the writer however this thread leaves (a failed assertion included), so
            // the scope can join it.
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let stopper = StopOnDrop(&stop);
            let mut buf = vec![0u8; SPAN as usize];
            let mut copies = Vec::new();
            // Copies must overlap a good stretch of commits, not just the writer's start-up.
            let started = std::time::Instant::now();
            let mut overlapped = 0;
            while (copies.len() < 300 || overlapped < 50) && !writer.is_finished() && started.elapsed().as_secs() < 30 {
                let lsn = copy(&engine, &mut buf);
                let at = |w: u64| u64::from_le_bytes(buf[w as usize..w as usize + 8].try_into().unwrap());
                let values: Vec<u64> = words.iter().map(|&w| at(w)).collect();
                assert!(values.iter().all(|&v| v == values[0]), "torn copy at LSN {lsn}: {values:?}");
                // The writer committed both before and after this copy's state.
                if values[0] > 0 && values[0] < progress.load(Ordering::Relaxed) {
                    overlapped += 1;
                }
                copies.push((lsn, values[0]));
            }
            drop(stopper);
            let commits = writer.join().unwrap();
            assert!(overlapped >= 50, "only {overlapped} copies ran while the writer did");
            for (lsn, seen) in copies {
                // One writer: its commits ascend by LSN (a binary search, not a scan per copy).
                let below = commits.partition_point(|&(l, _)| l < lsn);
                let expected = below.checked_sub(1).map_or(0, |i| commits[i].1);
                assert_eq!(seen, expected, "copy with LSN {lsn} does not hold exactly the commits below it");
            }
        });
    }

    /// Both copy paths, one after the other: run side by side they would share the two cores
    /// four ways and take many times as long.
    #[test]
    fn chunk_copies_are_consistent_at_their_lsn() {
        copies_are_consistent_at_their_lsn(|e, buf| e.copy_consistent(0, buf).unwrap());
        copies_are_consistent_at_their_lsn(|e, buf| {
            let stripes = (0..SPAN / STRIPE_BYTES).map(|i| e.stripes.index_of(i * STRIPE_BYTES)).collect();
            e.copy_locked(0, buf, stripes)
        });
    }
}
