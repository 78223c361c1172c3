//! Large transactions write in place.
//!
//! A transaction buffers its writes in its write set, and every read looks its line up there
//! (read-your-writes). Past [`IN_PLACE_FROM`] lines that lookup outgrows the caches, and every
//! access of the transaction pays for it. So a transaction whose write set grows that large
//! changes mode, once: it takes one of the engine's in-place states, and from then on it holds a
//! stripe lock on every line it reads or writes (strict two-phase locking on the same stripe
//! words committers lock), writes straight into the heap after saving the line's before-image
//! in an undo log, and reads the heap directly. Its per-access cost is then a bit test in a
//! bitmap of held stripes: flat in the transaction's size.
//!
//! - **Entering** (`Transaction::try_in_place`): enter the commit gate (held until the end, so
//!   snapshots, which close it, see none of the in-place writes, and new transactions start in
//!   stripe mode), draw an empty LSN (the clock moves, so clock-mode readers re-validate
//!   against stripes before they could see an in-place store), lock the stripes of the read
//!   set and check that each still carries a version ≤ the read version (else: conflict, as at
//!   commit), lock the write set's stripes, and apply the write set in place.
//! - **Others** find those stripes locked: a reader spins, then conflicts and retries; a
//!   committer's try-lock fails and it retries. They never see an in-place store (the seqlock
//!   protocol of the stripe words).
//! - **Waiting**: the in-place transaction waits for a locked stripe (a commit's write-back
//!   is short, another run's hold lasts to its end), but while the commit gate is closed only
//!   for [`LOCK_WAIT`]: a commit waiting at a closed gate holds its locks while the snapshot
//!   closing the gate waits for this transaction's pass, so a long wait then is a cycle,
//!   broken by aborting (the undo log restores every line, every stripe gets its old word
//!   back) and retrying. With the gate open nothing a run waits for waits in turn, but for
//!   another run: the older of two wounds the younger (see [`Runs`]); a wait is bounded by
//!   [`RUN_WAIT`] all the same.
//! - **Commit**: the written bytes of the written lines, as they are now, form the redo
//!   record (whole words marked in a byte per line, partial words listed: a record holds what
//!   its transaction wrote and nothing else, since a `Partition` record may be replayed beyond
//!   an LSN gap, where words of the line that others wrote must not come with it); the LSN
//!   is drawn while every lock is held, pages are stamped dirty, the gate
//!   is left, and the written stripes are unlocked with the LSN as their version (stripes only
//!   read get their old word back). So LSNs keep their rules: drawn once the transaction can no
//!   longer abort, while it holds its write locks.
//!
//! Several transactions run in place at once, each with one of the engine's in-place states
//! ([`Runs`], at most [`MAX_RUNS`]); a large transaction that finds none free keeps buffering.
//! Runs lock every line they read as well as the lines they write, so two runs can wait for
//! each other: runs are ordered by age, and a run that waits past [`WOUND_AFTER`] wounds the
//! younger ones, which give up (wound-wait; see [`Runs`]). A large transaction that lost to a
//! conflict starts its next attempt in place, with the age it had: it waits for a state in
//! arrival order (at most [`RETRY_WAIT`]) before its first access, so it holds every line it
//! touches from the start, and once it is the oldest run no other run can make it lose
//! (before the waiting retries, 4 threads committing 100 k-key transactions into one tree
//! retried each one 132 times).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tusk_storage::line_record::MAX_WHOLE_LINES;

use crate::kept::clear_for_reuse;
use crate::snapshot::gate::Pass;
use std::sync::{Arc, OnceLock};

use tusk_storage::region::AtomicWords;

use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex};
use crate::write_set::{LineWrite, LINE_BYTES, LINE_WORDS};

/// Write-set lines beyond which a transaction changes to in-place mode (one under loom, so
/// that a model's second line changes it).
#[cfg(not(loom))]
pub const IN_PLACE_FROM: usize = 4096;
#[cfg(loom)]
pub const IN_PLACE_FROM: usize = 1;

/// Longest wait for one stripe lock, while the commit gate is closed, before the in-place
/// transaction aborts (see the module docs: a longer wait is a cycle through the gate).
pub const LOCK_WAIT: Duration = Duration::from_millis(20);

/// Longest wait for one stripe lock with the gate open: no cycle forms then (see the module
/// docs), so this is only a bound on a wait for another run's end.
pub const RUN_WAIT: Duration = Duration::from_secs(2);

/// Longest wait for an in-place state of a large transaction's retry. The waiter holds
/// nothing, so a wait is never part of a cycle of locks; the bound is for states held by
/// transactions that wait for the waiter some other way (a channel): past it, the retry runs
/// buffered as a first attempt does.
pub const RETRY_WAIT: Duration = Duration::from_secs(2);

#[cfg(not(loom))]
thread_local! {
    /// Whether this thread runs a transaction in place (holding the commit gate's pass).
    static RUNNING_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn set_running_here(running: bool) {
    #[cfg(not(loom))]
    RUNNING_HERE.with(|r| r.set(running));
    #[cfg(loom)]
    let _ = running;
}

/// The commit gate's pass an in-place run holds to its end: while it lives, this thread is
/// noted as running in place ([`running_here`]), so the note cannot outlive the pass.
pub(crate) struct RunPass<'g> {
    _pass: Pass<'g>,
}

impl<'g> RunPass<'g> {
    pub(crate) fn new(pass: Pass<'g>) -> RunPass<'g> {
        set_running_here(true);
        RunPass { _pass: pass }
    }
}

impl Drop for RunPass<'_> {
    fn drop(&mut self) {
        set_running_here(false);
    }
}

/// Whether this thread runs a transaction in place: closing the commit gate here would wait
/// for that transaction's pass forever (see [`crate::Engine::with_gate_closed`]).
pub fn running_here() -> bool {
    #[cfg(not(loom))]
    return RUNNING_HERE.with(|r| r.get());
    #[cfg(loom)]
    false
}

/// Most transactions that run in place at once: each holds one of the engine's in-place
/// states, made when first needed (a state's bitmaps are as long as the stripes and the heap's
/// lines, but zeroed lazily by the system: only what a run touches takes memory).
#[cfg(not(loom))]
pub const MAX_RUNS: usize = 16;
#[cfg(loom)]
pub const MAX_RUNS: usize = 2;

/// How long a run waits for a stripe before it wounds the younger run that holds it: a
/// commit's write-back holds a stripe for microseconds and a chunk copy for at most 1 ms
/// (`COPY_HOLD_AND_WAIT`), a run holds its stripes to its end.
pub const WOUND_AFTER: Duration = Duration::from_millis(2);

/// [`WOUND_AFTER`] for a run doing the work it left to its commit (`crate::deferred`: a
/// B-link tree's separators, into the few nodes near the root). What it waits for is then
/// mostly another run's commit, which holds those nodes while it writes its record
/// (milliseconds for a large run), or another run's such work waiting for one: a run in its
/// own part of the tree holds them only where its leaf splits post into them or a removal
/// posted its separators early. Wounding after 2 ms there sent whole runs back to their start
/// for a wait about to end; [`RUN_WAIT`] still bounds the wait.
pub const COMMIT_WOUND_AFTER: Duration = Duration::from_millis(100);

/// What the other runs see of a run: its age (0 while the seat is free), whether an older
/// run wounded it, and the stripes it holds. On a line of its own: a run loads its flag at
/// every stripe it newly locks.
#[repr(align(64))]
struct Seat {
    age: AtomicU64,
    wounded: AtomicBool,
    /// The age of the oldest run that wounded it (`u64::MAX`: none).
    wounded_by: AtomicU64,
    /// The held bits of the state made for this seat (set once, when it is made).
    held: OnceLock<Arc<HeldBits>>,
}

/// One bit per stripe: held by a run. Only the run's thread writes its bits (plain loads and
/// stores of atomic words, no read-modify-write: as cheap as a plain bitmap); an older run
/// that waits for a stripe reads them to find the run it waits for (see [`Runs::wound_holder`]).
/// Zeroed lazily, like the stripe words.
pub(crate) struct HeldBits(AtomicWords);

impl HeldBits {
    fn new(stripes: u64) -> HeldBits {
        HeldBits(AtomicWords::new(stripes.div_ceil(64)).expect("the held stripes' bitmap is mapped"))
    }

    #[inline]
    fn word(&self, s: u32) -> (&AtomicU64, u64) {
        (self.0.get(u64::from(s / 64)), 1u64 << (s % 64))
    }

    #[inline]
    fn get(&self, s: u32) -> bool {
        let (word, bit) = self.word(s);
        word.load(Ordering::Relaxed) & bit != 0
    }

    /// Sets bit `s` (by the owning run only); returns whether it was set.
    #[inline]
    fn set(&self, s: u32) -> bool {
        let (word, bit) = self.word(s);
        let was = word.load(Ordering::Relaxed);
        word.store(was | bit, Ordering::Relaxed);
        was & bit != 0
    }

    /// Clears bit `s` (by the owning run only).
    #[inline]
    fn clear(&self, s: u32) {
        let (word, bit) = self.word(s);
        word.store(word.load(Ordering::Relaxed) & !bit, Ordering::Relaxed);
    }

    #[cfg(test)]
    fn all_clear(&self) -> bool {
        (0..self.0.len()).all(|i| self.0.get(i).load(Ordering::Relaxed) == 0)
    }
}

/// The engine's in-place states, handed to one transaction each, and the queue of retries
/// waiting for one, served in arrival order so that each eventually runs.
///
/// Runs hold their stripes to their ends, so two of them can wait for each other. They are
/// ordered by age, drawn when a transaction first runs in place and kept by its retries: a run
/// that waits for a stripe past [`WOUND_AFTER`] wounds the younger run holding it, and a wounded run
/// gives up at its next stripe or its next spin of a wait (wound-wait), and its retry waits
/// for the run that wounded it to end before it starts again (else it would meet the same
/// lines still held, and lose again). So the oldest run never loses to another run, and a
/// transaction that lost keeps its age until it is the oldest: none loses forever.
pub struct Runs {
    pool: Mutex<Pool>,
    returned: Condvar,
    seats: Box<[Seat]>,
    stripes: u64,
    heap_capacity: u64,
}

struct Pool {
    /// States made and not running. Boxed: a state moves into a transaction and back, as one
    /// pointer rather than its dozen lists.
    #[allow(clippy::vec_box)]
    free: Vec<Box<InPlace>>,
    /// States made so far (at most [`MAX_RUNS`]); state `k` sits at seat `k`.
    made: usize,
    /// Tickets of the waiters, first come first.
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// The last age drawn.
    last_age: u64,
    /// Retries running (one at most): while one runs or waits, no first attempt starts a
    /// run.
    retries: usize,
}

impl Pool {
    fn has_free(&self) -> bool {
        !self.free.is_empty() || self.made < MAX_RUNS
    }
}

impl Runs {
    /// For `stripes` stripe words and a heap of `heap_capacity` bytes.
    pub fn new(stripes: u64, heap_capacity: u64) -> Runs {
        let seats = (0..MAX_RUNS).map(|_| Seat { age: AtomicU64::new(0), wounded: AtomicBool::new(false), wounded_by: AtomicU64::new(u64::MAX), held: OnceLock::new() }).collect();
        let pool = Pool { free: Vec::new(), made: 0, queue: VecDeque::new(), next_ticket: 0, last_age: 0, retries: 0 };
        Runs { pool: Mutex::new(pool), returned: Condvar::new(), seats, stripes, heap_capacity }
    }

    /// A state for a first attempt's run of age `age` (a new age if `None`), if one is free
    /// and no retry runs or waits for one. Runs lose to each other where they share lines;
    /// once one lost, its retry runs while first attempts keep buffering, so that where
    /// large transactions overlap they take turns instead of losing again and again, and
    /// where they do not, they run side by side again once the retries are through.
    pub fn try_take(&self, age: Option<u64>) -> Option<Box<InPlace>> {
        let mut pool = self.pool.lock();
        if pool.queue.is_empty() && pool.retries == 0 {
            self.take_locked(&mut pool, age)
        } else {
            None
        }
    }

    fn take_locked(&self, pool: &mut Pool, age: Option<u64>) -> Option<Box<InPlace>> {
        let mut state = match pool.free.pop() {
            Some(state) => state,
            None if pool.made < MAX_RUNS => {
                let mut state = Box::new(InPlace::new(self.stripes, self.heap_capacity));
                state.seat = pool.made;
                let first = self.seats[state.seat].held.set(state.held_bits.clone()).is_ok();
                debug_assert!(first, "seat {} made twice", state.seat);
                pool.made += 1;
                state
            }
            None => return None,
        };
        state.age = age.unwrap_or_else(|| {
            pool.last_age += 1;
            pool.last_age
        });
        let seat = &self.seats[state.seat];
        seat.wounded.store(false, Ordering::Relaxed);
        seat.wounded_by.store(u64::MAX, Ordering::Relaxed);
        seat.age.store(state.age, Ordering::Relaxed);
        Some(state)
    }

    /// A state for a retry's run of age `age`, after the waiters that came first and once no
    /// other retry runs (retries take turns: they lost where runs overlap); `None` once the
    /// wait has lasted `limit`.
    pub fn take_waiting(&self, age: Option<u64>, limit: Duration) -> Option<Box<InPlace>> {
        let mut pool = self.pool.lock();
        let ticket = pool.next_ticket;
        pool.next_ticket += 1;
        pool.queue.push_back(ticket);
        let deadline = Instant::now() + limit;
        loop {
            if pool.has_free() && pool.retries == 0 && pool.queue.front() == Some(&ticket) {
                pool.queue.pop_front();
                let state = self.take_locked(&mut pool, age).map(|mut state| {
                    state.retry = true;
                    pool.retries += 1;
                    state
                });
                // The next waiter may find a state free too.
                self.returned.notify_all();
                return state;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.returned.wait_for(&mut pool, left);
        }
        pool.queue.retain(|&t| t != ticket);
        // The waiter behind this one may be first now.
        self.returned.notify_all();
        None
    }

    /// Hands a state back (cleared by [`InPlace::reset`]) and wakes the waiters.
    pub fn give_back(&self, mut state: Box<InPlace>) {
        let seat = &self.seats[state.seat];
        seat.age.store(0, Ordering::Relaxed);
        seat.wounded.store(false, Ordering::Relaxed);
        // Stored before the lock is taken: a retry waiting for this run's end (`wait_ended`)
        // looks at the seats under the lock, so it sees the free seat or sleeps before this
        // notification.
        let mut pool = self.pool.lock();
        debug_assert!(pool.free.len() < pool.made, "a state given back twice");
        if std::mem::take(&mut state.retry) {
            pool.retries -= 1;
        }
        pool.free.push(state);
        drop(pool);
        self.returned.notify_all();
    }

    /// Whether an older run wounded the run of `state`.
    #[inline]
    pub fn wounded(&self, state: &InPlace) -> bool {
        self.seats[state.seat].wounded.load(Ordering::Relaxed)
    }

    /// The age of the oldest run that wounded the run of `state`, if one did.
    pub fn wounder(&self, state: &InPlace) -> Option<u64> {
        let seat = &self.seats[state.seat];
        let by = seat.wounded_by.load(Ordering::Relaxed);
        (seat.wounded.load(Ordering::Relaxed) && by != u64::MAX).then_some(by)
    }

    /// Wounds the run younger than the run of `state` that holds stripe `s`, if one does: a
    /// waiter wounds only the run it waits for. (The holder's bit may not be visible yet, just
    /// after its lock: the waiter looks again at its next look at the clock. A bit of a run
    /// that just ended may still be set: that seat's next run is wounded for nothing and only
    /// starts again.) Wounding every younger run instead sent runs that shared nothing with
    /// the waiter back to the start: on disjoint key ranges, most of the retries.
    pub fn wound_holder(&self, state: &InPlace, s: u32) {
        for seat in self.seats.iter() {
            let holds = || seat.held.get().is_some_and(|held| held.get(s));
            if seat.age.load(Ordering::Relaxed) > state.age && holds() {
                seat.wounded_by.fetch_min(state.age, Ordering::Relaxed);
                seat.wounded.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Waits until no run of age `age` runs, at most `limit`.
    pub fn wait_ended(&self, age: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut pool = self.pool.lock();
        while self.seats.iter().any(|seat| seat.age.load(Ordering::Relaxed) == age) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.returned.wait_for(&mut pool, left);
        }
    }

    /// Retries waiting for a state (tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.pool.lock().queue.len()
    }

    /// Takes every state, making them all, so that no transaction can run in place (tests).
    #[cfg(test)]
    #[allow(clippy::vec_box)]
    pub(crate) fn take_all(&self) -> Vec<Box<InPlace>> {
        std::iter::from_fn(|| self.try_take(None)).collect()
    }

    /// Runs `f` on a state while it runs nowhere, making one if none was made (tests).
    #[cfg(test)]
    pub(crate) fn with_free<T>(&self, f: impl FnOnce(&mut InPlace) -> T) -> Option<T> {
        let mut pool = self.pool.lock();
        if pool.free.is_empty() {
            let state = self.take_locked(&mut pool, None)?;
            self.seats[state.seat].age.store(0, Ordering::Relaxed);
            pool.free.push(state);
        }
        pool.free.last_mut().map(|state| f(state))
    }
}

/// Bitmap words scanned per written line at most, when the written lines are read off the
/// saved-lines bitmap rather than sorted (a word covers 64 lines, 4 KiB of heap).
const BITMAP_SCAN_PER_LINE: usize = 4;

/// Spins between looks at the clock while waiting for a lock.
#[cfg(not(loom))]
const SPINS_PER_CLOCK_LOOK: u32 = 1024;
/// A wait for a lock longer than this naps [`NAP`] at each look at the clock.
#[cfg(not(loom))]
const NAP_AFTER: Duration = Duration::from_millis(1);
#[cfg(not(loom))]
const NAP: Duration = Duration::from_micros(50);

/// What an in-place transaction keeps: held stripes, the undo log and their bitmaps. The
/// engine keeps these states ([`Runs`]); their buffers are kept between transactions, cleared
/// by the bits that were set.
pub struct InPlace {
    /// Stripes held. The word each had before is its locked word less the lock bit (only the
    /// holder changes a locked word), so it is not kept: 4 bytes a stripe, not 16 (a 64 M-key
    /// batch holds all 2^24 stripes: 64 MiB instead of 256).
    pub(crate) held: Vec<u32>,
    /// One bit per stripe: held (read by the other runs, see [`HeldBits`]).
    held_bits: Arc<HeldBits>,
    /// One bit per stripe: a line under it was written.
    written_bits: Vec<u64>,
    /// One bit per heap line: its before-image is in `undo`.
    saved_bits: Vec<u64>,
    /// One byte per heap line: bit `w` set when word `w` of the line was written whole.
    whole_words: Vec<u8>,
    /// Words written in part: (offset, byte mask), in the order written.
    partial: Vec<(u64, u8)>,
    /// Before-images (`masks` unused), one per written line, in the order first written.
    pub(crate) undo: Vec<LineWrite>,
    /// Written lines in heap this transaction took from brk: zero before it, by the
    /// allocator's rule (memory never handed out is zero), so their before-image is all zeros
    /// and is not kept (a 64 M-key load writes almost only such lines).
    pub(crate) fresh: Vec<u64>,
    /// The lowest and highest line written (byte offsets), while any is.
    written_range: (u64, u64),
    /// The written lines in ascending order, made at commit by [`InPlace::lines_in_order`].
    pub(crate) lines: Vec<u64>,
    /// Their written bytes, in the same order (byte `w` the mask of word `w`).
    pub(crate) masks: Vec<u64>,
    /// The most lines a run may write: its record must fit one record even if every line
    /// were written whole.
    pub(crate) max_lines: usize,
    /// Its seat among the engine's runs (see [`Runs`]).
    seat: usize,
    /// The age of the run that holds it.
    pub(crate) age: u64,
    /// Whether a retry holds it (see [`Runs::try_take`]).
    retry: bool,
}

/// The byte mask of the words a whole-word bitmap names (bit `w` → byte `w` all ones).
const WHOLE_WORD_BYTES: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut bits = 0;
    while bits < 256 {
        let mut w = 0;
        while w < LINE_WORDS {
            if bits & (1 << w) != 0 {
                table[bits] |= 0xFF << (8 * w);
            }
            w += 1;
        }
        bits += 1;
    }
    table
};

#[inline]
fn test_and_set(bits: &mut [u64], i: u64) -> bool {
    let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
    let was = bits[word] & bit != 0;
    bits[word] |= bit;
    was
}

#[inline]
fn clear(bits: &mut [u64], i: u64) {
    bits[(i / 64) as usize] &= !(1u64 << (i % 64));
}

impl InPlace {
    /// For `stripes` stripe words and a heap of `heap_capacity` bytes. The bitmaps are zeroed
    /// lazily by the system (a calloc'd reservation): only the parts a transaction touches
    /// take memory.
    pub fn new(stripes: u64, heap_capacity: u64) -> InPlace {
        let lines = heap_capacity.div_ceil(LINE_BYTES);
        InPlace {
            held: Vec::new(),
            held_bits: Arc::new(HeldBits::new(stripes)),
            written_bits: vec![0; stripes.div_ceil(64) as usize],
            saved_bits: vec![0; lines.div_ceil(64) as usize],
            whole_words: vec![0; lines as usize],
            partial: Vec::new(),
            undo: Vec::new(),
            fresh: Vec::new(),
            written_range: (u64::MAX, 0),
            lines: Vec::new(),
            masks: Vec::new(),
            max_lines: MAX_WHOLE_LINES,
            seat: 0,
            age: 0,
            retry: false,
        }
    }

    #[inline]
    pub fn is_held(&self, s: u32) -> bool {
        self.held_bits.get(s)
    }

    /// Records that stripe `s` is held (locked by this run).
    #[inline]
    pub fn note_held(&mut self, s: u32) {
        let was = self.held_bits.set(s);
        debug_assert!(!was, "stripe {s} held twice");
        self.held.push(s);
    }

    #[inline]
    pub fn note_written(&mut self, s: u32) {
        test_and_set(&mut self.written_bits, u64::from(s));
    }

    #[inline]
    pub fn was_written(&self, s: u32) -> bool {
        self.written_bits[(s / 64) as usize] & (1u64 << (s % 64)) != 0
    }

    /// Whether the line at `line` needs its before-image saved (the first write to it);
    /// marks it saved.
    #[inline]
    pub fn first_write(&mut self, line: u64) -> bool {
        if test_and_set(&mut self.saved_bits, line / LINE_BYTES) {
            return false;
        }
        self.written_range = (self.written_range.0.min(line), self.written_range.1.max(line));
        true
    }

    /// Notes that `words` words from `off` (inside one line) were written whole.
    #[inline]
    pub fn note_whole(&mut self, off: u64, words: usize) {
        debug_assert!(words >= 1 && (off % LINE_BYTES) / 8 + words as u64 <= LINE_WORDS as u64);
        let bits = (((1u32 << words) - 1) << ((off % LINE_BYTES) / 8)) as u8;
        self.whole_words[(off / LINE_BYTES) as usize] |= bits;
    }

    /// Notes a write of the bytes `mask` of the word at `off`.
    #[inline]
    pub fn note_bytes(&mut self, off: u64, mask: u8) {
        if mask == 0xFF {
            self.note_whole(off, 1);
        } else {
            self.partial.push((off, mask));
        }
    }

    /// Lines written so far (with a before-image or fresh).
    #[inline]
    pub fn written_lines(&self) -> usize {
        self.undo.len() + self.fresh.len()
    }

    /// Fetches the run's notes on the line at `line` (its saved bit, its whole words): a line
    /// a run reads is often written next (an index leaf), and those notes lie in maps as long
    /// as the heap, where each costs the write a cache miss.
    #[inline]
    pub fn prefetch_notes(&self, line: u64) {
        let i = (line / LINE_BYTES) as usize;
        if let (Some(whole), Some(saved)) = (self.whole_words.get(i), self.saved_bits.get(i / 64)) {
            tusk_storage::region::prefetch_at(whole);
            tusk_storage::region::prefetch_at(saved);
        }
    }

    /// Whether a write to `line` would add a before-image (its first write).
    #[inline]
    pub fn first_write_would_add(&self, line: u64) -> bool {
        let i = line / LINE_BYTES;
        self.saved_bits[(i / 64) as usize] & (1u64 << (i % 64)) == 0
    }

    /// The written lines in ascending order. Where they lie densely (the bitmap words between
    /// the lowest and the highest are at most `BITMAP_SCAN_PER_LINE` per line) they are
    /// read off the bitmap, in address order for free; elsewhere their offsets are sorted.
    pub fn lines_in_order(&mut self) -> &[u64] {
        self.lines.clear();
        let written = self.written_lines();
        if written == 0 {
            return &self.lines;
        }
        let (lo, hi) = (self.written_range.0 / LINE_BYTES, self.written_range.1 / LINE_BYTES);
        let words = (lo / 64) as usize..=(hi / 64) as usize;
        if words.clone().count() <= BITMAP_SCAN_PER_LINE * written {
            for w in words {
                let mut bits = self.saved_bits[w];
                while bits != 0 {
                    self.lines.push((w as u64 * 64 + u64::from(bits.trailing_zeros())) * LINE_BYTES);
                    bits &= bits - 1;
                }
            }
        } else {
            self.lines.extend(self.undo.iter().map(|e| e.line).chain(self.fresh.iter().copied()));
            self.lines.sort_unstable();
        }
        debug_assert_eq!(self.lines.len(), written);
        &self.lines
    }

    /// The written bytes of each line of [`InPlace::lines_in_order`] (called after it), in
    /// `masks`.
    pub fn masks_in_order(&mut self) {
        self.masks.clear();
        self.masks.extend(self.lines.iter().map(|&line| WHOLE_WORD_BYTES[usize::from(self.whole_words[(line / LINE_BYTES) as usize])]));
        for &(off, mask) in &self.partial {
            let k = self.lines.binary_search(&(off & !(LINE_BYTES - 1))).expect("a partial write's line is saved");
            self.masks[k] |= u64::from(mask) << (8 * ((off % LINE_BYTES) / 8));
        }
        debug_assert!(self.masks.iter().all(|&m| m != 0), "every saved line was written");
    }

    /// Clears every bit set and empties the lists, keeping their memory for the next run
    /// unless an earlier, larger run grew them (see `crate::kept`).
    pub fn reset(&mut self) {
        for &s in &self.held {
            self.held_bits.clear(s);
            clear(&mut self.written_bits, u64::from(s));
        }
        for line in self.undo.iter().map(|e| e.line).chain(self.fresh.iter().copied()) {
            clear(&mut self.saved_bits, line / LINE_BYTES);
            self.whole_words[(line / LINE_BYTES) as usize] = 0;
        }
        clear_for_reuse(&mut self.partial, KEPT_LIST_BYTES);
        clear_for_reuse(&mut self.masks, KEPT_LIST_BYTES);
        clear_for_reuse(&mut self.held, KEPT_LIST_BYTES);
        clear_for_reuse(&mut self.undo, KEPT_LIST_BYTES);
        clear_for_reuse(&mut self.fresh, KEPT_LIST_BYTES);
        self.written_range = (u64::MAX, 0);
        clear_for_reuse(&mut self.lines, KEPT_LIST_BYTES);
    }

    /// Bytes the lists hold allocated (tests).
    #[cfg(test)]
    pub(crate) fn list_bytes(&self) -> usize {
        use std::mem::size_of_val;
        let bytes = |cap: usize, one: usize| cap * one;
        bytes(self.held.capacity(), size_of_val(&0u32))
            + bytes(self.partial.capacity(), size_of_val(&(0u64, 0u8)))
            + bytes(self.undo.capacity(), std::mem::size_of::<LineWrite>())
            + bytes(self.fresh.capacity() + self.lines.capacity() + self.masks.capacity(), size_of_val(&0u64))
    }
}

/// A list's allocation that an in-place state keeps from one run to the next,
/// whatever the runs use. Runs of one size keep their lists, so they do not grow them again
/// each time (a 1 M-upsert B-link batch's before-images take about 140 MB; trimming them after
/// every batch cost repeated batches 14% of their rate).
#[cfg(not(test))]
const KEPT_LIST_BYTES: usize = 64 << 20;
/// Small in tests, so that a test's run passes it.
#[cfg(test)]
const KEPT_LIST_BYTES: usize = 1 << 20;

/// A wait for a stripe lock, bounded by [`LOCK_WAIT`] or another limit (under loom: by a few
/// spins).
pub struct LockWait {
    spins: u32,
    #[cfg_attr(loom, allow(dead_code))]
    since: Option<Instant>,
    #[cfg_attr(loom, allow(dead_code))]
    limit: Duration,
}

impl Default for LockWait {
    fn default() -> Self {
        Self::new()
    }
}

impl LockWait {
    pub fn new() -> LockWait {
        LockWait::with_limit(LOCK_WAIT)
    }

    /// A wait bounded by `limit` instead of [`LOCK_WAIT`].
    pub fn with_limit(limit: Duration) -> LockWait {
        LockWait { spins: 0, since: None, limit }
    }

    /// One more spin; false once the wait has lasted [`LOCK_WAIT`].
    #[cfg(loom)]
    pub fn again(&mut self) -> bool {
        self.spins += 1;
        crate::sync::spin_loop();
        self.spins < 4
    }

    /// Whether this spin is one that looks at the clock (under loom: every one).
    #[inline]
    pub fn at_clock_look(&self) -> bool {
        #[cfg(not(loom))]
        return self.spins.is_multiple_of(SPINS_PER_CLOCK_LOOK);
        #[cfg(loom)]
        true
    }

    /// Whether the wait has lasted past `d` (under loom: past two spins).
    #[cfg(loom)]
    pub fn lasted(&self, _d: Duration) -> bool {
        self.spins >= 2
    }

    /// Whether the wait has lasted past `d` (looked at once the first spins are over).
    #[cfg(not(loom))]
    #[inline]
    pub fn lasted(&self, d: Duration) -> bool {
        self.since.is_some_and(|since| since.elapsed() > d)
    }

    /// One more spin; false once the wait has lasted its limit.
    #[cfg(not(loom))]
    #[inline]
    pub fn again(&mut self) -> bool {
        self.spins += 1;
        if self.spins.is_multiple_of(SPINS_PER_CLOCK_LOOK) {
            let since = *self.since.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if waited > self.limit {
                return false;
            }
            if waited > NAP_AFTER {
                // Most likely another run's hold, to its end: give the core away.
                std::thread::sleep(NAP);
            } else {
                std::thread::yield_now();
            }
        } else {
            crate::sync::spin_loop();
        }
        true
    }
}

/// The words of a line, to be saved as its before-image.
pub fn before_image(line: u64, words: [u64; LINE_WORDS]) -> LineWrite {
    LineWrite { line, masks: 0, words }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bits_are_set_once_and_cleared_by_reset() {
        let mut ip = InPlace::new(1 << 12, 1 << 20);
        assert!(!ip.is_held(5));
        ip.note_held(5);
        ip.note_written(5);
        assert!(ip.is_held(5) && ip.was_written(5));
        assert!(ip.first_write(4096));
        assert!(!ip.first_write((4096 + 8 * 3) & !(LINE_BYTES - 1)));
        ip.undo.push(before_image(4096, [0; LINE_WORDS]));
        ip.reset();
        assert!(!ip.is_held(5) && !ip.was_written(5));
        assert!(ip.first_write(4096), "saved bit cleared");
        assert!(ip.held_bits.all_clear() && ip.written_bits.iter().all(|&w| w == 0));
    }

    fn wait_until(mut done: impl FnMut() -> bool) {
        let since = Instant::now();
        while !done() {
            assert!(since.elapsed() < Duration::from_secs(10), "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Retries get a state in the order they asked for one, once every state runs; a first
    /// try does not jump the queue; a waiter that gives up leaves it.
    #[test]
    fn states_go_to_waiting_retries_in_arrival_order() {
        let runs = Runs::new(64, 1 << 12);
        let mut held = runs.take_all();
        assert_eq!(held.len(), MAX_RUNS, "every state is made once all are wanted");
        let order = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for who in 0..3 {
                let (runs, order) = (&runs, &order);
                s.spawn(move || {
                    let state = runs.take_waiting(None, Duration::from_secs(10)).expect("served before the limit");
                    order.lock().unwrap().push(who);
                    runs.give_back(state);
                });
                wait_until(|| runs.waiting() == who + 1);
            }
            runs.give_back(held.pop().unwrap());
            wait_until(|| order.lock().unwrap().len() == 3);
        });
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        held.push(runs.try_take(None).expect("free again, nobody waiting"));
        assert!(runs.take_waiting(None, Duration::from_millis(5)).is_none(), "all run: the wait times out");
        assert_eq!(runs.waiting(), 0, "a waiter that gave up left the queue");
        std::thread::scope(|s| {
            // The waiter keeps the state it is served until the first try below is made: had
            // it given it back at once, a waiter woken before that try (a loaded machine: the
            // fresh-clone CI run of 2026-11-29 failed so) would leave it free to anyone.
            let (tried, after_try) = std::sync::mpsc::channel::<()>();
            let runs = &runs;
            s.spawn(move || {
                let state = runs.take_waiting(None, Duration::from_secs(10)).expect("served");
                after_try.recv().unwrap();
                runs.give_back(state);
            });
            wait_until(|| runs.waiting() == 1);
            runs.give_back(held.pop().unwrap());
            // Given back while the waiter sleeps (or already held by it): not free to a first try.
            assert!(runs.try_take(None).is_none(), "a first try never jumps a waiting retry");
            tried.send(()).unwrap();
        });
        held.into_iter().for_each(|state| runs.give_back(state));
    }

    /// Ages grow with each run that starts anew and stay with a retry that passes its own; a
    /// waiting run wounds the run that holds its stripe if that one is younger, and no other;
    /// a state handed on starts unwounded.
    #[test]
    fn a_run_wounds_only_the_younger_run_that_holds_its_stripe() {
        let runs = Runs::new(64, 1 << 12);
        let first = runs.try_take(None).unwrap();
        let mut second = runs.try_take(None).unwrap();
        let mut third = runs.try_take(None).unwrap();
        assert!(first.age < second.age && second.age < third.age);
        second.note_held(7);
        third.note_held(9);
        runs.wound_holder(&first, 8);
        assert!(![&first, &second, &third].iter().any(|run| runs.wounded(run)), "nobody holds stripe 8");
        runs.wound_holder(&second, 9);
        assert!(!runs.wounded(&first) && !runs.wounded(&second) && runs.wounded(&third));
        runs.wound_holder(&third, 7);
        assert!(!runs.wounded(&second), "an older holder is waited for, not wounded");
        runs.wound_holder(&first, 7);
        assert!(runs.wounded(&second));
        assert_eq!(runs.wounder(&second), Some(first.age));
        let (second_age, third_age) = (second.age, third.age);
        second.reset();
        third.reset();
        runs.give_back(third);
        runs.give_back(second);
        let mut retry = runs.try_take(Some(second_age)).unwrap();
        assert_eq!(retry.age, second_age, "a retry keeps its age");
        assert!(!runs.wounded(&retry), "wounds go with the run, not the state");
        runs.wound_holder(&first, 7);
        assert!(!runs.wounded(&retry), "a run's held bits go with it");
        let fresh = runs.try_take(None).unwrap();
        assert!(fresh.age > third_age, "a new run is younger than every run before it");
        retry.note_held(3);
        runs.wound_holder(&fresh, 3);
        assert!(!runs.wounded(&retry), "the younger waits for the older");
        retry.reset();
        [first, retry, fresh].into_iter().for_each(|state| runs.give_back(state));
    }
}

#[cfg(all(test, not(loom)))]
mod engine_tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use tusk_storage::Heap;

    use super::IN_PLACE_FROM;
    use crate::stripes::version;
    use crate::write_set::LINE_BYTES;
    use crate::{Commit, Engine, EngineConfig, Transaction, TxnError};

    const BASE: u64 = 1 << 16;

    fn engine(heap: u64) -> Engine {
        let config = EngineConfig { stripes_log2: 14, log: None, existing_segments: Vec::new() };
        Engine::start(config, Heap::new(heap).unwrap(), 0).unwrap()
    }

    fn line(i: u64) -> u64 {
        BASE + i * LINE_BYTES
    }

    /// Runs `body` until it commits.
    fn transact(engine: &Engine, mut body: impl FnMut(&mut Transaction<'_>) -> Result<(), TxnError>) -> Option<u64> {
        let mut tx = engine.begin();
        loop {
            match body(&mut tx).and_then(|()| tx.commit(Commit::Async)) {
                Ok(lsn) => return lsn,
                Err(TxnError::Conflict) => tx.restart(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Past the threshold a transaction runs in place, reads its own writes (whole words,
    /// partial words, runs), and its commit publishes exactly them under one LSN.
    #[test]
    fn a_large_transaction_runs_in_place_and_commits_its_writes() {
        let engine = engine(8 << 20);
        let n = IN_PLACE_FROM as u64 * 2;
        transact(&engine, |tx| (0..n).try_for_each(|i| tx.store(line(i) + 8, 1)));
        let before = engine.last_lsn();
        let mut tx = engine.begin();
        for i in 0..n {
            tx.store(line(i), i + 100).unwrap();
            assert_eq!(tx.is_in_place(), i as usize >= IN_PLACE_FROM, "line {i}");
        }
        for i in 0..n {
            assert_eq!(tx.load(line(i)).unwrap(), i + 100, "reads its writes");
            assert_eq!(tx.load(line(i) + 8).unwrap(), 1, "and the committed words beside them");
        }
        tx.write_raw(line(3) + 17, &[0xAB]).unwrap();
        tx.store_words(line(n) - 16, &[7, 8, 9, 10]).unwrap();
        let mut run = [0u64; 4];
        tx.load_words(line(n) - 16, &mut run).unwrap();
        assert_eq!(run, [7, 8, 9, 10]);
        let lsn = tx.commit(Commit::Async).unwrap().unwrap();
        assert!(lsn > before + 1, "an empty LSN marked the change to in-place mode");
        assert!(!tx.is_in_place());
        drop(tx);
        let mut check = engine.begin();
        for i in 0..n - 1 {
            assert_eq!(check.load(line(i)).unwrap(), i + 100);
        }
        assert_eq!(check.load(line(3) + 16).unwrap(), 0xAB << 8);
        assert_eq!(check.load(line(n)).unwrap(), 9);
        assert!(engine.stripes.load(engine.stripes.index_of(line(0))) >> 1 == lsn, "written stripes carry the LSN");
        assert!(engine.in_place.with_free(|_| ()).is_some(), "the state is back");
    }

    /// A huge run's lists do not stay with the engine: the next, smaller run gives back what
    /// it does not use, past `KEPT_LIST_BYTES` each. Runs of one size keep their lists.
    #[test]
    fn a_huge_runs_lists_go_back_with_the_next_smaller_run() {
        let per_line = std::mem::size_of::<super::LineWrite>();
        let huge = (8 * super::KEPT_LIST_BYTES / per_line) as u64;
        let small = IN_PLACE_FROM as u64 + 100;
        let engine = engine((BASE + huge * LINE_BYTES + (1 << 20)).next_multiple_of(1 << 21));
        // Written once first: each later run saves a before-image per line.
        transact(&engine, |tx| (0..huge).try_for_each(|i| tx.store(line(i), i)));
        let undo_bytes = |engine: &Engine| engine.in_place.with_free(|s| s.undo.capacity() * per_line).expect("free");
        for (round, n) in [huge, huge, small, small].into_iter().enumerate() {
            let round = round as u64;
            transact(&engine, |tx| (0..n).try_for_each(|i| tx.store(line(i), i + round)));
            let mut check = engine.begin();
            for i in (0..n).step_by(997) {
                assert_eq!(check.load(line(i)).unwrap(), i + round);
            }
            let kept = undo_bytes(&engine);
            if n == huge {
                assert!(kept >= huge as usize * per_line, "round {round}: runs of one size keep their lists ({kept} bytes)");
            } else {
                assert!(kept <= super::KEPT_LIST_BYTES, "round {round}: {kept} bytes of before-images kept");
                let lists = engine.in_place.with_free(|s| s.list_bytes()).expect("free");
                assert!(lists <= 6 * super::KEPT_LIST_BYTES, "round {round}: {lists} bytes of lists kept");
            }
        }
    }

    /// An in-place transaction that ends without committing (dropped, or restarted) leaves
    /// the heap and the stripe words as they were; others then write the same lines.
    #[test]
    fn an_abandoned_in_place_run_restores_every_line_and_stripe() {
        let engine = engine(8 << 20);
        let n = IN_PLACE_FROM as u64 + 500;
        transact(&engine, |tx| (0..n).try_for_each(|i| tx.store(line(i), i)));
        let stripe_word = |i: u64| engine.stripes.load(engine.stripes.index_of(line(i)));
        let only_read = n + 64;
        for restart in [false, true] {
            let words: Vec<u64> = (0..n).map(stripe_word).collect();
            let read_word = stripe_word(only_read);
            let mut tx = engine.begin();
            assert_eq!(tx.load(line(only_read)).unwrap(), 0);
            for i in 0..n {
                tx.store(line(i), 999).unwrap();
            }
            assert!(tx.is_in_place());
            assert_eq!(engine.heap().load_word(line(0)), 999, "written in place");
            if restart {
                tx.restart();
                assert!(!tx.is_in_place());
            }
            drop(tx);
            for i in 0..n {
                assert_eq!(engine.heap().load_word(line(i)), i, "line {i} restored");
                // A new version, not the old word: a reader that loaded the old word before the
                // run and the line during it must not find the word unchanged afterwards.
                let word = stripe_word(i);
                assert!(!crate::stripes::is_locked(word), "stripe of line {i} unlocked");
                assert!(version(word) > version(words[i as usize]), "stripe of line {i}: {word} after {}", words[i as usize]);
                assert!(version(word) <= engine.last_lsn(), "a version is an LSN drawn");
            }
            assert_eq!(stripe_word(only_read), read_word, "a stripe only read gets its word back");
        }
        transact(&engine, |tx| tx.store(line(0), 5));
        assert_eq!(engine.heap().load_word(line(0)), 5);
    }

    /// A dropped run's written stripes get a version above every one they had: also above
    /// that of a commit to a line the run wrote only after that commit, once in place. (Its
    /// entry LSN would be below it: a reader that began between the two would then take the
    /// commit's value as its own read version's.)
    #[test]
    fn a_dropped_runs_stripes_get_a_version_above_every_commit() {
        let engine = engine(8 << 20);
        let n = IN_PLACE_FROM as u64 + 10;
        let mut run = engine.begin();
        for i in 0..n {
            run.store(line(i), 1).unwrap();
        }
        assert!(run.is_in_place());
        let later = line(n + 100);
        let lsn = transact(&engine, |tx| tx.store(later, 7)).expect("an LSN");
        run.store(later, 8).unwrap();
        drop(run);
        assert_eq!(engine.heap().load_word(later), 7, "the commit's value restored");
        let word = engine.stripes.load(engine.stripes.index_of(later));
        assert!(version(word) > lsn, "version {} after the commit's {lsn}", version(word));
    }

    /// A large transaction whose earlier reads were overwritten before it changed mode
    /// conflicts at the change, as it would at commit.
    #[test]
    fn the_change_to_in_place_validates_earlier_reads() {
        let engine = engine(8 << 20);
        let mut tx = engine.begin();
        assert_eq!(tx.load(line(0)).unwrap(), 0);
        transact(&engine, |w| w.store(line(0), 1));
        let result = (1..=IN_PLACE_FROM as u64 + 1).try_for_each(|i| tx.store(line(i), i));
        assert!(matches!(result, Err(TxnError::Conflict)), "{result:?}");
        assert!(!tx.is_in_place());
        drop(tx);
        assert_eq!(engine.heap().load_word(line(1)), 0, "nothing of it stayed");
    }

    /// A transaction that keeps buffering because every in-place state runs fails with
    /// `TooLarge` at the write that takes it past what one record holds (`MAX_LINES`, the real
    /// limit: about 7.7 M lines, 0.7 GB of write set), not only at its commit; nothing of it is
    /// written, and with the states back the same writes run in place.
    #[test]
    fn a_buffered_set_past_the_record_limit_is_refused_at_the_write() {
        use tusk_storage::line_record::MAX_LINES;
        let n = MAX_LINES as u64 + 1;
        let engine = engine(BASE + (n + 1) * LINE_BYTES);
        let held = engine.in_place.take_all();
        let mut tx = engine.begin();
        let result = (0..n).try_for_each(|i| tx.store(line(i), i + 1).map_err(|e| (i, e)));
        assert!(
            matches!(result, Err((i, TxnError::TooLarge { max })) if i == n - 1 && max == MAX_LINES as u64),
            "{:?}",
            result.map_err(|(i, e)| (i, e.to_string()))
        );
        assert!(!tx.is_in_place());
        assert!(matches!(tx.commit(Commit::Async), Err(TxnError::Conflict)), "the transaction stays failed");
        drop(tx);
        for i in [0, n / 2, n - 1] {
            assert_eq!(engine.heap().load_word(line(i)), 0, "line {i}");
        }
        held.into_iter().for_each(|state| engine.in_place.give_back(state));
        let mut tx = engine.begin();
        (0..IN_PLACE_FROM as u64 + 10).try_for_each(|i| tx.store(line(i), 9)).unwrap();
        assert!(tx.is_in_place(), "in-place mode works as before");
        tx.commit(Commit::Async).unwrap();
    }

    /// A run that would write more lines than one record holds fails with `TooLarge`, and
    /// leaves nothing behind: every line and stripe word as before, its state free again.
    /// (The real limit, `MAX_WHOLE_LINES`, is about 38 M lines; the test lowers it.)
    #[test]
    fn a_run_past_the_record_limit_fails_whole() {
        let engine = engine(8 << 20);
        let n = IN_PLACE_FROM as u64 + 100;
        transact(&engine, |tx| (0..n).try_for_each(|i| tx.store(line(i), i)));
        engine.in_place.with_free(|s| s.max_lines = IN_PLACE_FROM + 50).unwrap();
        let mut tx = engine.begin();
        let result = (0..n).try_for_each(|i| tx.store(line(i), 7));
        assert!(matches!(result, Err(TxnError::TooLarge { max }) if max == IN_PLACE_FROM as u64 + 50), "{result:?}");
        assert!(!tx.is_in_place());
        assert!(matches!(tx.commit(Commit::Async), Err(TxnError::Conflict)), "the transaction stays failed");
        drop(tx);
        for i in 0..n {
            assert_eq!(engine.heap().load_word(line(i)), i, "line {i}");
        }
        let mut tx = engine.begin();
        (0..IN_PLACE_FROM as u64 + 10).try_for_each(|i| tx.store(line(i), 9)).unwrap();
        assert!(tx.is_in_place(), "its state is free again");
        tx.commit(Commit::Async).unwrap();
    }

    /// A transaction that reads a line an in-place run holds waits for the run's end, holding
    /// nothing, and then reads on, extending its read version over the run's commit, which
    /// wrote nothing it had read: it commits at its first attempt, with the run's value
    /// (before, it conflicted and started over, losing what a large first attempt had
    /// buffered).
    #[test]
    fn a_reader_of_a_held_line_waits_for_the_run_and_reads_on() {
        let engine = engine(8 << 20);
        let mut run = engine.begin();
        for i in 0..IN_PLACE_FROM as u64 + 1 {
            run.store(line(100 + i), 1).unwrap();
        }
        assert!(run.is_in_place());
        run.store(line(3), 33).unwrap();
        let attempts = AtomicU64::new(0);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                transact(&engine, |tx| {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let before = tx.load(line(1))?;
                    let held = tx.load(line(3))?;
                    tx.store(line(2), before + held)
                });
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(attempts.load(Ordering::Relaxed), 1, "the reader waits in its first attempt");
            run.commit(Commit::Async).unwrap();
            reader.join().unwrap();
        });
        assert_eq!(attempts.load(Ordering::Relaxed), 1, "committed at its first attempt");
        let mut tx = engine.begin();
        assert_eq!(tx.load(line(2)).unwrap(), 33, "it read the run's write");
    }

    /// A checkpoint's chunk copy that finds a stripe held by an in-place run does not hold
    /// the others it took while it waits: the run then locks one of those (after the copy
    /// took it) and goes on instead of giving up after `LOCK_WAIT` and starting over; the
    /// copy completes after the commit and holds its writes.
    #[test]
    fn a_chunk_copy_never_makes_an_in_place_run_give_up() {
        let engine = engine(8 << 20);
        let mut tx = engine.begin();
        for i in 0..IN_PLACE_FROM as u64 + 1 {
            tx.store(line(100 + i), 1).unwrap();
        }
        assert!(tx.is_in_place());
        tx.store(line(3), 33).unwrap();
        std::thread::scope(|s| {
            let copier = s.spawn(|| {
                let mut out = vec![0u8; 4 * LINE_BYTES as usize];
                let lsn = engine.copy_consistent(line(0), &mut out).unwrap();
                (lsn, out)
            });
            // The copy finds line 3 locked in every optimistic round, then locks lines 0..2
            // and waits for line 3.
            std::thread::sleep(std::time::Duration::from_millis(50));
            tx.store(line(0), 7).expect("the run locks a stripe the copy took: the copy let go");
            let lsn = tx.commit(Commit::Async).unwrap().unwrap();
            let (copy_lsn, out) = copier.join().unwrap();
            assert!(copy_lsn > lsn, "the copy waited for the commit");
            let word = |i: usize| u64::from_le_bytes(out[i..i + 8].try_into().unwrap());
            assert_eq!((word(0), word(3 * LINE_BYTES as usize)), (7, 33), "the copy holds the run's writes");
        });
    }

    /// Transfers between 16,384 accounts (a line each) by large transactions (thousands of
    /// transfers each, in place) and by small ones at once, with readers summing every
    /// account: the total never changes, and every kind commits. (A sum over every account
    /// may not get through while large ones run back to back, since each holds its lines to
    /// its end: the small ones and the readers go on until each has committed once.)
    #[test]
    fn large_and_small_transfers_conserve_money() {
        const ACCOUNTS: u64 = 1 << 14;
        let engine = engine(16 << 20);
        transact(&engine, |tx| (0..ACCOUNTS).try_for_each(|a| tx.store(line(a), 100)));
        let stop = AtomicBool::new(false);
        let (large, small, sums) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let transfer = |tx: &mut Transaction<'_>, from: u64, to: u64| -> Result<(), TxnError> {
            let a = tx.load(line(from))?;
            if a > 0 && from != to {
                tx.store(line(from), a - 1)?;
                let b = tx.load(line(to))?;
                tx.store(line(to), b + 1)?;
            }
            Ok(())
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut x = 1u64;
                for _ in 0..6 {
                    let mut ran_in_place = false;
                    transact(&engine, |tx| {
                        for _ in 0..6000 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                            transfer(tx, (x >> 20) % ACCOUNTS, (x >> 40) % ACCOUNTS)?;
                        }
                        ran_in_place |= tx.is_in_place();
                        Ok(())
                    });
                    assert!(ran_in_place, "a transaction of 6000 transfers runs in place");
                    large.fetch_add(1, Ordering::Relaxed);
                }
                stop.store(true, Ordering::Relaxed);
            });
            s.spawn(|| {
                let mut x = 7u64;
                while !stop.load(Ordering::Relaxed) || small.load(Ordering::Relaxed) == 0 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    transact(&engine, |tx| transfer(tx, (x >> 20) % ACCOUNTS, (x >> 40) % ACCOUNTS));
                    small.fetch_add(1, Ordering::Relaxed);
                }
            });
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) || sums.load(Ordering::Relaxed) == 0 {
                    let mut total = 0;
                    transact(&engine, |tx| {
                        total = (0..ACCOUNTS).map(|a| tx.load(line(a))).sum::<Result<u64, _>>()?;
                        Ok(())
                    });
                    assert_eq!(total, 100 * ACCOUNTS, "a reader saw money appear or vanish");
                    sums.fetch_add(1, Ordering::Relaxed);
                }
            });
        });
        let mut total = 0;
        transact(&engine, |tx| {
            total = (0..ACCOUNTS).map(|a| tx.load(line(a))).sum::<Result<u64, _>>()?;
            Ok(())
        });
        assert_eq!(total, 100 * ACCOUNTS);
        assert_eq!(large.load(Ordering::Relaxed), 6);
        assert!(small.load(Ordering::Relaxed) > 0 && sums.load(Ordering::Relaxed) > 0);
    }

    /// Four threads each add one to the same 6000 lines, three times, in transactions that
    /// run in place: every one commits, and a retry runs in place from its start (in arrival
    /// order), so a transaction loses about once. Before the waiting retries, such
    /// transactions lost tens to hundreds of times each (spinning on the lines the run held).
    #[test]
    fn large_transactions_on_the_same_lines_lose_about_once() {
        const LINES: u64 = 6000;
        const THREADS: u64 = 4;
        const EACH: u64 = 3;
        let engine = engine(16 << 20);
        let attempts = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..EACH {
                        transact(&engine, |tx| {
                            attempts.fetch_add(1, Ordering::Relaxed);
                            (0..LINES).try_for_each(|i| {
                                let v = tx.load(line(i))?;
                                tx.store(line(i), v + 1)
                            })
                        });
                    }
                });
            }
        });
        let mut values = Vec::new();
        transact(&engine, |tx| {
            values = (0..LINES).map(|i| tx.load(line(i))).collect::<Result<_, _>>()?;
            Ok(())
        });
        assert!(values.iter().all(|&v| v == THREADS * EACH), "every transaction committed once");
        let retries = attempts.load(Ordering::Relaxed) - THREADS * EACH;
        let per_txn = retries as f64 / (THREADS * EACH) as f64;
        assert!(per_txn <= 3.0, "{per_txn} retries per transaction");
    }
}


/// The states' hand-over under every interleaving loom explores: two retries wait while
/// every state runs; when one is given back each is served in turn, none sleeps through its
/// turn (loom never times out a wait, so a lost wake-up is a deadlock it reports), and every
/// state ends free.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn loom_in_place_states_reach_every_waiting_retry() {
        loom::model(|| {
            let runs = Arc::new(Runs::new(64, 1 << 12));
            let mut held = runs.take_all();
            assert_eq!(held.len(), MAX_RUNS);
            let served = Arc::new(crate::sync::AtomicU64::new(0));
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let (runs, served) = (runs.clone(), served.clone());
                    loom::thread::spawn(move || {
                        let state = runs.take_waiting(None, Duration::from_secs(1)).expect("served");
                        served.fetch_add(1, Ordering::Relaxed);
                        runs.give_back(state);
                    })
                })
                .collect();
            runs.give_back(held.pop().unwrap());
            for w in waiters {
                w.join().unwrap();
            }
            assert_eq!(served.load(Ordering::Relaxed), 2);
            held.into_iter().for_each(|state| runs.give_back(state));
            assert_eq!(runs.take_all().len(), MAX_RUNS, "free at the end");
        });
    }
}
