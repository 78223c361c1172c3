//! The snapshot gate: commit write-back passes it, a snapshot closes it.
//!
//! A committing transaction enters the gate just before it draws its LSN and leaves once its
//! write-back (heap stores and dirty stamps) is done. Closing the gate stops new entries and
//! waits until every transaction inside has left: then the heap holds exactly the commits
//! with LSN ≤ the clock, and nothing of any later one — the one state a snapshot needs.
//!
//! Entering costs one atomic add on a per-thread-slot counter (its own cache line), a fence
//! and one load of the `closed` flag; the closer sets the flag, fences, and then reads every
//! counter. With a SeqCst fence between each side's store and load (Dekker), either the
//! committer sees the flag and backs out, or the closer sees the counter and waits for it.
//! (Fences rather than SeqCst accesses, which give the same guarantee in the C++ model:
//! loom models SeqCst accesses only as acquire/release, so with them its model of this file
//! failed; with fences, which it models exactly, it passes.) Transactions wait at a closed
//! gate while still holding their stripe locks; the closer never takes stripe locks, so no
//! cycle forms.

use crate::sync::{fence, AtomicBool, AtomicU64, Mutex};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

/// Counters per gate (threads share one when their slots collide, which costs only
/// contention).
#[cfg(not(loom))]
const SLOTS: usize = 64;
#[cfg(loom)]
const SLOTS: usize = 2;

/// Spins before a waiter starts yielding its core to the copy it waits for.
const SPINS_BEFORE_YIELD: u32 = 64;

#[repr(align(128))]
struct Slot(AtomicU64);

pub struct CommitGate {
    slots: Box<[Slot]>,
    closed: AtomicBool,
    /// One closer at a time (two snapshots taken at once queue here).
    closer: Mutex<()>,
}

/// A committer's pass through an open gate; leaves the gate when dropped.
pub struct Pass<'g> {
    slot: &'g AtomicU64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Release);
    }
}

/// The gate held closed; opens again when dropped.
pub struct Closed<'g> {
    gate: &'g CommitGate,
    _closer: crate::sync::MutexGuard<'g, ()>,
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        self.gate.closed.store(false, Release);
    }
}

impl Default for CommitGate {
    fn default() -> Self {
        Self::new()
    }
}

impl CommitGate {
    pub fn new() -> CommitGate {
        CommitGate { slots: (0..SLOTS).map(|_| Slot(AtomicU64::new(0))).collect(), closed: AtomicBool::new(false), closer: Mutex::new(()) }
    }

    /// Enters (waiting while the gate is closed). `thread_slot` picks the counter.
    #[inline]
    pub fn enter(&self, thread_slot: usize) -> Pass<'_> {
        let slot = &self.slots[thread_slot % SLOTS].0;
        loop {
            slot.fetch_add(1, Relaxed);
            fence(SeqCst);
            if !self.closed.load(Relaxed) {
                return Pass { slot };
            }
            slot.fetch_sub(1, Release);
            wait_while(|| self.closed.load(Acquire));
        }
    }

    /// Whether no committer is inside through the counters of the first `used` thread slots
    /// (those handed out so far). Read after the LSN clock, a true answer means every commit
    /// the clock covers has finished its write-back and its stores are visible: a commit
    /// enters the gate before it draws its LSN (a release RMW of the clock), so a reader that
    /// saw the LSN sees the increment, and zero then comes from the commit's release of it.
    #[inline]
    pub fn is_idle(&self, used: usize) -> bool {
        self.slots[..used.min(SLOTS)].iter().all(|slot| slot.0.load(Acquire) == 0)
    }

    /// Whether the gate is closed or being closed (a hint: it may open or close right after).
    #[inline]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }

    /// Closes the gate and waits until no committer is inside.
    pub fn close(&self) -> Closed<'_> {
        let closer = self.closer.lock();
        self.closed.store(true, Relaxed);
        fence(SeqCst);
        for slot in self.slots.iter() {
            // Acquire: pairs with the Release of a leaving pass, so its write-back is visible.
            wait_while(|| slot.0.load(Acquire) != 0);
        }
        Closed { gate: self, _closer: closer }
    }
}

fn wait_while(busy: impl Fn() -> bool) {
    let mut spins = 0u32;
    while busy() {
        if spins < SPINS_BEFORE_YIELD {
            spins += 1;
            crate::sync::spin_loop();
        } else {
            #[cfg(not(loom))]
            std::thread::yield_now();
            #[cfg(loom)]
            crate::sync::spin_loop();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn close_waits_for_passes_and_holds_new_ones() {
        let gate = CommitGate::new();
        let pass = gate.enter(3);
        let entered = AtomicBool::new(false);
        std::thread::scope(|s| {
            let closer = s.spawn(|| {
                let closed = gate.close();
                // No pass is out while closed: the one below waits for us.
                std::thread::sleep(std::time::Duration::from_millis(20));
                assert!(!entered.load(SeqCst), "a committer passed a closed gate");
                drop(closed);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!closer.is_finished(), "close returned while a pass was out");
            drop(pass);
            // Wait until the closer holds the gate, then try to enter.
            while !gate.closed.load(SeqCst) {
                std::hint::spin_loop();
            }
            let _again = gate.enter(3);
            entered.store(true, SeqCst);
            closer.join().unwrap();
        });
    }
}

/// Loom model of the gate (run by .ci/loom).
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::Arc;

    use loom::sync::atomic::AtomicU64;
    use loom::thread;

    use super::*;

    /// A committer writes two words inside a pass; a closer reads both while the gate is
    /// closed. The closer sees both writes or neither (never half a write-back), and after
    /// the gate reopens the committer finishes.
    #[test]
    fn loom_closed_gate_sees_whole_write_backs() {
        loom::model(|| {
            let gate = Arc::new(CommitGate::new());
            let words = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
            let committer = {
                let (gate, words) = (gate.clone(), words.clone());
                thread::spawn(move || {
                    let _pass = gate.enter(1);
                    words[0].store(1, std::sync::atomic::Ordering::Relaxed);
                    words[1].store(1, std::sync::atomic::Ordering::Relaxed);
                })
            };
            {
                let _closed = gate.close();
                let a = words[0].load(std::sync::atomic::Ordering::Relaxed);
                let b = words[1].load(std::sync::atomic::Ordering::Relaxed);
                assert_eq!(a, b, "a closed gate let half a write-back through");
            }
            committer.join().unwrap();
            assert_eq!(words[1].load(std::sync::atomic::Ordering::Relaxed), 1);
        });
    }
}
