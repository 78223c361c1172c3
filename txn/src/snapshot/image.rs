//! A heap image in memory, the target of memcpy snapshots: the heap's bytes at the same
//! offsets, copied by `threads` threads, read afterwards with plain loads.

use std::ops::Range;

use tusk_storage::region::{self, ImageRegion};
use tusk_storage::{workers, Heap, PAGE_SIZE};

use super::copy::PageSink;
use crate::TxnError;

/// Copies smaller than this run on the calling thread alone (starting threads costs more).
const PARALLEL_COPY_BYTES: u64 = 8 << 20;

pub struct ImageTarget {
    region: ImageRegion,
    /// Bytes of the image that hold heap contents.
    len: u64,
    threads: usize,
}

impl ImageTarget {
    /// An empty image able to grow to `capacity` bytes (the heap's capacity), copied by
    /// `threads` threads.
    pub fn new(capacity: u64, threads: usize) -> Result<ImageTarget, TxnError> {
        Ok(ImageTarget { region: ImageRegion::reserve(capacity)?, len: 0, threads: threads.max(1) })
    }

    /// The image's bytes (heap offset i at index i).
    pub fn bytes(&self) -> &[u8] {
        self.region.bytes(self.len)
    }

    /// Bytes of memory the image has touched (resident unless swapped).
    pub fn resident_bytes(&self) -> u64 {
        self.region.touched()
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// [`PageSink::copy_runs`] that hands every page to `packer` as it goes: each copier
    /// thread fills portions of at most `portion` bytes, copying [`PACK_STEP`] bytes at a time
    /// into the image and packing them at once from the heap (their lines still in that core's
    /// cache), and sends each full portion to `consume` on the calling thread while it goes on.
    /// What consumes the portions (an upload to a device) then overlaps the copy, and the
    /// packing is spread over the copiers. The image is written with non-temporal stores
    /// (nobody reads it soon, and its lines need not be read before they are written), so
    /// a page costs one read of the heap and one write each of the image and the portion.
    /// Portions come to `consume` in no particular order; its first error is returned once
    /// every copy has ended (a portion after it is still packed but not consumed).
    ///
    /// A page written while it is copied may differ between the image and the portion; the
    /// consistent copy copies every such page again under the closed gate (`copy.rs`).
    pub fn copy_runs_streamed<P: PortionPacker, E>(
        &mut self,
        heap: &Heap,
        runs: &[Range<u64>],
        portion: u64,
        packer: &P,
        consume: &mut dyn FnMut(P::Portion) -> Result<(), E>,
    ) -> Result<(), E> {
        self.copy_runs_with(heap, runs, Stepping { portion: whole_pages(portion), step: PACK_STEP, streaming: true }, packer, consume)
    }

    fn copy_runs_with<P: PortionPacker, E>(
        &mut self,
        heap: &Heap,
        runs: &[Range<u64>],
        stepping: Stepping,
        packer: &P,
        consume: &mut dyn FnMut(P::Portion) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(end) = runs.last().map(|r| r.end) else { return Ok(()) };
        self.len = self.len.max(end);
        let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
        let threads = if total < PARALLEL_COPY_BYTES { 1 } else { self.threads };
        let jobs = split_runs(self.region.bytes_mut(end), runs, total.div_ceil(threads as u64).next_multiple_of(PAGE_SIZE));
        // Each job's pieces, cut into steps that fill portions exactly, copied and packed step
        // by step.
        let tasks = jobs.into_iter().map(|job| {
            move |send: &mut dyn FnMut(P::Portion)| {
                let mut filler = Filler { heap, packer, stepping, open: None, bytes: 0 };
                for (off, dst) in job {
                    filler.copy(off, dst, send);
                }
                filler.finish(send);
            }
        });
        run_copiers(tasks.collect(), consume)
    }

    /// [`ImageTarget::copy_runs_streamed`] of the pages in `pages` (page numbers) stamped after
    /// `since` and of every page of `growth` (bytes, page-aligned, after `pages`; `hint`
    /// estimates the pages in all), the epochs scanned by the copier threads as they go: the
    /// page range is cut into parts of [`SCAN_PART_PAGES`], and each copier takes the next
    /// part, finds its dirty runs and copies them, so the scan needs no pass of its own and
    /// spreads like the copy. Returns the pages copied.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_dirty_streamed<P: PortionPacker, E>(
        &mut self,
        heap: &Heap,
        pages: Range<u64>,
        since: u64,
        growth: Range<u64>,
        hint: u64,
        portion: u64,
        packer: &P,
        consume: &mut dyn FnMut(P::Portion) -> Result<(), E>,
    ) -> Result<u64, E> {
        assert!(growth.is_empty() || growth.start >= pages.end * PAGE_SIZE, "growth after the scanned pages");
        let end = (pages.end * PAGE_SIZE).max(growth.end);
        self.len = self.len.max(end);
        let stepping = Stepping { portion: whole_pages(portion), step: PACK_STEP, streaming: true };
        let count = pages.end.saturating_sub(pages.start);
        // One thread only where both the scan and the copy (as `hint` pages estimate it) are
        // small.
        let small = count < tusk_storage::heap::PARALLEL_SCAN_PAGES && hint * PAGE_SIZE < PARALLEL_COPY_BYTES;
        let threads = if small { 1 } else { self.threads };
        // The parts, each with its stretch of the image: scans of `SCAN_PART_PAGES` pages, then
        // the growth in pieces of a portion. Small parts, since dirty pages gather where the
        // writes went (an index's pages): larger ones would leave most copiers idle.
        let mut parts = Vec::new();
        let (mut rest, mut rest_at) = (self.region.bytes_mut(end), 0u64);
        let mut cut = |from: u64, to: u64, part: fn(u64, &mut [u8]) -> Part<'_>| {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((from - rest_at) as usize);
            let (mine, tail) = tail.split_at_mut((to - from) as usize);
            (rest, rest_at) = (tail, to);
            part(from, mine)
        };
        let mut p = pages.start;
        while p < pages.end {
            let q = (p + SCAN_PART_PAGES).min(pages.end);
            parts.push(cut(p * PAGE_SIZE, q * PAGE_SIZE, |at, image| Part::Scan { at, image }));
            p = q;
        }
        let mut g = growth.start;
        while g < growth.end {
            let h = (g + stepping.portion).min(growth.end);
            parts.push(cut(g, h, |at, image| Part::Whole { at, image }));
            g = h;
        }
        let queue = std::sync::Mutex::new(parts.into_iter());
        let copied = std::sync::atomic::AtomicU64::new(0);
        let (queue, copied_ref) = (&queue, &copied);
        let tasks = (0..threads).map(|_| {
            move |send: &mut dyn FnMut(P::Portion)| {
                let mut filler = Filler { heap, packer, stepping, open: None, bytes: 0 };
                let mut runs = Vec::new();
                let mut pages_copied = 0;
                loop {
                    let next = queue.lock().expect("no copier panics holding the queue").next();
                    match next {
                        None => break,
                        Some(Part::Whole { at, image }) => {
                            pages_copied += image.len() as u64 / PAGE_SIZE;
                            filler.copy(at, image, send);
                        }
                        Some(Part::Scan { at, image }) => {
                            runs.clear();
                            let first = at / PAGE_SIZE;
                            pages_copied += heap.dirty_runs(first..first + image.len() as u64 / PAGE_SIZE, since, &mut runs);
                            for run in &runs {
                                let lo = (run.start - at) as usize;
                                filler.copy(run.start, &mut image[lo..lo + (run.end - run.start) as usize], send);
                            }
                        }
                    }
                }
                filler.finish(send);
                copied_ref.fetch_add(pages_copied, std::sync::atomic::Ordering::Relaxed);
            }
        });
        run_copiers(tasks.collect(), consume)?;
        Ok(copied.into_inner())
    }
}

/// `portion` rounded down to whole pages (one at least): a portion is packed page by page.
fn whole_pages(portion: u64) -> u64 {
    (portion / PAGE_SIZE).max(1) * PAGE_SIZE
}

/// A stretch of the image a fused scan and copy hands to a copier: heap bytes from `at`, to be
/// scanned for dirty pages, or copied whole (growth).
enum Part<'a> {
    Scan { at: u64, image: &'a mut [u8] },
    Whole { at: u64, image: &'a mut [u8] },
}

/// Runs each task on a copier thread of the worker pool (one task: on this thread), each
/// sending what it makes to `consume` on this thread as it goes. Returns `consume`'s first
/// error once every task has ended (what comes after it is not consumed).
fn run_copiers<T: Send, E, F: FnOnce(&mut dyn FnMut(T)) + Send>(mut tasks: Vec<F>, consume: &mut dyn FnMut(T) -> Result<(), E>) -> Result<(), E> {
    let mut result = Ok(());
    let mut take = |made: T| {
        if result.is_ok() {
            result = consume(made);
        }
    };
    if tasks.len() <= 1 {
        if let Some(task) = tasks.pop() {
            task(&mut take);
        }
        return result;
    }
    let (tx, rx) = crossbeam_channel::unbounded::<T>();
    // The copiers on the worker pool, the consumer on this thread (not a worker: its waits for
    // portions hold up no copier).
    workers::pool().in_place_scope(|s| {
        for task in tasks {
            let tx = tx.clone();
            s.spawn(move |_| task(&mut |made| tx.send(made).expect("the calling thread receives until every copier ends")));
        }
        drop(tx);
        for made in rx {
            take(made);
        }
    });
    result
}

/// One copier's open portion: copies pieces into the image step by step, packs each step, and
/// sends each portion once full.
struct Filler<'a, P: PortionPacker> {
    heap: &'a Heap,
    packer: &'a P,
    stepping: Stepping,
    open: Option<P::Portion>,
    bytes: u64,
}

impl<P: PortionPacker> Filler<'_, P> {
    /// Copies the heap's bytes at `off` into `dst` (their place in the image).
    fn copy(&mut self, off: u64, mut dst: &mut [u8], send: &mut dyn FnMut(P::Portion)) {
        let Stepping { portion, step, streaming } = self.stepping;
        let mut at = off;
        while !dst.is_empty() {
            let take = (portion - self.bytes).min(step).min(dst.len() as u64) as usize;
            let (piece, rest) = std::mem::take(&mut dst).split_at_mut(take);
            if streaming {
                self.heap.copy_out_streaming(at, piece);
            } else {
                self.heap.copy_out(at, piece);
            }
            let packer = self.packer;
            packer.pack(self.open.get_or_insert_with(|| packer.begin()), self.heap, at, take);
            dst = rest;
            at += take as u64;
            self.bytes += take as u64;
            if self.bytes == portion {
                region::streaming_fence();
                send(self.open.take().expect("packed above"));
                self.bytes = 0;
            }
        }
    }

    /// Sends the last portion, after the stores of the portion and of the image are ordered
    /// before whatever comes next.
    fn finish(self, send: &mut dyn FnMut(P::Portion)) {
        region::streaming_fence();
        if let Some(last) = self.open {
            send(last);
        }
    }
}

/// Pages of the epochs a copier of a fused scan and copy scans at a time (4 MiB of heap, 8 KiB
/// of epochs): a 4 GiB heap makes a thousand parts, which the copiers share out as they go.
pub const SCAN_PART_PAGES: u64 = 1024;

/// Bytes a streamed copy copies into the image before packing them: small enough that they
/// are still in the copier's cache (L2) when the packer reads them again.
pub const PACK_STEP: u64 = 64 << 10;

/// How a copy is cut: portions of `portion` bytes, copied `step` bytes at a time, the image
/// written with non-temporal stores or not.
#[derive(Clone, Copy)]
struct Stepping {
    portion: u64,
    step: u64,
    streaming: bool,
}

/// Where a streamed copy's pages go besides the image (the GPU mirror's pinned staging
/// buffers): each copier fills one portion at a time.
pub trait PortionPacker: Sync {
    type Portion: Send;
    /// An empty portion (it may wait, for an idle buffer say).
    fn begin(&self) -> Self::Portion;
    /// Adds the heap's whole pages `[off, off + len)` to `portion`, read from `heap`: the
    /// copier has just copied them into the image, so their lines are in its cache. Stores
    /// may be non-temporal: the copy fences before it hands a portion over.
    fn pack(&self, portion: &mut Self::Portion, heap: &Heap, off: u64, len: usize);
}

/// A packer that keeps nothing: the plain copy.
struct NoPacking;

impl PortionPacker for NoPacking {
    type Portion = ();
    fn begin(&self) {}
    fn pack(&self, _: &mut (), _: &Heap, _: u64, _: usize) {}
}

impl PageSink for ImageTarget {
    fn copy_runs(&mut self, heap: &Heap, runs: &[Range<u64>]) -> Result<(), TxnError> {
        // Nothing to hand over: one portion per copier, copied in one go per piece with plain
        // stores (a snapshot's readers may read what was just copied), consumed by no one.
        let plain = Stepping { portion: u64::MAX, step: u64::MAX, streaming: false };
        self.copy_runs_with::<_, std::convert::Infallible>(heap, runs, plain, &NoPacking, &mut |()| Ok(())).unwrap_or_else(|never| match never {});
        Ok(())
    }
}

/// Cuts `image` into the pieces `runs` name, grouped into jobs of about `per_job` bytes
/// (runs are split at page boundaries to balance them).
fn split_runs<'a>(image: &'a mut [u8], runs: &[Range<u64>], per_job: u64) -> Vec<Vec<(u64, &'a mut [u8])>> {
    let mut jobs = vec![Vec::new()];
    let mut in_job = 0u64;
    let mut rest = image;
    let mut rest_at = 0u64;
    for run in runs {
        let mut at = run.start;
        while at < run.end {
            let take = (run.end - at).min(per_job - in_job);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((at - rest_at) as usize);
            let (piece, tail) = tail.split_at_mut(take as usize);
            jobs.last_mut().expect("one job at least").push((at, piece));
            rest = tail;
            rest_at = at + take;
            at += take;
            in_job += take;
            if in_job == per_job {
                jobs.push(Vec::new());
                in_job = 0;
            }
        }
    }
    jobs.retain(|j| !j.is_empty());
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_runs_covers_each_run_once_in_balanced_jobs() {
        let mut image = vec![0u8; 64 * PAGE_SIZE as usize];
        let runs = [0..3 * PAGE_SIZE, 10 * PAGE_SIZE..11 * PAGE_SIZE, 20 * PAGE_SIZE..30 * PAGE_SIZE];
        let jobs = split_runs(&mut image, &runs, 4 * PAGE_SIZE);
        let sizes: Vec<u64> = jobs.iter().map(|j| j.iter().map(|(_, p)| p.len() as u64).sum()).collect();
        assert_eq!(sizes, [4 * PAGE_SIZE, 4 * PAGE_SIZE, 4 * PAGE_SIZE, 2 * PAGE_SIZE]);
        let mut pieces: Vec<(u64, u64)> = jobs.into_iter().flatten().map(|(at, p)| (at, at + p.len() as u64)).collect();
        pieces.sort_unstable();
        let mut covered = Vec::new();
        for (a, b) in pieces {
            match covered.last_mut() {
                Some((_, e)) if *e == a => *e = b,
                _ => covered.push((a, b)),
            }
        }
        assert_eq!(covered, runs.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>());
    }

    /// Packs copies of the pages, at most a step at a time, each whole pages.
    struct Recording;

    impl PortionPacker for Recording {
        type Portion = Vec<(u64, Vec<u8>)>;
        fn begin(&self) -> Self::Portion {
            Vec::new()
        }
        fn pack(&self, portion: &mut Self::Portion, heap: &Heap, off: u64, len: usize) {
            assert!(len as u64 <= PACK_STEP && off.is_multiple_of(PAGE_SIZE) && (len as u64).is_multiple_of(PAGE_SIZE), "{len} bytes at {off}");
            let mut bytes = vec![0u8; len];
            heap.copy_out(off, &mut bytes);
            portion.push((off, bytes));
        }
    }

    /// Streamed copies hand over every copied byte exactly once, in portions no larger than
    /// asked, packed a step at a time with the heap's bytes, on one thread or several;
    /// they leave the image equal to the heap in every run; a consumer's error comes back
    /// after the copy ended.
    #[test]
    fn streamed_copies_hand_over_each_run_once_after_copying_it() {
        let heap = Heap::new(64 << 20).unwrap();
        for i in 0..(40u64 << 20) / 8 {
            heap.store_word(i * 8, i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        let runs: Vec<Range<u64>> = (0..2000u64).map(|i| (i * 5 + i % 3) * PAGE_SIZE..(i * 5 + i % 3 + 1 + i % 2) * PAGE_SIZE).collect();
        let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
        for threads in [1, 4] {
            let mut image = ImageTarget::new(heap.capacity(), threads).unwrap();
            let mut seen: Vec<Range<u64>> = Vec::new();
            let mut portions = 0;
            let packer = Recording;
            image
                .copy_runs_streamed::<_, ()>(&heap, &runs, 1 << 20, &packer, &mut |portion| {
                    portions += 1;
                    let bytes: usize = portion.iter().map(|(_, b)| b.len()).sum();
                    assert!(bytes <= 1 << 20, "a portion of {bytes} bytes, more than asked");
                    for (off, piece) in portion {
                        let mut want = vec![0u8; piece.len()];
                        heap.read_bytes(off, &mut want);
                        assert!(piece == want, "piece at {off} packed with other bytes than the heap's");
                        seen.push(off..off + piece.len() as u64);
                    }
                    Ok(())
                })
                .unwrap();
            assert!(portions >= (total >> 20) as usize, "{portions} portions for {total} bytes in portions of 1 MiB");
            seen.sort_unstable_by_key(|r| r.start);
            let mut merged: Vec<Range<u64>> = Vec::new();
            for r in seen {
                match merged.last_mut() {
                    Some(m) if m.end == r.start => m.end = r.end,
                    _ => merged.push(r),
                }
            }
            let mut expected: Vec<Range<u64>> = Vec::new();
            for r in &runs {
                match expected.last_mut() {
                    Some(m) if m.end == r.start => m.end = r.end,
                    _ => expected.push(r.clone()),
                }
            }
            assert_eq!(merged, expected, "{threads} threads: every run once");
            for r in &runs {
                let mut want = vec![0u8; (r.end - r.start) as usize];
                heap.read_bytes(r.start, &mut want);
                assert!(image.bytes()[r.start as usize..r.end as usize] == want[..], "{threads} threads: run {r:?} copied");
            }
            let mut calls = 0;
            let failed = image.copy_runs_streamed(&heap, &runs, 1 << 20, &NoPacking, &mut |()| {
                calls += 1;
                Err(calls)
            });
            assert_eq!(failed, Err(1), "the first error, and no call after it");
        }
    }

    /// The fused scan and copy hands over exactly the pages stamped after `since` in the
    /// scanned range and every page of the growth, once each, with the heap's bytes, and
    /// leaves them in the image: on one thread, and on several (a heap past the parallel scan's
    /// size, so that the page range is cut into parts).
    #[test]
    fn fused_scan_and_copy_takes_exactly_the_dirty_pages() {
        let pages = tusk_storage::heap::PARALLEL_SCAN_PAGES + 1000;
        let heap = Heap::new(pages * PAGE_SIZE).unwrap();
        let mut x = 11u64;
        let mut dirty = std::collections::BTreeSet::new();
        for i in 0..3000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let page = (x >> 24) % (pages - 200);
            // Old stamps (epoch 2) are not copied; runs of new ones (epoch 5) are.
            let epoch = if i % 3 == 0 { 2 } else { 5 };
            let len = 1 + (x >> 60) % 3;
            for p in page..page + len {
                heap.store_word(p * PAGE_SIZE + 8 * (i % 512), i + 1);
                heap.stamp_dirty(p * PAGE_SIZE, 8, epoch);
            }
        }
        for p in 0..pages - 200 {
            if heap.page_epoch(p) > 3 {
                dirty.insert(p);
            }
        }
        let growth = (pages - 100) * PAGE_SIZE..(pages - 60) * PAGE_SIZE;
        heap.store_word(growth.start + 64, 77);
        let mut expected: Vec<u64> = dirty.iter().copied().collect();
        expected.extend(growth.start / PAGE_SIZE..growth.end / PAGE_SIZE);
        for threads in [1, 4] {
            let mut image = ImageTarget::new(heap.capacity(), threads).unwrap();
            let mut seen = Vec::new();
            let copied = image
                .copy_dirty_streamed::<_, ()>(&heap, 0..pages - 200, 3, growth.clone(), expected.len() as u64, 1 << 20, &Recording, &mut |portion| {
                    for (off, piece) in portion {
                        let mut want = vec![0u8; piece.len()];
                        heap.read_bytes(off, &mut want);
                        assert!(piece == want, "piece at {off} packed with other bytes than the heap's");
                        seen.extend(off / PAGE_SIZE..(off + piece.len() as u64) / PAGE_SIZE);
                    }
                    Ok(())
                })
                .unwrap();
            seen.sort_unstable();
            assert_eq!(copied, expected.len() as u64, "{threads} threads: pages copied");
            assert!(seen == expected, "{threads} threads: every dirty page and the growth, once each");
            for &p in &expected {
                let at = (p * PAGE_SIZE) as usize;
                let mut want = vec![0u8; PAGE_SIZE as usize];
                heap.read_bytes(p * PAGE_SIZE, &mut want);
                assert!(image.bytes()[at..at + PAGE_SIZE as usize] == want[..], "{threads} threads: page {p} in the image");
            }
        }
    }

    /// Packs pages into staging buffers taken from a pool, as the GPU mirror's sync does
    /// (`index-gpu`'s `cuda/streamed.rs`), with non-temporal stores.
    struct Staging {
        idle: crossbeam_channel::Receiver<Vec<u8>>,
    }

    impl PortionPacker for Staging {
        type Portion = (Vec<u8>, usize);
        fn begin(&self) -> Self::Portion {
            (self.idle.recv().expect("buffers come back"), 0)
        }
        fn pack(&self, (buffer, used): &mut Self::Portion, heap: &Heap, off: u64, len: usize) {
            // Line-aligned, as pinned buffers are (else the copy is a plain one).
            let at = buffer.as_ptr().align_offset(64) + *used;
            heap.copy_out_streaming(off, &mut buffer[at..at + len]);
            *used += len;
        }
    }

    /// Times copies of 1% of a 4 GiB heap's pages (random single pages) and of 300 MB of
    /// runs into an image: plain, streamed with nothing packed, and streamed into staging buffers
    /// (run on a many-core host:
    /// `--ignored --nocapture copy_timing`).
    #[test]
    #[ignore = "a timing, not a check: run it where the cores are"]
    fn copy_timing() {
        let pages = 1u64 << 20;
        let heap = Heap::new(pages * PAGE_SIZE).unwrap();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
        let mut image = ImageTarget::new(heap.capacity(), threads).unwrap();
        image.copy_runs(&heap, std::slice::from_ref(&(0..pages * PAGE_SIZE))).unwrap();
        let mut x = 7u64;
        let mut picks: Vec<u64> = (0..pages / 100)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 20) % pages
            })
            .collect();
        picks.sort_unstable();
        picks.dedup();
        let scattered: Vec<Range<u64>> = picks.iter().map(|&p| p * PAGE_SIZE..(p + 1) * PAGE_SIZE).collect();
        let long: Vec<Range<u64>> = (0..300u64).map(|i| i * 3 * (1 << 20)..(i * 3 + 1) * (1 << 20)).collect();
        for (what, runs) in [("1% scattered pages", &scattered), ("300 runs of 1 MiB", &long)] {
            let bytes: u64 = runs.iter().map(|r| r.end - r.start).sum();
            let time = |f: &mut dyn FnMut()| {
                let mut ms: Vec<f64> = (0..7)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        f();
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect();
                ms.sort_by(f64::total_cmp);
                ms[3]
            };
            let plain = time(&mut || image.copy_runs(&heap, runs).unwrap());
            let streamed = time(&mut || image.copy_runs_streamed::<_, ()>(&heap, runs, 2 << 20, &NoPacking, &mut |()| Ok(())).unwrap());
            // As a GPU sync packs: into staging buffers that go round a pool (no device here).
            let (back, idle) = crossbeam_channel::unbounded();
            for _ in 0..32 {
                back.send(vec![0u8; (2 << 20) + 64]).unwrap();
            }
            let staging = Staging { idle };
            let packed = time(&mut || {
                image
                    .copy_runs_streamed::<_, ()>(&heap, runs, 2 << 20, &staging, &mut |(buffer, _)| {
                        back.send(buffer).unwrap();
                        Ok(())
                    })
                    .unwrap()
            });
            eprintln!(
                "{what} ({} MB) on {threads} threads: plain {plain:.3} ms ({:.1} GB/s), streamed {streamed:.3} ms, streamed and packed {packed:.3} ms ({:.1} GB/s)",
                bytes >> 20,
                bytes as f64 / plain / 1e6,
                bytes as f64 / packed / 1e6
            );
        }
    }

    #[test]
    fn parallel_copy_equals_the_heap() {
        let heap = Heap::new(64 << 20).unwrap();
        for i in 0..(40u64 << 20) / 8 {
            heap.store_word(i * 8, i ^ 0xDEAD_BEEF);
        }
        let mut image = ImageTarget::new(heap.capacity(), 3).unwrap();
        image.copy_runs(&heap, std::slice::from_ref(&(0..(40 << 20)))).unwrap();
        let mut expected = vec![0u8; 40 << 20];
        heap.read_bytes(0, &mut expected);
        assert!(image.bytes() == expected.as_slice(), "the image differs from the heap");
    }
}
