//! Syncs that upload while the host copy runs.
//!
//! The consistent copy fills the host image on its copier threads
//! (`ImageTarget::copy_runs_streamed`; an incremental sync's copiers also find the dirty pages,
//! scanning the epochs a part at a time: `copy_dirty_streamed`), 64 KiB at a time. Each copier packs what it has just
//! copied, read again from the heap while its lines are in that core's cache, into the pinned
//! stream buffer of the portion it fills ([`Packer`]: a table of (heap offset, length) pairs,
//! then the pieces [`PIECE`] bytes apart), and sends each full buffer to the calling thread,
//! which submits it at once ([`Devices::submit_streamed`]): one copy to the buffer's device
//! twin at the bus's rate and one scatter launch. So the bus carries one portion while the
//! copiers copy and pack the next, and the packing is spread over all of them.
//!
//! Host memory is what a sync waits on (a 16-core host moves about 130 GB/s, and every byte
//! of a sync crosses it several times), so both the image and the buffers are written with
//! non-temporal stores: a page costs one read of the heap, one write of the image, one write
//! and one DMA read of the buffer, where cached stores would also read each destination line
//! before writing it and packing from the image would read the page a second time.
//!
//! Every submission goes to one stream, in the order the portions arrive. A page copied
//! twice (written during the copy's open pass, so copied again under the closed gate) is
//! scattered twice in that order, and the consistent copy is the one left on the device.
//!
//! Buffers go round: idle ones wait in a channel the copiers take from (each when its portion
//! begins); a submitted one comes back once its scatter has completed. At most all but two
//! are in flight after a submission (see `Devices::submit_streamed`), and a copier holds its
//! buffer only while it fills it, waiting on nothing else, so a copier waiting for a buffer
//! always gets one.
//!
//! A mirror on several GPUs streams to all of them at once: the pinned buffers (portable)
//! belong to the first device, and every device copies each one into its own twin and
//! scatters it; a buffer comes back once every device has scattered it.

use std::collections::VecDeque;

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::sys;
use tusk_storage::Heap;
use tusk_txn::snapshot::image::PortionPacker;

use super::raw::{driver, DeviceBuffer, Event, PinnedBuffer, Stream};
use super::{check_scatter, scatter, CudaMirror, ScatterIo, PIECE};
use crate::mirror::devices::Devices;
use crate::mirror::index_pages::IndexPages;
use crate::mirror::MirrorError;

/// Most bytes of heap a stream buffer carries (the image copy's largest portion).
pub(crate) const STREAM_PORTION: usize = 2 << 20;
/// Least bytes of a portion: below it, a buffer's fixed costs (a copy's setup, a launch) take a
/// large share of its time on the bus.
pub(crate) const MIN_STREAM_PORTION: usize = 1 << 20;
/// Stream buffers: enough that copiers rarely wait for one while earlier ones cross the bus
/// (a copier holds one from its portion's first page to its last, so twice the copiers of a
/// 16-core host).
const STREAM_BUFFERS: usize = 32;
/// Table entries a buffer has room for: a portion cut into whole pieces (portions are made of
/// whole pages, and a page is a piece).
const TABLE_ENTRIES: usize = STREAM_PORTION / PIECE;
const _: () = assert!(PIECE as u64 == tusk_storage::PAGE_SIZE);
/// Bytes before a buffer's pieces, and of the whole buffer (copied to the device in one go).
const TABLE_BYTES: usize = 16 * TABLE_ENTRIES;
const BUFFER_BYTES: usize = TABLE_BYTES + STREAM_PORTION;

/// A stream buffer on its way: which one, its pinned memory, and the pieces packed in it.
pub(crate) struct Packed {
    id: usize,
    buffer: PinnedBuffer,
    pieces: usize,
    /// Heap bytes packed, and the end of the last heap byte written.
    bytes: u64,
    end: u64,
}

impl Packed {
    /// Heap bytes packed.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing was packed (every page left out by the table).
    pub(crate) fn is_empty(&self) -> bool {
        self.pieces == 0
    }
}

/// A stream buffer's device side: its twin, and the events of its last copy and scatter.
struct Twin {
    dev: DeviceBuffer,
    copied: Event,
    done: Event,
}

/// The pinned buffers of a streamed sync and their round: held by the first device of a
/// mirror; the others copy from the same (portable) buffers into their own twins.
struct Pool {
    /// Idle pinned buffers, for the copiers; `back` puts buffers back.
    idle: Receiver<(usize, PinnedBuffer)>,
    back: Sender<(usize, PinnedBuffer)>,
    /// Submitted, oldest first.
    in_flight: VecDeque<(usize, PinnedBuffer)>,
}

/// A device's side of streamed syncs.
pub(crate) struct StreamBuffers {
    /// By buffer id.
    device: Vec<Twin>,
    /// The copies' stream (the scatters go on the sync stream, each after its copy): a copy
    /// crosses the bus while the scatter before it runs.
    copy: Stream,
    pool: Option<Pool>,
}

impl StreamBuffers {
    fn new(with_pool: bool) -> Result<StreamBuffers, MirrorError> {
        let mut device = Vec::with_capacity(STREAM_BUFFERS);
        for _ in 0..STREAM_BUFFERS {
            device.push(Twin { dev: DeviceBuffer::alloc(BUFFER_BYTES)?, copied: Event::untimed()?, done: Event::untimed()? });
        }
        let pool = if with_pool {
            let (back, idle) = crossbeam_channel::bounded(STREAM_BUFFERS);
            for id in 0..STREAM_BUFFERS {
                back.send((id, PinnedBuffer::alloc(BUFFER_BYTES)?)).expect("room for every buffer");
            }
            Some(Pool { idle, back, in_flight: VecDeque::new() })
        } else {
            None
        };
        Ok(StreamBuffers { device, copy: Stream::new()?, pool })
    }

    /// Waits for the copies in flight (before the buffers are freed).
    pub(crate) fn sync_copies(&self) {
        let _ = self.copy.sync();
    }
}

/// Packs the pages each copier has just copied into the portion it fills: an idle buffer from
/// `pool` (waiting for one if none is idle), taken when the portion begins. Runs on the copier
/// threads. With `held` (the index-only layout, `index_pages.rs`) only pages some GPU holds
/// are packed (each GPU's scatter translates them through its own table).
pub(crate) struct Packer<'a> {
    pub(crate) pool: &'a Receiver<(usize, PinnedBuffer)>,
    pub(crate) held: Option<&'a IndexPages>,
}

impl PortionPacker for Packer<'_> {
    type Portion = Packed;

    fn begin(&self) -> Packed {
        let (id, buffer) = self.pool.recv().expect("the mirror keeps its stream buffers while a sync runs");
        Packed { id, buffer, pieces: 0, bytes: 0, end: 0 }
    }

    /// Adds a table entry (heap offset, length) per page and the page itself, read from the
    /// heap with non-temporal stores (the buffer is read next by the DMA engine, not a core).
    fn pack(&self, packed: &mut Packed, heap: &Heap, off: u64, len: usize) {
        assert!(off.is_multiple_of(PIECE as u64) && len.is_multiple_of(PIECE), "a portion of whole pages: {len} bytes at {off}");
        let bytes = packed.buffer.as_mut_slice();
        let (entries, data) = bytes.split_at_mut(TABLE_BYTES);
        for at in (off..off + len as u64).step_by(PIECE) {
            let n = packed.pieces;
            assert!(n < TABLE_ENTRIES, "a portion of more than {TABLE_ENTRIES} pieces");
            if self.held.is_some_and(|h| !h.held_anywhere(at / PIECE as u64)) {
                continue;
            }
            entries[16 * n..16 * n + 8].copy_from_slice(&at.to_le_bytes());
            entries[16 * n + 8..16 * n + 16].copy_from_slice(&(PIECE as u64).to_le_bytes());
            heap.copy_out_streaming(at, &mut data[n * PIECE..(n + 1) * PIECE]);
            packed.pieces += 1;
            packed.bytes += PIECE as u64;
            packed.end = packed.end.max(at + PIECE as u64);
        }
    }
}

impl CudaMirror {
    /// Starts a streamed sync of an image whose extent is about `extent_hint`: grows the device
    /// heap; with `pool` (the first device), returns the pinned buffers' pool for [`Packer`].
    pub(crate) fn begin_streamed(&mut self, extent_hint: u64, pool: bool) -> Result<Option<Receiver<(usize, PinnedBuffer)>>, MirrorError> {
        self.bind()?;
        if !self.indexes_only {
            self.grow(extent_hint)?;
        }
        if self.streams.is_none() {
            self.streams = Some(StreamBuffers::new(pool)?);
        }
        Ok(self.streams.as_ref().expect("made above").pool.as_ref().map(|p| p.idle.clone()))
    }

    fn streams(&self) -> &StreamBuffers {
        self.streams.as_ref().expect("begin_streamed made the buffers")
    }

    fn pool(&mut self) -> &mut Pool {
        self.streams.as_mut().and_then(|s| s.pool.as_mut()).expect("the first device holds the pool")
    }

    /// Copies a packed buffer to this device's twin of it and scatters it into the heap, on
    /// the sync stream, without waiting.
    pub(crate) fn enqueue_packed(&mut self, packed: &Packed) -> Result<(), MirrorError> {
        self.bind()?;
        let (pages, page_count) = if self.indexes_only() {
            if self.pages_ptr() == 0 || self.heap.is_none() {
                // Nothing placed on this GPU yet: it holds none of the pages.
                return self.streams().device[packed.id].done.record(&self.staging[0].stream);
            }
            (self.pages_ptr(), self.page_entries())
        } else {
            self.grow(packed.end)?;
            (0, 0)
        };
        let buffer = self.heap.as_ref().expect("grown above or placed");
        let (heap, extent) = (buffer.ptr(), buffer.bytes() as u64);
        let kernel = self.kernels.scatter;
        let stream = &self.staging[0].stream;
        let streams = self.streams();
        let twin = &streams.device[packed.id];
        let dev = &twin.dev;
        // SAFETY: the table and the pieces, [0, TABLE_BYTES + pieces * PIECE), lie inside the
        // pinned buffer and its device twin (both BUFFER_BYTES); the pinned bytes stay untouched
        // until every device's `done` for it completed (the buffer comes back to the pool only
        // after that), and the twin is not written again before then either.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dev.ptr(), packed.buffer.ptr(), TABLE_BYTES + packed.pieces * PIECE, streams.copy.raw()) }
            .result()
            .map_err(|e| driver("cuMemcpyHtoDAsync (sync pieces)", e))?;
        twin.copied.record(&streams.copy)?;
        stream.wait(&twin.copied)?;
        scatter(kernel, ScatterIo { heap, extent, pages, page_count, table: dev.ptr(), data: dev.at(TABLE_BYTES), pieces: packed.pieces, err: self.staging[0].err.ptr() }, stream.raw())?;
        twin.done.record(stream)?;
        Ok(())
    }

    /// Whether this device's scatter of buffer `id` has completed.
    fn scattered(&self, id: usize) -> Result<bool, MirrorError> {
        self.bind()?;
        self.streams().device[id].done.done()
    }

    /// Waits for this device's scatter of buffer `id`.
    fn wait_scattered(&self, id: usize) -> Result<(), MirrorError> {
        self.bind()?;
        self.streams().device[id].done.sync()
    }

    /// Ends a streamed sync on this device: waits for every upload, checks the scatter's
    /// error slot, and answers for heap bytes [0, extent) from now on. The first device also
    /// takes every buffer back.
    pub(crate) fn end_streamed(&mut self, extent: u64) -> Result<(), MirrorError> {
        self.bind()?;
        if let Some(streams) = self.streams.as_ref() {
            streams.copy.sync()?;
        }
        self.staging[0].stream.sync()?;
        if let Some(pool) = self.streams.as_mut().and_then(|s| s.pool.as_mut()) {
            while let Some(idle) = pool.in_flight.pop_front() {
                pool.back.send(idle).expect("room for every buffer");
            }
        }
        check_scatter(&self.staging[0].err)?;
        if !self.indexes_only {
            self.grow(extent)?;
        }
        self.extent = extent;
        Ok(())
    }
}

impl Devices {
    /// Starts a streamed sync on every device; returns the pool of pinned buffers for
    /// [`Packer`].
    pub(crate) fn begin_streamed(&mut self, extent_hint: u64) -> Result<Receiver<(usize, PinnedBuffer)>, MirrorError> {
        let mut pool = None;
        for (i, d) in self.all_mut().iter_mut().enumerate() {
            let p = d.begin_streamed(extent_hint, i == 0).map_err(|e| d.name_error(e))?;
            pool = pool.or(p);
        }
        Ok(pool.expect("the first device holds the pool"))
    }

    /// Uploads a packed buffer to every device (the same pinned bytes, each device's own copy
    /// and scatter), without waiting; takes back the buffers every device has scattered, and
    /// waits for the oldest while all but one are in flight (so that a copier waiting for an
    /// idle buffer always has one coming).
    pub(crate) fn submit_streamed(&mut self, packed: Packed) -> Result<(), MirrorError> {
        let mut queued = Ok(());
        for d in self.all_mut() {
            queued = d.enqueue_packed(&packed).map_err(|e| d.name_error(e));
            if queued.is_err() {
                break;
            }
        }
        if let Err(e) = queued {
            // Back to the pool, so that no copier waits for it forever. A copy from it may
            // still be queued, but this sync fails and the next copies everything again, so
            // what the devices get from it no longer matters.
            self.give_back(packed);
            return Err(e);
        }
        self.primary_mut().pool().in_flight.push_back((packed.id, packed.buffer));
        loop {
            let (front, count) = {
                let pool = self.primary_mut().pool();
                match pool.in_flight.front() {
                    Some(&(id, _)) => (id, pool.in_flight.len()),
                    None => return Ok(()),
                }
            };
            if count < STREAM_BUFFERS - 1 {
                let mut done = true;
                for d in self.all() {
                    done &= d.scattered(front)?;
                }
                if !done {
                    return Ok(());
                }
            }
            for d in self.all() {
                d.wait_scattered(front)?;
            }
            let pool = self.primary_mut().pool();
            let idle = pool.in_flight.pop_front().expect("front exists");
            pool.back.send(idle).expect("room for every buffer");
        }
    }

    /// Puts a packed buffer back in the pool unsent (after a failed sync's error, the copiers
    /// still pack what they copied; their buffers must come back or they would wait forever).
    pub(crate) fn give_back(&mut self, packed: Packed) {
        self.primary_mut().pool().back.send((packed.id, packed.buffer)).expect("room for every buffer");
    }

    /// Ends a streamed sync on every device (each waited for, whatever failed).
    pub(crate) fn end_streamed(&mut self, extent: u64) -> Result<(), MirrorError> {
        let mut result = Ok(());
        for d in self.all_mut() {
            let r = d.end_streamed(extent).map_err(|e| d.name_error(e));
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}
