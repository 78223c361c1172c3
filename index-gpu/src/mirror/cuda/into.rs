//! Batches into the caller's buffers (`mirror::buffers`) on the device. The buffers' memory is
//! pinned and has device twins of its size, so a batch is three streams of work and nothing on
//! the host: chunk by chunk, `copy_in` copies the queries from the caller's pinned memory,
//! `run` answers them (and packs lookups' found bytes into bits), `copy_out` copies the
//! answers into the caller's pinned memory. Each stream waits only for the chunk it needs
//! (events), so chunk c+1's copy in, chunk c's kernels and chunk c−1's copy out run at once:
//! the call costs the slowest of the three plus one chunk of each of the others. A small pass
//! takes smaller chunks ([`chunk_bounds`]), so that it overlaps too.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use super::raw::{driver, DeviceBuffer, Event, HostMemory, PinnedBuffer, Stream};
use super::{err_slot, kernel_error, CudaMirror, KernelIo, Op, BLOCK, ERR_BYTES};
use crate::mirror::buffers::{BatchKind, BatchMemory};
use crate::mirror::MirrorError;

/// Queries per chunk: a multiple of 64 (one found-bit word), large enough that a kernel fills
/// the device (1 M lookups: 8 MiB of keys, about 0.15 ms of copy each way at 55 GB/s; chunks
/// of 128 K made 16 M B-link lookups' kernels 1.6x slower in all on an H100).
pub(crate) const CHUNK_QUERIES: usize = 1 << 20;
const _: () = assert!(CHUNK_QUERIES.is_multiple_of(64));
/// Queries per chunk of a pass under [`SMALL_PASS`] queries: a pass of one or a few whole
/// chunks would barely overlap its copies with its kernels. On an H100, 1 M range queries in
/// chunks of 256 K took 0.96x the kernels' time alone end to end, in one chunk 0.90x; 16 M
/// lookups gained nothing from smaller first and last chunks.
const SMALL_CHUNK: usize = CHUNK_QUERIES / 4;
const SMALL_PASS: usize = 4 * CHUNK_QUERIES;
const _: () = assert!(SMALL_CHUNK.is_multiple_of(64));

/// Most chunks a pass over at most `capacity` queries has.
fn max_chunks(capacity: usize) -> usize {
    capacity.div_ceil(CHUNK_QUERIES).max(capacity.min(SMALL_PASS).div_ceil(SMALL_CHUNK))
}

/// The chunks of a pass over `n` queries, in order: each starts at a multiple of 64 (a found-bit
/// word), all of [`CHUNK_QUERIES`] but the last, or of [`SMALL_CHUNK`] for a small pass.
fn chunk_bounds(n: usize) -> Vec<std::ops::Range<usize>> {
    let size = if n < SMALL_PASS { SMALL_CHUNK } else { CHUNK_QUERIES };
    (0..n).step_by(size).map(|start| start..(start + size).min(n)).collect()
}

/// One device's side of a set of caller buffers (its share of them).
pub(crate) struct DeviceQueue {
    /// The device the twins live on.
    pub(crate) device: usize,
    /// Most queries a pass on it takes.
    capacity: usize,
    dev_in: DeviceBuffer,
    dev_out: DeviceBuffer,
    /// Lookups: a found byte per query, then packed into `dev_bits`.
    dev_found: DeviceBuffer,
    dev_bits: DeviceBuffer,
    dev_err: DeviceBuffer,
    pin_err: PinnedBuffer,
    copy_in: Stream,
    run: Stream,
    copy_out: Stream,
    /// Per chunk: its queries are on the device; its answers are ready.
    copied: Vec<Event>,
    answered: Vec<Event>,
    // Dropped after the buffers above (their Drop needs the context current: `Drop` below).
    ctx: Arc<CudaContext>,
}

// SAFETY: the queue's driver handles (streams, events, device and pinned memory) may be used
// from any thread once the context is current, and every use binds it first (`begin_pass`,
// `queue_chunk`, `end_pass`, `finish_pass`, `Drop`); moving the queue between threads moves
// no thread-bound state.
unsafe impl Send for DeviceQueue {}

impl Drop for DeviceQueue {
    fn drop(&mut self) {
        // The buffers' frees need the context current; nothing may still copy into them.
        if self.ctx.bind_to_thread().is_ok() {
            for s in [&self.copy_in, &self.run, &self.copy_out] {
                let _ = s.sync();
            }
        }
    }
}

/// Which stages a pass enqueues (timing runs them alone).
#[derive(Clone, Copy)]
pub(crate) struct Stages {
    copy_in: bool,
    kernels: bool,
    copy_out: bool,
}

impl Stages {
    pub(crate) const ALL: Stages = Stages { copy_in: true, kernels: true, copy_out: true };
    pub(crate) const COPY_IN: Stages = Stages { copy_in: true, kernels: false, copy_out: false };
    pub(crate) const KERNELS: Stages = Stages { copy_in: false, kernels: true, copy_out: false };
    pub(crate) const COPY_OUT: Stages = Stages { copy_in: false, kernels: false, copy_out: true };
}

/// The caller's pinned memory of one device's slice of a batch: where its queries start,
/// where their answers and found bits go.
#[derive(Clone, Copy)]
pub(crate) struct HostSlice {
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) bits: u64,
    pub(crate) n: usize,
}

/// A pass begun on one device: what each of its chunks needs.
pub(crate) struct Pass {
    meta: u64,
    heap: u64,
    kind: BatchKind,
    host: HostSlice,
    stages: Stages,
    chunks: Vec<std::ops::Range<usize>>,
}

impl Pass {
    /// Chunks of the pass.
    pub(crate) fn chunks(&self) -> usize {
        self.chunks.len()
    }
}

impl CudaMirror {
    /// Device twins and streams for `capacity` queries of `kind` (this device's share of a
    /// batch's buffers).
    pub(crate) fn queue(&self, kind: BatchKind, capacity: usize) -> Result<DeviceQueue, MirrorError> {
        self.bind()?;
        let (in_words, out_words, found_words) = (capacity * kind.in_words(), capacity * kind.out_words(), BatchMemory::found_words(kind, capacity));
        let chunks = max_chunks(capacity);
        let mut copied = Vec::with_capacity(chunks);
        let mut answered = Vec::with_capacity(chunks);
        for _ in 0..chunks {
            copied.push(Event::untimed()?);
            answered.push(Event::untimed()?);
        }
        Ok(DeviceQueue {
            device: self.device,
            capacity,
            dev_in: DeviceBuffer::alloc(8 * in_words)?,
            dev_out: DeviceBuffer::alloc(8 * out_words)?,
            dev_found: DeviceBuffer::alloc(if kind.lookups() { capacity } else { 0 })?,
            dev_bits: DeviceBuffer::alloc(8 * found_words)?,
            dev_err: DeviceBuffer::alloc(ERR_BYTES)?,
            pin_err: PinnedBuffer::alloc(ERR_BYTES)?,
            copy_in: Stream::new()?,
            run: Stream::new()?,
            copy_out: Stream::new()?,
            copied,
            answered,
            ctx: self.ctx.clone(),
        })
    }

    /// Pinned host memory for `capacity` queries of `kind` (portable: every device's copies
    /// reach it).
    pub(crate) fn host_memory(kind: BatchKind, capacity: usize) -> Result<[HostMemory; 3], MirrorError> {
        let (in_words, out_words, found_words) = (capacity * kind.in_words(), capacity * kind.out_words(), BatchMemory::found_words(kind, capacity));
        Ok([HostMemory::pinned(in_words)?, HostMemory::pinned(out_words)?, HostMemory::pinned(found_words)?])
    }

    /// Starts a pass of `stages` over `host`'s queries on `queue` (made by this device): its
    /// chunks are then queued one by one ([`CudaMirror::queue_chunk`], so that the chunks of
    /// several devices can be queued in turn and every device starts at once), then
    /// [`CudaMirror::end_pass`]; [`CudaMirror::finish_pass`] waits. `None`: nothing to do.
    pub(crate) fn begin_pass(&self, meta: u64, kind: BatchKind, queue: &DeviceQueue, host: HostSlice, stages: Stages) -> Result<Option<Pass>, MirrorError> {
        assert_eq!(queue.device, self.device, "a device's queue on its own device");
        assert!(host.n <= queue.capacity, "a slice of {} queries on a queue for {}", host.n, queue.capacity);
        if host.n == 0 {
            return Ok(None);
        }
        self.bind()?;
        let heap = self.heap_ptr(meta)?;
        if stages.kernels {
            // SAFETY: the slot holds ERR_BYTES bytes; ordered before this pass's kernels.
            unsafe { cu::memset_d8_async(queue.dev_err.ptr(), 0, ERR_BYTES, queue.run.raw()) }.map_err(|e| driver("cuMemsetD8Async", e))?;
        }
        Ok(Some(Pass { meta, heap, kind, host, stages, chunks: chunk_bounds(host.n) }))
    }

    /// Waits for every copy and kernel of the pass on `queue` and checks its kernels' error
    /// slot. Always waits, even after an error: nothing may still copy into the caller's memory
    /// once the call returns.
    pub(crate) fn finish_pass(&self, kind: BatchKind, queue: &DeviceQueue, n: usize, stages: Stages) -> Result<(), MirrorError> {
        self.bind()?;
        let mut synced = Ok(());
        for s in [&queue.copy_in, &queue.run, &queue.copy_out] {
            let r = s.sync();
            if synced.is_ok() {
                synced = r;
            }
        }
        synced?;
        // (No queries: no kernel ran, and the slot still holds an earlier pass's report.)
        if stages.kernels && n > 0 {
            let (code, at) = err_slot(queue.pin_err.as_slice());
            if code != 0 {
                return Err(kernel_error(op_of(kind), code, at));
            }
        }
        Ok(())
    }

    /// Queues chunk `c` of `pass` on `q`: its copy in, its kernels, its copy out, each on its
    /// stream after the one before it (events).
    pub(crate) fn queue_chunk(&self, pass: &Pass, q: &DeviceQueue, c: usize) -> Result<(), MirrorError> {
        self.bind()?;
        let (kind, stages) = (pass.kind, pass.stages);
        let (in_bytes, out_bytes) = (8 * kind.in_words(), 8 * kind.out_words());
        let fixed_len = match kind {
            BatchKind::ArtGet { key_len } => key_len as i32,
            _ => -1,
        };
        let (host_in, host_out, host_bits) = (pass.host.input, pass.host.output, pass.host.bits);
        let (start, len) = (pass.chunks[c].start, pass.chunks[c].len());
        let (at_in, at_out) = (start * in_bytes, start * out_bytes);
        let bits_at = 8 * (start / 64);
        let bits_len = 8 * len.div_ceil(64);
        if stages.copy_in {
            // SAFETY: both ranges lie inside the buffers made for `capacity ≥ n` queries of
            // this kind; the caller's pinned memory is borrowed exclusively until the pass
            // has synchronized every stream.
            unsafe { sys::cuMemcpyHtoDAsync_v2(q.dev_in.at(at_in), (host_in + at_in as u64) as *const c_void, len * in_bytes, q.copy_in.raw()) }
                .result()
                .map_err(|e| driver("cuMemcpyHtoDAsync (batch queries)", e))?;
            q.copied[c].record(&q.copy_in)?;
        }
        if stages.kernels {
            q.run.wait(&q.copied[c])?;
            // Only lookups have found flags: the other kinds' flag buffer is empty.
            let found = if kind.lookups() { q.dev_found.at(start) } else { 0 };
            let io = KernelIo { input: q.dev_in.at(at_in), offs: 0, lens: 0, out: q.dev_out.at(at_out), found, err: q.dev_err.ptr(), n: len };
            self.launch(op_of(kind), pass.meta, pass.heap, io, fixed_len, q.run.raw())?;
            if kind.lookups() {
                self.launch_found_bits(q.dev_found.at(start), len, q.dev_bits.at(bits_at), &q.run)?;
            }
            q.answered[c].record(&q.run)?;
        }
        if stages.copy_out {
            q.copy_out.wait(&q.answered[c])?;
            // SAFETY: as for the copy in, for the answer memory.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2((host_out + at_out as u64) as *mut c_void, q.dev_out.at(at_out), len * out_bytes, q.copy_out.raw())
                    .result()
                    .map_err(|e| driver("cuMemcpyDtoHAsync (batch answers)", e))?;
                if kind.lookups() {
                    sys::cuMemcpyDtoHAsync_v2((host_bits + bits_at as u64) as *mut c_void, q.dev_bits.at(bits_at), bits_len, q.copy_out.raw())
                        .result()
                        .map_err(|e| driver("cuMemcpyDtoHAsync (found bits)", e))?;
                }
            }
        }
        Ok(())
    }

    /// Ends `pass` on `q` once every chunk is queued: its error slot follows its kernels home.
    pub(crate) fn end_pass(&self, pass: &Pass, q: &DeviceQueue) -> Result<(), MirrorError> {
        if pass.stages.kernels {
            self.bind()?;
            // SAFETY: the pinned slot holds ERR_BYTES bytes; read only after the pass syncs.
            unsafe { sys::cuMemcpyDtoHAsync_v2(q.pin_err.ptr() as *mut c_void, q.dev_err.ptr(), ERR_BYTES, q.run.raw()) }
                .result()
                .map_err(|e| driver("cuMemcpyDtoHAsync (error slot)", e))?;
        }
        Ok(())
    }

    /// Packs `n` found bytes at `found` into bits at `bits` (answers.cu).
    fn launch_found_bits(&self, found: u64, n: usize, bits: u64, stream: &Stream) -> Result<(), MirrorError> {
        let k = self.kernels.found_bits;
        let (mut a_found, mut a_n, mut a_bits) = (found, n as u64, bits);
        let mut params = [&mut a_found as *mut u64 as *mut c_void, &mut a_n as *mut u64 as *mut c_void, &mut a_bits as *mut u64 as *mut c_void];
        let blocks = (n.div_ceil(64) as u64).div_ceil(BLOCK as u64).clamp(1, k.blocks as u64) as u32;
        // SAFETY: the parameters match tusk_found_bits; `found` holds n bytes and `bits`
        // ceil(n / 64) words of device memory (the queue's buffers, sized for its capacity).
        unsafe { cu::launch_kernel(k.f, (blocks, 1, 1), (BLOCK, 1, 1), 0, stream.raw(), &mut params) }.map_err(|e| driver("launching tusk_found_bits", e))
    }

}

fn op_of(kind: BatchKind) -> Op {
    match kind {
        BatchKind::BtreeGet => Op::BtreeGet,
        BatchKind::BtreeCountSum => Op::BtreeCountSum,
        BatchKind::ArtGet { .. } => Op::ArtGet,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_query_once_on_found_word_bounds() {
        let sizes = [0, 1, 63, 64, 65, SMALL_CHUNK, SMALL_CHUNK + 1, 1 << 20, SMALL_PASS - 1, SMALL_PASS, SMALL_PASS + 1, (SMALL_PASS * 2) - 1, 7 << 17, (7 << 18) - 1, 7 << 18, (7 << 18) + 1, 3 << 20, 16_000_000, 16_000_037, (16 << 20) + 5];
        for n in sizes {
            let bounds = chunk_bounds(n);
            // Every pass fits the events of buffers made for any capacity ≥ n.
            for capacity in sizes.into_iter().filter(|&c| c >= n) {
                assert!(bounds.len() <= max_chunks(capacity), "{n} in {capacity}: {} chunks", bounds.len());
            }
            let mut next = 0;
            for b in &bounds {
                assert_eq!(b.start, next, "{n}: contiguous");
                assert!(b.start.is_multiple_of(64) && !b.is_empty() && b.len() <= CHUNK_QUERIES, "{n}: {b:?}");
                next = b.end;
            }
            assert_eq!(next, n, "{n}: covered");
        }
        // A small pass overlaps in quarter chunks; a large one takes whole chunks.
        assert_eq!(chunk_bounds(1 << 20).len(), 4);
        assert!(chunk_bounds(16_000_037).iter().rev().skip(1).all(|b| b.len() == CHUNK_QUERIES));
    }
}
