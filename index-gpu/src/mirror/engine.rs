//! The mirror: a host image of the heap kept at one LSN by the consistent incremental page
//! copy (the same mechanism as incremental snapshots), and, with the CUDA backend, a device
//! copy that each sync updates with exactly the pages that copy brought over.
//!
//! Why a host image with the device copy: the device needs a consistent source to upload
//! from (the live heap changes under the copy, and the copy's second pass fixes pages up
//! only in its own target), the CPU engine answers at exactly the mirror's LSN from it (keys
//! too long for the kernels; the equality checks of GPU answers), and it is the whole
//! backend when there is no GPU. Its cost is one more copy of the heap's used extent in host
//! memory.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use tusk_storage::{Heap, PAGE_SIZE};
use tusk_txn::snapshot::copy::{CopyState, PageSink};
use tusk_txn::snapshot::image::ImageTarget;
use tusk_txn::{Engine, TxnError};

use super::buffers::{ArtLookupBuffers, BatchKind, BatchMemory, LookupBuffers, RangeBuffers};
use super::cpu;
use super::cuda::raw::{HostMemory, PinnedBuffer};
use super::cuda::streamed::{self, Packed};
use super::cuda::CudaMirror;
use super::devices::{Devices, StageTiming};
use super::index_pages::IndexPages;
use super::{Backend, GpuOptions, MirrorContents, MirrorError};

/// Longest ART key or prefix the kernels take; longer ones are answered on the CPU.
pub const DEVICE_MAX_KEY: usize = 32;

/// What one sync did.
#[derive(Clone, Debug, Default)]
pub struct SyncReport {
    /// The mirror now answers for every LSN ≤ this and nothing after.
    pub lsn: u64,
    /// Pages copied into the host image (pages written during the copy count twice).
    pub pages: u64,
    /// Bytes uploaded to the device (0 on the CPU backend).
    pub uploaded: u64,
    /// Time of the host copy, and of the upload after it. A streamed sync uploads while the
    /// host copies (its `host` includes those uploads' launches), so its `upload` is only the
    /// wait for the last portions.
    pub host: Duration,
    pub upload: Duration,
    /// How long commits were held at the gate.
    pub pause: Duration,
    /// Of `host`: estimating the dirty pages and the closed pass's scan of the epochs, and
    /// copying them (the open pass's scan too, which the copiers make as they copy; with a
    /// streamed sync, the uploads' launches as well).
    pub scan: Duration,
    pub copy: Duration,
}

/// A page sink that fills the host image and uploads each portion of it as soon as it is
/// there (`cuda/streamed.rs`). An upload error does not stop the copy (the image must still
/// reach its LSN); it is kept and reported after, and later portions go back to the pool.
struct Streaming<'a> {
    image: &'a mut ImageTarget,
    devices: &'a mut Devices,
    /// The index-only layout (pages no GPU holds stay on the host).
    held: Option<&'a IndexPages>,
    pool: Receiver<(usize, PinnedBuffer)>,
    uploaded: u64,
    failed: Option<MirrorError>,
}

impl Streaming<'_> {
    /// About four portions per copier for `bytes` in all, so that the bus starts early, but
    /// none so small that a buffer's fixed costs dominate.
    fn portion(&self, bytes: u64) -> u64 {
        // (The copy rounds it to whole pages.)
        (bytes / (4 * self.image.threads() as u64)).clamp(streamed::MIN_STREAM_PORTION as u64, streamed::STREAM_PORTION as u64)
    }

    /// Submits a packed buffer (or gives it back, empty or after an error).
    fn submit(devices: &mut Devices, uploaded: &mut u64, failed: &mut Option<MirrorError>, packed: Packed) {
        if failed.is_some() || packed.is_empty() {
            devices.give_back(packed);
            return;
        }
        *uploaded += packed.bytes();
        if let Err(e) = devices.submit_streamed(packed) {
            *failed = Some(e);
        }
    }
}

impl PageSink for Streaming<'_> {
    fn copy_runs(&mut self, heap: &Heap, runs: &[Range<u64>]) -> Result<(), TxnError> {
        let packer = streamed::Packer { pool: &self.pool, held: self.held };
        let portion = self.portion(runs.iter().map(|r| r.end - r.start).sum());
        let (devices, uploaded, failed) = (&mut *self.devices, &mut self.uploaded, &mut self.failed);
        self.image
            .copy_runs_streamed::<_, std::convert::Infallible>(heap, runs, portion, &packer, &mut |packed| {
                Self::submit(devices, uploaded, failed, packed);
                Ok(())
            })
            .unwrap_or_else(|never| match never {});
        Ok(())
    }

    /// The copiers find the dirty pages as they copy them (`copy_dirty_streamed`).
    fn copy_dirty(&mut self, heap: &Heap, pages: Range<u64>, since: u64, growth: Range<u64>, hint: u64) -> Result<u64, TxnError> {
        let packer = streamed::Packer { pool: &self.pool, held: self.held };
        let portion = self.portion(hint * PAGE_SIZE);
        let (devices, uploaded, failed) = (&mut *self.devices, &mut self.uploaded, &mut self.failed);
        let copied = self
            .image
            .copy_dirty_streamed::<_, std::convert::Infallible>(heap, pages, since, growth, hint, portion, &packer, &mut |packed| {
                Self::submit(devices, uploaded, failed, packed);
                Ok(())
            })
            .unwrap_or_else(|never| match never {});
        Ok(copied)
    }
}

pub struct Mirror {
    engine: Arc<Engine>,
    image: ImageTarget,
    state: Option<CopyState>,
    lsn: u64,
    /// The GPUs (none: the CPU backend).
    devices: Option<Devices>,
    backend: String,
    threads: usize,
    /// Why the last sync failed, if it did: the image and the device may then hold a mix of
    /// states, so queries are refused until a sync succeeds.
    failed_sync: Option<String>,
    /// The index-only layout (`index_pages.rs`), on the CUDA backend when asked for.
    index_pages: Option<IndexPages>,
    limit: Option<u64>,
}

impl Mirror {
    /// Opens the backend `options` ask for (`Auto`: CUDA when usable, else the CPU, saying
    /// why in [`Mirror::backend`]) and syncs once.
    pub fn open(engine: Arc<Engine>, options: &GpuOptions) -> Result<Mirror, MirrorError> {
        let threads = match options.cpu_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            t => t,
        };
        let (devices, backend) = match options.backend {
            Backend::Cpu => (None, format!("cpu ({threads} threads, chosen)")),
            Backend::Cuda => {
                let d = Devices::open(options)?;
                let name = format!("cuda ({})", d.name());
                (Some(d), name)
            }
            Backend::Auto => match Devices::open(options) {
                Ok(d) => {
                    let name = format!("cuda ({})", d.name());
                    (Some(d), name)
                }
                Err(why) => (None, format!("cpu ({threads} threads; no GPU: {why})")),
            },
        };
        let image = ImageTarget::new(engine.heap().capacity(), threads)?;
        let indexes_only = devices.is_some() && options.contents == MirrorContents::Indexes;
        let index_pages = devices.as_ref().filter(|_| indexes_only).map(|d| IndexPages::new(d.len(), options.device_memory_limit));
        let backend = if indexes_only { format!("{backend}, indexes only") } else { backend };
        let limit = options.device_memory_limit;
        let mut mirror = Mirror { engine, image, state: None, lsn: 0, devices, backend, threads, failed_sync: None, index_pages, limit };
        mirror.sync()?;
        Ok(mirror)
    }

    /// "cuda (device)" or "cpu (threads; why no GPU)".
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Whether queries run on the GPU.
    pub fn on_gpu(&self) -> bool {
        self.devices.is_some()
    }

    /// Every answer is exact for this LSN.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// The host image (heap offset i at index i), at [`Mirror::lsn`].
    pub fn image(&self) -> &[u8] {
        self.image.bytes()
    }

    /// Brings the mirror to the committed state at one LSN, copying only the pages dirtied
    /// since the last sync to the host image and, on the CUDA backend, to the device: each
    /// portion is uploaded as soon as it is copied, while the host copies the next
    /// (`cuda/streamed.rs`).
    pub fn sync(&mut self) -> Result<SyncReport, MirrorError> {
        let result = self.sync_once();
        self.failed_sync = result.as_ref().err().map(|e| e.to_string());
        if result.is_err() {
            // The next sync copies everything again (and places every index page anew).
            self.state = None;
            if let (Some(pages), Some(devices)) = (self.index_pages.as_mut(), self.devices.as_ref()) {
                *pages = IndexPages::new(devices.len(), self.limit);
            }
        }
        result
    }

    fn sync_once(&mut self) -> Result<SyncReport, MirrorError> {
        let started = Instant::now();
        if let Some(devices) = self.devices.as_mut() {
            let pool = devices.begin_streamed(self.engine.used_extent())?;
            return self.sync_streamed(started, pool);
        }
        // The CPU backend: the image is all there is.
        let (state, copy) = self.engine.copy_pages_consistent(self.state, &mut self.image)?;
        self.state = Some(state);
        self.lsn = copy.lsn;
        Ok(SyncReport { lsn: copy.lsn, pages: copy.pages_open + copy.pages_closed, host: started.elapsed(), pause: copy.pause, scan: copy.scan, copy: copy.copy, ..SyncReport::default() })
    }

    /// [`Mirror::sync`] with each copied portion of the image uploaded at once.
    fn sync_streamed(&mut self, started: Instant, pool: Receiver<(usize, PinnedBuffer)>) -> Result<SyncReport, MirrorError> {
        let devices = self.devices.as_mut().expect("streams only to a device");
        let held = self.index_pages.as_ref();
        let mut sink = Streaming { image: &mut self.image, devices, held, pool, uploaded: 0, failed: None };
        let copied = self.engine.copy_pages_consistent(self.state, &mut sink);
        let (uploaded, failed) = (sink.uploaded, sink.failed.take());
        let host = started.elapsed();
        let drained = Instant::now();
        let result = match (copied, failed) {
            (Err(e), _) => Err(e.into()),
            (Ok(_), Some(e)) => Err(e),
            (Ok((state, copy)), None) => self.devices.as_mut().expect("streamed to the devices").end_streamed(copy.extent).map(|()| (state, copy)),
        };
        // Index-only: the image is at the new LSN; bring the layout to its trees.
        let mut uploaded = uploaded;
        let result = result.and_then(|(state, copy)| {
            if let Some(pages) = self.index_pages.as_mut() {
                let refresh = pages.refresh(self.image.bytes(), copy.extent)?;
                uploaded += refresh.devices.iter().flat_map(|d| &d.new).map(|r| r.end - r.start).sum::<u64>();
                self.devices.as_mut().expect("index pages live on devices").apply_layout(self.image.bytes(), &refresh, pages)?;
            }
            Ok((state, copy))
        });
        let (state, copy) = match result {
            Ok(done) => done,
            Err(e) => {
                // Let the uploads end (the device keeps its extent; its contents are unknown
                // until the next sync, which `sync` makes copy everything).
                let devices = self.devices.as_mut().expect("streamed to the devices");
                let extent = devices.primary().extent();
                let _ = devices.end_streamed(extent);
                return Err(e);
            }
        };
        self.state = Some(state);
        self.lsn = copy.lsn;
        Ok(SyncReport { lsn: copy.lsn, pages: copy.pages_open + copy.pages_closed, uploaded, host, upload: drained.elapsed(), pause: copy.pause, scan: copy.scan, copy: copy.copy })
    }

    /// Refuses queries after a failed sync, and (index-only) about trees the devices do not
    /// hold.
    fn check_synced(&self, meta: u64) -> Result<(), MirrorError> {
        if let Some(why) = &self.failed_sync {
            return Err(MirrorError::SyncFailed(why.clone()));
        }
        match &self.index_pages {
            Some(pages) if pages.holders(meta).is_empty() => Err(MirrorError::NotMirrored(meta)),
            _ => Ok(()),
        }
    }

    /// The GPUs a batch about the tree at `meta` runs on: those holding it (index-only), or
    /// all.
    fn on<'a>(&'a self, devices: &'a Devices, meta: u64) -> &'a [usize] {
        match &self.index_pages {
            Some(pages) => pages.holders(meta),
            None => devices.every(),
        }
    }

    /// Bytes of device memory the mirror's heap (or index pages and page table) takes on the
    /// first GPU (0 on the CPU backend; a sharded index-only mirror's GPUs differ: see
    /// [`IndexPages::device_bytes`]).
    pub fn device_bytes(&self) -> u64 {
        match (&self.devices, &self.index_pages) {
            (None, _) => 0,
            (Some(_), Some(pages)) => pages.device_bytes(0),
            (Some(d), None) => d.primary().extent(),
        }
    }

    /// The index-only layout, if this mirror uses it.
    pub fn index_pages(&self) -> Option<&IndexPages> {
        self.index_pages.as_ref()
    }

    pub fn btree_get(&self, meta: u64, keys: &[u64]) -> Result<Vec<Option<u64>>, MirrorError> {
        self.check_synced(meta)?;
        match &self.devices {
            Some(d) => d.split(self.on(d, meta), keys.len(), |d, r, out| d.btree_get_to(meta, &keys[r], out)),
            None => Ok(cpu::btree_get(self.image(), self.threads, meta, keys)?),
        }
    }

    pub fn btree_count_sum(&self, meta: u64, ranges: &[(u64, u64)]) -> Result<Vec<(u64, u128)>, MirrorError> {
        self.check_synced(meta)?;
        match &self.devices {
            Some(d) => d.split(self.on(d, meta), ranges.len(), |d, r, out| d.btree_count_sum_to(meta, &ranges[r], out)),
            None => Ok(cpu::btree_count_sum(self.image(), self.threads, meta, ranges)?),
        }
    }

    pub fn art_get(&self, meta: u64, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, MirrorError> {
        self.check_synced(meta)?;
        self.split_by_length(keys, |d, short| d.split(self.on(d, meta), short.len(), |d, r, out| d.art_get_to(meta, &short[r], out)), |long| cpu::art_get(self.image(), self.threads, meta, long))
    }

    pub fn art_count_sum_prefix(&self, meta: u64, prefixes: &[&[u8]]) -> Result<Vec<(u64, u128)>, MirrorError> {
        self.check_synced(meta)?;
        self.split_by_length(
            prefixes,
            |d, short| d.split(self.on(d, meta), short.len(), |d, r, out| d.art_count_sum_prefix_to(meta, &short[r], out)),
            |long| cpu::art_count_sum_prefix(self.image(), self.threads, meta, long),
        )
    }

    /// Buffers for batches of up to `capacity` B-link lookups, reused by every
    /// [`Mirror::btree_get_into`]: on the CUDA backend pinned host memory with device twins
    /// (allocated here, once), so that a batch copies straight between them.
    pub fn lookup_buffers(&self, capacity: usize) -> Result<LookupBuffers, MirrorError> {
        Ok(LookupBuffers { mem: self.batch_memory(BatchKind::BtreeGet, capacity)? })
    }

    /// Buffers for batches of up to `capacity` B-link range counts and sums.
    pub fn range_buffers(&self, capacity: usize) -> Result<RangeBuffers, MirrorError> {
        Ok(RangeBuffers { mem: self.batch_memory(BatchKind::BtreeCountSum, capacity)? })
    }

    /// Buffers for batches of up to `capacity` ART lookups of keys of `key_len` bytes (1 to
    /// [`DEVICE_MAX_KEY`]: longer keys go through [`Mirror::art_get`]).
    pub fn art_lookup_buffers(&self, capacity: usize, key_len: usize) -> Result<ArtLookupBuffers, MirrorError> {
        if !(1..=DEVICE_MAX_KEY).contains(&key_len) {
            return Err(MirrorError::Unsupported(format!("ART lookup buffers take keys of 1 to {DEVICE_MAX_KEY} bytes, not {key_len}")));
        }
        Ok(ArtLookupBuffers { mem: self.batch_memory(BatchKind::ArtGet { key_len }, capacity)? })
    }

    fn batch_memory(&self, kind: BatchKind, capacity: usize) -> Result<BatchMemory, MirrorError> {
        match &self.devices {
            Some(d) => d.batch_memory(kind, capacity),
            None => Ok(BatchMemory::plain(kind, capacity)),
        }
    }

    /// The value under each key set in `buffers`, into its answer memory (values and found
    /// bits), exact at [`Mirror::lsn`].
    pub fn btree_get_into(&self, meta: u64, buffers: &mut LookupBuffers) -> Result<(), MirrorError> {
        self.answer_into(meta, &mut buffers.mem)
    }

    /// Count and sum of each range set in `buffers`, into its answer memory.
    pub fn btree_count_sum_into(&self, meta: u64, buffers: &mut RangeBuffers) -> Result<(), MirrorError> {
        self.answer_into(meta, &mut buffers.mem)
    }

    /// The value under each ART key set in `buffers`, into its answer memory.
    pub fn art_get_into(&self, meta: u64, buffers: &mut ArtLookupBuffers) -> Result<(), MirrorError> {
        self.answer_into(meta, &mut buffers.mem)
    }

    fn answer_into(&self, meta: u64, mem: &mut BatchMemory) -> Result<(), MirrorError> {
        self.check_synced(meta)?;
        if let Some(devices) = self.devices.as_ref().filter(|d| d.own(mem)) {
            return devices.answer_into(meta, mem, self.on(devices, meta));
        }
        // The CPU engine, or buffers made by a mirror of another backend or device: the
        // general path, its answers written into the buffers.
        match mem.kind {
            BatchKind::BtreeGet => {
                let answers = self.btree_get(meta, mem.input_words())?;
                mem.write_lookups(&answers);
            }
            BatchKind::BtreeCountSum => {
                let ranges: Vec<(u64, u64)> = mem.input_words().chunks_exact(2).map(|w| (w[0], w[1])).collect();
                let answers = self.btree_count_sum(meta, &ranges)?;
                mem.write_count_sums(&answers);
            }
            BatchKind::ArtGet { key_len } => {
                let stride = 8 * mem.kind.in_words();
                let keys: Vec<&[u8]> = HostMemory::word_bytes(mem.input_words()).chunks_exact(stride).map(|k| &k[..key_len]).collect();
                let answers = self.art_get(meta, &keys)?;
                mem.write_lookups(&answers);
            }
        }
        Ok(())
    }

    /// The CPU engine's answers at the mirror's LSN (what GPU answers must equal).
    pub fn cpu(&self) -> CpuEngine<'_> {
        CpuEngine { image: self.image(), threads: self.threads }
    }

    /// The first GPU, for the benchmark's device-resident timings.
    pub fn device(&self) -> Option<&CudaMirror> {
        self.devices.as_ref().map(|d| d.primary())
    }

    /// The first GPU holding the tree at `meta` (index-only; else the first GPU), for
    /// device-resident timings.
    pub fn device_for(&self, meta: u64) -> Option<&CudaMirror> {
        let devices = self.devices.as_ref()?;
        let first = self.index_pages.as_ref().and_then(|p| p.holders(meta).first().copied()).unwrap_or(0);
        devices.all().get(first)
    }

    /// The GPUs.
    pub fn devices(&self) -> Option<&Devices> {
        self.devices.as_ref()
    }

    /// B-link lookups into caller buffers timed per stage on every GPU ([`StageTiming`]);
    /// None on the CPU backend.
    pub fn time_btree_get_into(&self, meta: u64, buffers: &mut LookupBuffers, rounds: usize) -> Result<Option<StageTiming>, MirrorError> {
        self.time_into(meta, &mut buffers.mem, rounds)
    }

    /// B-link range count/sum into caller buffers timed per stage.
    pub fn time_btree_count_sum_into(&self, meta: u64, buffers: &mut RangeBuffers, rounds: usize) -> Result<Option<StageTiming>, MirrorError> {
        self.time_into(meta, &mut buffers.mem, rounds)
    }

    /// ART lookups into caller buffers timed per stage.
    pub fn time_art_get_into(&self, meta: u64, buffers: &mut ArtLookupBuffers, rounds: usize) -> Result<Option<StageTiming>, MirrorError> {
        self.time_into(meta, &mut buffers.mem, rounds)
    }

    fn time_into(&self, meta: u64, mem: &mut BatchMemory, rounds: usize) -> Result<Option<StageTiming>, MirrorError> {
        self.check_synced(meta)?;
        match self.devices.as_ref().filter(|d| d.own(mem)) {
            Some(d) => Ok(Some(d.time_into(meta, mem, rounds, self.on(d, meta))?)),
            None => Ok(None),
        }
    }

    /// Sends keys of at most [`DEVICE_MAX_KEY`] bytes to the device and longer ones to the
    /// CPU engine, and puts the answers back in order.
    fn split_by_length<T>(
        &self,
        keys: &[&[u8]],
        on_device: impl FnOnce(&Devices, &[&[u8]]) -> Result<Vec<T>, MirrorError>,
        on_cpu: impl Fn(&[&[u8]]) -> Result<Vec<T>, crate::IndexError>,
    ) -> Result<Vec<T>, MirrorError> {
        let Some(device) = &self.devices else { return Ok(on_cpu(keys)?) };
        if keys.iter().all(|k| k.len() <= DEVICE_MAX_KEY) {
            // A batch the kernels cannot finish (a subtree deeper than their walk's stack)
            // is answered by the CPU engine, at the same LSN.
            return match on_device(device, keys) {
                Err(MirrorError::Unsupported(_)) => Ok(on_cpu(keys)?),
                done => done,
            };
        }
        type Indexed<'k> = Vec<(usize, &'k [u8])>;
        let (short, long): (Indexed<'_>, Indexed<'_>) = keys.iter().copied().enumerate().partition(|(_, k)| k.len() <= DEVICE_MAX_KEY);
        let short_keys: Vec<&[u8]> = short.iter().map(|&(_, k)| k).collect();
        let long_keys: Vec<&[u8]> = long.iter().map(|&(_, k)| k).collect();
        let mut out: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
        let short_answers = match on_device(device, &short_keys) {
            Err(MirrorError::Unsupported(_)) => on_cpu(&short_keys)?,
            done => done?,
        };
        for ((i, _), v) in short.iter().zip(short_answers) {
            out[*i] = Some(v);
        }
        for ((i, _), v) in long.iter().zip(on_cpu(&long_keys)?) {
            out[*i] = Some(v);
        }
        Ok(out.into_iter().map(|v| v.expect("every key answered")).collect())
    }
}

/// The CPU engine over a mirror's host image.
pub struct CpuEngine<'m> {
    image: &'m [u8],
    threads: usize,
}

impl CpuEngine<'_> {
    pub fn btree_get(&self, meta: u64, keys: &[u64]) -> Result<Vec<Option<u64>>, MirrorError> {
        Ok(cpu::btree_get(self.image, self.threads, meta, keys)?)
    }
    pub fn btree_count_sum(&self, meta: u64, ranges: &[(u64, u64)]) -> Result<Vec<(u64, u128)>, MirrorError> {
        Ok(cpu::btree_count_sum(self.image, self.threads, meta, ranges)?)
    }
    pub fn art_get(&self, meta: u64, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, MirrorError> {
        Ok(cpu::art_get(self.image, self.threads, meta, keys)?)
    }
    pub fn art_count_sum_prefix(&self, meta: u64, prefixes: &[&[u8]]) -> Result<Vec<(u64, u128)>, MirrorError> {
        Ok(cpu::art_count_sum_prefix(self.image, self.threads, meta, prefixes)?)
    }
}

