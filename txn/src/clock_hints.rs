//! Whether a thread's next transaction should begin in clock mode.
//!
//! Clock mode (see [`crate::transaction`]) saves a stripe word per read while no commit happens
//! during the transaction, but it has a price at its start: to know that no write-back is in
//! flight, a beginning transaction reads the commit gate's counter of every thread slot
//! ([`CommitGate::is_idle`](crate::snapshot::gate::CommitGate::is_idle)), one cache line
//! each, which every committing thread writes. Where commits are frequent the clock moves
//! under most transactions anyway, which then change to stripe mode having paid for the scan
//! and for their clock checks, and the scans pull the counters' lines away from their
//! committers: on the 16-core device host, with 16 threads of the Hathi workload (durability
//! off), beginning and restarting took 29% of the time.
//!
//! So each thread slot keeps a hint: after [`BUSY_STREAK`] of its begins in a row found a
//! commit writing back (the scan said no, and the transaction began in stripe mode anyway),
//! the next [`SKIPPED_BEGINS`] begins start in stripe mode without the scan; then one scans
//! again. A begin that found the gate idle ends the streak. (Counting the clock's moves under
//! clock-mode transactions instead gained less at 16 threads: 5.97 M against 6.98 M Hathi
//! transactions/s, BENCHMARKS.md, "16 cores".) Where begins find the gate idle, as a single
//! thread's do, a begin costs a load of the hint more than before, and the skip's path is
//! kept out of line (inline, it cost single-threaded 1-key B-link inserts 7-9% here).
//! Stripe mode is always correct, so a hint only costs or saves time: threads whose slots
//! collide share a hint, and a hint's stores are plain, owner-written, relaxed.
//!
//! A transaction that begins in stripe mode this way does not read the clock either (that
//! load missed too: every commit writes the clock's line). Its read version is the last clock
//! value its slot saw — its own last commit's LSN, or the clock as an extension or a begin
//! that found a commit writing back read it. Any value the clock once had is a sound read
//! version (TL2's argument: every commit with an LSN at or below it had locked its write set
//! when it was drawn, so a stripe it wrote reads as locked or with its new version); an older
//! one only makes a read of a line written since extend (reading the clock then) where a fresh
//! one would not have. The value is stored
//! with release after the clock's read or draw, and loaded with acquire, so that a thread whose
//! slot another thread's value reaches is ordered after that clock value's commits as well.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// Begins in a row that found a commit writing back before begins skip the scan.
pub const BUSY_STREAK: u32 = 4;
/// Begins that then start in stripe mode before one tries clock mode again.
pub const SKIPPED_BEGINS: u32 = 64;

/// Hints per engine (a thread uses the one of its slot modulo this).
const SLOTS: usize = 64;

#[repr(align(128))]
struct Hint {
    /// Low byte: the streak; above it: begins left to skip.
    word: AtomicU32,
    /// The last clock value the slot saw.
    version: AtomicU64,
}

pub struct ClockHints {
    hints: Box<[Hint]>,
}

impl ClockHints {
    /// Hints of an engine whose clock starts at `clock`.
    pub fn new(clock: u64) -> ClockHints {
        ClockHints { hints: (0..SLOTS).map(|_| Hint { word: AtomicU32::new(0), version: AtomicU64::new(clock) }).collect() }
    }

    fn hint(&self, thread_slot: usize) -> &AtomicU32 {
        &self.hints[thread_slot % SLOTS].word
    }

    /// A read version for a transaction that begins on `thread_slot` in stripe mode: the last
    /// clock value the slot saw (see the module docs).
    #[inline]
    pub fn version(&self, thread_slot: usize) -> u64 {
        self.hints[thread_slot % SLOTS].version.load(Acquire)
    }

    /// `thread_slot` read or drew `clock` (kept where newer than what the slot saw).
    #[inline]
    pub fn saw(&self, thread_slot: usize, clock: u64) {
        let version = &self.hints[thread_slot % SLOTS].version;
        if version.load(Relaxed) < clock {
            version.store(clock, Release);
        }
    }

    /// Whether the transaction that begins now on `thread_slot` should try clock mode (and so
    /// read the gate's counters); counts down a skip.
    #[inline]
    pub fn try_clock_mode(&self, thread_slot: usize) -> bool {
        let hint = self.hint(thread_slot);
        let h = hint.load(Relaxed);
        let skips = h >> 8;
        if skips == 0 {
            return true;
        }
        hint.store((skips - 1) << 8, Relaxed);
        false
    }

    /// A begin on `thread_slot` that scanned the gate found it `idle`, or not.
    #[inline]
    pub fn begun(&self, thread_slot: usize, idle: bool) {
        let hint = self.hint(thread_slot);
        let h = hint.load(Relaxed);
        if idle {
            if h != 0 {
                hint.store(0, Relaxed);
            }
            return;
        }
        let streak = (h & 0xff) + 1;
        hint.store(if streak >= BUSY_STREAK { SKIPPED_BEGINS << 8 } else { streak }, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_of_busy_begins_skips_then_tries_again() {
        let hints = ClockHints::new(0);
        for _ in 0..BUSY_STREAK - 1 {
            hints.begun(3, false);
            assert!(hints.try_clock_mode(3), "below the streak clock mode is tried");
        }
        hints.begun(3, false);
        for i in 0..SKIPPED_BEGINS {
            assert!(!hints.try_clock_mode(3), "begin {i} of the skip");
            assert!(hints.try_clock_mode(4), "another slot's hint is its own");
        }
        assert!(hints.try_clock_mode(3), "tried again after the skip");
    }

    #[test]
    fn a_slot_keeps_the_newest_clock_it_saw() {
        let hints = ClockHints::new(7);
        assert_eq!(hints.version(5), 7, "the clock at the start");
        hints.saw(5, 12);
        hints.saw(5, 9);
        assert_eq!(hints.version(5), 12);
        assert_eq!(hints.version(6), 7, "another slot's is its own");
    }

    #[test]
    fn a_begin_that_finds_the_gate_idle_ends_the_streak() {
        let hints = ClockHints::new(0);
        for _ in 0..3 {
            for _ in 0..BUSY_STREAK - 1 {
                hints.begun(0, false);
            }
            hints.begun(0, true);
        }
        assert!(hints.try_clock_mode(0), "no streak of {BUSY_STREAK} busy begins in a row");
    }
}
