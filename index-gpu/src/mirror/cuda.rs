//! The CUDA backend of the GPU mirror: one device buffer holding the heap's bytes
//! `[0, extent)` at their heap offsets, so that the kernels (tusk-kernels) follow the trees'
//! offsets unchanged, and batch queries over it. With the index-only layout
//! (`index_pages.rs`) the buffer holds only the indexes' pages, and a second buffer the page
//! table the kernels translate heap offsets through.
//!
//! - **Sync** ([`CudaMirror::upload`]): the changed runs are packed in 4 KiB pieces into
//!   `staging_buffers` pinned buffers, each with a table of (heap offset, length); a buffer is
//!   copied to the device in one go on its own stream and scattered to the heap by a kernel,
//!   while the host fills the next buffer. Many small runs thus cost one copy and one launch
//!   per buffer. The device buffer grows (allocate larger, copy device to device, zero the
//!   rest) when the extent does.
//! - **Queries** (`btree_get`, `btree_count_sum`, `art_get`, `art_count_sum_prefix`): a batch
//!   goes through in chunks on two streams, each chunk packed into pinned memory, copied in,
//!   answered and copied out while the host packs the next, so copies and kernels overlap.
//! - **Timing** (`time_*`): the inputs uploaded once and kept on the device; the kernel alone
//!   timed with CUDA events (median over rounds after a warm-up), and the end-to-end path
//!   (host slice in, host vector out) timed with the host clock.
//!
//! Every driver call's result is checked; every launch's too, and each kernel's error slot
//! after it completes (a damaged offset or link in the mirror is reported as the CPU read
//! path would report it, never followed). `unsafe` is confined to this module and `raw`.

mod into;
pub(crate) mod streamed;
pub(crate) mod raw;

pub(crate) use into::{DeviceQueue, HostSlice, Stages};

use std::collections::VecDeque;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use tusk_kernels as kernels;
pub use tusk_kernels::names::{BTreeGet, NodeSearch};
use tusk_txn::TxnError;

use self::raw::{driver, DeviceBuffer, Event, Module, PinnedBuffer, Stream};
use super::{index_pages, GpuOptions, MirrorError};
use crate::art::link as art_link;
use crate::IndexError;

/// Threads per block of every launch.
const BLOCK: u32 = kernels::BLOCK_THREADS;
/// The heap buffer grows by at least a quarter, in steps of this many bytes.
const HEAP_GRANULE: u64 = 2 << 20;
/// Pinned and device bytes per query slot for one chunk's inputs and outputs.
const CHUNK_IN_BYTES: usize = 16 << 20;
const CHUNK_OUT_BYTES: usize = 24 << 20;
/// Query slots (each a stream with its buffers): a chunk's copies and kernel overlap the
/// packing of the next and the decoding of the one before.
const QUERY_SLOTS: usize = 3;
/// Host threads that pack and decode a chunk (at most; one per core).
const MAX_HOST_THREADS: usize = 16;
/// Fewest queries a host thread packs or decodes (fewer: not worth a thread).
const MIN_PART: usize = 1 << 15;
const MIN_STAGING_BUFFERS: usize = 2;
/// A kernel's error slot: code, then offset.
const ERR_BYTES: usize = 16;
const PIECE: usize = kernels::SCATTER_PIECE;
/// Threads that pack a staging buffer, at most.
const PACK_THREADS_MAX: usize = 8;
/// Staging batches smaller than this are packed by the calling thread alone.
const PACK_PARALLEL_PIECES: usize = 256;
/// Alignment of the sections (keys, offsets, lengths; values, flags) inside a chunk.
const SECTION: usize = 256;
/// Longest ART key or prefix the kernels take.
pub const GPU_MAX_KEY: usize = kernels::ART_MAX_KEY;
/// The B-link lookup kernel variants: (tile width, internal nodes' children loaded with their
/// keys, registers capped for more queries in flight).
pub const BTREE_KERNELS: [BTreeGet; 15] = kernels::names::BTREE_GET_VARIANTS;
/// The B-link lookup kernel used unless told otherwise: one thread per query, searching each
/// node's keys one 32-byte sector at a time, starting at the sector its parent's separators
/// predict (`kernels/btree.cu`). Measured on an H100 (`gpu_lookup_timing` in
/// tests/gpu_mirror.rs, bulk-loaded full nodes, shuffled present keys, kernel alone): 64 M keys
/// 5.12 G lookups/s against 3.16 for the scan of all 28 keys by one thread (tile 1) and 4.46
/// for the plain binary sector search; 16 M keys 6.96 G/s against 3.67. The scan keeps a
/// node's 28 keys in registers (a quarter of the warps a multiprocessor holds) and reads every
/// key line; the sector search keeps four keys and reads one to three sectors a node.
pub const DEFAULT_BTREE_KERNEL: BTreeGet = BTreeGet::sectors(NodeSearch::Guessed, false);

/// What one of the timing functions measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelTiming {
    /// Median milliseconds of the kernel alone over device-resident inputs and outputs.
    pub kernel_ms: f64,
    /// Median milliseconds from a host slice of queries to a host vector of answers.
    pub end_to_end_ms: f64,
}

/// The bus's rates with page-locked memory ([`CudaMirror::bus_rates`]).
#[derive(Clone, Copy, Debug)]
pub struct BusRates {
    pub to_device_gb_per_s: f64,
    pub to_host_gb_per_s: f64,
    /// Both directions at once, their sum.
    pub both_gb_per_s: f64,
}

#[derive(Clone, Copy)]
struct Kernel {
    f: sys::CUfunction,
    /// Resident blocks the whole device holds (multiprocessors × occupancy): the grid of a
    /// grid-stride launch never needs more.
    blocks: u32,
}

struct Kernels {
    scatter: Kernel,
    btree_get: Vec<(BTreeGet, Kernel)>,
    btree_count_sum: Kernel,
    art_get: Kernel,
    art_get_nospec: Kernel,
    art_prefix: Kernel,
    found_bits: Kernel,
    fault: Kernel,
}

/// One pinned staging buffer of the sync with its device twin: a table of
/// (heap offset, length) pairs, then the pieces, PIECE bytes apart.
struct Staging {
    pinned: PinnedBuffer,
    dev: DeviceBuffer,
    err: DeviceBuffer,
    stream: Stream,
    done: Event,
    in_flight: bool,
}

/// One query slot: a stream and the buffers of one chunk.
struct QuerySlot {
    stream: Stream,
    done: Event,
    pin_in: PinnedBuffer,
    pin_out: PinnedBuffer,
    pin_err: PinnedBuffer,
    dev_in: DeviceBuffer,
    dev_out: DeviceBuffer,
    dev_err: DeviceBuffer,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    BtreeGet,
    BtreeCountSum,
    ArtGet,
    ArtPrefix,
}

impl Op {
    fn is_art(self) -> bool {
        matches!(self, Op::ArtGet | Op::ArtPrefix)
    }

    /// Output bytes per query (before section alignment).
    fn out_per_query(self) -> usize {
        match self {
            Op::BtreeGet | Op::ArtGet => 9,
            Op::BtreeCountSum | Op::ArtPrefix => 24,
        }
    }
}

/// A batch's queries.
enum Input<'a> {
    Words(&'a [u64]),
    Ranges(&'a [(u64, u64)]),
    /// ART keys or prefixes of at most GPU_MAX_KEY bytes; `fixed`: all of this length.
    Keys { keys: &'a [&'a [u8]], fixed: Option<usize> },
}

impl Input<'_> {
    fn len(&self) -> usize {
        match self {
            Input::Words(w) => w.len(),
            Input::Ranges(r) => r.len(),
            Input::Keys { keys, .. } => keys.len(),
        }
    }

    /// Most input bytes one query takes (before section alignment).
    fn in_per_query(&self) -> usize {
        match self {
            Input::Words(_) => 8,
            Input::Ranges(_) => 16,
            Input::Keys { fixed: Some(len), .. } => 8 * len.div_ceil(8),
            Input::Keys { fixed: None, .. } => 8 * GPU_MAX_KEY.div_ceil(8) + 4 + 1,
        }
    }

    /// The `fixed_len` kernel argument (-1: per-key offsets and lengths).
    fn fixed_len(&self) -> i32 {
        match self {
            Input::Keys { fixed: Some(len), .. } => *len as i32,
            _ => -1,
        }
    }
}

/// Where things sit in one chunk's input and output bytes.
#[derive(Clone, Copy, Debug)]
struct Layout {
    n: usize,
    in_bytes: usize,
    /// Variable-length keys: the u32 word offsets and the u8 lengths.
    offs_at: usize,
    lens_at: usize,
    /// Lookups: the found flags after the values.
    found_at: usize,
    out_bytes: usize,
}

/// Device addresses of one launch's queries and answers: `input` (with the variable-length
/// keys' `offs` and `lens`) holds `n` queries, `out` (with `found` for lookups) room for their
/// answers, `err` an error slot of ERR_BYTES.
#[derive(Clone, Copy, Debug)]
struct KernelIo {
    input: u64,
    offs: u64,
    lens: u64,
    out: u64,
    found: u64,
    err: u64,
    n: usize,
}

impl KernelIo {
    /// A chunk laid out by [`layout`] in one input and one output buffer.
    fn of_layout(layout: &Layout, dev_in: u64, dev_out: u64, err: u64) -> KernelIo {
        KernelIo {
            input: dev_in,
            offs: dev_in + layout.offs_at as u64,
            lens: dev_in + layout.lens_at as u64,
            out: dev_out,
            found: dev_out + layout.found_at as u64,
            err,
            n: layout.n,
        }
    }
}

fn align(x: usize) -> usize {
    x.next_multiple_of(SECTION)
}

/// Items per part when `n` items are split among at most `threads` threads, no part (but the
/// last) shorter than MIN_PART.
fn part_len(n: usize, threads: usize) -> usize {
    n.div_ceil(threads.max(1)).max(MIN_PART).min(n).max(1)
}

/// Runs `f(part, first)` on the parts of `dst` (`part` items each, the last shorter), `first`
/// being the part's first index in `dst`; on scoped threads, the first part on the caller's.
fn par_parts<A: Send>(dst: &mut [A], part: usize, f: impl Fn(&mut [A], usize) + Sync) {
    let part = part.max(1);
    if dst.len() <= part {
        f(dst, 0);
        return;
    }
    let f = &f;
    std::thread::scope(|scope| {
        let mut parts = dst.chunks_mut(part).enumerate();
        let (_, first) = parts.next().expect("dst is longer than one part");
        for (i, chunk) in parts {
            scope.spawn(move || f(chunk, i * part));
        }
        f(first, 0);
    });
}

/// Where queries `range` of `input` go in a chunk's input bytes, and where the answers come.
fn layout(op: Op, input: &Input<'_>, range: Range<usize>) -> Layout {
    let n = range.len();
    let (mut offs_at, mut lens_at) = (0, 0);
    let in_bytes = match input {
        Input::Keys { keys, fixed: None } => {
            let words: usize = keys[range].iter().map(|k| k.len().div_ceil(8)).sum();
            offs_at = align(8 * words);
            lens_at = align(offs_at + 4 * n);
            lens_at + n
        }
        _ => n * input.in_per_query(),
    };
    let (found_at, out_bytes) = match op {
        Op::BtreeGet | Op::ArtGet => (align(8 * n), align(8 * n) + n),
        Op::BtreeCountSum | Op::ArtPrefix => (0, 24 * n),
    };
    Layout { n, in_bytes, offs_at, lens_at, found_at, out_bytes }
}

/// Packs queries `range` of `input` into `dst`, fixed-size layouts on up to `threads`
/// threads; returns the layout.
fn pack(op: Op, input: &Input<'_>, range: Range<usize>, dst: &mut [u8], threads: usize) -> Layout {
    let l = layout(op, input, range.clone());
    let part = part_len(l.n, threads);
    let base = range.start;
    match input {
        Input::Words(w) => par_parts(&mut dst[..8 * l.n], 8 * part, |d, at| {
            let first = base + at / 8;
            for (d, k) in d.chunks_exact_mut(8).zip(&w[first..]) {
                d.copy_from_slice(&k.to_le_bytes());
            }
        }),
        Input::Ranges(r) => par_parts(&mut dst[..16 * l.n], 16 * part, |d, at| {
            let first = base + at / 16;
            for (d, (lo, hi)) in d.chunks_exact_mut(16).zip(&r[first..]) {
                d[..8].copy_from_slice(&lo.to_le_bytes());
                d[8..].copy_from_slice(&hi.to_le_bytes());
            }
        }),
        Input::Keys { keys, fixed: Some(len) } => {
            let stride = 8 * len.div_ceil(8);
            if stride > 0 {
                par_parts(&mut dst[..stride * l.n], stride * part, |d, at| {
                    let first = base + at / stride;
                    for (d, k) in d.chunks_exact_mut(stride).zip(&keys[first..]) {
                        d[..k.len()].copy_from_slice(k);
                        d[k.len()..].fill(0);
                    }
                });
            }
        }
        Input::Keys { keys, fixed: None } => {
            let mut w = 0usize;
            for (i, k) in keys[range].iter().enumerate() {
                let span = 8 * k.len().div_ceil(8);
                dst[8 * w..8 * w + k.len()].copy_from_slice(k);
                dst[8 * w + k.len()..8 * w + span].fill(0);
                let at = u32::try_from(w).expect("chunk word offsets fit u32");
                dst[l.offs_at + 4 * i..l.offs_at + 4 * i + 4].copy_from_slice(&at.to_le_bytes());
                dst[l.lens_at + i] = k.len() as u8;
                w += span / 8;
            }
        }
    }
    l
}

fn word_at(bytes: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

/// Lookup answers of a chunk into `dst` (`layout.n` slots), on up to `threads` threads.
fn decode_get(out: &[u8], layout: &Layout, dst: &mut [MaybeUninit<Option<u64>>], threads: usize) {
    assert_eq!(dst.len(), layout.n);
    let found = &out[layout.found_at..layout.found_at + layout.n];
    par_parts(dst, part_len(layout.n, threads), |d, at| {
        for (i, slot) in d.iter_mut().enumerate() {
            slot.write((found[at + i] != 0).then(|| word_at(out, at + i)));
        }
    });
}

/// Count/sum answers of a chunk into `dst` (`layout.n` slots), on up to `threads` threads.
fn decode_count_sum(out: &[u8], layout: &Layout, dst: &mut [MaybeUninit<(u64, u128)>], threads: usize) {
    assert_eq!(dst.len(), layout.n);
    par_parts(dst, part_len(layout.n, threads), |d, at| {
        for (i, slot) in d.iter_mut().enumerate() {
            let q = 3 * (at + i);
            slot.write((word_at(out, q), word_at(out, q + 1) as u128 | (word_at(out, q + 2) as u128) << 64));
        }
    });
}

/// A kernel's error slot as the error the CPU read path would give for the same damage.
fn kernel_error(op: Op, code: u64, at: u64) -> MirrorError {
    let art = |what: &str| MirrorError::Index(IndexError::ArtInvariant { node: at, what: what.to_string() });
    match code {
        kernels::err::BAD_OFFSET => MirrorError::Index(IndexError::Txn(TxnError::InvalidPointer(at))),
        kernels::err::LOOP if op.is_art() => art("a lookup that does not end (a cycle of links)"),
        kernels::err::LOOP => MirrorError::Index(IndexError::Invariant { node: at, what: "a descent or leaf chain that does not end (a cycle)".into() }),
        kernels::err::BAD_LINK => art("a link of an unknown kind, index 0, or beyond its slab's chunks"),
        kernels::err::BAD_TERMINAL => art("a terminal link that is not a leaf"),
        kernels::err::TOO_DEEP => MirrorError::Unsupported(format!("prefix {at} of a chunk: its subtree is deeper than the GPU walk's stack")),
        _ => MirrorError::Driver(format!("kernel reported unknown error code {code} at {at}")),
    }
}

fn err_slot(bytes: &[u8]) -> (u64, u64) {
    let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    (word(0), word(1))
}

fn median(mut xs: Vec<f64>) -> f64 {
    assert!(!xs.is_empty(), "median of nothing");
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

/// Checks ART query keys against the device limit; Some(len) when all have one length.
fn check_keys(keys: &[&[u8]], what: &str) -> Result<Option<usize>, MirrorError> {
    let first = keys.first().map_or(0, |k| k.len());
    let (mut longest, mut same) = (0, true);
    for k in keys {
        longest = longest.max(k.len());
        same &= k.len() == first;
    }
    if longest > GPU_MAX_KEY {
        let i = keys.iter().position(|k| k.len() > GPU_MAX_KEY).expect("one is that long");
        return Err(MirrorError::Unsupported(format!("{what} {i} has {} bytes, more than the {GPU_MAX_KEY} the GPU kernels take", keys[i].len())));
    }
    Ok(same.then_some(first))
}

/// Runs a driver call sequence: an error without libcuda, and an error, not a crash, where
/// cudarc panics (a driver older than its bindings lacks an entry point).
fn guarded<T>(f: impl FnOnce() -> Result<T, MirrorError> + std::panic::UnwindSafe) -> Result<T, MirrorError> {
    // SAFETY: probing for the driver library only dlopens (and closes) it.
    if !unsafe { sys::is_culib_present() } {
        return Err(MirrorError::NoDriver("libcuda.so.1 (the NVIDIA driver library) is not on this machine".into()));
    }
    match std::panic::catch_unwind(f) {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(MirrorError::Driver(format!("CUDA driver unusable: {}", msg.unwrap_or_else(|| "panic".into()))))
        }
    }
}

/// cuInit, its failure typed.
fn init() -> Result<(), MirrorError> {
    cu::init().map_err(|e| {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE {
            MirrorError::NoDevice(format!("cuInit: {e}"))
        } else {
            MirrorError::NoDriver(format!("cuInit: {e}"))
        }
    })
}

/// Answers of a batch cut in `parts` (a device and its range of the queries, the ranges
/// tiling `0..n` in order): one vector, each part's answers written straight into its range
/// by `f` on a thread of its own (a single part on the calling thread). Writing in place, not
/// into a vector per part joined after, keeps the answers' first touch on the threads that
/// decode them: one thread joining 256 MB of answers made a batch on two GPUs four times
/// slower than on one.
pub(crate) fn gather<T: Send>(
    parts: &[(&CudaMirror, Range<usize>)],
    f: impl Fn(&CudaMirror, Range<usize>, &mut [MaybeUninit<T>]) -> Result<(), MirrorError> + Sync,
) -> Result<Vec<T>, MirrorError> {
    let n = parts.last().map_or(0, |(_, r)| r.end);
    let mut out: Vec<T> = Vec::with_capacity(n);
    let mut rest = &mut out.spare_capacity_mut()[..n];
    let mut slices = Vec::with_capacity(parts.len());
    let mut at = 0;
    for (d, r) in parts {
        assert_eq!(r.start, at, "the parts tile the batch in order");
        let (mine, tail) = rest.split_at_mut(r.len());
        slices.push((*d, r.clone(), mine));
        rest = tail;
        at = r.end;
    }
    let results: Vec<Result<(), MirrorError>> = if let [(d, r, slice)] = slices.as_mut_slice() {
        vec![f(d, r.clone(), slice).map_err(|e| d.name_error(e))]
    } else {
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = slices.into_iter().map(|(d, r, slice)| s.spawn(move || f(d, r, slice).map_err(|e| d.name_error(e)))).collect();
            handles.into_iter().map(|h| h.join().expect("a device thread does not panic")).collect()
        })
    };
    for r in results {
        r?;
    }
    // SAFETY: every part's `f` returned Ok, and each writes every slot of its slice (the
    // `*_to` functions decode into each element of the slice they are given); the slices tile
    // 0..n.
    unsafe { out.set_len(n) };
    Ok(out)
}

/// One launch of `tusk_scatter` (upload.cu): `pieces` table entries at `table` (offset,
/// length), their bytes PIECE apart at `data`, into the heap buffer of `extent` bytes; the
/// offsets are device offsets, or, with `pages` (a page table of `page_count` entries; 0:
/// none), heap offsets the kernel translates.
struct ScatterIo {
    heap: u64,
    extent: u64,
    pages: u64,
    page_count: u64,
    table: u64,
    data: u64,
    pieces: usize,
    err: u64,
}

/// Launches the sync scatter on `stream`.
fn scatter(kernel: Kernel, io: ScatterIo, stream: sys::CUstream) -> Result<(), MirrorError> {
    let (mut a_heap, mut a_extent, mut a_table, mut a_data, mut a_n, mut a_err) = (io.heap, io.extent, io.table, io.data, io.pieces as u64, io.err);
    let (mut a_pages, mut a_page_count) = (io.pages, io.page_count);
    let mut params = [
        &mut a_heap as *mut u64 as *mut c_void,
        &mut a_extent as *mut u64 as *mut c_void,
        &mut a_pages as *mut u64 as *mut c_void,
        &mut a_page_count as *mut u64 as *mut c_void,
        &mut a_table as *mut u64 as *mut c_void,
        &mut a_data as *mut u64 as *mut c_void,
        &mut a_n as *mut u64 as *mut c_void,
        &mut a_err as *mut u64 as *mut c_void,
    ];
    let blocks = (io.pieces as u32).min(kernel.blocks).max(1);
    // SAFETY: the parameters match tusk_scatter's signature; the callers name live device
    // buffers holding the table and the pieces (ScatterIo's contract), the heap buffer of
    // `extent` bytes (the kernel bounds-checks every write against it), a page table of
    // `page_count` entries or none, and an error slot.
    unsafe { cu::launch_kernel(kernel.f, (blocks, 1, 1), (BLOCK, 1, 1), 0, stream, &mut params) }.map_err(|e| driver("launching tusk_scatter", e))
}

/// Reads (and clears) a sync scatter's error slot, once its stream is idle.
fn check_scatter(err: &DeviceBuffer) -> Result<(), MirrorError> {
    let mut slot = [0u8; ERR_BYTES];
    // SAFETY: the slot holds ERR_BYTES bytes; the caller synchronized its stream.
    unsafe { cu::memcpy_dtoh_sync(&mut slot, err.ptr()) }.map_err(|e| driver("cuMemcpyDtoH", e))?;
    let (code, at) = err_slot(&slot);
    if code != 0 {
        // SAFETY: as above; clears the slot for the next sync.
        unsafe { cu::memset_d8_sync(err.ptr(), 0, ERR_BYTES) }.map_err(|e| driver("cuMemsetD8", e))?;
        return Err(MirrorError::Driver(format!("sync scatter refused a piece at heap offset {at} (code {code})")));
    }
    Ok(())
}

/// A device handle and the heap mirror on it.
pub struct CudaMirror {
    name: String,
    /// The CUDA device ordinal.
    device: usize,
    compute: (u32, u32),
    /// The mirrored extent: heap bytes [0, extent) are on the device (index-only: the
    /// indexes' pages among them).
    extent: u64,
    /// The heap's bytes at their offsets, or (index-only) the indexes' pages.
    heap: Option<DeviceBuffer>,
    /// Index-only: the page table (one u32 per heap page of the extent; `index_pages.rs`),
    /// `page_entries` of them valid.
    pages: Option<DeviceBuffer>,
    page_entries: usize,
    indexes_only: bool,
    /// Most bytes the heap (or index page) buffer may take.
    limit: Option<u64>,
    /// ART slot sizes then base exponents, one u64 per kind each (from `art::link`).
    art_geometry: DeviceBuffer,
    staging: Vec<Staging>,
    /// The buffers of streamed syncs (`cuda/streamed.rs`), made at the first one.
    streams: Option<streamed::StreamBuffers>,
    pieces_per_staging: usize,
    /// Bytes of a staging buffer before its pieces (the table, rounded up to a piece).
    table_bytes: usize,
    query: Mutex<Vec<QuerySlot>>,
    /// Threads that pack and decode a chunk on the host.
    host_threads: usize,
    btree_kernel: BTreeGet,
    art_speculate: bool,
    kernels: Kernels,
    // Dropped after every handle above that lives in it.
    _module: Module,
    ctx: Arc<CudaContext>,
}

// SAFETY: the raw driver handles (functions, streams, events, device and pinned pointers) may be
// used from any thread while the context is current, and every method makes it current first
// (`bind`). Host-side mutable state is reached through `&mut self` (uploads) or the `query`
// mutex (batches); timing functions use buffers and a stream of their own.
unsafe impl Send for CudaMirror {}
// SAFETY: as above: shared (`&self`) methods touch no unsynchronized mutable state.
unsafe impl Sync for CudaMirror {}

impl CudaMirror {
    /// Opens the first device `options` name. Never panics: without libcuda, without a device
    /// (or the one asked for), or when NVRTC is missing or fails, returns the typed error.
    pub fn open(options: &GpuOptions) -> Result<CudaMirror, MirrorError> {
        let first = options.devices.ordinals(CudaMirror::device_count()?)?[0];
        CudaMirror::open_ordinal(options, first)
    }

    /// How many CUDA devices the host has (an error without a driver).
    pub fn device_count() -> Result<usize, MirrorError> {
        guarded(|| {
            init()?;
            Ok(cu::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?.max(0) as usize)
        })
    }

    /// Opens device `ordinal` with `options`' buffers.
    pub fn open_ordinal(options: &GpuOptions, ordinal: usize) -> Result<CudaMirror, MirrorError> {
        guarded(|| CudaMirror::open_device(options, ordinal))
    }

    fn open_device(options: &GpuOptions, ordinal: usize) -> Result<CudaMirror, MirrorError> {
        init()?;
        let count = cu::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(MirrorError::NoDevice(format!("device {ordinal} asked for, {count} present")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("retaining the primary context", e))?;
        ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| driver("compute capability", e))?;
        let compute = (major as u32, minor as u32);
        let name = ctx.name().map_err(|e| driver("cuDeviceGetName", e))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver("multiprocessor count", e))?
            .max(1) as u32;
        let mut driver_version: std::ffi::c_int = 0;
        // SAFETY: a valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(|e| driver("cuDriverGetVersion", e))?;

        let compiled = kernels::compile(compute.0, compute.1, driver_version).map_err(|e| MirrorError::Compile(e.to_string()))?;
        let module = Module::load(&compiled.ptx)?;
        let kernel = |name: &str| -> Result<Kernel, MirrorError> {
            let f = module.function(name)?;
            // SAFETY: f is a function of the live module.
            let per_sm = unsafe { cu::occupancy::max_active_block_per_multiprocessor(f, BLOCK as i32, 0) }
                .map_err(|e| driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
            Ok(Kernel { f, blocks: sms * per_sm.max(1) as u32 })
        };
        let mut btree_get = Vec::new();
        for variant in BTREE_KERNELS {
            let name = kernels::names::btree_get_variant(variant).expect("every listed variant has a kernel");
            btree_get.push((variant, kernel(name)?));
        }
        let kernels = Kernels {
            scatter: kernel(kernels::names::SCATTER)?,
            btree_get,
            btree_count_sum: kernel(kernels::names::BTREE_COUNT_SUM)?,
            art_get: kernel(kernels::names::ART_GET)?,
            art_get_nospec: kernel(kernels::names::ART_GET_NOSPEC)?,
            art_prefix: kernel(kernels::names::ART_COUNT_SUM_PREFIX)?,
            found_bits: kernel(kernels::names::FOUND_BITS)?,
            fault: kernel(kernels::names::FAULT)?,
        };

        // The ART's slot geometry, straight from the Rust definitions.
        let mut geometry = Vec::with_capacity(2 * art_link::KINDS);
        geometry.extend((0..art_link::KINDS as u8).map(art_link::slot_size));
        geometry.extend((0..art_link::KINDS as u8).map(|k| art_link::base_log2(k) as u64));
        let art_geometry = DeviceBuffer::alloc(8 * geometry.len())?;
        // SAFETY: the buffer holds 8 * geometry.len() bytes; a synchronous copy.
        unsafe { cu::memcpy_htod_sync(art_geometry.ptr(), &geometry) }.map_err(|e| driver("cuMemcpyHtoD", e))?;

        let pieces_per_staging = (options.staging_bytes / PIECE).max(1);
        let table_bytes = (16 * pieces_per_staging).next_multiple_of(PIECE);
        let mut staging = Vec::new();
        for _ in 0..options.staging_buffers.max(MIN_STAGING_BUFFERS) {
            let bytes = table_bytes + pieces_per_staging * PIECE;
            let err = DeviceBuffer::alloc(ERR_BYTES)?;
            // SAFETY: err holds ERR_BYTES bytes.
            unsafe { cu::memset_d8_sync(err.ptr(), 0, ERR_BYTES) }.map_err(|e| driver("cuMemsetD8", e))?;
            staging.push(Staging {
                pinned: PinnedBuffer::alloc(bytes)?,
                dev: DeviceBuffer::alloc(bytes)?,
                err,
                stream: Stream::new()?,
                done: Event::new()?,
                in_flight: false,
            });
        }
        let mut slots = Vec::with_capacity(QUERY_SLOTS);
        for _ in 0..QUERY_SLOTS {
            slots.push(QuerySlot {
                stream: Stream::new()?,
                done: Event::new()?,
                pin_in: PinnedBuffer::alloc(CHUNK_IN_BYTES)?,
                pin_out: PinnedBuffer::alloc(CHUNK_OUT_BYTES)?,
                pin_err: PinnedBuffer::alloc(ERR_BYTES)?,
                dev_in: DeviceBuffer::alloc(CHUNK_IN_BYTES)?,
                dev_out: DeviceBuffer::alloc(CHUNK_OUT_BYTES)?,
                dev_err: DeviceBuffer::alloc(ERR_BYTES)?,
            });
        }
        // SAFETY: everything above was created synchronously or on the legacy stream; wait for
        // it before the non-blocking streams start.
        unsafe { sys::cuCtxSynchronize() }.result().map_err(|e| driver("cuCtxSynchronize", e))?;
        Ok(CudaMirror {
            name: format!("{name} (sm_{}{})", compute.0, compute.1),
            device: ordinal,
            compute,
            extent: 0,
            heap: None,
            pages: None,
            page_entries: 0,
            indexes_only: options.contents == super::MirrorContents::Indexes,
            limit: options.device_memory_limit,
            art_geometry,
            staging,
            streams: None,
            pieces_per_staging,
            table_bytes,
            query: Mutex::new(slots),
            host_threads: std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_HOST_THREADS),
            btree_kernel: DEFAULT_BTREE_KERNEL,
            art_speculate: true,
            kernels,
            _module: module,
            ctx,
        })
    }

    fn bind(&self) -> Result<(), MirrorError> {
        self.ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// `e`, a driver error, with this GPU named (a mirror of several says which one failed,
    /// e.g. one that fell off the bus); other errors as they are. Applied once, where
    /// `Devices` (or `gather`) calls into one GPU.
    pub(crate) fn name_error(&self, e: MirrorError) -> MirrorError {
        match e {
            MirrorError::Driver(what) => MirrorError::Driver(format!("GPU {} ({}): {what}", self.device, self.name)),
            other => other,
        }
    }

    /// Faults this GPU (a kernel that traps), which leaves its context unusable as a GPU
    /// that fails or falls off the bus does: every later call on it fails. Returns the
    /// fault's error. Tests only.
    #[doc(hidden)]
    pub fn fail_for_tests(&self) -> MirrorError {
        if let Err(e) = self.bind() {
            return e;
        }
        let stream = &self.staging[0].stream;
        let mut params: [*mut c_void; 0] = [];
        // SAFETY: tusk_fault takes no parameters; it only traps.
        let launched = unsafe { cu::launch_kernel(self.kernels.fault.f, (1, 1, 1), (1, 1, 1), 0, stream.raw(), &mut params) }.map_err(|e| driver("launching tusk_fault", e));
        match launched.and_then(|()| stream.sync()) {
            Err(e) => self.name_error(e),
            Ok(()) => MirrorError::Driver("tusk_fault did not fault".into()),
        }
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.device
    }

    /// The device, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
    pub fn device_name(&self) -> String {
        self.name.clone()
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute
    }

    /// Heap bytes mirrored: [0, extent).
    pub fn extent(&self) -> u64 {
        self.extent
    }

    /// Picks the B-link lookup kernel (one of [`BTREE_KERNELS`]): tile width, whether internal
    /// nodes' children are loaded with their keys, whether registers are capped, how a node is
    /// searched. For measurements.
    pub fn set_btree_kernel(&mut self, kernel: BTreeGet) -> Result<(), MirrorError> {
        if !self.kernels.btree_get.iter().any(|(k, _)| *k == kernel) {
            return Err(MirrorError::Unsupported(format!("no B-link lookup kernel {kernel:?}")));
        }
        self.btree_kernel = kernel;
        Ok(())
    }

    /// The B-link lookup kernel in use.
    pub fn btree_kernel(&self) -> BTreeGet {
        self.btree_kernel
    }

    /// Whether ART lookups load the child for the next key byte together with a node's header
    /// (right whenever the node has no compressed prefix). For measurements.
    pub fn set_art_speculation(&mut self, on: bool) {
        self.art_speculate = on;
    }

    /// Copies `runs` (ascending, disjoint, 8-byte aligned byte ranges of the heap; page-aligned
    /// in practice) from `image` (image\[i\] is heap offset i) to the same device offsets, after
    /// growing the device buffer to `extent` bytes if needed. Staged through the pinned
    /// buffers, copies overlapped on their streams. Returns once every copy has completed.
    pub fn upload(&mut self, image: &[u8], runs: &[Range<u64>], extent: u64) -> Result<(), MirrorError> {
        let mut prev = 0u64;
        for r in runs {
            assert!(r.start <= r.end && r.start >= prev, "runs must ascend and not overlap: {r:?} after {prev}");
            assert!(r.start.is_multiple_of(8) && r.end.is_multiple_of(8), "runs must be 8-byte aligned: {r:?}");
            assert!(r.end <= extent && r.end <= image.len() as u64, "run {r:?} beyond the extent {extent} or the image of {} bytes", image.len());
            prev = r.end;
        }
        if self.indexes_only {
            return Err(MirrorError::Unsupported("a mirror of the indexes only takes its pages from syncs, not whole-heap uploads".into()));
        }
        self.bind()?;
        self.grow(extent)?;
        self.extent = extent;
        self.finish_staging(image, runs, None)
    }

    /// Stages `runs` of `image` (through `table`, if given: see [`CudaMirror::stage_runs`])
    /// and waits for every copy; checks the scatters.
    fn finish_staging(&mut self, image: &[u8], runs: &[Range<u64>], table: Option<&[u32]>) -> Result<(), MirrorError> {
        let result = self.stage_runs(image, runs, table);
        // Whatever happened, nothing may still be copying when this returns.
        let mut synced = Ok(());
        for s in &mut self.staging {
            let r = s.stream.sync();
            s.in_flight = false;
            if synced.is_ok() {
                synced = r;
            }
        }
        result?;
        synced?;
        for s in &self.staging {
            check_scatter(&s.err)?;
        }
        Ok(())
    }

    /// Makes the device buffer hold at least `extent` bytes, keeping what it held (a streamed
    /// sync may have uploaded beyond the old extent) and zeroing the rest.
    fn grow(&mut self, extent: u64) -> Result<(), MirrorError> {
        let cap = self.heap.as_ref().map_or(0, |h| h.bytes() as u64);
        if extent <= cap && self.heap.is_some() {
            return Ok(());
        }
        if let Some(limit) = self.limit.filter(|&l| extent > l) {
            return Err(MirrorError::OverLimit { bytes: extent, limit });
        }
        let want = extent.max(cap + cap / 4).next_multiple_of(HEAP_GRANULE).min(self.limit.unwrap_or(u64::MAX)).max(extent);
        let new = match DeviceBuffer::alloc(want as usize) {
            Err(MirrorError::OutOfMemory { .. }) => DeviceBuffer::alloc(extent.next_multiple_of(PIECE as u64) as usize)?,
            r => r?,
        };
        let keep = cap as usize;
        let stream = &self.staging[0].stream;
        if let Some(old) = &self.heap {
            if keep > 0 {
                // SAFETY: both buffers hold at least `keep` bytes; ordered on this stream.
                unsafe { cu::memcpy_dtod_async(new.ptr(), old.ptr(), keep, stream.raw()) }.map_err(|e| driver("cuMemcpyDtoDAsync", e))?;
            }
        }
        // SAFETY: [keep, size) lies in the new buffer.
        unsafe { cu::memset_d8_async(new.at(keep), 0, new.bytes() - keep, stream.raw()) }.map_err(|e| driver("cuMemsetD8Async", e))?;
        stream.sync()?;
        self.heap = Some(new);
        Ok(())
    }

    /// Copies `runs` of `image` to the device: to the same offsets, or, with `table` (the
    /// index-only layout's page table, `index_pages.rs`), to the device pages it names (runs
    /// of whole pages; pages it does not hold are skipped).
    fn stage_runs(&mut self, image: &[u8], runs: &[Range<u64>], table: Option<&[u32]>) -> Result<(), MirrorError> {
        // Every piece (heap offset, device offset, length) first, so that a staging buffer's
        // pieces can be packed by several threads at once: dirty pages are scattered, and one
        // thread copying them into pinned memory was the slowest part of a sync.
        let mut pieces: Vec<(u64, u64, usize)> = Vec::new();
        for r in runs {
            let mut off = r.start;
            while off < r.end {
                let len = (PIECE as u64).min(r.end - off) as usize;
                match table {
                    None => pieces.push((off, off, len)),
                    Some(t) => {
                        debug_assert!(off.is_multiple_of(PIECE as u64), "index pages go whole");
                        if let Some(page) = t.get((off / PIECE as u64) as usize).copied().filter(|&p| p != index_pages::NO_PAGE) {
                            pieces.push((off, page as u64 * PIECE as u64, len));
                        }
                    }
                }
                off += len as u64;
            }
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(PACK_THREADS_MAX);
        for (batch, cur) in pieces.chunks(self.pieces_per_staging).zip((0..self.staging.len()).cycle()) {
            let table_bytes = self.table_bytes;
            let s = &mut self.staging[cur];
            if s.in_flight {
                s.done.sync()?;
                s.in_flight = false;
            }
            let buf = s.pinned.as_mut_slice();
            let (table, data) = buf.split_at_mut(table_bytes);
            let pack = |batch: &[(u64, u64, usize)], table: &mut [u8], data: &mut [u8]| {
                for (i, &(off, dst, len)) in batch.iter().enumerate() {
                    table[16 * i..16 * i + 8].copy_from_slice(&dst.to_le_bytes());
                    table[16 * i + 8..16 * i + 16].copy_from_slice(&(len as u64).to_le_bytes());
                    data[i * PIECE..i * PIECE + len].copy_from_slice(&image[off as usize..off as usize + len]);
                }
            };
            if batch.len() < PACK_PARALLEL_PIECES || threads <= 1 {
                pack(batch, table, data);
            } else {
                let per = batch.len().div_ceil(threads);
                std::thread::scope(|scope| {
                    let parts = batch.chunks(per).zip(table.chunks_mut(16 * per)).zip(data.chunks_mut(PIECE * per));
                    for ((b, t), d) in parts {
                        scope.spawn(move || pack(b, t, d));
                    }
                });
            }
            self.submit(cur, batch.len())?;
        }
        Ok(())
    }

    /// Copies staging buffer `i`'s first `pieces` table entries and pieces to the device and
    /// scatters them into the heap, on the buffer's stream.
    fn submit(&mut self, i: usize, pieces: usize) -> Result<(), MirrorError> {
        let heap = self.heap.as_ref().expect("grown before staging").ptr();
        let extent = self.device_bytes();
        let table_bytes = self.table_bytes;
        let kernel = self.kernels.scatter;
        let s = &mut self.staging[i];
        let stream = s.stream.raw();
        let data_bytes = pieces * PIECE;
        // SAFETY: source ranges lie in the pinned buffer, destinations in its device twin of
        // the same size; the pinned bytes stay untouched until `done` completes (the host waits
        // for it before refilling the buffer).
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(s.dev.ptr(), s.pinned.ptr(), 16 * pieces, stream)
                .result()
                .map_err(|e| driver("cuMemcpyHtoDAsync (sync table)", e))?;
            sys::cuMemcpyHtoDAsync_v2(s.dev.at(table_bytes), (s.pinned.ptr() as *const u8).add(table_bytes) as *const c_void, data_bytes, stream)
                .result()
                .map_err(|e| driver("cuMemcpyHtoDAsync (sync pieces)", e))?;
        }
        scatter(kernel, ScatterIo { heap, extent, pages: 0, page_count: 0, table: s.dev.ptr(), data: s.dev.at(table_bytes), pieces, err: s.err.ptr() }, stream)?;
        s.done.record(&s.stream)?;
        s.in_flight = true;
        Ok(())
    }

    /// The bytes device offsets are checked against: the extent, or (index-only) the page
    /// buffer's size.
    fn device_bytes(&self) -> u64 {
        match (&self.heap, self.indexes_only) {
            (Some(h), true) => h.bytes() as u64,
            _ => self.extent,
        }
    }

    /// The page table's device pointer (0: the whole-heap layout) and its valid entries.
    fn pages_ptr(&self) -> u64 {
        self.pages.as_ref().map_or(0, |p| p.ptr())
    }

    pub(crate) fn page_entries(&self) -> u64 {
        self.page_entries as u64
    }

    pub(crate) fn indexes_only(&self) -> bool {
        self.indexes_only
    }

    /// Index-only: after a sync's copy and a refresh of the layout, makes the page buffer hold
    /// `refresh.device_pages` pages (keeping what it holds), uploads the changed stretch of
    /// `table`, and uploads the new objects' pages from `image`.
    pub(crate) fn apply_layout(&mut self, image: &[u8], refresh: &index_pages::DeviceRefresh, table: &[u32]) -> Result<(), MirrorError> {
        assert!(self.indexes_only, "only the index-only layout has a page table");
        self.bind()?;
        self.grow((refresh.device_pages * PIECE as u64).max(PIECE as u64))?;
        if let Some(changed) = refresh.changed.clone() {
            let have = self.pages.as_ref().map_or(0, |p| p.bytes() / 4);
            let whole = have < table.len();
            if whole {
                // Room for growth, as the heap buffer has.
                let entries = table.len().max(have + have / 4).next_multiple_of(PIECE / 4);
                self.pages = Some(DeviceBuffer::alloc(4 * entries)?);
            }
            let range = if whole { 0..table.len() } else { changed };
            let dev = self.pages.as_ref().expect("allocated above");
            // SAFETY: the buffer holds at least table.len() entries; a synchronous copy.
            unsafe { cu::memcpy_htod_sync(dev.at(4 * range.start), &table[range]) }.map_err(|e| driver("cuMemcpyHtoD (page table)", e))?;
        }
        self.page_entries = table.len();
        if refresh.new.is_empty() {
            // Nothing to upload: no staging streams to wait for (most syncs).
            return Ok(());
        }
        self.finish_staging(image, &refresh.new, Some(table))
    }

    fn heap_ptr(&self, meta: u64) -> Result<u64, MirrorError> {
        match &self.heap {
            Some(h) => Ok(h.ptr()),
            // Nothing mirrored: the descriptor is not in the (empty) image.
            None => Err(MirrorError::Index(IndexError::Txn(TxnError::InvalidPointer(meta)))),
        }
    }

    fn kernel_for(&self, op: Op) -> Kernel {
        match op {
            Op::BtreeGet => self
                .kernels
                .btree_get
                .iter()
                .find(|(k, _)| *k == self.btree_kernel)
                .map(|(_, f)| *f)
                .expect("set_btree_kernel checks the choice"),
            Op::BtreeCountSum => self.kernels.btree_count_sum,
            Op::ArtGet if self.art_speculate => self.kernels.art_get,
            Op::ArtGet => self.kernels.art_get_nospec,
            Op::ArtPrefix => self.kernels.art_prefix,
        }
    }

    /// Launches `op`'s kernel over the queries and answers `io` names, on `stream`.
    fn launch(&self, op: Op, meta: u64, heap: u64, io: KernelIo, fixed_len: i32, stream: sys::CUstream) -> Result<(), MirrorError> {
        let k = self.kernel_for(op);
        let threads_per_query: u64 = match op {
            Op::BtreeGet => self.btree_kernel.width as u64,
            Op::BtreeCountSum | Op::ArtPrefix => 32,
            Op::ArtGet => 1,
        };
        let want = (io.n as u64 * threads_per_query).div_ceil(BLOCK as u64);
        let blocks = want.clamp(1, k.blocks as u64) as u32;
        let (mut a_heap, mut a_extent, mut a_meta, mut a_n, mut a_err) = (heap, self.extent, meta, io.n as u64, io.err);
        let (mut a_pages, mut a_bytes) = (self.pages_ptr(), self.device_bytes());
        let mut a_geom = self.art_geometry.ptr();
        let (mut a_in, mut a_offs, mut a_lens) = (io.input, io.offs, io.lens);
        let mut a_fixed = fixed_len;
        let (mut a_out, mut a_found) = (io.out, io.found);
        macro_rules! p {
            ($x:expr) => {
                $x as *mut _ as *mut c_void
            };
        }
        let mut params: Vec<*mut c_void> = match op {
            Op::BtreeGet => vec![p!(&mut a_heap), p!(&mut a_extent), p!(&mut a_pages), p!(&mut a_bytes), p!(&mut a_meta), p!(&mut a_in), p!(&mut a_n), p!(&mut a_out), p!(&mut a_found), p!(&mut a_err)],
            Op::BtreeCountSum => vec![p!(&mut a_heap), p!(&mut a_extent), p!(&mut a_pages), p!(&mut a_bytes), p!(&mut a_meta), p!(&mut a_in), p!(&mut a_n), p!(&mut a_out), p!(&mut a_err)],
            Op::ArtGet => vec![
                p!(&mut a_heap),
                p!(&mut a_extent),
                p!(&mut a_pages),
                p!(&mut a_bytes),
                p!(&mut a_meta),
                p!(&mut a_geom),
                p!(&mut a_in),
                p!(&mut a_offs),
                p!(&mut a_lens),
                p!(&mut a_fixed),
                p!(&mut a_n),
                p!(&mut a_out),
                p!(&mut a_found),
                p!(&mut a_err),
            ],
            Op::ArtPrefix => vec![
                p!(&mut a_heap),
                p!(&mut a_extent),
                p!(&mut a_pages),
                p!(&mut a_bytes),
                p!(&mut a_meta),
                p!(&mut a_geom),
                p!(&mut a_in),
                p!(&mut a_offs),
                p!(&mut a_lens),
                p!(&mut a_fixed),
                p!(&mut a_n),
                p!(&mut a_out),
                p!(&mut a_err),
            ],
        };
        // SAFETY: the parameter lists match the kernels' signatures (btree.cu, art.cu) in
        // order and type; the input and output pointers name device memory holding `io.n`
        // queries' inputs and answers (KernelIo's contract), the heap pointer `extent` bytes
        // (every offset the kernels follow is checked against it), the error slot ERR_BYTES.
        unsafe { cu::launch_kernel(k.f, (blocks, 1, 1), (BLOCK, 1, 1), 0, stream, &mut params) }.map_err(|e| driver(&format!("launching the {op:?} kernel"), e))
    }

    /// Most queries of `input` per chunk.
    fn chunk_queries(op: Op, input: &Input<'_>) -> usize {
        let by_in = (CHUNK_IN_BYTES - 3 * SECTION) / input.in_per_query().max(1);
        let by_out = (CHUNK_OUT_BYTES - 2 * SECTION) / op.out_per_query();
        by_in.min(by_out).max(1)
    }

    /// Answers a batch through the query slots: chunks packed into pinned memory, copied in,
    /// answered and copied out on rotating streams while the host packs the next chunk and
    /// decodes an earlier one, straight into the answer vector (on several threads: the host
    /// side, page faults of the answer included, would otherwise bound the whole path).
    fn run_batch<T: Send>(&self, op: Op, meta: u64, input: &Input<'_>, decode: impl Fn(&[u8], &Layout, &mut [MaybeUninit<T>], usize) + Sync) -> Result<Vec<T>, MirrorError> {
        gather(&[(self, 0..input.len())], |d, _, out| d.run_batch_into(op, meta, input, &decode, out))
    }

    /// [`CudaMirror::run_batch`] into `out` (one slot per query): on `Ok`, every slot is
    /// written.
    fn run_batch_into<T: Send>(&self, op: Op, meta: u64, input: &Input<'_>, decode: &impl Fn(&[u8], &Layout, &mut [MaybeUninit<T>], usize), out: &mut [MaybeUninit<T>]) -> Result<(), MirrorError> {
        assert_eq!(out.len(), input.len(), "an answer slot per query");
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let heap = self.heap_ptr(meta)?;
        let mut slots = self.query.lock().unwrap_or_else(|e| e.into_inner());
        let result = self.run_chunks(op, meta, heap, input, &mut slots, decode, out);
        if result.is_err() {
            // Nothing may still write into the slots' pinned buffers after this returns.
            for s in slots.iter() {
                let _ = s.stream.sync();
            }
        }
        result
    }

    /// B-link lookups of `keys` into `out` (see [`gather`]).
    pub(crate) fn btree_get_to(&self, meta: u64, keys: &[u64], out: &mut [MaybeUninit<Option<u64>>]) -> Result<(), MirrorError> {
        self.run_batch_into(Op::BtreeGet, meta, &Input::Words(keys), &decode_get, out)
    }

    /// B-link count/sum of `ranges` into `out`.
    pub(crate) fn btree_count_sum_to(&self, meta: u64, ranges: &[(u64, u64)], out: &mut [MaybeUninit<(u64, u128)>]) -> Result<(), MirrorError> {
        self.run_batch_into(Op::BtreeCountSum, meta, &Input::Ranges(ranges), &decode_count_sum, out)
    }

    /// ART lookups of `keys` (at most 32 bytes each) into `out`.
    pub(crate) fn art_get_to(&self, meta: u64, keys: &[&[u8]], out: &mut [MaybeUninit<Option<u64>>]) -> Result<(), MirrorError> {
        let fixed = check_keys(keys, "key")?;
        self.run_batch_into(Op::ArtGet, meta, &Input::Keys { keys, fixed }, &decode_get, out)
    }

    /// ART prefix count/sum of `prefixes` (at most 32 bytes each) into `out`.
    pub(crate) fn art_count_sum_prefix_to(&self, meta: u64, prefixes: &[&[u8]], out: &mut [MaybeUninit<(u64, u128)>]) -> Result<(), MirrorError> {
        let fixed = check_keys(prefixes, "prefix")?;
        self.run_batch_into(Op::ArtPrefix, meta, &Input::Keys { keys: prefixes, fixed }, &decode_count_sum, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_chunks<T: Send>(
        &self,
        op: Op,
        meta: u64,
        heap: u64,
        input: &Input<'_>,
        slots: &mut [QuerySlot],
        decode: &impl Fn(&[u8], &Layout, &mut [MaybeUninit<T>], usize),
        out: &mut [MaybeUninit<T>],
    ) -> Result<(), MirrorError> {
        let n = input.len();
        let per = Self::chunk_queries(op, input);
        // (slot, first query, layout) of the chunks in flight, oldest first.
        let mut pending: VecDeque<(usize, usize, Layout)> = VecDeque::new();
        let finish = |slot: &QuerySlot, first: usize, layout: &Layout, out: &mut [MaybeUninit<T>]| -> Result<(), MirrorError> {
            slot.done.sync()?;
            let (code, at) = err_slot(slot.pin_err.as_slice());
            if code != 0 {
                return Err(kernel_error(op, code, at));
            }
            decode(&slot.pin_out.as_slice()[..layout.out_bytes], layout, &mut out[first..first + layout.n], self.host_threads);
            Ok(())
        };
        let mut start = 0usize;
        let mut chunk = 0usize;
        while start < n {
            let end = n.min(start + per);
            let si = chunk % slots.len();
            // The slot's previous chunk must be finished (decoded) before the slot is reused.
            while let Some(&(s, first, layout)) = pending.front() {
                if !pending.iter().any(|p| p.0 == si) {
                    break;
                }
                pending.pop_front();
                finish(&slots[s], first, &layout, out)?;
            }
            let slot = &mut slots[si];
            let layout = pack(op, input, start..end, slot.pin_in.as_mut_slice(), self.host_threads);
            assert!(layout.in_bytes <= slot.dev_in.bytes() && layout.out_bytes <= slot.dev_out.bytes(), "chunk layout {layout:?} exceeds the slot");
            let stream = slot.stream.raw();
            // SAFETY: every copy stays inside its pinned and device buffers (checked above); the
            // pinned bytes are not touched by the host until `done` completes.
            unsafe {
                cu::memset_d8_async(slot.dev_err.ptr(), 0, ERR_BYTES, stream).map_err(|e| driver("cuMemsetD8Async", e))?;
                if layout.in_bytes > 0 {
                    sys::cuMemcpyHtoDAsync_v2(slot.dev_in.ptr(), slot.pin_in.ptr(), layout.in_bytes, stream).result().map_err(|e| driver("cuMemcpyHtoDAsync", e))?;
                }
            }
            self.launch(op, meta, heap, KernelIo::of_layout(&layout, slot.dev_in.ptr(), slot.dev_out.ptr(), slot.dev_err.ptr()), input.fixed_len(), stream)?;
            // SAFETY: as above.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(slot.pin_out.mut_ptr(), slot.dev_out.ptr(), layout.out_bytes, stream).result().map_err(|e| driver("cuMemcpyDtoHAsync", e))?;
                sys::cuMemcpyDtoHAsync_v2(slot.pin_err.mut_ptr(), slot.dev_err.ptr(), ERR_BYTES, stream).result().map_err(|e| driver("cuMemcpyDtoHAsync", e))?;
            }
            slot.done.record(&slot.stream)?;
            pending.push_back((si, start, layout));
            start = end;
            chunk += 1;
        }
        while let Some((s, first, layout)) = pending.pop_front() {
            finish(&slots[s], first, &layout, out)?;
        }
        Ok(())
    }

    /// B-link point lookups; `meta` is the tree descriptor's heap offset (root at meta + 8).
    pub fn btree_get(&self, meta: u64, keys: &[u64]) -> Result<Vec<Option<u64>>, MirrorError> {
        self.run_batch(Op::BtreeGet, meta, &Input::Words(keys), decode_get)
    }

    /// Count and sum of the values of keys in [lo, hi] (inclusive; empty when lo > hi), per
    /// range.
    pub fn btree_count_sum(&self, meta: u64, ranges: &[(u64, u64)]) -> Result<Vec<(u64, u128)>, MirrorError> {
        self.run_batch(Op::BtreeCountSum, meta, &Input::Ranges(ranges), decode_count_sum)
    }

    /// ART point lookups for keys of at most 32 bytes (a longer key fails the batch with
    /// [`MirrorError::Unsupported`]: the caller answers it on the CPU).
    pub fn art_get(&self, meta: u64, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, MirrorError> {
        let fixed = check_keys(keys, "key")?;
        self.run_batch(Op::ArtGet, meta, &Input::Keys { keys, fixed }, decode_get)
    }

    /// Count and sum of the values of the keys starting with each prefix (prefixes of at most
    /// 32 bytes; the empty prefix is the whole tree).
    pub fn art_count_sum_prefix(&self, meta: u64, prefixes: &[&[u8]]) -> Result<Vec<(u64, u128)>, MirrorError> {
        let fixed = check_keys(prefixes, "prefix")?;
        self.run_batch(Op::ArtPrefix, meta, &Input::Keys { keys: prefixes, fixed }, decode_count_sum)
    }

    /// Times `op` over `input`: the kernel alone on device-resident buffers (CUDA events,
    /// median of `rounds` after a warm-up), and `end_to_end` (host clock, median of `rounds`
    /// after a warm-up).
    fn time_op(&self, op: Op, meta: u64, input: &Input<'_>, rounds: usize, end_to_end: Option<&dyn Fn() -> Result<(), MirrorError>>) -> Result<KernelTiming, MirrorError> {
        let rounds = rounds.max(1);
        let n = input.len();
        self.bind()?;
        let heap = self.heap_ptr(meta)?;
        let in_bytes = n * input.in_per_query() + 3 * SECTION;
        let mut host = vec![0u8; in_bytes];
        let layout = pack(op, input, 0..n, &mut host, self.host_threads);
        let dev_in = DeviceBuffer::alloc(layout.in_bytes)?;
        let dev_out = DeviceBuffer::alloc(layout.out_bytes)?;
        let dev_err = DeviceBuffer::alloc(ERR_BYTES)?;
        let stream = Stream::new()?;
        let (start, stop) = (Event::new()?, Event::new()?);
        // SAFETY: synchronous copies into buffers of at least these sizes.
        unsafe {
            cu::memcpy_htod_sync(dev_in.ptr(), &host[..layout.in_bytes]).map_err(|e| driver("cuMemcpyHtoD", e))?;
            cu::memset_d8_sync(dev_err.ptr(), 0, ERR_BYTES).map_err(|e| driver("cuMemsetD8", e))?;
        }
        drop(host);
        let check = |stream: &Stream| -> Result<(), MirrorError> {
            stream.sync()?;
            let mut slot = [0u8; ERR_BYTES];
            // SAFETY: the error slot holds ERR_BYTES bytes; its stream is idle.
            unsafe { cu::memcpy_dtoh_sync(&mut slot, dev_err.ptr()) }.map_err(|e| driver("cuMemcpyDtoH", e))?;
            let (code, at) = err_slot(&slot);
            if code != 0 {
                return Err(kernel_error(op, code, at));
            }
            Ok(())
        };
        let io = KernelIo::of_layout(&layout, dev_in.ptr(), dev_out.ptr(), dev_err.ptr());
        let launch = || self.launch(op, meta, heap, io, input.fixed_len(), stream.raw());
        launch()?;
        check(&stream)?;
        let mut kernel = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            start.record(&stream)?;
            launch()?;
            stop.record(&stream)?;
            stop.sync()?;
            kernel.push(start.elapsed_ms(&stop)?);
        }
        check(&stream)?;
        let Some(end_to_end) = end_to_end else {
            return Ok(KernelTiming { kernel_ms: median(kernel), end_to_end_ms: f64::NAN });
        };
        end_to_end()?;
        let mut e2e = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            end_to_end()?;
            e2e.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(KernelTiming { kernel_ms: median(kernel), end_to_end_ms: median(e2e) })
    }

    /// The bus's rates with page-locked memory, GB/s, medians of `rounds` after a warm-up:
    /// `bytes` copied host to device alone, device to host alone, and both at once on two
    /// streams (their sum). What a batch that moves its queries in and its answers out can
    /// reach end to end, whatever its kernels do.
    pub fn bus_rates(&self, bytes: usize, rounds: usize) -> Result<BusRates, MirrorError> {
        self.bus_rates_in_step(bytes, rounds, &|_| ())
    }

    /// [`CudaMirror::bus_rates`] with `step(k)` called before the k-th timed copy (k from 0):
    /// probes of several GPUs at once pass a barrier's wait, so that each direction runs on all
    /// of them together.
    pub fn bus_rates_in_step(&self, bytes: usize, rounds: usize, step: &(dyn Fn(usize) + Sync)) -> Result<BusRates, MirrorError> {
        self.bind()?;
        let (host_in, mut host_out) = (PinnedBuffer::alloc(bytes)?, PinnedBuffer::alloc(bytes)?);
        let (dev_in, dev_out) = (DeviceBuffer::alloc(bytes)?, DeviceBuffer::alloc(bytes)?);
        let (to_device, to_host) = (Stream::new()?, Stream::new()?);
        let host_out = host_out.mut_ptr();
        let steps = std::cell::Cell::new(0);
        let time = |up: bool, down: bool| -> Result<f64, MirrorError> {
            step(steps.replace(steps.get() + 1));
            let t = Instant::now();
            // SAFETY: both buffers hold `bytes` bytes; both streams are synchronized below,
            // whatever the launches returned, before the buffers can be dropped.
            let up = if up { unsafe { sys::cuMemcpyHtoDAsync_v2(dev_in.ptr(), host_in.ptr(), bytes, to_device.raw()) }.result() } else { Ok(()) };
            // SAFETY: as above.
            let down = if down { unsafe { sys::cuMemcpyDtoHAsync_v2(host_out, dev_out.ptr(), bytes, to_host.raw()) }.result() } else { Ok(()) };
            let synced = (to_device.sync(), to_host.sync());
            up.map_err(|e| driver("cuMemcpyHtoDAsync (bus probe)", e))?;
            down.map_err(|e| driver("cuMemcpyDtoHAsync (bus probe)", e))?;
            synced.0?;
            synced.1?;
            Ok(t.elapsed().as_secs_f64())
        };
        let rate = |up: bool, down: bool| -> Result<f64, MirrorError> {
            time(up, down)?;
            let secs = (0..rounds.max(1)).map(|_| time(up, down)).collect::<Result<Vec<f64>, _>>()?;
            let moved = bytes as f64 * f64::from(u8::from(up) + u8::from(down));
            Ok(moved / median(secs) / 1e9)
        };
        Ok(BusRates { to_device_gb_per_s: rate(true, false)?, to_host_gb_per_s: rate(false, true)?, both_gb_per_s: rate(true, true)? })
    }

    /// B-link lookups timed: kernel alone on device-resident keys, and end to end.
    pub fn time_btree_get(&self, meta: u64, keys: &[u64], rounds: usize) -> Result<KernelTiming, MirrorError> {
        self.time_op(Op::BtreeGet, meta, &Input::Words(keys), rounds, Some(&|| self.btree_get(meta, keys).map(drop)))
    }

    /// B-link lookups timed, the kernel alone (for sweeps over kernel variants): median ms.
    pub fn time_btree_get_kernel(&self, meta: u64, keys: &[u64], rounds: usize) -> Result<f64, MirrorError> {
        Ok(self.time_op(Op::BtreeGet, meta, &Input::Words(keys), rounds, None)?.kernel_ms)
    }

    /// B-link range count/sum timed.
    pub fn time_btree_count_sum(&self, meta: u64, ranges: &[(u64, u64)], rounds: usize) -> Result<KernelTiming, MirrorError> {
        self.time_op(Op::BtreeCountSum, meta, &Input::Ranges(ranges), rounds, Some(&|| self.btree_count_sum(meta, ranges).map(drop)))
    }

    /// ART lookups timed.
    pub fn time_art_get(&self, meta: u64, keys: &[&[u8]], rounds: usize) -> Result<KernelTiming, MirrorError> {
        let fixed = check_keys(keys, "key")?;
        self.time_op(Op::ArtGet, meta, &Input::Keys { keys, fixed }, rounds, Some(&|| self.art_get(meta, keys).map(drop)))
    }

    /// ART lookups timed, the kernel alone: median ms.
    pub fn time_art_get_kernel(&self, meta: u64, keys: &[&[u8]], rounds: usize) -> Result<f64, MirrorError> {
        let fixed = check_keys(keys, "key")?;
        Ok(self.time_op(Op::ArtGet, meta, &Input::Keys { keys, fixed }, rounds, None)?.kernel_ms)
    }

    /// ART prefix count/sum timed.
    pub fn time_art_count_sum_prefix(&self, meta: u64, prefixes: &[&[u8]], rounds: usize) -> Result<KernelTiming, MirrorError> {
        let fixed = check_keys(prefixes, "prefix")?;
        self.time_op(Op::ArtPrefix, meta, &Input::Keys { keys: prefixes, fixed }, rounds, Some(&|| self.art_count_sum_prefix(meta, prefixes).map(drop)))
    }
}

impl Drop for CudaMirror {
    fn drop(&mut self) {
        // The fields' owners free driver objects: the context must be current, and no copy may
        // still be running into memory about to be freed.
        if self.bind().is_ok() {
            for s in &self.staging {
                let _ = s.stream.sync();
            }
            for s in self.query.get_mut().unwrap_or_else(|e| e.into_inner()).iter() {
                let _ = s.stream.sync();
            }
            if let Some(streams) = &self.streams {
                streams.sync_copies();
            }
        }
    }
}

impl std::fmt::Debug for CudaMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMirror").field("device", &self.name).field("extent", &self.extent).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_fixed_and_variable_keys() {
        let keys: Vec<&[u8]> = vec![b"", b"a", b"abcdefghi", &[0xFF; 32]];
        let input = Input::Keys { keys: &keys, fixed: None };
        let mut buf = vec![0xAAu8; 4096];
        let l = pack(Op::ArtGet, &input, 0..keys.len(), &mut buf, 4);
        // words: "" 0, "a" 1, "abcdefghi" 2, 32 bytes 4 = 7 words
        assert_eq!(l.offs_at, 256);
        let offs: Vec<u32> = (0..4).map(|i| u32::from_le_bytes(buf[l.offs_at + 4 * i..l.offs_at + 4 * i + 4].try_into().unwrap())).collect();
        assert_eq!(offs, [0, 0, 1, 3]);
        assert_eq!(&buf[l.lens_at..l.lens_at + 4], &[0, 1, 9, 32]);
        assert_eq!(&buf[8..24], b"abcdefghi\0\0\0\0\0\0\0");
        assert_eq!(buf[1..8], [0; 7], "padding zeroed");
        assert_eq!(l.found_at, 256);
        assert_eq!(l.out_bytes, 256 + 4);

        let same: Vec<&[u8]> = vec![b"12345678", b"abcdefgh"];
        assert_eq!(check_keys(&same, "key").unwrap(), Some(8));
        let input = Input::Keys { keys: &same, fixed: Some(8) };
        let l = pack(Op::ArtPrefix, &input, 1..2, &mut buf, 4);
        assert_eq!(l.in_bytes, 8);
        assert_eq!(&buf[..8], b"abcdefgh");
        assert_eq!(l.out_bytes, 24);
        assert_eq!(input.fixed_len(), 8);
    }

    /// Parallel packing and decoding over many parts equal the serial result.
    #[test]
    fn parallel_packing_and_decoding() {
        let n = 5 * MIN_PART + 17;
        let words: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let ranges: Vec<(u64, u64)> = words.iter().map(|&w| (w, !w)).collect();
        let keys8: Vec<[u8; 8]> = words.iter().map(|w| w.to_be_bytes()).collect();
        let keys: Vec<&[u8]> = keys8.iter().map(|k| &k[..]).collect();
        for threads in [1, 3, 16] {
            let mut buf = vec![0u8; 16 * n + 4096];
            let l = pack(Op::BtreeGet, &Input::Words(&words), 3..n, &mut buf, threads);
            assert!((0..n - 3).all(|i| word_at(&buf, i) == words[i + 3]));
            assert_eq!(l.in_bytes, 8 * (n - 3));
            pack(Op::BtreeCountSum, &Input::Ranges(&ranges), 0..n, &mut buf, threads);
            assert!((0..n).all(|i| word_at(&buf, 2 * i) == ranges[i].0 && word_at(&buf, 2 * i + 1) == ranges[i].1));
            pack(Op::ArtGet, &Input::Keys { keys: &keys, fixed: Some(8) }, 1..n, &mut buf, threads);
            assert!((0..n - 1).all(|i| buf[8 * i..8 * i + 8] == keys8[i + 1]));

            let l = layout(Op::BtreeGet, &Input::Words(&words), 0..n);
            let mut out = vec![0u8; l.out_bytes];
            for i in 0..n {
                out[8 * i..8 * i + 8].copy_from_slice(&words[i].to_le_bytes());
                out[l.found_at + i] = (i % 3 == 0) as u8;
            }
            let mut got = vec![MaybeUninit::uninit(); n];
            decode_get(&out, &l, &mut got, threads);
            // SAFETY: decode_get writes every slot.
            assert!(got.iter().enumerate().all(|(i, g)| unsafe { g.assume_init() } == (i % 3 == 0).then_some(words[i])));
            let l = layout(Op::BtreeCountSum, &Input::Ranges(&ranges), 0..n);
            let mut out = vec![0u8; l.out_bytes];
            for i in 0..n {
                out[24 * i..24 * i + 8].copy_from_slice(&(i as u64).to_le_bytes());
                out[24 * i + 8..24 * i + 16].copy_from_slice(&words[i].to_le_bytes());
                out[24 * i + 16..24 * i + 24].copy_from_slice(&1u64.to_le_bytes());
            }
            let mut got = vec![MaybeUninit::uninit(); n];
            decode_count_sum(&out, &l, &mut got, threads);
            // SAFETY: decode_count_sum writes every slot.
            assert!(got.iter().enumerate().all(|(i, g)| unsafe { g.assume_init() } == (i as u64, words[i] as u128 | 1 << 64)));
        }
        assert_eq!(part_len(10, 4), 10);
        assert_eq!(part_len(4 * MIN_PART, 4), MIN_PART);
        assert_eq!(part_len(0, 4), 1);
    }

    #[test]
    fn long_keys_are_unsupported() {
        let long = [7u8; GPU_MAX_KEY + 1];
        let keys: Vec<&[u8]> = vec![b"x", &long];
        assert!(matches!(check_keys(&keys, "key"), Err(MirrorError::Unsupported(_))));
        assert_eq!(check_keys(&[], "key").unwrap(), Some(0));
    }

    #[test]
    fn decoding_and_chunking() {
        let mut out = vec![0u8; 512];
        out[..8].copy_from_slice(&5u64.to_le_bytes());
        out[8..16].copy_from_slice(&6u64.to_le_bytes());
        let l = Layout { n: 2, in_bytes: 16, offs_at: 0, lens_at: 0, found_at: 256, out_bytes: 258 };
        out[256] = 1;
        let mut got = [MaybeUninit::uninit(); 2];
        decode_get(&out, &l, &mut got, 4);
        // SAFETY: decode_get wrote both.
        assert_eq!(got.map(|g| unsafe { g.assume_init() }), [Some(5), None]);
        let mut agg = vec![0u8; 24];
        agg[..8].copy_from_slice(&3u64.to_le_bytes());
        agg[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        agg[16..24].copy_from_slice(&2u64.to_le_bytes());
        let mut got = [MaybeUninit::uninit(); 1];
        decode_count_sum(&agg, &Layout { n: 1, ..l }, &mut got, 4);
        // SAFETY: decode_count_sum wrote it.
        assert_eq!(got.map(|g| unsafe { g.assume_init() }), [(3, u64::MAX as u128 | 2u128 << 64)]);
        for op in [Op::BtreeGet, Op::BtreeCountSum, Op::ArtGet, Op::ArtPrefix] {
            for input in [Input::Words(&[]), Input::Ranges(&[]), Input::Keys { keys: &[], fixed: None }, Input::Keys { keys: &[], fixed: Some(32) }] {
                // A full chunk's worst-case layout fits a slot's buffers.
                let per = CudaMirror::chunk_queries(op, &input);
                assert!(per * input.in_per_query() + 3 * SECTION <= CHUNK_IN_BYTES);
                let out = if op.out_per_query() == 9 { align(8 * per) + per } else { 24 * per };
                assert!(out <= CHUNK_OUT_BYTES, "{op:?}");
            }
        }
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn open_without_a_gpu_is_an_error_not_a_panic() {
        match CudaMirror::open(&GpuOptions::default()) {
            Ok(m) => eprintln!("a GPU is present: {}", m.device_name()),
            Err(e) => eprintln!("no GPU: {e}"),
        }
    }
}
