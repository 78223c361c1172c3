//! Transactions: buffered writes, invisible reads validated against stripe versions
//! (TL2 with read-version extension), opacity, and the commit protocol.
//!
//! Commit: lock the write set's stripes (in index order, try-lock, abort on a held lock);
//! validate the read set; then, past the point of no return, draw the LSN and append the
//! redo record (one critical section of the thread's log partition), write back, stamp
//! dirty pages, and release the stripes with the LSN as their new version. So every LSN
//! drawn belongs to a committed transaction (no gaps), and a transaction that read another's
//! writes has a larger LSN (it read them after their stripes were released).
//!
//! Clock mode: a transaction that begins while no commit is writing back (the commit gate is
//! idle behind the clock it read) sees in the heap exactly the commits up to its read
//! version. Until the clock moves, a read needs no stripe word: it loads the words, and
//! checks that the clock still stands at the read version (one word every transaction reads,
//! in cache unless commits are happening). A commit draws its LSN before it writes back, so a
//! load that saw any of its stores finds the clock moved. On the first read that finds it
//! moved, a transaction that has written changes to stripe mode at once, keeping its read
//! version; one that has only read extends its read version (validating its read set) and stays in
//! clock mode if no write-back is in flight behind the new version, else (or after a few
//! extensions) changes to stripe mode for good: the stripes it read in clock mode are in its
//! read set, and their values were the read version's, so extension and commit validate them
//! like any other read (a stripe written since, even through an alias line, fails that
//! validation: a false conflict at worst).

use tusk_storage::layout::{BlockHeader, CLASS_LARGE, DATA_START, HEADER_SIZE, STATE_ALLOCATED};
use tusk_storage::line_record::{encode_lines, measure_lines, LineWrites, MeasuredLines, MAX_LINES};
use tusk_storage::log_format::{RecordEncoder, RecordHeader, FLAG_PARTITION};
use tusk_storage::{Heap, HeapPtr};

use crate::deferred::{Deferred, DeferredWork};
use crate::engine::Engine;
use crate::log::progress::Streamed;
use crate::in_place::{before_image, running_here, InPlace, LockWait, RunPass, IN_PLACE_FROM, COMMIT_WOUND_AFTER, RETRY_WAIT, RUN_WAIT, WOUND_AFTER};
use crate::stripes::{is_locked, version, Stripes, STRIPE_BYTES};
use crate::write_set::{LineWrite, WriteSet, LINE_BYTES, LINE_WORDS};
use crate::TxnError;

/// Stripe words in one cache line.
const STRIPE_WORDS_PER_LINE: u64 = 64 / 8;

/// A log sequence number: the commit order of update transactions, from 1, without gaps.
pub type Lsn = u64;

/// How long `commit` waits for durability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Returns once this transaction and every lower LSN are durable.
    Sync,
    /// Returns at once; durability follows within the group-commit interval.
    Async,
    /// Returns once the log partition it went to holds the record durably (not waiting for
    /// the other partitions); the record is flagged so that recovery applies it even beyond
    /// an LSN gap.
    Partition,
}

impl Commit {
    /// Whether the commit waits for its record's flush (and so appends where other waiters
    /// do: [`Engine::partition_for_commit`]).
    pub fn waits(self) -> bool {
        self != Commit::Async
    }
}

/// How often a reader re-reads a locked stripe before giving up with a conflict.
const LOCKED_SPINS: u32 = 256;
/// How often a clock-mode transaction extends its read version before it changes to stripes.
const CLOCK_EXTENSIONS: u32 = 4;
/// Allocations whose bounds a transaction remembers.
const BOUNDS_CACHE: usize = 4;
/// Read-set stripe words fetched ahead at commit (more would be evicted before validation
/// reaches them in a large read set).
const PREFETCH_READS: usize = 64;
/// Lines (and stripe words) an in-place commit fetches ahead of the one it reads or unlocks.
const COMMIT_PREFETCH_AHEAD: usize = 16;

pub struct Transaction<'e> {
    engine: &'e Engine,
    /// Read version: every stripe read must carry a version ≤ rv.
    rv: u64,
    /// Clock mode (see the module docs): reads validate against the clock, not the stripes.
    clock_mode: bool,
    bufs: Buffers,
    /// (user pointer, length) of recently checked allocations.
    bounds: [(u64, u64); BOUNDS_CACHE],
    bounds_next: usize,
    /// Set once a conflict was seen: every later operation fails (opacity).
    doomed: bool,
    /// In-place mode (see [`crate::in_place`]): its state and the gate pass.
    in_place: Option<InPlaceRun<'e>>,
    /// Write-set lines at which the next try for an in-place state is made.
    in_place_from: usize,
    /// Whether this attempt grew past [`IN_PLACE_FROM`] lines: a retry after a conflict then
    /// waits for an in-place state and runs in place from its start (see [`crate::in_place`]).
    went_large: bool,
    /// The age of this transaction's runs in place, drawn at its first and kept by its
    /// retries (see [`crate::in_place::Runs`]).
    age: Option<u64>,
    /// The age of the older run that wounded this attempt's run: the retry waits for its end.
    lost_to: Option<u64>,
    /// A stripe this attempt gave up on, locked by another transaction past a spin: a retry
    /// waits for it first (it is most likely an in-place run's, held to the run's end, and a
    /// retry that met it again at once would only spin and conflict again).
    locked_out: Option<u32>,
    /// Work left to the commit (see [`crate::deferred`]).
    deferred: DeferredWork,
    /// Whether the commit is doing that work now.
    finishing: bool,
    /// The size of this transaction's last take from its arena (0: none): its commit in place
    /// then fills the arena's reserve with steps for such requests (`alloc.rs`).
    pub(crate) arena_request: u64,
    /// Heap this transaction took from brk or its arena, `[from, to)`, the latest contiguous
    /// range of its takes (`alloc.rs`): never handed out before, hence zero (see
    /// [`crate::in_place`]'s fresh lines).
    pub(crate) fresh: (u64, u64),
}

/// A transaction running in place: one of the engine's in-place states and the commit gate
/// pass it holds until it ends.
struct InPlaceRun<'e> {
    state: Box<InPlace>,
    pass: RunPass<'e>,
}

/// A transaction's growable buffers, reused by the next transaction of the same thread.
#[derive(Default)]
struct Buffers {
    reads: Vec<u32>,
    writes: WriteSet,
    /// Stripes locked by commit (each word seen before locking is the locked word less the
    /// lock bit).
    locked: Vec<u32>,
}

impl Buffers {
    fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
        self.locked.clear();
    }

    /// Whether keeping these buffers for reuse is worth their memory.
    fn worth_keeping(&self) -> bool {
        self.reads.capacity() <= 1 << 16 && self.writes.capacity() <= 1 << 13
    }
}

#[cfg(not(loom))]
thread_local! {
    static SPARE_BUFFERS: std::cell::Cell<Option<Buffers>> = const { std::cell::Cell::new(None) };
}

// Per model thread and execution under loom (see `engine.rs`'s thread slots).
#[cfg(loom)]
loom::thread_local! {
    static SPARE_BUFFERS: std::cell::Cell<Option<Buffers>> = std::cell::Cell::new(None);
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        self.abandon_in_place();
        let mut bufs = std::mem::take(&mut self.bufs);
        if bufs.worth_keeping() {
            bufs.clear();
            let _ = SPARE_BUFFERS.try_with(|spare| spare.set(Some(bufs)));
        }
    }
}

impl<'e> Transaction<'e> {
    pub(crate) fn new(engine: &'e Engine) -> Transaction<'e> {
        let (rv, clock_mode) = engine.begin_version();
        Transaction {
            engine,
            rv,
            clock_mode,
            bufs: SPARE_BUFFERS.try_with(|spare| spare.take()).ok().flatten().unwrap_or_default(),
            bounds: [(0, 0); BOUNDS_CACHE],
            bounds_next: 0,
            doomed: false,
            in_place: None,
            in_place_from: IN_PLACE_FROM,
            went_large: false,
            age: None,
            lost_to: None,
            locked_out: None,
            deferred: DeferredWork::default(),
            finishing: false,
            arena_request: 0,
            fresh: (0, 0),
        }
    }

    /// Starts over (after a conflict), keeping allocated buffers. An attempt that grew large
    /// is retried in place from its start, with the age it had, once an in-place state is its
    /// (waiting for the retries before it, at most [`RETRY_WAIT`]): it loses to another run
    /// only while an older one runs.
    pub fn restart(&mut self) {
        // Only an attempt that lost (doomed) waits: `commit` restarts a committed one too.
        let lost = self.doomed;
        let went_large = std::mem::take(&mut self.went_large) && lost;
        self.age = self.age.filter(|_| lost);
        let locked_out = self.locked_out.take().filter(|_| lost);
        let lost_to = self.lost_to.take().filter(|_| lost);
        self.clear_attempt();
        // Beside a run of this thread's (another open transaction) no wait: the stripe may be
        // that run's, which would hold it (and its gate pass) all the while.
        if !running_here() {
            if let Some(s) = locked_out {
                self.engine.wait_unlocked(s, Some(RETRY_WAIT));
            }
            if let Some(older) = lost_to {
                self.engine.in_place.wait_ended(older, RETRY_WAIT);
            }
        }
        // Not beside a run of this thread's (another open transaction): its pass would stay
        // entered while this one's is.
        let mut state = if went_large && !running_here() { self.engine.in_place.take_waiting(self.age, RETRY_WAIT) } else { None };
        if state.is_some() && self.engine.check_open().is_err() {
            // Closed (perhaps during the wait): no in-place mode; commit reports the closure,
            // as for a first attempt.
            self.engine.in_place.give_back(state.take().expect("checked"));
        }
        (self.rv, self.clock_mode) = self.engine.begin_version();
        if let Some(state) = state {
            self.went_large = true;
            self.enter_in_place(state).expect("no read to validate, no write to apply");
        }
    }

    /// Starts over after a commit, as a new transaction whose read version is `rv` (with
    /// `clock_mode`) without reading the clock: after an update's commit, its own LSN (every
    /// commit below it had locked its write set when it was drawn, as at a read of the clock
    /// then), in stripe mode; after a read-only one, the version and mode it had. Reading the
    /// clock here cost every committed transaction a miss on the line all committers write,
    /// and `Store::transact` drops the transaction right after.
    fn start_over_committed(&mut self, rv: u64, clock_mode: bool) {
        debug_assert!(!self.doomed, "a committed transaction");
        self.engine.clock_hints.saw(self.engine.thread_slot(), rv);
        self.went_large = false;
        self.age = None;
        self.locked_out = None;
        self.lost_to = None;
        self.clear_attempt();
        (self.rv, self.clock_mode) = (rv, clock_mode);
    }

    /// Forgets the attempt's reads, writes, run and deferred work.
    fn clear_attempt(&mut self) {
        self.abandon_in_place();
        self.deferred.clear();
        self.in_place_from = IN_PLACE_FROM;
        self.fresh = (0, 0);
        self.arena_request = 0;
        self.bufs.reads.clear();
        self.bufs.writes.clear();
        self.bounds = [(0, 0); BOUNDS_CACHE];
        self.doomed = false;
    }

    /// Whether reads still validate against the clock (see the module docs).
    #[cfg(test)]
    pub(crate) fn in_clock_mode(&self) -> bool {
        self.clock_mode
    }

    pub fn engine(&self) -> &'e Engine {
        self.engine
    }

    /// Whether the transaction has buffered writes.
    pub fn is_read_only(&self) -> bool {
        self.bufs.writes.is_empty() && self.in_place.is_none()
    }

    /// Whether the transaction runs in place (see [`crate::in_place`]).
    pub fn is_in_place(&self) -> bool {
        self.in_place.is_some()
    }

    fn conflict<T>(&mut self) -> Result<T, TxnError> {
        self.doomed = true;
        Err(TxnError::Conflict)
    }

    /// Brings the heap's chunks under `[off, off+len)` in where a reopen left them absent
    /// (one load once all are in), and fails on a damaged one: its bytes are not data, and a
    /// write would let the next checkpoint pass them off as such.
    #[inline]
    fn heap_ready(&self, off: u64, len: u64) -> Result<(), TxnError> {
        self.engine.heap().ready(off, len).map_err(TxnError::DamagedChunk)
    }

    fn check_range(&self, off: u64, len: u64) -> Result<(), TxnError> {
        if self.engine.heap().contains(off, len) {
            Ok(())
        } else {
            Err(TxnError::InvalidPointer(off))
        }
    }

    // ---- word access (unchecked against allocations; used by the allocator and indexes) ----

    /// Reads the word at `off` (8-aligned) as of this transaction.
    #[inline]
    pub fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        debug_assert!(off.is_multiple_of(8));
        self.heap_ready(off, 8)?;
        if self.in_place.is_some() {
            return self.load_in_place(off);
        }
        if self.doomed {
            return Err(TxnError::Conflict);
        }
        if self.bufs.writes.is_empty() {
            return self.load_shared(off);
        }
        match self.bufs.writes.get(off) {
            Some((value, 0xFF)) => Ok(value),
            Some((value, mask)) => {
                let shared = self.load_shared(off)?;
                let bits = tusk_storage::heap::mask_bits(mask);
                Ok((shared & !bits) | (value & bits))
            }
            None => self.load_shared(off),
        }
    }

    /// Buffers a write of the word at `off` (8-aligned).
    #[inline]
    pub fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError> {
        self.store_masked(off, value, 0xFF)
    }

    /// Buffers writes of `values.len()` consecutive words from `off` (8-aligned): the same as
    /// storing them one by one, with one write-set lookup per line.
    pub fn store_words(&mut self, off: u64, values: &[u64]) -> Result<(), TxnError> {
        debug_assert!(off.is_multiple_of(8));
        self.heap_ready(off, 8 * values.len() as u64)?;
        if self.doomed {
            return Err(TxnError::Conflict);
        }
        if self.in_place.is_some() {
            return self.store_words_in_place(off, values);
        }
        let lines = self.bufs.writes.len();
        self.bufs.writes.put_words(off, values);
        self.prefetch_new_lines(lines);
        self.maybe_in_place()
    }

    /// Fetches the stripe words (and page stamps) of the lines written since the write set
    /// held `before` lines: commit locks them, and a clock-mode transaction has not read them.
    #[inline]
    fn prefetch_new_lines(&self, before: usize) {
        for e in self.bufs.writes.iter_from(before) {
            self.engine.stripes.prefetch(e.line);
            self.engine.heap().prefetch_dirty_stamp(e.line);
        }
    }

    #[inline]
    fn store_masked(&mut self, off: u64, value: u64, mask: u8) -> Result<(), TxnError> {
        debug_assert!(off.is_multiple_of(8));
        self.heap_ready(off, 8)?;
        if self.in_place.is_some() {
            return self.store_in_place(off, value, mask);
        }
        if self.doomed {
            return Err(TxnError::Conflict);
        }
        let lines = self.bufs.writes.len();
        self.bufs.writes.put(off, value, mask);
        if self.bufs.writes.len() != lines {
            self.prefetch_new_lines(lines);
            return self.maybe_in_place();
        }
        Ok(())
    }

    #[inline]
    fn load_shared(&mut self, off: u64) -> Result<u64, TxnError> {
        let mut word = [0u64; 1];
        self.load_run_shared(off, &mut word)?;
        Ok(word[0])
    }

    /// Reads `out.len()` words from `off` as of this transaction (8-aligned; a fast path for
    /// index nodes: the words of one 64-byte line are validated together, with one stripe
    /// check instead of one per word, and overlaid with this transaction's writes to the line).
    #[inline]
    pub fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        debug_assert!(off.is_multiple_of(8));
        self.heap_ready(off, 8 * out.len() as u64)?;
        if self.in_place.is_some() {
            return self.load_words_in_place(off, out);
        }
        self.load_words_shared(off, out)
    }

    /// [`Transaction::load_words`] outside in-place mode.
    fn load_words_shared(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        if self.doomed {
            return Err(TxnError::Conflict);
        }
        if self.clock_mode && self.bufs.writes.is_empty() && !out.is_empty() {
            // Clock mode with nothing written: load the whole run (one bounds check), then
            // one check of the clock covers every word of it, as it covers one line's words in
            // `load_run_shared` (a commit draws its LSN before writing back, so a load that saw
            // any of its stores finds the clock moved). The run's lines go to the read set, for
            // extension and commit to validate like any other read.
            let engine = self.engine;
            engine.heap().load_words(off, out);
            if engine.clock_still(self.rv) {
                let last = off + 8 * (out.len() as u64 - 1);
                let mut line = off & !(STRIPE_BYTES - 1);
                while line <= last {
                    self.note_read(engine.stripes.index_of(line));
                    line += STRIPE_BYTES;
                }
                return Ok(());
            }
            // The clock moved: line by line below, where the first read extends or changes
            // to stripe mode.
        }
        let mut i = 0;
        while i < out.len() {
            let at = off + 8 * i as u64;
            let line_end = (at | (STRIPE_BYTES - 1)) + 1;
            let n = (((line_end - at) / 8) as usize).min(out.len() - i);
            let run = &mut out[i..i + n];
            i += n;
            let first = ((at % LINE_BYTES) / 8) as usize;
            let line = at & !(LINE_BYTES - 1);
            let Some(e) = self.bufs.writes.line(line) else {
                self.load_run_shared(at, run)?;
                continue;
            };
            // Words written whole need no shared read (as in `load`); any other needs the line.
            if !(first..first + n).all(|w| e.is_full(w)) {
                self.load_run_shared(at, run)?;
            }
            self.overlay_writes(at, run);
        }
        Ok(())
    }

    /// Overlays `run`, the words at `at` within one line, with this transaction's buffered
    /// writes to them.
    #[inline]
    fn overlay_writes(&self, at: u64, run: &mut [u64]) {
        let Some(e) = self.bufs.writes.line(at & !(LINE_BYTES - 1)) else { return };
        let first = ((at % LINE_BYTES) / 8) as usize;
        for (j, out) in run.iter_mut().enumerate() {
            let mask = e.mask(first + j);
            if mask != 0 {
                let bits = tusk_storage::heap::mask_bits(mask);
                *out = (*out & !bits) | (e.words[first + j] & bits);
            }
        }
    }

    /// Reads `out.len()` words from `off` as this transaction sees them, its own writes
    /// included, but without noting them: no read set, no stripe lock in place, nothing for
    /// commit to validate. Other transactions' commits may make what it returns stale, or tear
    /// it; only for reads whose use is proven otherwise (an index descent's internal nodes,
    /// where the leaf reached proves itself). Returns false, reading nothing, where the words
    /// leave the heap or lie in a damaged chunk (the load that follows reports it).
    #[inline]
    pub fn peek_words(&self, off: u64, out: &mut [u64]) -> bool {
        debug_assert!(off.is_multiple_of(8));
        let heap = self.engine.heap();
        if !heap.contains(off, 8 * out.len() as u64) || heap.ready(off, 8 * out.len() as u64).is_err() {
            return false;
        }
        heap.load_words(off, out);
        if self.in_place.is_none() && !self.bufs.writes.is_empty() {
            let mut i = 0;
            while i < out.len() {
                let at = off + 8 * i as u64;
                let n = ((((at | (LINE_BYTES - 1)) + 1 - at) / 8) as usize).min(out.len() - i);
                self.overlay_writes(at, &mut out[i..i + n]);
                i += n;
            }
        }
        true
    }

    /// Reads the words of `out` from `off`, all inside one stripe's line, validated together
    /// against the stripe (seqlock style) and recorded in the read set once.
    #[inline]
    fn load_run_shared(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        if self.in_place.is_some() {
            return self.load_words_in_place(off, out);
        }
        let engine = self.engine;
        let stripes = &engine.stripes;
        let s = stripes.index_of(off);
        debug_assert!(out.len() as u64 * 8 <= STRIPE_BYTES - off % STRIPE_BYTES);
        let mut clock_extensions = 0;
        while self.clock_mode {
            engine.heap().load_words(off, out);
            if engine.clock_still(self.rv) {
                self.note_read(s);
                return Ok(());
            }
            // The clock moved (a commit, or an LSN drawn without writes, such as a checkpoint's
            // chunk copy). A transaction that has written is an update among other updates:
            // it changes to stripe mode at once, keeping its read version (its clock-mode reads
            // hold that version's values; stripe mode extends only when a stripe it reads is
            // newer). Extending here on every moved clock cost write-heavy workloads 15-20% of
            // their throughput (`bench txn --commit off`, 2 threads). A transaction that has
            // only read extends as stripe mode does, and stays in clock mode while no
            // write-back is in flight behind the new read version; a few times at most, since
            // each extension validates the whole read set.
            if !self.bufs.writes.is_empty() {
                self.clock_mode = false;
                break;
            }
            let (now, idle) = engine.read_version();
            if !self.reads_valid() {
                return self.conflict();
            }
            self.rv = now;
            engine.clock_hints.saw(engine.thread_slot(), now);
            clock_extensions += 1;
            self.clock_mode = idle && clock_extensions <= CLOCK_EXTENSIONS;
        }
        let mut spins = 0;
        loop {
            let before = stripes.load(s);
            if is_locked(before) {
                spins += 1;
                if spins > LOCKED_SPINS {
                    // Held past a commit's write-back: most likely by a run in place, to its
                    // end. This transaction holds no lock, so it may wait for the stripe, and
                    // then reads on, extending its read version if its reads are untouched,
                    // rather than losing what it did (a large transaction's first attempt
                    // buffers thousands of lines). Not beside a run of this thread's, which
                    // may be what holds the stripe.
                    if running_here() || !self.engine.wait_unlocked(s, Some(RETRY_WAIT)) {
                        self.locked_out = Some(s);
                        return self.conflict();
                    }
                    spins = 0;
                    continue;
                }
                crate::sync::spin_loop();
                continue;
            }
            engine.heap().load_words(off, out);
            let after = stripes.recheck(s);
            if before != after {
                continue;
            }
            if version(before) > self.rv {
                self.extend()?;
                continue;
            }
            self.note_read(s);
            return Ok(());
        }
    }

    /// Adds stripe `s` to the read set, unless it is the one added last (a node's lines are
    /// often read one after another: header, keys, a value; re-reading the stripe word at
    /// validation would only repeat the check).
    #[inline]
    fn note_read(&mut self, s: u32) {
        if self.bufs.reads.last() != Some(&s) {
            self.bufs.reads.push(s);
        }
    }

    /// Moves the read version forward if everything read so far is unchanged.
    fn extend(&mut self) -> Result<(), TxnError> {
        let now = self.engine.last_lsn();
        if !self.reads_valid() {
            return self.conflict();
        }
        self.rv = now;
        self.engine.clock_hints.saw(self.engine.thread_slot(), now);
        Ok(())
    }

    fn reads_valid(&self) -> bool {
        let stripes = &self.engine.stripes;
        self.bufs.reads.iter().all(|&s| {
            let w = stripes.load(s);
            let w = if is_locked(w) {
                // Locked by this transaction's commit: judge by the version it locked.
                match self.bufs.locked.binary_search(&s) {
                    Ok(_) => w & !1,
                    Err(_) => return false,
                }
            } else {
                w
            };
            version(w) <= self.rv
        })
    }

    /// Reads `buf.len()` bytes at heap offset `off` (unchecked against allocations).
    pub fn read_raw(&mut self, off: u64, buf: &mut [u8]) -> Result<(), TxnError> {
        self.check_range(off, buf.len() as u64)?;
        let mut pos = 0usize;
        while pos < buf.len() {
            let at = off + pos as u64;
            let word_off = at & !7;
            let skip = (at - word_off) as usize;
            let take = (8 - skip).min(buf.len() - pos);
            let bytes = self.load(word_off)?.to_le_bytes();
            buf[pos..pos + take].copy_from_slice(&bytes[skip..skip + take]);
            pos += take;
        }
        Ok(())
    }

    /// Writes `data` at heap offset `off` (unchecked against allocations).
    pub fn write_raw(&mut self, off: u64, data: &[u8]) -> Result<(), TxnError> {
        self.check_range(off, data.len() as u64)?;
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let word_off = at & !7;
            let skip = (at - word_off) as usize;
            let take = (8 - skip).min(data.len() - pos);
            let mut bytes = [0u8; 8];
            bytes[skip..skip + take].copy_from_slice(&data[pos..pos + take]);
            let mask = (((1u16 << take) - 1) << skip) as u8;
            self.store_masked(word_off, u64::from_le_bytes(bytes), mask)?;
            pos += take;
        }
        Ok(())
    }

    // ---- checked access to allocations ----

    /// The length of the live allocation at `p`.
    pub fn len(&mut self, p: HeapPtr) -> Result<u64, TxnError> {
        let ptr = p.offset();
        if let Some(&(_, len)) = self.bounds.iter().find(|&&(start, _)| start == ptr && start != 0) {
            return Ok(len);
        }
        if !ptr.is_multiple_of(8) || ptr < DATA_START + HEADER_SIZE || !self.engine.heap().contains(ptr, 0) {
            return Err(TxnError::InvalidPointer(ptr));
        }
        let header = BlockHeader::decode(self.load(ptr - HEADER_SIZE)?).ok_or(TxnError::InvalidPointer(ptr))?;
        if header.state != STATE_ALLOCATED {
            return Err(TxnError::InvalidPointer(ptr));
        }
        let len = if header.class == CLASS_LARGE { self.load(ptr - 2 * HEADER_SIZE)? } else { header.len as u64 };
        self.bounds[self.bounds_next] = (ptr, len);
        self.bounds_next = (self.bounds_next + 1) % BOUNDS_CACHE;
        Ok(len)
    }

    pub(crate) fn forget_bounds(&mut self, p: HeapPtr) {
        for b in &mut self.bounds {
            if b.0 == p.offset() {
                *b = (0, 0);
            }
        }
    }

    fn checked(&mut self, p: HeapPtr, offset: u64, len: u64) -> Result<u64, TxnError> {
        let alloc_len = self.len(p)?;
        match offset.checked_add(len) {
            Some(end) if end <= alloc_len => Ok(p.offset() + offset),
            _ => Err(TxnError::OutOfBounds { ptr: p.offset(), offset, len, alloc_len }),
        }
    }

    /// Reads `buf.len()` bytes from the start of the allocation at `p`.
    pub fn read(&mut self, p: HeapPtr, buf: &mut [u8]) -> Result<(), TxnError> {
        self.read_at(p, 0, buf)
    }

    /// Reads `buf.len()` bytes at `offset` within the allocation at `p`.
    pub fn read_at(&mut self, p: HeapPtr, offset: u64, buf: &mut [u8]) -> Result<(), TxnError> {
        let at = self.checked(p, offset, buf.len() as u64)?;
        self.read_raw(at, buf)
    }

    /// Writes `data` at the start of the allocation at `p`.
    pub fn write(&mut self, p: HeapPtr, data: &[u8]) -> Result<(), TxnError> {
        self.write_at(p, 0, data)
    }

    /// Writes `data` at `offset` within the allocation at `p`.
    pub fn write_at(&mut self, p: HeapPtr, offset: u64, data: &[u8]) -> Result<(), TxnError> {
        let at = self.checked(p, offset, data.len() as u64)?;
        self.write_raw(at, data)
    }

    /// Reads the little-endian u64 at `offset` within the allocation at `p`.
    pub fn read_u64_at(&mut self, p: HeapPtr, offset: u64) -> Result<u64, TxnError> {
        let at = self.checked(p, offset, 8)?;
        if at % 8 == 0 {
            return self.load(at);
        }
        let mut b = [0u8; 8];
        self.read_raw(at, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `value` as a little-endian u64 at `offset` within the allocation at `p`.
    pub fn write_u64_at(&mut self, p: HeapPtr, offset: u64, value: u64) -> Result<(), TxnError> {
        let at = self.checked(p, offset, 8)?;
        if at % 8 == 0 {
            return self.store(at, value);
        }
        self.write_raw(at, &value.to_le_bytes())
    }

    /// Hints that the word at `offset` of the allocation at `p` will be accessed soon: its
    /// line and (in stripe mode) its stripe lock are fetched into cache, so that a transaction touching
    /// several random words waits for their memory in parallel rather than one by one.
    /// Unchecked and without effect on the transaction's state.
    #[inline]
    pub fn prefetch(&self, p: HeapPtr, offset: u64) {
        let at = p.offset().wrapping_add(offset);
        self.engine.heap().prefetch(at);
        if !self.clock_mode {
            self.engine.stripes.prefetch(at);
        }
    }

    /// [`Transaction::prefetch`] of every line of the `len` bytes at heap offset `off` (an
    /// index node as soon as its offset is known). Unchecked and without effect on the
    /// transaction's state.
    #[inline]
    pub fn prefetch_range(&self, off: u64, len: u64) {
        let heap = self.engine.heap();
        let end = off.saturating_add(len).min(heap.capacity());
        let mut line = off & !(STRIPE_BYTES - 1);
        let first = line;
        while line < end {
            heap.prefetch(line);
            // One prefetch per cache line of stripe words (eight lines' words): more only
            // queue behind the first for the same line.
            if !self.clock_mode && (line == first || (line / STRIPE_BYTES).is_multiple_of(STRIPE_WORDS_PER_LINE)) {
                self.engine.stripes.prefetch(line);
            }
            line += STRIPE_BYTES;
        }
    }

    // ---- commit ----

    /// Commits. Returns the LSN for update transactions, `None` for read-only ones.
    /// On `Err(Conflict)` nothing was written; the caller may `restart` and retry.
    pub fn commit(&mut self, mode: Commit) -> Result<Option<Lsn>, TxnError> {
        if self.doomed {
            return Err(TxnError::Conflict);
        }
        self.finishing = true;
        while let Some(work) = self.deferred.take_next() {
            if let Err(e) = work.finish(self) {
                self.finishing = false;
                return self.deferred_failed(e);
            }
        }
        self.finishing = false;
        if self.in_place.is_some() {
            return self.commit_in_place(mode);
        }
        if self.bufs.writes.is_empty() {
            // The transaction may be used again: it starts over as a new one.
            self.start_over_committed(self.rv, self.clock_mode);
            return Ok(None);
        }
        // A conflict here has doomed the transaction, as any read's does.
        self.fill_reserve_before_commit()?;
        let engine = self.engine;
        engine.check_open()?;
        if self.bufs.writes.len() > MAX_LINES {
            // Its record would not fit (a large transaction that found the in-place token
            // taken all along): nothing is written.
            self.doomed = true;
            return Err(TxnError::TooLarge { max: MAX_LINES as u64 });
        }
        self.lock_write_set()?;
        if !self.reads_valid() {
            self.unlock_restore();
            return self.conflict();
        }
        // Point of no return: the transaction commits. The gate pass spans the LSN draw and
        // the write-back, so a snapshot sees all of this commit or none of it.
        let pass = engine.gate.enter(engine.thread_slot());
        let partition = engine.partition_for_commit(mode.waits());
        let flags = if mode == Commit::Partition { FLAG_PARTITION } else { 0 };
        let (lsn, over_bound) = match &engine.log {
            Some(log) => {
                let lines = self.bufs.writes.sorted();
                log.append(partition, mode.waits(), |buf, lsn| {
                    encode_record(buf, lsn, partition as u32, flags, lines.len(), |k| {
                        let e = lines.get(k);
                        LineWrites { line: e.line, masks: e.masks, words: e.words }
                    })
                })
            }
            None => (engine.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1, false),
        };
        // Clock-mode readers: a load that sees a store of this write-back must then see the
        // LSN just drawn (pairs with the acquire fence of `Engine::clock_still`). A
        // compiler-only barrier on x86.
        crate::sync::fence(std::sync::atomic::Ordering::Release);
        let heap = engine.heap();
        let mut stamps = PageStamps::new(heap, engine.dirty_epoch());
        for e in self.bufs.writes.iter() {
            if e.masks == u64::MAX {
                for (w, &value) in e.words.iter().enumerate() {
                    heap.store_word(e.line + 8 * w as u64, value);
                }
            } else {
                for (off, value, mask) in e.written() {
                    heap.store_word_masked(off, value, mask);
                }
            }
            stamps.line(e.line);
        }
        drop(pass);
        for &s in &self.bufs.locked {
            engine.stripes.unlock_with(s, lsn);
        }
        self.bufs.locked.clear();
        // The transaction may be used again: it starts over as a new one, re-checking every
        // allocation it touches (its bounds cache may name blocks freed since).
        self.start_over_committed(lsn, false);
        self.wait_for(mode, partition, lsn, over_bound)
    }

    /// What `mode` waits for after the commit of `lsn` in `partition`.
    fn wait_for(&self, mode: Commit, partition: usize, lsn: Lsn, over_bound: bool) -> Result<Option<Lsn>, TxnError> {
        if let Some(log) = &self.engine.log {
            match mode {
                Commit::Sync => log.wait_durable(lsn)?,
                Commit::Partition => log.wait_partition(partition, lsn)?,
                Commit::Async if over_bound => log.throttle(partition, lsn)?,
                Commit::Async => {}
            }
            log.respect_space_limit()?;
        }
        Ok(Some(lsn))
    }

    /// Abandons the transaction (nothing it wrote becomes visible).
    pub fn abort(self) {}

    /// The work of type `T` this transaction left to its commit under `key`, if any (see
    /// [`crate::deferred`]).
    pub fn deferred<T: Deferred>(&self, key: u64) -> Option<&T> {
        self.deferred.get(key)
    }

    /// The work of type `T` left to the commit under `key`, made by `make` if there is none;
    /// `None` if `key` holds work of another type.
    pub fn defer<T: Deferred>(&mut self, key: u64, make: impl FnOnce() -> T) -> Option<&mut T> {
        self.deferred.get_or_insert(key, make)
    }

    /// Does the work left to the commit under `key` now (for an operation that needs it done
    /// first).
    pub fn finish_deferred(&mut self, key: u64) -> Result<(), TxnError> {
        match self.deferred.take(key) {
            Some(work) => work.finish(self).or_else(|e| self.deferred_failed(e)),
            None => Ok(()),
        }
    }

    /// Ends an attempt whose deferred work failed part way (a conflict, a full heap): what it
    /// left undone is lost with it, so it may not commit. A run in place ends first (a
    /// conflict ended it already; a full heap did not).
    #[cold]
    fn deferred_failed<T>(&mut self, error: TxnError) -> Result<T, TxnError> {
        self.deferred.clear();
        self.abandon_in_place();
        self.doomed = true;
        Err(error)
    }

    fn lock_write_set(&mut self) -> Result<(), TxnError> {
        let engine = self.engine;
        let stripes = &engine.stripes;
        self.bufs.locked.clear();
        // Sorted by line (the record needs that too), the stripes come out ascending unless
        // the write set spans the stripe table's wrap-around; only then sort them again. One
        // entry is one line, so one stripe.
        const _: () = assert!(LINE_BYTES == STRIPE_BYTES);
        self.bufs.writes.sort();
        for e in self.bufs.writes.sorted().iter() {
            self.bufs.locked.push(stripes.index_of(e.line));
        }
        // The stripe words of the read set are validated right after locking: fetch them now,
        // so that their misses (a clock-mode transaction has not touched them yet) overlap
        // with the locks' instead of following them one by one.
        for &s in self.bufs.reads.iter().take(PREFETCH_READS) {
            stripes.prefetch(u64::from(s) * STRIPE_BYTES);
        }
        self.bufs.locked.dedup();
        if !self.bufs.locked.windows(2).all(|p| p[0] < p[1]) {
            self.bufs.locked.sort_unstable();
            self.bufs.locked.dedup();
        }
        for i in 0..self.bufs.locked.len() {
            let s = self.bufs.locked[i];
            let mut spins = 0;
            loop {
                let seen = stripes.load(s);
                if !is_locked(seen) && stripes.try_lock(s, seen) {
                    break;
                }
                spins += 1;
                if spins > LOCKED_SPINS {
                    self.bufs.locked.truncate(i);
                    self.unlock_restore();
                    self.locked_out = Some(s);
                    return self.conflict();
                }
                crate::sync::spin_loop();
            }
        }
        Ok(())
    }

    fn unlock_restore(&mut self) {
        for &s in &self.bufs.locked {
            self.engine.stripes.unlock_unchanged(s);
        }
        self.bufs.locked.clear();
    }

    // ---- in-place mode (see `crate::in_place`) ----

    /// Changes to in-place mode once the write set has outgrown the threshold.
    #[inline]
    fn maybe_in_place(&mut self) -> Result<(), TxnError> {
        if self.bufs.writes.len() <= self.in_place_from {
            return Ok(());
        }
        self.try_in_place()
    }

    #[cold]
    fn try_in_place(&mut self) -> Result<(), TxnError> {
        let engine = self.engine;
        // A closed store draws no LSN (the change draws one); commit reports the closure.
        let state = if engine.check_open().is_ok() {
            self.went_large = true;
            // One run per thread (see `restart`).
            if running_here() {
                None
            } else {
                engine.in_place.try_take(self.age)
            }
        } else {
            None
        };
        if let Some(state) = state {
            return self.enter_in_place(state);
        }
        // Every state runs: keep buffering, try again at twice the size; but
        // a set past what one record holds is refused now, before it grows further (commit
        // would refuse it anyway).
        let lines = self.bufs.writes.len();
        if lines > MAX_LINES {
            self.doomed = true;
            return Err(TxnError::TooLarge { max: MAX_LINES as u64 });
        }
        self.in_place_from = (lines * 2).min(MAX_LINES);
        Ok(())
    }

    /// Changes to in-place mode with `state`: validates and holds the read set, applies the
    /// write set in place.
    fn enter_in_place(&mut self, state: Box<InPlace>) -> Result<(), TxnError> {
        let engine = self.engine;
        self.age = Some(state.age);
        let pass = RunPass::new(engine.gate.enter(engine.thread_slot()));
        // The clock moves: a clock-mode reader that could see an in-place store finds it moved
        // and turns to the stripes, which this transaction holds (pairs with the acquire fence
        // of `Engine::clock_still`, as a commit's LSN does).
        engine.draw_empty_lsn();
        crate::sync::fence(std::sync::atomic::Ordering::Release);
        self.clock_mode = false;
        self.in_place = Some(InPlaceRun { state, pass });
        // Every stripe read so far: held from now on, and still at a version this transaction
        // may read (the check commit would make).
        let reads = std::mem::take(&mut self.bufs.reads);
        let mut valid = true;
        for &s in &reads {
            match self.hold(s) {
                Some(Some(seen)) if version(seen) <= self.rv => {}
                Some(None) => {}
                _ => {
                    valid = false;
                    break;
                }
            }
        }
        self.bufs.reads = reads;
        self.bufs.reads.clear();
        if !valid {
            return self.in_place_conflict();
        }
        let mut writes = std::mem::take(&mut self.bufs.writes);
        let applied = writes.iter().try_for_each(|e| self.apply_in_place(e));
        writes.clear();
        self.bufs.writes = writes;
        applied.or_else(|e| self.in_place_fail(e))
    }

    /// Locks stripe `s` for the in-place run unless it holds it: `Some(Some(word seen))` when
    /// newly locked, `Some(None)` when held already, `None` when the wait timed out or an
    /// older run wounded this one (see [`crate::in_place::Runs`]).
    #[inline(always)]
    fn hold(&mut self, s: u32) -> Option<Option<u64>> {
        if self.in_place.as_ref().expect("in place").state.is_held(s) {
            return Some(None);
        }
        self.hold_new(s)
    }

    /// [`Transaction::hold`] of a stripe the run does not hold yet.
    #[inline(never)]
    fn hold_new(&mut self, s: u32) -> Option<Option<u64>> {
        let run = self.in_place.as_mut().expect("in place");
        let (stripes, runs, gate) = (&self.engine.stripes, &self.engine.in_place, &self.engine.gate);
        let (mut wait, mut gate_closed_wait) = (LockWait::with_limit(RUN_WAIT), LockWait::new());
        loop {
            if runs.wounded(&run.state) {
                self.lost_to = runs.wounder(&run.state);
                return None;
            }
            if let Some(seen) = lock_for_run(stripes, &mut run.state, s) {
                return Some(Some(seen));
            }
            // Again at every look at the clock, not once: a younger run may have entered since
            // and taken the stripe.
            if wait.at_clock_look() && wait.lasted(if self.finishing { COMMIT_WOUND_AFTER } else { WOUND_AFTER }) {
                runs.wound_holder(&run.state, s);
            }
            // Only a wait with the gate closed all along counts towards `LOCK_WAIT` (see
            // `crate::in_place`): a gate that opened starts that count again.
            if !gate.is_closed() {
                gate_closed_wait = LockWait::new();
            }
            if !wait.again() || gate.is_closed() && !gate_closed_wait.again() {
                // The retry waits for it first, holding nothing (see `locked_out`).
                self.locked_out = Some(s);
                return None;
            }
        }
    }

    /// Holds the stripe of `line` for the run in place if it is held already or can be locked
    /// at once, without waiting (false otherwise, and when the transaction does not run in
    /// place): for work a run may leave undone.
    pub(crate) fn hold_at_once(&mut self, line: u64) -> bool {
        let s = self.engine.stripes.index_of(line);
        let stripes = &self.engine.stripes;
        let Some(run) = self.in_place.as_mut() else { return false };
        run.state.is_held(s) || lock_for_run(stripes, &mut run.state, s).is_some()
    }

    /// Whether a buffered transaction may still write `lines` more lines and stay buffered
    /// (false when it runs in place).
    pub(crate) fn buffered_room_for(&self, lines: usize) -> bool {
        self.in_place.is_none() && self.bufs.writes.len() + lines <= self.in_place_from.min(MAX_LINES)
    }

    /// Lines in the write set.
    #[cfg(test)]
    pub(crate) fn buffered_lines(&self) -> usize {
        self.bufs.writes.len()
    }

    /// Whether the run in place may still write `lines` more lines (false when it does not run
    /// in place).
    pub(crate) fn in_place_room_for(&self, lines: usize) -> bool {
        self.in_place.as_ref().is_some_and(|run| run.state.written_lines() + lines < run.state.max_lines)
    }

    /// Makes the line at `line` writable in place: its stripe held (else a conflict), its
    /// before-image saved (unless the run already writes the most lines a record holds).
    #[inline(always)]
    fn writable(&mut self, line: u64) -> Result<(), TxnError> {
        if !self.in_place.as_ref().expect("in place").state.first_write_would_add(line) {
            // Written before in this run: its stripe is held, its before-image saved.
            return Ok(());
        }
        self.writable_first(line)
    }

    /// [`Transaction::writable`] for the run's first write to the line.
    #[inline(never)]
    fn writable_first(&mut self, line: u64) -> Result<(), TxnError> {
        let s = self.engine.stripes.index_of(line);
        if self.hold(s).is_none() {
            return Err(TxnError::Conflict);
        }
        let fresh = (self.fresh.0..self.fresh.1).contains(&line);
        let state = &mut self.in_place.as_mut().expect("in place").state;
        state.note_written(s);
        if state.written_lines() >= state.max_lines && state.first_write_would_add(line) {
            return Err(TxnError::TooLarge { max: state.max_lines as u64 });
        }
        if state.first_write(line) {
            if fresh {
                state.fresh.push(line);
                return Ok(());
            }
            let mut words = [0u64; LINE_WORDS];
            self.engine.heap().load_words(line, &mut words);
            state.undo.push(before_image(line, words));
        }
        Ok(())
    }

    /// Applies a buffered line write in place (entering in-place mode).
    fn apply_in_place(&mut self, e: &LineWrite) -> Result<(), TxnError> {
        self.writable(e.line)?;
        let heap = self.engine.heap();
        let state = &mut self.in_place.as_mut().expect("in place").state;
        for (off, value, mask) in e.written() {
            heap.store_word_masked(off, value, mask);
            state.note_bytes(off, mask);
        }
        Ok(())
    }

    /// [`Transaction::load`] in place: the word's line held, then a plain load (every access
    /// of a large transaction comes here, so it is kept short).
    #[inline(always)]
    fn load_in_place(&mut self, off: u64) -> Result<u64, TxnError> {
        debug_assert!(!self.doomed, "a run ends before its transaction is doomed");
        self.hold_to_read(off & !(LINE_BYTES - 1))?;
        Ok(self.engine.heap().load_word(off))
    }

    /// Holds the line at `line` for a read in place (else the run ends in a conflict); a line
    /// newly held has its notes fetched for a write that may follow.
    #[inline(always)]
    fn hold_to_read(&mut self, line: u64) -> Result<(), TxnError> {
        match self.hold(self.engine.stripes.index_of(line)) {
            Some(None) => Ok(()),
            Some(Some(_)) => {
                self.in_place.as_ref().expect("in place").state.prefetch_notes(line);
                Ok(())
            }
            None => self.in_place_conflict(),
        }
    }

    /// [`Transaction::load_words`] in place: every line of the run held, then one load of the
    /// whole run (nothing is buffered to overlay).
    #[inline]
    fn load_words_in_place(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        let Some(last) = (out.len() as u64).checked_sub(1).map(|n| off + 8 * n) else { return Ok(()) };
        let mut line = off & !(STRIPE_BYTES - 1);
        while line <= last {
            self.hold_to_read(line)?;
            line += STRIPE_BYTES;
        }
        self.engine.heap().load_words(off, out);
        Ok(())
    }

    #[inline(always)]
    fn store_in_place(&mut self, off: u64, value: u64, mask: u8) -> Result<(), TxnError> {
        if let Err(e) = self.writable(off & !(LINE_BYTES - 1)) {
            return self.in_place_fail(e);
        }
        self.engine.heap().store_word_masked(off, value, mask);
        self.in_place.as_mut().expect("in place").state.note_bytes(off, mask);
        Ok(())
    }

    #[inline(never)]
    fn store_words_in_place(&mut self, off: u64, values: &[u64]) -> Result<(), TxnError> {
        let heap = self.engine.heap();
        let mut i = 0;
        while i < values.len() {
            let at = off + 8 * i as u64;
            let line = at & !(LINE_BYTES - 1);
            if let Err(e) = self.writable(line) {
                return self.in_place_fail(e);
            }
            let n = (((line + LINE_BYTES - at) / 8) as usize).min(values.len() - i);
            for (j, &v) in values[i..i + n].iter().enumerate() {
                heap.store_word(at + 8 * j as u64, v);
            }
            self.in_place.as_mut().expect("in place").state.note_whole(at, n);
            i += n;
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn in_place_conflict<T>(&mut self) -> Result<T, TxnError> {
        self.in_place_fail(TxnError::Conflict)
    }

    /// Ends the in-place run on `error` (restoring everything) and dooms the transaction.
    #[cold]
    #[inline(never)]
    fn in_place_fail<T>(&mut self, error: TxnError) -> Result<T, TxnError> {
        self.abandon_in_place();
        self.doomed = true;
        Err(error)
    }

    /// Ends an in-place run without committing: every written line gets its before-image
    /// back, the gate is left, a stripe only read gets the word it had, and a stripe written
    /// gets a newly drawn LSN as its version (below).
    fn abandon_in_place(&mut self) {
        let Some(InPlaceRun { mut state, pass }) = self.in_place.take() else { return };
        let engine = self.engine;
        let heap = engine.heap();
        for &line in &state.fresh {
            for w in 0..LINE_WORDS as u64 {
                heap.store_word(line + 8 * w, 0);
            }
        }
        for e in &state.undo {
            for (w, &value) in e.words.iter().enumerate() {
                heap.store_word(e.line + 8 * w as u64, value);
            }
        }
        // A stripe whose lines were written and restored gets a new version: back at its old
        // word, a reader that loaded the word before the run locked it and a line between the
        // run's store and the restore would find the word unchanged after it and take a value
        // no commit wrote (found by the loom model `readers_see_nothing_of_dropped_in_place_runs`).
        // So would a checkpoint's optimistic copy. The version is an LSN drawn now, above every
        // version the stripes had (the run's entry LSN is not: a commit may have written a
        // stripe between the run's entry and its lock), drawn without a record once the store
        // is closed.
        let wrote = state.held.iter().any(|&s| state.was_written(s));
        let version = wrote.then(|| match engine.check_open() {
            Ok(()) => engine.draw_empty_lsn(),
            Err(_) => engine.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1,
        });
        // The restored pages are stamped like a commit's: a consistent page copy whose open
        // pass read them while the run's stores were there must copy them again in its closed
        // pass (which waits for this pass), or it keeps stores no commit made (found by
        // `snapshot::copy::tests::an_in_place_run_dropped_during_the_open_pass_leaves_no_trace`).
        let mut stamps = PageStamps::new(heap, engine.dirty_epoch());
        for line in state.fresh.iter().copied().chain(state.undo.iter().map(|e| e.line)) {
            stamps.line(line);
        }
        drop(pass);
        for &s in &state.held {
            match version {
                // The release store of the unlock publishes the restored lines.
                Some(version) if state.was_written(s) => engine.stripes.unlock_with(s, version),
                _ => engine.stripes.unlock_unchanged(s),
            }
        }
        state.reset();
        engine.in_place.give_back(state);
    }

    /// Commits an in-place run: the bytes it wrote are its redo record;
    /// the LSN is drawn while every stripe is held.
    #[cold]
    #[inline(never)]
    fn commit_in_place(&mut self, mode: Commit) -> Result<Option<Lsn>, TxnError> {
        let engine = self.engine;
        if let Err(e) = engine.check_open() {
            self.abandon_in_place();
            return Err(e);
        }
        // Its last writes; a failure there has ended the run (none is expected: every line
        // it writes is held, and there is room for them).
        self.fill_reserve_at_commit()?;
        let InPlaceRun { mut state, pass } = self.in_place.take().expect("in place");
        let heap = engine.heap();
        // The record holds the bytes this transaction wrote, read from the heap (where they
        // are its last values) as it is encoded, in line order, the lines in address order.
        // Only those: a `Partition` record may be replayed beyond an LSN gap, and the other
        // words of its lines may hold writes of transactions lost in that gap.
        state.lines_in_order();
        state.masks_in_order();
        let partition = engine.partition_for_commit(mode.waits());
        let flags = if mode == Commit::Partition { FLAG_PARTITION } else { 0 };
        let (lines, masks) = (&state.lines, &state.masks);
        let after = |k: usize| {
            // Ascending, but with gaps the hardware prefetcher does not follow.
            if let Some(&ahead) = lines.get(k + COMMIT_PREFETCH_AHEAD) {
                heap.prefetch(ahead);
            }
            let mut words = [0u64; LINE_WORDS];
            heap.load_words(lines[k], &mut words);
            LineWrites { line: lines[k], masks: masks[k], words }
        };
        let header = |lsn| RecordHeader { lsn, partition: partition as u32, flags, void: None };
        let mut streamed = Ok(());
        let (lsn, over_bound) = match &engine.log {
            // Whole lines bound the record's size from above (its runs' headers aside).
            Some(log) if log.streams(lines.len() as u64 * LINE_BYTES) => {
                let measured = measure_lines(lines.len(), after, STREAM_PIECE);
                let (lsn, written) = log.append_streamed(partition, |lsn| LinesRecord { measured: &measured, header: header(lsn), line: &after });
                streamed = written;
                // With no LSN (the log had failed or stopped), the writes stay in memory, as
                // a failed flush leaves them, and the lines' next version is drawn as
                // without a log; the commit reports the error.
                (lsn.unwrap_or_else(|| engine.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1), false)
            }
            Some(log) => log.append(partition, mode.waits(), |buf, lsn| encode_record(buf, lsn, partition as u32, flags, lines.len(), after)),
            None => (engine.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1, false),
        };
        crate::sync::fence(std::sync::atomic::Ordering::Release);
        let mut stamps = PageStamps::new(heap, engine.dirty_epoch());
        for &line in lines {
            stamps.line(line);
        }
        drop(pass);
        for (k, &s) in state.held.iter().enumerate() {
            if let Some(&ahead) = state.held.get(k + COMMIT_PREFETCH_AHEAD) {
                engine.stripes.prefetch(u64::from(ahead) * STRIPE_BYTES);
            }
            if state.was_written(s) {
                engine.stripes.unlock_with(s, lsn);
            } else {
                engine.stripes.unlock_unchanged(s);
            }
        }
        state.reset();
        engine.in_place.give_back(state);
        self.start_over_committed(lsn, false);
        streamed?;
        self.wait_for(mode, partition, lsn, over_bound)
    }
}

/// Locks stripe `s` for the run of `state` if it is unlocked now; returns the word it had.
#[inline]
fn lock_for_run(stripes: &Stripes, state: &mut InPlace, s: u32) -> Option<u64> {
    let seen = stripes.load(s);
    (!is_locked(seen) && stripes.try_lock(s, seen)).then(|| {
        state.note_held(s);
        seen
    })
}

impl Engine {
    /// Starts a transaction. (Defined here, not in `engine.rs`: the engine sits below the
    /// transaction and does not know it.)
    pub fn begin(&self) -> Transaction<'_> {
        Transaction::new(self)
    }
}

/// Stamps the pages of written lines dirty: a line lies in one page, so a run of lines in one
/// page stamps it once.
struct PageStamps<'h> {
    heap: &'h Heap,
    epoch: u64,
    page: u64,
}

impl<'h> PageStamps<'h> {
    fn new(heap: &'h Heap, epoch: u64) -> PageStamps<'h> {
        PageStamps { heap, epoch, page: u64::MAX }
    }

    #[inline]
    fn line(&mut self, line: u64) {
        let page = line / tusk_storage::heap::PAGE_SIZE;
        if page != self.page {
            self.heap.stamp_dirty(line, LINE_BYTES, self.epoch);
            self.page = page;
        }
    }
}

/// Encodes a redo record of `count` line writes, `line(k)` the k-th in ascending line order
/// (see [`tusk_storage::line_record`]); with none (an in-place run that wrote nothing in the
/// end), an empty record, which still takes the LSN.
fn encode_record(buf: &mut Vec<u8>, lsn: u64, partition: u32, flags: u32, count: usize, line: impl Fn(usize) -> LineWrites) {
    let header = RecordHeader { lsn, partition, flags, void: None };
    if count == 0 {
        RecordEncoder::begin(buf, header).finish(buf);
        return;
    }
    encode_lines(buf, header, count, line);
}

/// Bytes of a streamed record encoded between two hand-overs to the log's writer.
const STREAM_PIECE: usize = 1 << 20;

/// An in-place transaction's record, streamed: encoded again from the heap as the writer
/// takes it (the lines stay held until it is on disk).
struct LinesRecord<'a, F: Fn(usize) -> LineWrites> {
    measured: &'a MeasuredLines,
    header: RecordHeader,
    line: F,
}

impl<F: Fn(usize) -> LineWrites> Streamed for LinesRecord<'_, F> {
    fn size(&self) -> usize {
        self.measured.framed_len(self.header)
    }

    fn produce(&mut self, out: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        self.measured.emit(self.header, &self.line, STREAM_PIECE, out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tusk_storage::Heap;

    use super::Commit;
    use crate::{Engine, EngineConfig, TxnError};

    fn engine() -> Engine {
        let config = EngineConfig { stripes_log2: 12, log: None, existing_segments: Vec::new() };
        Engine::start(config, Heap::new(1 << 20).unwrap(), 0).unwrap()
    }

    /// `load_words` validates a line's words together: while a writer keeps setting 20 words
    /// across three lines to one counter, every read-only `load_words` sees them all equal.
    #[test]
    fn load_words_sees_one_committed_state() {
        let engine = engine();
        let (base, n) = (4096 + 40, 20u64);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 1u64..20_000 {
                    let mut tx = engine.begin();
                    (0..n).try_for_each(|i| tx.store(base + 8 * i, k)).unwrap();
                    let _ = tx.commit(Commit::Async);
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) || seen == 0 {
                let mut tx = engine.begin();
                let mut out = [0u64; 20];
                match tx.load_words(base, &mut out) {
                    Ok(()) => {
                        assert!(out.iter().all(|&w| w == out[0]), "torn read {out:?}");
                        seen += 1;
                    }
                    Err(TxnError::Conflict) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });
    }

    /// A transaction begun with no commit in flight reads in clock mode; the first read after
    /// a commit extends over it when its earlier reads are untouched (staying in clock mode,
    /// since that commit is done), and conflicts once a commit overwrote one of them.
    #[test]
    fn clock_mode_extends_then_validates_like_stripe_mode() {
        let engine = engine();
        let mut tx = engine.begin();
        assert!(tx.in_clock_mode());
        assert_eq!(tx.load(4096).unwrap(), 0);
        let write = |off: u64| {
            let mut w = engine.begin();
            w.store(off, 7).unwrap();
            w.commit(Commit::Async).unwrap().unwrap()
        };
        write(8192);
        assert_eq!(tx.load(8192).unwrap(), 7, "extended over a commit it did not conflict with");
        assert!(tx.in_clock_mode(), "no write-back in flight behind the new read version");
        write(4096);
        write(12288);
        assert!(matches!(tx.load(12288), Err(TxnError::Conflict)), "its read of 4096 is stale");
    }

    proptest::proptest! {
        /// The redo record of a write set (runs of whole words across adjacent lines, partial
        /// words by byte range), decoded and applied to a zero heap, gives exactly the bytes
        /// the write set holds; its writes ascend without overlap (the encoder checks that).
        #[test]
        fn record_holds_exactly_the_write_set(
            writes in proptest::collection::vec((0u64..96, proptest::prelude::any::<u64>(), 1u8..=255, 0u8..3), 1..120),
        ) {
            use tusk_storage::log_format::{decode_frame, Frame};
            let mut ws = crate::write_set::WriteSet::default();
            let mut model = vec![0u8; 4 * 256];
            for (word, value, mask, kind) in writes {
                // Words bunched in four pages' first lines, some whole, some partial, some runs (of
                // three words, across lines too); the model keeps 256 bytes per page.
                let off = (word / 24) * 4096 + (word % 24) * 8;
                let mask = if kind == 0 { mask } else { 0xFF };
                let at = |off: u64| ((off / 4096) * 256 + off % 4096) as usize;
                if kind == 2 {
                    let vs = [value, !value, value.rotate_left(7)];
                    ws.put_words(off, &vs);
                    for (i, v) in vs.iter().enumerate() {
                        let o = off + 8 * i as u64;
                        model[at(o)..at(o) + 8].copy_from_slice(&v.to_le_bytes());
                    }
                } else {
                    ws.put(off, value, mask);
                    for b in 0..8 {
                        if mask & (1 << b) != 0 {
                            model[at(off) + b] = value.to_le_bytes()[b];
                        }
                    }
                }
            }
            ws.sort();
            let mut buf = Vec::new();
            let lines = ws.sorted();
            super::encode_record(&mut buf, 7, 1, 0, lines.len(), |k| {
                let e = lines.get(k);
                super::LineWrites { line: e.line, masks: e.masks, words: e.words }
            });
            let lines: Vec<_> = ws.sorted().iter().copied().collect();
            let Frame::Record(view, _) = decode_frame(&buf, 0) else { panic!("record does not decode") };
            let mut got = vec![0u8; model.len()];
            let mut written = vec![false; model.len()];
            for (off, bytes) in view.writes() {
                for (i, &b) in bytes.iter().enumerate() {
                    let o = off + i as u64;
                    let at = ((o / 4096) * 256 + o % 4096) as usize;
                    got[at] = b;
                    written[at] = true;
                }
            }
            proptest::prop_assert_eq!(&got, &model);
            for e in &lines {
                for w in 0..crate::write_set::LINE_WORDS {
                    for b in 0..8 {
                        let o = e.line + 8 * w as u64 + b;
                        let at = ((o / 4096) * 256 + o % 4096) as usize;
                        proptest::prop_assert_eq!(written[at], e.mask(w) & (1 << b) != 0, "byte {} logged iff written", o);
                    }
                }
            }
        }
    }

    /// A clock-mode `load_words` over several lines checks the clock once for the whole run:
    /// a commit before the read moves the clock, so the read extends (nothing read before)
    /// and sees the commit whole; every line of the run is in the read set, so a later commit
    /// of its last line makes the next read (which finds the clock moved) a conflict; a read
    /// after a commit of lines read earlier is a conflict too.
    #[test]
    fn multi_line_clock_mode_reads_validate_every_line() {
        let engine = engine();
        let write = |offs: &[u64], v: u64| {
            let mut w = engine.begin();
            offs.iter().try_for_each(|&o| w.store(o, v)).unwrap();
            w.commit(Commit::Async).unwrap().unwrap()
        };
        // Commit between begin and the read: extended, whole commit seen.
        let mut tx = engine.begin();
        assert!(tx.in_clock_mode());
        write(&[8192, 8192 + 64, 8192 + 128 + 8], 5);
        let mut out = [0u64; 18];
        tx.load_words(8192, &mut out).unwrap();
        assert_eq!((out[0], out[8], out[17]), (5, 5, 5));
        assert!(tx.in_clock_mode());
        // The run's last line is in the read set.
        let mut tx = engine.begin();
        tx.load_words(8192, &mut out).unwrap();
        assert!(tx.in_clock_mode());
        write(&[8192 + 128 + 8], 6);
        assert!(matches!(tx.load(16384), Err(TxnError::Conflict)), "the run's third line was recorded");
        // A multi-line read after a commit overwrote an earlier read conflicts.
        let mut tx = engine.begin();
        assert_eq!(tx.load(4096).unwrap(), 0);
        write(&[4096, 8192 + 64], 7);
        assert!(matches!(tx.load_words(8192, &mut out), Err(TxnError::Conflict)));
        // Read-only transactions that read nothing stale commit.
        let mut tx = engine.begin();
        tx.load_words(8192, &mut out).unwrap();
        assert_eq!((out[0], out[8], out[17]), (5, 7, 6));
        assert_eq!(tx.commit(Commit::Async).unwrap(), None);
    }

    /// While a writer keeps committing two words on different lines, read-only transactions
    /// that read both in one `load_words` (clock mode, one clock check) see them equal or fail
    /// with a conflict, and a later single-word read of the first agrees with the run.
    #[test]
    fn multi_line_clock_mode_read_under_commits() {
        let engine = engine();
        let (a, b) = (4096u64, 4096 + 3 * 64 + 8);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 1u64..20_000 {
                    let mut tx = engine.begin();
                    tx.store(a, k).unwrap();
                    tx.store(b, k).unwrap();
                    let _ = tx.commit(Commit::Async);
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) || seen == 0 {
                let mut tx = engine.begin();
                let mut out = [0u64; 26];
                let run = tx.load_words(a, &mut out).and_then(|()| Ok((out[0], out[25], tx.load(a)?)));
                match run {
                    Ok((x, y, again)) => {
                        assert_eq!(x, y, "torn multi-line read");
                        assert_eq!(again, x, "a later read disagrees with the run");
                        seen += 1;
                    }
                    Err(TxnError::Conflict) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });
    }

    /// With buffered writes, `load_words` returns them (read-your-writes), like `load`.
    #[test]
    fn load_words_reads_own_writes() {
        let engine = engine();
        let mut tx = engine.begin();
        for i in 0..10u64 {
            tx.store(8192 + 8 * i, i * 3).unwrap();
        }
        tx.commit(Commit::Async).unwrap();
        let mut tx = engine.begin();
        tx.store(8192 + 16, 99).unwrap();
        let mut out = [0u64; 10];
        tx.load_words(8192, &mut out).unwrap();
        assert_eq!(out, [0, 3, 99, 9, 12, 15, 18, 21, 24, 27]);
    }
}

/// Loom models of clock mode (run by .ci/loom), beside `loom_models.rs`'s readers of whole
/// commits: a reader begun on a spawned thread and a commit of two words run on the model's
/// own (`loom_models::reader_beside_a_commit`). The reader begins in clock mode unless the
/// commit is writing back at that moment; each model checks that some of its executions ran
/// the reader in clock mode (the readers of whole commits also cover stripe mode).
///
/// The other way round (the reader begun on the model's thread before it spawned the
/// committer, which made clock mode certain), loom 0.7 explored a single interleaving of these
/// models (tokio-rs/loom#392: a spawned thread whose first operation is an atomic load,
/// `begin`'s, is never scheduled elsewhere): they passed with clock-mode validation switched
/// off (`Engine::clock_still` always true). Making the committer wait until the reader had
/// begun left them at 12 executions, still blind to that. As they are now, each fails
/// without it.
#[cfg(all(test, loom))]
mod loom_models {
    use crate::loom_models::{engine, reader_beside_a_commit, transact};
    use crate::{Commit, TxnError};
    use loom::thread;

    /// A clock-mode `load_words` spanning two lines (one load of the run, one clock check)
    /// concurrent with a commit of a word on each line sees both old or both new values, or
    /// fails with a conflict; a single-word read after it agrees with it.
    #[test]
    fn loom_clock_mode_multi_line_read_sees_whole_commits() {
        reader_beside_a_commit(64, 128, |t, a, b| {
            let mut out = [0u64; 9];
            if t.load_words(a, &mut out).is_ok() {
                assert_eq!(out[0], out[8], "a multi-line clock-mode read saw half of a commit");
                if let Ok(again) = t.load(b) {
                    assert_eq!(again, out[8], "a later read disagrees with the run");
                }
            }
        });
    }

    /// An update transaction that read in clock mode is validated at commit like any other:
    /// two increments of one word, one of them read in clock mode, lose no update.
    #[test]
    fn loom_clock_mode_update_loses_no_update() {
        loom::model(|| {
            let engine = engine();
            let mut t = engine.begin();
            assert!(t.in_clock_mode());
            let other = {
                let engine = engine.clone();
                thread::spawn(move || transact(&engine, |t| {
                    let old = t.load(64)?;
                    t.store(64, old + 1)
                }))
            };
            loop {
                let done = t.load(64).and_then(|old| t.store(64, old + 1)).and_then(|()| t.commit(Commit::Async));
                match done {
                    Ok(lsn) => {
                        assert!(lsn.is_some());
                        break;
                    }
                    Err(TxnError::Conflict) => {
                        t.restart();
                        thread::yield_now();
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            drop(t);
            other.join().unwrap();
            assert_eq!(engine.heap().load_word(64), 2, "an update was lost");
        });
    }

    /// A transaction that begins in stripe mode on its slot's last clock value, older than
    /// the clock (`clock_hints`), loses no update beside a concurrent increment, and of the
    /// two, the one that read the other's write has the larger LSN. The stale side runs on the
    /// spawned thread: it begins without loading a modeled atomic (see loom#392 above).
    #[test]
    fn loom_stale_read_version_loses_no_update() {
        let increment = |t: &mut crate::Transaction<'_>| {
            let old = t.load(64)?;
            t.store(64, old + 1)?;
            Ok(old)
        };
        loom::model(move || {
            let engine = engine();
            let stale = {
                let engine = engine.clone();
                thread::spawn(move || {
                    let slot = engine.thread_slot();
                    for _ in 0..crate::clock_hints::BUSY_STREAK {
                        engine.clock_hints.begun(slot, false);
                    }
                    transact(&engine, |t| {
                        assert!(!t.in_clock_mode(), "the hint skips clock mode");
                        increment(t)
                    })
                })
            };
            let (read_here, lsn_here) = transact(&engine, increment);
            let (read_stale, lsn_stale) = stale.join().unwrap();
            assert_eq!(engine.heap().load_word(64), 2, "an update was lost");
            let (first, second) = if read_stale == 1 { (lsn_here, lsn_stale) } else { (lsn_stale, lsn_here) };
            assert_eq!(read_here + read_stale, 1, "one read the other's write");
            assert!(second > first, "the transaction that read the other's write has the larger LSN");
        });
    }

    /// A reader that fell back to stripes keeps its clock-mode reads valid only while their
    /// stripes are unchanged: once it has read `a`, a commit of both words makes its later
    /// read of `b` either the value that goes with its `a` or a conflict, never the other.
    #[test]
    fn loom_clock_mode_fallback_validates_earlier_reads() {
        reader_beside_a_commit(64, 128, |t, a, b| {
            let Ok(x) = t.load(a) else { return };
            match t.load(b) {
                Ok(y) => assert_eq!(y, x, "read a b that does not go with the a read before"),
                Err(TxnError::Conflict) => {}
                Err(e) => panic!("{e}"),
            }
        });
    }
}
