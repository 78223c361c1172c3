//! The consistent incremental page copy: brings a target (a snapshot image in memory, the
//! GPU mirror's device memory) to exactly the committed state at one LSN, copying only the
//! pages dirtied since the target's last copy. One mechanism, many targets ([`PageSink`]).
//!
//! Why this way (and not a pause for the whole copy, as the paper's memcpy snapshot does):
//! writers would stop for the whole copy, ~0.1 s per GiB here. Instead:
//! 1. close the gate for a moment and start a new dirty epoch `e_mid` (every write-back from
//!    then on stamps its pages above `e_mid`);
//! 2. copy, with the gate open, every page the target lacks (all of the heap's used extent
//!    for a new target, else the pages stamped since the target's epoch, which the sink finds
//!    as it copies: [`PageSink::copy_dirty`]); bytes written meanwhile may come out torn;
//! 3. close the gate and copy again the pages stamped above `e_mid` (exactly those written
//!    during step 2), plus any extent the heap grew by; the target now equals the heap, the
//!    heap holds every LSN ≤ the clock and nothing later (the gate), so that is the copy's
//!    LSN; start another epoch, the target's new one, and open the gate.
//!
//! Writers pause only for step 3, which is proportional to what they wrote during step 2
//! (and for step 1, microseconds). When the target lacks little (below
//! [`DIRECT_COPY_BYTES`]: a sample of one epoch in [`ESTIMATE_STRIDE`] says so, and a scan of
//! them all confirms it), step 2 is skipped and step 3 copies it all: one pass instead of
//! two, with a pause of at most the time to copy those bytes (~0.5 ms).

use std::ops::Range;
use std::time::{Duration, Instant};

use tusk_storage::layout::BRK_OFF;
use tusk_storage::{Heap, PAGE_SIZE};

use crate::engine::Engine;
use crate::TxnError;

/// Targets lacking fewer bytes than this are copied in one pass under the closed gate.
pub const DIRECT_COPY_BYTES: u64 = 4 << 20;

/// Where copied pages go: the same offsets of a target as large as the heap's extent.
pub trait PageSink {
    /// Copies the heap's bytes in each of `runs` (page-aligned, ascending, disjoint) to the
    /// same offsets of the target.
    fn copy_runs(&mut self, heap: &Heap, runs: &[Range<u64>]) -> Result<(), TxnError>;

    /// Copies the pages in `pages` (page numbers) stamped after `since`, and every page of
    /// `growth` (bytes, page-aligned, after `pages`); returns how many pages that was. `hint`
    /// estimates it. This default scans the epochs, then copies the runs found; a sink with
    /// copier threads may scan on them as it copies (the GPU mirror's sync).
    fn copy_dirty(&mut self, heap: &Heap, pages: Range<u64>, since: u64, growth: Range<u64>, hint: u64) -> Result<u64, TxnError> {
        let _ = hint;
        let mut runs = Vec::new();
        let copied = dirty_and_growth(heap, pages, since, growth, &mut runs);
        self.copy_runs(heap, &runs)?;
        Ok(copied)
    }
}

/// Appends the runs of the pages in `pages` stamped after `since`, then `growth`, to `runs`;
/// returns how many pages they hold.
fn dirty_and_growth(heap: &Heap, pages: Range<u64>, since: u64, growth: Range<u64>, runs: &mut Vec<Range<u64>>) -> u64 {
    let mut found = heap.dirty_runs(pages, since, runs);
    if !growth.is_empty() {
        found += (growth.end - growth.start) / PAGE_SIZE;
        push_run(runs, growth);
    }
    found
}

/// What step 2 copies.
enum OpenPass {
    /// Nothing: the target lacks little, step 3 copies it.
    None,
    /// The whole used extent (a new target).
    Whole,
    /// The runs already found by a full scan (this many pages).
    Found(u64),
    /// The pages stamped since the target's state, which the sink finds as it copies.
    Dirty(CopyState),
}

/// One page in this many is sampled to estimate what a target lacks (whether the copy makes
/// an open pass): a 4 GiB heap's estimate reads 4,096 epochs, not a million.
pub const ESTIMATE_STRIDE: u64 = 256;

/// What a target holds: every page stamped ≤ `epoch`, up to `extent` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyState {
    pub epoch: u64,
    pub extent: u64,
}

/// What one consistent copy did.
#[derive(Clone, Debug, Default)]
pub struct CopyReport {
    /// The target holds every LSN ≤ this and nothing after.
    pub lsn: u64,
    /// Bytes of the heap the target covers (its used extent, rounded up to a page).
    pub extent: u64,
    /// Pages copied in the open-gate pass and in the closed-gate pass.
    pub pages_open: u64,
    pub pages_closed: u64,
    /// How long writers were held at the gate (both closings).
    pub pause: Duration,
    /// Time spent finding the pages to copy (the estimate of step 2, the scan of step 3) and
    /// copying them (with step 2's scan, which the sink makes as it copies: `copy_dirty`).
    pub scan: Duration,
    pub copy: Duration,
    /// Wall time of the whole copy.
    pub elapsed: Duration,
}

impl CopyReport {
    pub fn bytes_copied(&self) -> u64 {
        (self.pages_open + self.pages_closed) * PAGE_SIZE
    }
}

impl Engine {
    /// The heap's used extent, rounded up to a page (read without the gate: a hint).
    pub fn used_extent(&self) -> u64 {
        let brk = self.heap().load_word(BRK_OFF);
        brk.next_multiple_of(PAGE_SIZE).clamp(PAGE_SIZE, self.heap().capacity())
    }

    /// Pages stamped after `since` within the first `extent` bytes (what a refresh of a
    /// target at that state would copy, bar growth).
    pub fn dirty_pages_since(&self, since: u64, extent: u64) -> u64 {
        let mut runs = Vec::new();
        self.heap().dirty_runs(0..extent / PAGE_SIZE, since, &mut runs)
    }

    /// An estimate of [`Engine::dirty_pages_since`] from every `stride`-th page (exact for a
    /// stride of 1): what a cost model needs, at a fraction of a full scan of the epochs.
    pub fn dirty_pages_sampled(&self, since: u64, extent: u64, stride: u64) -> u64 {
        let pages = extent / PAGE_SIZE;
        let stride = stride.max(1);
        let hits = (0..pages).step_by(stride as usize).filter(|&p| self.heap().page_epoch(p) > since).count() as u64;
        (hits * stride).min(pages)
    }

    /// Brings `sink` from `state` (`None`: it holds nothing) to the committed state at one
    /// LSN (see the module note); returns its new state and what the copy did.
    pub fn copy_pages_consistent(&self, state: Option<CopyState>, sink: &mut dyn PageSink) -> Result<(CopyState, CopyReport), TxnError> {
        self.check_open()?;
        check_no_pass_here()?;
        let started = Instant::now();
        let mut report = CopyReport::default();
        let heap = self.heap();
        let mut runs = Vec::new();

        // Step 1. Every write-back from here on stamps above `e_mid`.
        let pause = Instant::now();
        let (e_mid, lsn_mid) = {
            let _closed = self.gate.close();
            (self.advance_dirty_epoch(), self.last_lsn())
        };
        report.pause += pause.elapsed();
        // What the target lacks now (its state's epoch is ≤ e_mid, so this covers every page
        // written up to step 1 and perhaps some after).
        let extent_open = self.used_extent();
        // Whether the target lacks much. A sample of the epochs says when it surely does; then
        // the sink finds the exact pages as it copies (a full scan first would cost the copy a
        // third of a millisecond per 4 GiB of heap, and its threads' start). A sample saying
        // "little" may have missed pages between its points, so the epochs are then scanned
        // whole before step 3 is allowed to copy everything under the closed gate.
        let scan = Instant::now();
        let old = state.map_or(0, |s| s.extent.min(extent_open));
        let growth = old..extent_open;
        let sampled = match state {
            None => extent_open / PAGE_SIZE,
            Some(s) => self.dirty_pages_sampled(s.epoch, old, ESTIMATE_STRIDE) + (extent_open - old) / PAGE_SIZE,
        };
        let open_pass = match state {
            None if sampled * PAGE_SIZE > DIRECT_COPY_BYTES => OpenPass::Whole,
            Some(s) if sampled * PAGE_SIZE > DIRECT_COPY_BYTES => OpenPass::Dirty(s),
            Some(s) => match dirty_and_growth(heap, 0..old / PAGE_SIZE, s.epoch, growth.clone(), &mut runs) {
                lacking if lacking * PAGE_SIZE > DIRECT_COPY_BYTES => OpenPass::Found(lacking),
                _ => OpenPass::None,
            },
            None => OpenPass::None,
        };
        report.scan += scan.elapsed();
        // Step 2, only when the target lacks much; else step 3 copies it all.
        let optimistic = !matches!(open_pass, OpenPass::None);
        let copy = Instant::now();
        report.pages_open = match open_pass {
            OpenPass::None => 0,
            OpenPass::Whole => {
                sink.copy_runs(heap, std::slice::from_ref(&(0..extent_open)))?;
                extent_open / PAGE_SIZE
            }
            OpenPass::Found(lacking) => {
                sink.copy_runs(heap, &runs)?;
                lacking
            }
            OpenPass::Dirty(s) => sink.copy_dirty(heap, 0..old / PAGE_SIZE, s.epoch, growth, sampled)?,
        };
        report.copy += copy.elapsed();
        let (since_closed, covered) = if optimistic { (e_mid, extent_open) } else { (state.map_or(0, |s| s.epoch), state.map_or(0, |s| s.extent)) };

        let pause = Instant::now();
        let closed = self.gate.close();
        let extent = self.used_extent().max(covered);
        runs.clear();
        let scan = Instant::now();
        // Every stamp comes with an LSN drawn under a gate pass (a commit's write-back, an
        // in-place run's commit or restore), so with the clock where step 1 left it, no page
        // was stamped above `e_mid`: the open pass copied a quiet heap, and the closed pass has
        // nothing to scan for (a scan of a 4 GiB heap's epochs is a third of a millisecond).
        let quiet = optimistic && self.last_lsn() == lsn_mid;
        let mut pages = if quiet { 0 } else { heap.dirty_runs(0..covered.min(extent) / PAGE_SIZE, since_closed, &mut runs) };
        if extent > covered {
            push_run(&mut runs, covered..extent);
            pages += (extent - covered) / PAGE_SIZE;
        }
        report.scan += scan.elapsed();
        let copy = Instant::now();
        let copied = sink.copy_runs(heap, &runs);
        report.copy += copy.elapsed();
        report.lsn = self.last_lsn();
        let epoch = self.advance_dirty_epoch();
        drop(closed);
        report.pause += pause.elapsed();
        copied?;
        // A chunk a reopen on demand found damaged copied as zeros: no snapshot of it.
        if let Some((_, damage)) = heap.damaged_chunks().into_iter().find(|(_, d)| d.heap.start < extent) {
            return Err(TxnError::DamagedChunk(damage));
        }
        report.pages_closed = pages;
        report.extent = extent;
        report.elapsed = started.elapsed();
        Ok((CopyState { epoch, extent }, report))
    }

    /// Runs `f` with the gate closed: the heap then holds exactly the commits with LSN ≤ the
    /// LSN passed to `f`. Returns `f`'s value and how long writers were held.
    pub fn with_gate_closed<T>(&self, f: impl FnOnce(u64) -> T) -> Result<(T, Duration), TxnError> {
        self.check_open()?;
        check_no_pass_here()?;
        let started = Instant::now();
        let closed = self.gate.close();
        let value = f(self.last_lsn());
        drop(closed);
        Ok((value, started.elapsed()))
    }
}

/// Fails where this thread holds the gate's pass to the end of an in-place run: closing the
/// gate would wait for that pass, held until the closure that asks returns.
fn check_no_pass_here() -> Result<(), TxnError> {
    if crate::in_place::running_here() {
        Err(TxnError::InsideInPlaceTransaction)
    } else {
        Ok(())
    }
}

/// Appends `run`, joining it to the last run when they touch.
fn push_run(runs: &mut Vec<Range<u64>>, run: Range<u64>) {
    match runs.last_mut() {
        Some(last) if last.end == run.start => last.end = run.end,
        _ => runs.push(run),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::engine::EngineConfig;
    use crate::snapshot::image::ImageTarget;
    use crate::transaction::Commit;

    const HEAP: u64 = 24 << 20;

    #[test]
    fn sampled_dirty_counts_estimate_the_exact_ones() {
        let engine = Engine::start(EngineConfig { stripes_log2: 8, log: None, existing_segments: Vec::new() }, Heap::new(1024 * PAGE_SIZE).unwrap(), 0).unwrap();
        for p in 0..512 {
            engine.heap().stamp_dirty(p * PAGE_SIZE, 8, 3);
        }
        let extent = 1024 * PAGE_SIZE;
        assert_eq!(engine.dirty_pages_sampled(2, extent, 1), engine.dirty_pages_since(2, extent));
        assert_eq!(engine.dirty_pages_sampled(2, extent, 16), 512, "half the pages, contiguous");
        assert_eq!(engine.dirty_pages_sampled(3, extent, 16), 0, "nothing after epoch 3");
    }

    /// A writer keeps setting words on pages spread over the heap to its commit counter
    /// (three per commit, pages chosen at random); every consistent copy, full or
    /// incremental, must hold exactly the counter of the last commit below its LSN in every
    /// word the writer ever touched.
    #[test]
    fn copies_equal_the_heap_at_their_lsn_while_a_writer_runs() {
        let engine = Engine::start(EngineConfig { stripes_log2: 12, log: None, existing_segments: Vec::new() }, Heap::new(HEAP).unwrap(), 0).unwrap();
        engine.heap().store_word(BRK_OFF, HEAP);
        let word = |i: u64| (1 << 16) + (i * 7919 % ((HEAP - (2 << 16)) / PAGE_SIZE)) * PAGE_SIZE + (i % 64) * 8;
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut commits = Vec::new();
                let mut x = 1u64;
                for k in 1u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let words: Vec<u64> = (0..3).map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        word(x >> 40)
                    }).collect();
                    let mut tx = engine.begin();
                    words.iter().try_for_each(|&w| tx.store(w, k)).unwrap();
                    let lsn = tx.commit(Commit::Async).unwrap().unwrap();
                    commits.push((lsn, words));
                }
                commits
            });
            let mut checks = Vec::new();
            let mut image = ImageTarget::new(HEAP, 2).unwrap();
            let mut state = None;
            for round in 0..12 {
                // Full copies now and then, incremental refreshes in between.
                if round % 4 == 0 {
                    image = ImageTarget::new(HEAP, 2).unwrap();
                    state = None;
                }
                let (next, report) = engine.copy_pages_consistent(state, &mut image).unwrap();
                state = Some(next);
                assert_eq!(report.extent, HEAP);
                checks.push((report.lsn, image.bytes().to_vec()));
            }
            stop.store(true, Ordering::Relaxed);
            let commits = writer.join().unwrap();
            assert!(commits.len() > 100, "the writer ran ({} commits)", commits.len());
            for (lsn, bytes) in checks {
                let mut expected: std::collections::HashMap<u64, u64> = commits.iter().flat_map(|(_, w)| w.iter().map(|&w| (w, 0))).collect();
                // Commit i set its words to i + 1; LSNs ascend in commit order (one writer).
                for (i, (_, words)) in commits.iter().enumerate().take_while(|(_, (l, _))| *l <= lsn) {
                    for &w in words {
                        expected.insert(w, i as u64 + 1);
                    }
                }
                for (w, k) in expected {
                    let got = u64::from_le_bytes(bytes[w as usize..w as usize + 8].try_into().unwrap());
                    assert_eq!(got, k, "copy at LSN {lsn}: word {w}");
                }
            }
        });
    }

    /// Dirty pages that the estimate's sample misses (every page but the sampled ones) still
    /// go through the open pass: the closed gate never copies more than a small target lacks.
    #[test]
    fn pages_the_sample_misses_are_copied_with_the_gate_open() {
        let engine = Engine::start(EngineConfig { stripes_log2: 12, log: None, existing_segments: Vec::new() }, Heap::new(HEAP).unwrap(), 0).unwrap();
        engine.heap().store_word(BRK_OFF, HEAP);
        let mut image = ImageTarget::new(HEAP, 2).unwrap();
        let (state, _) = engine.copy_pages_consistent(None, &mut image).unwrap();
        let pages = HEAP / PAGE_SIZE;
        let missed: Vec<u64> = (1..pages).filter(|p| !p.is_multiple_of(ESTIMATE_STRIDE)).collect();
        for &p in &missed {
            engine.heap().store_word(p * PAGE_SIZE, p);
            engine.heap().stamp_dirty(p * PAGE_SIZE, 8, engine.dirty_epoch());
        }
        let (_, report) = engine.copy_pages_consistent(Some(state), &mut image).unwrap();
        assert_eq!(engine.dirty_pages_sampled(state.epoch, HEAP, ESTIMATE_STRIDE), 0, "the sample sees none of them");
        assert_eq!((report.pages_open, report.pages_closed), (missed.len() as u64, 0), "all in the open pass");
        for &p in &missed {
            let at = (p * PAGE_SIZE) as usize;
            assert_eq!(u64::from_le_bytes(image.bytes()[at..at + 8].try_into().unwrap()), p, "page {p}");
        }
    }

    /// A large transaction that runs in place while a copy's open pass reads the heap, and is
    /// then dropped before the closed pass, leaves no trace in the copy: its stores were in the
    /// heap when the open pass read those pages, and the restore must send them through the
    /// closed pass again (before, the restored pages carried no stamp, and the copy kept the
    /// uncommitted words).
    #[test]
    fn an_in_place_run_dropped_during_the_open_pass_leaves_no_trace() {
        use crate::in_place::IN_PLACE_FROM;

        /// Calls `around(false)` before its first copy and `around(true)` after it.
        struct Hooked<'a> {
            image: ImageTarget,
            first: bool,
            around: &'a dyn Fn(bool),
        }
        impl PageSink for Hooked<'_> {
            fn copy_runs(&mut self, heap: &Heap, runs: &[Range<u64>]) -> Result<(), TxnError> {
                let first = std::mem::take(&mut self.first);
                if first {
                    (self.around)(false);
                }
                self.image.copy_runs(heap, runs)?;
                if first {
                    (self.around)(true);
                }
                Ok(())
            }
        }

        let engine = Engine::start(EngineConfig { stripes_log2: 14, log: None, existing_segments: Vec::new() }, Heap::new(HEAP).unwrap(), 0).unwrap();
        let base = 1u64 << 20;
        let lines = IN_PLACE_FROM as u64 + 64;
        let line = |i: u64| base + i * 64;
        let mut tx = engine.begin();
        (0..lines).try_for_each(|i| tx.store(line(i), 1)).unwrap();
        tx.commit(Commit::Async).unwrap();
        drop(tx);
        // An extent past the direct-copy size, so that the copy makes an open pass.
        engine.heap().store_word(BRK_OFF, 2 * DIRECT_COPY_BYTES);
        let (to_run, at_run) = crossbeam_channel::unbounded::<()>();
        let (ran, wait_run) = crossbeam_channel::unbounded::<()>();
        std::thread::scope(|s| {
            let engine = &engine;
            s.spawn(move || {
                at_run.recv().unwrap();
                let mut run = engine.begin();
                (0..lines).try_for_each(|i| run.store(line(i), 999)).unwrap();
                assert!(run.is_in_place());
                ran.send(()).unwrap();
                at_run.recv().unwrap();
                drop(run);
                ran.send(()).unwrap();
            });
            // The run writes in place before the open pass copies, and is dropped after it,
            // before the closed pass.
            let around = |_after: bool| {
                to_run.send(()).unwrap();
                wait_run.recv().unwrap();
            };
            let mut sink = Hooked { image: ImageTarget::new(HEAP, 1).unwrap(), first: true, around: &around };
            let (_, report) = engine.copy_pages_consistent(None, &mut sink).unwrap();
            assert!(report.pages_open > 0, "the copy made an open pass");
            for i in 0..lines {
                let at = line(i) as usize;
                let word = u64::from_le_bytes(sink.image.bytes()[at..at + 8].try_into().unwrap());
                assert_eq!(word, 1, "line {i}: the copy holds a dropped run's store");
            }
        });
    }
}
