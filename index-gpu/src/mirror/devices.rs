//! Every GPU a mirror uses ([`GpuDevices`]): each holds a replica of the mirrored heap, and a
//! batch is cut into one contiguous slice per device, answered on all of them at once and
//! put back in order. All replicas are synced together, to one LSN, so every answer of a
//! batch is exact at that LSN whichever device gave it.
//!
//! - **Syncs**: every device takes each streamed portion from the same pinned buffer
//!   (`cuda/streamed.rs`), so a sync of several costs about what a sync of one does while
//!   the host's memory keeps up.
//! - **Batches** (`get_batch` and the like): one host thread per device, each running that
//!   device's chunked pipeline over its slice.
//! - **Caller buffers**: one set of pinned host memory (portable, so every device's copies
//!   reach it) and one queue of device twins per device, sized for its slice; every device's
//!   pass is queued before any is waited for.

use std::mem::MaybeUninit;
use std::ops::Range;
use std::time::Instant;


use super::buffers::{BatchKind, BatchMemory};
use super::cuda::{gather, CudaMirror, HostSlice, Stages};
use super::{GpuDevices, GpuOptions, MirrorError};

/// Milliseconds per stage of one batch into caller buffers, each stage alone and then the
/// whole call (medians of the rounds, host clock: each includes its launches), over every
/// device of the mirror at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageTiming {
    pub copy_in_ms: f64,
    pub kernels_ms: f64,
    pub copy_out_ms: f64,
    /// The call as users make it: the three stages overlapped.
    pub call_ms: f64,
}

/// Device `i`'s slice of `n` queries cut for `devices` devices.
fn slice(devices: usize, i: usize, n: usize) -> Range<usize> {
    let share = share(devices, n);
    (i * share).min(n)..((i + 1) * share).min(n)
}

/// The longest slice of `n` queries over `devices` devices: no slice of fewer queries is longer.
fn share(devices: usize, n: usize) -> usize {
    n.div_ceil(devices).next_multiple_of(64)
}

/// The devices of a mirror (at least one).
pub struct Devices {
    list: Vec<CudaMirror>,
    /// 0..list.len(): the devices a whole-heap mirror runs every batch on.
    every: Vec<usize>,
}

impl Devices {
    /// Opens every device `options` name.
    pub fn open(options: &GpuOptions) -> Result<Devices, MirrorError> {
        let ordinals = match &options.devices {
            GpuDevices::One(d) => vec![*d],
            other => other.ordinals(CudaMirror::device_count()?)?,
        };
        let list = ordinals.into_iter().map(|d| CudaMirror::open_ordinal(options, d)).collect::<Result<Vec<_>, _>>()?;
        let every = (0..list.len()).collect();
        Ok(Devices { list, every })
    }

    /// Index-only: applies each device's part of a refreshed layout (`CudaMirror::apply_layout`).
    pub(crate) fn apply_layout(&mut self, image: &[u8], refresh: &super::index_pages::Refresh, pages: &super::index_pages::IndexPages) -> Result<(), MirrorError> {
        for (i, d) in self.list.iter_mut().enumerate() {
            d.apply_layout(image, &refresh.devices[i], pages.table(i)).map_err(|e| d.name_error(e))?;
        }
        Ok(())
    }

    /// Every device's index, in order (the devices a whole-heap mirror runs a batch on).
    pub(crate) fn every(&self) -> &[usize] {
        &self.every
    }

    /// The devices, in the order batches are cut.
    pub fn all(&self) -> &[CudaMirror] {
        &self.list
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// "NVIDIA H100 80GB HBM3 (sm_90)", or "2 × …" for several of one name.
    pub fn name(&self) -> String {
        let first = self.list[0].device_name();
        match self.list.len() {
            1 => first,
            n if self.list.iter().all(|d| d.device_name() == first) => format!("{n} × {first}"),
            _ => self.list.iter().map(|d| d.device_name()).collect::<Vec<_>>().join(" + "),
        }
    }

    pub(crate) fn all_mut(&mut self) -> &mut [CudaMirror] {
        &mut self.list
    }

    pub(crate) fn primary_mut(&mut self) -> &mut CudaMirror {
        &mut self.list[0]
    }

    pub(crate) fn primary(&self) -> &CudaMirror {
        &self.list[0]
    }

    /// Where device `i`'s slice of `n` queries starts and ends: equal slices, each starting at
    /// a multiple of 64 queries (one found-bit word).
    fn slice(&self, i: usize, n: usize) -> Range<usize> {
        slice(self.list.len(), i, n)
    }

    fn share(&self, n: usize) -> usize {
        share(self.list.len(), n)
    }

    /// Runs `f` on each device of `on` (indices into the device list, the GPUs holding the
    /// tree asked about) over its slice of `n` queries, each on its own thread, every answer
    /// written in place ([`gather`]).
    pub(crate) fn split<T: Send>(&self, on: &[usize], n: usize, f: impl Fn(&CudaMirror, Range<usize>, &mut [MaybeUninit<T>]) -> Result<(), MirrorError> + Sync) -> Result<Vec<T>, MirrorError> {
        assert!(!on.is_empty(), "a batch runs on some device");
        let parts: Vec<(&CudaMirror, Range<usize>)> = on.iter().enumerate().map(|(i, &d)| (&self.list[d], slice(on.len(), i, n))).collect();
        gather(&parts, f)
    }

    /// Pinned host memory and each device's queue for batches of up to `capacity` queries.
    pub(crate) fn batch_memory(&self, kind: BatchKind, capacity: usize) -> Result<BatchMemory, MirrorError> {
        // Every queue as long as the longest slice: the last device's slice of a full batch can
        // be shorter (or empty) than its slice of a smaller one (3 devices, 200 queries: 128,
        // 72, 0; 190 queries: 64, 64, 62).
        let queues = self.list.iter().map(|d| d.queue(kind, self.share(capacity)).map_err(|e| d.name_error(e))).collect::<Result<Vec<_>, _>>()?;
        let [input, output, found] = CudaMirror::host_memory(kind, capacity).map_err(|e| self.list[0].name_error(e))?;
        Ok(BatchMemory::new(kind, capacity, input, output, found, queues))
    }

    /// Whether `mem`'s queues are this mirror's devices', in order.
    pub(crate) fn own(&self, mem: &BatchMemory) -> bool {
        mem.device.len() == self.list.len() && mem.device.iter().zip(&self.list).all(|(q, d)| q.device == d.ordinal())
    }

    /// One pass of `stages` over the queries set in `mem`, on the devices of `on` at once. On
    /// every device, the queries are cut as for all of them; on fewer (the GPUs holding one
    /// tree of a sharded mirror), each takes slices of its queue's length in turn, in rounds.
    pub(crate) fn pass(&self, meta: u64, mem: &BatchMemory, stages: Stages, on: &[usize]) -> Result<(), MirrorError> {
        assert!(self.own(mem), "buffers of these devices");
        assert!(!on.is_empty(), "a batch runs on some device");
        let (n, kind) = (mem.len(), mem.kind);
        let slices: Vec<(usize, Range<usize>)> = if on.len() == self.list.len() {
            (0..self.list.len()).map(|i| (i, self.slice(i, n))).collect()
        } else {
            let per = self.share(mem.capacity()).max(64);
            (0..n.div_ceil(per)).map(|j| (on[j % on.len()], j * per..((j + 1) * per).min(n))).collect()
        };
        let pinned = |m: &super::cuda::raw::HostMemory| m.pinned_addr().expect("device buffers are pinned");
        let (input, output, bits) = (pinned(&mem.input), pinned(&mem.output), pinned(&mem.found));
        for round in slices.chunks(on.len()) {
            let mut started = Vec::with_capacity(round.len());
            let mut passes = Vec::with_capacity(round.len());
            // Begin every device's pass, then queue their chunks in turn (chunk 0 of each, then
            // chunk 1 of each, …), so that no device waits for another's whole pass to be
            // queued before its first kernel starts.
            let mut queue = || -> Result<(), MirrorError> {
                for (i, r) in round {
                    let (d, q) = (&self.list[*i], &mem.device[*i]);
                    let host = HostSlice {
                        input: input + (8 * kind.in_words() * r.start) as u64,
                        output: output + (8 * kind.out_words() * r.start) as u64,
                        bits: bits + (8 * (r.start / 64)) as u64,
                        n: r.len(),
                    };
                    started.push((d, q, r.len()));
                    if let Some(pass) = d.begin_pass(meta, kind, q, host, stages).map_err(|e| d.name_error(e))? {
                        passes.push((d, q, pass));
                    }
                }
                let most = passes.iter().map(|(_, _, p)| p.chunks()).max().unwrap_or(0);
                for c in 0..most {
                    for (d, q, pass) in passes.iter().filter(|(_, _, p)| c < p.chunks()) {
                        d.queue_chunk(pass, q, c).map_err(|e| d.name_error(e))?;
                    }
                }
                for (d, q, pass) in &passes {
                    d.end_pass(pass, q).map_err(|e| d.name_error(e))?;
                }
                Ok(())
            };
            let mut result = queue();
            // Every started pass is waited for, whatever failed.
            for (d, q, len) in started {
                let r = d.finish_pass(kind, q, len, stages).map_err(|e| d.name_error(e));
                if result.is_ok() {
                    result = r;
                }
            }
            result?;
        }
        Ok(())
    }

    /// Answers the queries set in `mem` into its answer memory, on the devices of `on`.
    pub(crate) fn answer_into(&self, meta: u64, mem: &mut BatchMemory, on: &[usize]) -> Result<(), MirrorError> {
        self.pass(meta, mem, Stages::ALL, on)?;
        mem.mark_answered();
        Ok(())
    }

    /// Times a batch into `mem`'s buffers: each stage alone, then the whole call, on every
    /// device at once; medians of `rounds` after a warm-up. The answers are left in `mem`.
    pub(crate) fn time_into(&self, meta: u64, mem: &mut BatchMemory, rounds: usize, on: &[usize]) -> Result<StageTiming, MirrorError> {
        let time = |stages: Stages, mem: &BatchMemory| -> Result<f64, MirrorError> {
            self.pass(meta, mem, stages, on)?;
            let mut ms = Vec::with_capacity(rounds.max(1));
            for _ in 0..rounds.max(1) {
                let started = Instant::now();
                self.pass(meta, mem, stages, on)?;
                ms.push(started.elapsed().as_secs_f64() * 1e3);
            }
            ms.sort_by(f64::total_cmp);
            Ok(ms[ms.len() / 2])
        };
        let copy_in_ms = time(Stages::COPY_IN, mem)?;
        let kernels_ms = time(Stages::KERNELS, mem)?;
        let copy_out_ms = time(Stages::COPY_OUT, mem)?;
        let call_ms = time(Stages::ALL, mem)?;
        mem.mark_answered();
        Ok(StageTiming { copy_in_ms, kernels_ms, copy_out_ms, call_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::{share, slice};

    /// Slices tile the batch in order, start on found-bit words, and never outgrow the queues
    /// made for the largest batch (the bug this guards: queues sized by the last device's
    /// slice of a full batch, which can be shorter than its slice of a smaller one).
    #[test]
    fn slices_tile_each_batch_and_fit_the_queues_of_any_larger_one() {
        for devices in 1..=8 {
            for capacity in [0, 1, 63, 64, 65, 200, 1000, 70_000] {
                for n in (0..=capacity).step_by((capacity / 97).max(1)).chain([capacity]) {
                    let mut next = 0;
                    for i in 0..devices {
                        let r = slice(devices, i, n);
                        assert_eq!(r.start, next, "{devices} devices, {n} queries: slice {i} starts where {} ended", i.max(1) - 1);
                        assert!(r.start.is_multiple_of(64) || r.is_empty(), "{devices} devices, {n} queries: slice {i} at {}", r.start);
                        assert!(r.len() <= share(devices, capacity), "{devices} devices, {n} of {capacity}: slice {i} of {} outgrows its queue", r.len());
                        next = r.end;
                    }
                    assert_eq!(next, n, "{devices} devices: the slices cover {n} queries");
                }
            }
        }
    }
}
