//! A heap image in memory, the target of memcpy snapshots: the heap's bytes at the same
//! offsets, copied by `threads` threads, read afterwards with plain loads.

use std::ops::Range;

use tusk_storage::region::ImageRegion;
use tusk_storage::{Heap, PAGE_SIZE};

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

    /// The image's first byte (heap offset 0), fixed for the image's life, and the bytes
    /// reserved from it: for a device that reads the image in place.
    pub fn reserved(&self) -> (*const u8, u64) {
        (self.region.base_ptr(), self.region.capacity())
    }

    /// [`PageSink::copy_runs`], handing each portion of about `portion` bytes to `copied` as
    /// soon as it is in the image, while the other threads go on copying: what consumes the
    /// image (an upload to a device) then overlaps the copy. `copied` runs on the calling
    /// thread, in no particular order of portions; its first error is returned once every
    /// copy has ended.
    pub fn copy_runs_streamed<E>(&mut self, heap: &Heap, runs: &[Range<u64>], portion: u64, copied: &mut dyn FnMut(&[Range<u64>]) -> Result<(), E>) -> Result<(), E> {
        let Some(end) = runs.last().map(|r| r.end) else { return Ok(()) };
        self.len = self.len.max(end);
        let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
        let portion = portion.max(PAGE_SIZE);
        let threads = if total < PARALLEL_COPY_BYTES { 1 } else { self.threads };
        let jobs = split_runs(self.region.bytes_mut(end), runs, total.div_ceil(threads as u64).next_multiple_of(PAGE_SIZE));
        // Each job's pieces, sent on in portions once copied.
        let copy_job = |job: Vec<(u64, &mut [u8])>, send: &mut dyn FnMut(Vec<Range<u64>>)| {
            let (mut done, mut bytes): (Vec<Range<u64>>, u64) = (Vec::new(), 0);
            for (off, dst) in job {
                heap.copy_out(off, dst);
                let len = dst.len() as u64;
                match done.last_mut() {
                    Some(r) if r.end == off => r.end += len,
                    _ => done.push(off..off + len),
                }
                bytes += len;
                if bytes >= portion {
                    send(std::mem::take(&mut done));
                    bytes = 0;
                }
            }
            if !done.is_empty() {
                send(done);
            }
        };
        let mut result = Ok(());
        let mut consume = |portion: Vec<Range<u64>>| {
            if result.is_ok() {
                result = copied(&portion);
            }
        };
        if jobs.len() <= 1 {
            for job in jobs {
                copy_job(job, &mut consume);
            }
            return result;
        }
        let (tx, rx) = crossbeam_channel::unbounded::<Vec<Range<u64>>>();
        std::thread::scope(|s| {
            for job in jobs {
                let tx = tx.clone();
                s.spawn(move || copy_job(job, &mut |p| tx.send(p).expect("the calling thread receives until every copier ends")));
            }
            drop(tx);
            for portion in rx {
                consume(portion);
            }
        });
        result
    }
}

impl PageSink for ImageTarget {
    fn copy_runs(&mut self, heap: &Heap, runs: &[Range<u64>]) -> Result<(), TxnError> {
        let Some(end) = runs.last().map(|r| r.end) else { return Ok(()) };
        self.len = self.len.max(end);
        let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
        let threads = if total < PARALLEL_COPY_BYTES { 1 } else { self.threads };
        let jobs = split_runs(self.region.bytes_mut(end), runs, total.div_ceil(threads as u64).next_multiple_of(PAGE_SIZE));
        let copy = |job: Vec<(u64, &mut [u8])>| {
            for (off, dst) in job {
                heap.copy_out(off, dst);
            }
        };
        std::thread::scope(|s| {
            let mut jobs = jobs.into_iter();
            let mine = jobs.next();
            for job in jobs {
                s.spawn(move || copy(job));
            }
            if let Some(job) = mine {
                copy(job);
            }
        });
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

    /// Streamed copies hand over every copied byte exactly once, on one thread or several, and
    /// leave the image equal to the heap in every run; a consumer's error comes back after the
    /// copy ended.
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
            image
                .copy_runs_streamed::<()>(&heap, &runs, 1 << 20, &mut |portion| {
                    portions += 1;
                    for r in portion {
                        seen.push(r.clone());
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
            let failed = image.copy_runs_streamed(&heap, &runs, 1 << 20, &mut |_| {
                calls += 1;
                Err(calls)
            });
            assert_eq!(failed, Err(1), "the first error, and no call after it");
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
