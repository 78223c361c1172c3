//! Loading a checkpoint: the newest manifest whose chunk images are all present and intact,
//! loaded in parallel (large reads of neighbouring images of a segment). A damaged or missing image makes recovery fall back to the previous
//! checkpoint (whose log the checkpointer keeps); the replay then checks that the log really
//! reaches as far as the newer checkpoint did.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::os::fd::AsRawFd;

use tusk_storage::checkpoint_format::{
    block_size, image_segment_path, image_size, list_manifests, ChunkEntry, ChunkHeader, Manifest, ManifestError, CHECKPOINT_VERSION,
    CHUNK_HEADER_SIZE,
};

use tusk_storage::io::sync::pread_full;
use tusk_storage::io::{open_direct_read, AlignedBuf};
use tusk_storage::{Heap, StorageError};

use crate::{FileKind, RecoveryError};

/// How recovery brings a checkpoint's images into the heap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeapLoad {
    /// Each chunk when first used, the rest by background loaders: opening takes as long as
    /// the log's tail, whatever the heap's size. A damaged image found while the store opens
    /// makes it load whole (and fall back as [`HeapLoad::Whole`] does); one found later fails
    /// the accesses of its chunk only.
    #[default]
    OnDemand,
    /// Every image before the store opens; any damage in the newest checkpoint falls back to
    /// the one before it.
    Whole,
}

/// The checkpoint recovery starts from.
#[derive(Clone, Debug)]
pub struct LoadedCheckpoint {
    pub manifest: Manifest,
    pub path: PathBuf,
    /// The checkpoint before it, if still on disk (kept for the checkpointer's garbage rules).
    pub previous: Option<Manifest>,
    /// A newer checkpoint that could not be used: its file, why, and the LSN through which
    /// the log must reach to make up for it.
    pub fallback: Option<Fallback>,
}

#[derive(Clone, Debug)]
pub struct Fallback {
    /// What broke: a manifest, or an image segment of the checkpoint it describes.
    pub kind: FileKind,
    pub path: PathBuf,
    /// What is wrong with it (without the path).
    pub reason: String,
    pub required_lsn: u64,
}

impl Fallback {
    /// What broke and what recovery did instead, naming the file once: `checkpoint manifest
    /// ckpt/MANIFEST-5: checksum mismatch; fell back to checkpoint 4` (`stood_in` is the
    /// epoch of the checkpoint loaded instead, 0 for none: the whole log stands in).
    pub fn describe(&self, stood_in: u64) -> String {
        let instead = match stood_in {
            0 => "no older checkpoint is usable: recovering from the whole log".to_string(),
            epoch => format!("fell back to the previous checkpoint (epoch {epoch})"),
        };
        format!("{} {}: {}; {instead}", self.kind, self.path.display(), self.reason)
    }
}

impl LoadedCheckpoint {
    /// The chunk LSN of chunk `index` (see [`chunk_lsn`]).
    pub fn chunk_lsn(&self, index: u64) -> u64 {
        chunk_lsn(&self.manifest, index)
    }
}

/// The chunk LSN of chunk `index` of `manifest`'s checkpoint (chunks past the covered range
/// hold nothing older than chunk 0's copy).
pub fn chunk_lsn(manifest: &Manifest, index: u64) -> u64 {
    let chunks = &manifest.chunks;
    chunks.get(index as usize).map_or_else(|| chunks.first().map_or(0, |c| c.lsn), |c| c.lsn)
}

/// The newest manifest, if it reads and checks: the checkpoint [`load_checkpoint`] loads,
/// unless its images turn out damaged. Read before the images load, so that the log scan
/// beside them can leave out what it covers and the replay's first pass can start.
pub fn newest_manifest(dir: &Path) -> Option<Manifest> {
    let manifests = list_manifests(dir).ok()?;
    let (_, path) = manifests.first()?;
    read_manifest(path).ok()
}

fn corrupt(path: &Path, reason: impl Into<String>) -> RecoveryError {
    RecoveryError::Corrupt { kind: FileKind::Manifest, path: path.to_path_buf(), offset: None, reason: reason.into() }
}

/// Reads and checks one manifest.
pub fn read_manifest(path: &Path) -> Result<Manifest, RecoveryError> {
    let bytes = std::fs::read(path).map_err(|e| StorageError::io(path, e))?;
    Manifest::decode(&bytes).map_err(|e| match e {
        ManifestError::Older { version } => {
            RecoveryError::OldCheckpointFormat { path: path.to_path_buf(), version, supported: CHECKPOINT_VERSION }
        }
        other => corrupt(path, other.to_string()),
    })
}

/// Loads the newest usable checkpoint into `heap` (zero on entry); without a heap, only
/// checks its images (what `inspect` does). `None` when there is none. With
/// [`HeapLoad::OnDemand`] the images are not read here: the heap reads each when first used
/// (see [`crate::on_demand`]), and only missing or short segment files make it fall back.
pub fn load_checkpoint(dir: &Path, heap: Option<&Heap>, load: HeapLoad) -> Result<Option<LoadedCheckpoint>, RecoveryError> {
    let manifests = list_manifests(dir).map_err(|e| StorageError::io(dir, e))?;
    let mut fallback: Option<Fallback> = None;
    for (i, (_, path)) in manifests.iter().enumerate() {
        let manifest = match read_manifest(path) {
            Ok(m) => m,
            // Falling back past a manifest of another format would silently drop what it
            // holds: refuse, naming it.
            Err(e @ RecoveryError::OldCheckpointFormat { .. }) => return Err(e),
            Err(RecoveryError::Corrupt { reason, .. }) if reason.contains("newer") => return Err(corrupt(path, reason)),
            Err(e) => {
                // A manifest is renamed into place only when complete: damage is media damage.
                // Its checkpoint was valid once, so LSN 1 was durable and the log may have
                // been trimmed past it since: whatever stands in for it (an older checkpoint
                // or the whole log) must reach at least LSN 1 — a log that starts later
                // cannot replace it (found by `crashtest --workload index --seed 5`: a flipped
                // bit in the only manifest recovered an empty heap plus the log's tail).
                let reason = match e {
                    RecoveryError::Corrupt { reason, .. } => reason,
                    other => other.to_string(),
                };
                fallback.get_or_insert(Fallback { kind: FileKind::Manifest, path: path.clone(), reason, required_lsn: 1 });
                continue;
            }
        };
        if let Some(heap) = heap.filter(|h| manifest.covered > h.capacity()) {
            return Err(RecoveryError::CapacityTooSmall { path: path.clone(), offset: 0, needed: manifest.covered, capacity: heap.capacity() });
        }
        let loaded = match (heap, load) {
            (Some(heap), HeapLoad::OnDemand) => crate::on_demand::ImageSource::open(dir, &manifest).map(|source| {
                heap.load_on_demand(manifest.chunk_size, manifest.chunks.len() as u64, Box::new(source));
                // The superblock's chunk, which the replay's end and every open read first,
                // comes in here, while the log's scan runs on its own thread. Its damage is
                // found where recovery checks the chunks read.
                let _ = heap.ready(0, tusk_storage::layout::DATA_START.min(heap.capacity()));
            }),
            _ => load_images(dir, &manifest, heap),
        };
        match loaded {
            Ok(()) => {
                let previous = manifests.get(i + 1).and_then(|(_, p)| read_manifest(p).ok());
                return Ok(Some(LoadedCheckpoint { manifest, path: path.clone(), previous, fallback }));
            }
            Err((image, reason)) => {
                if let Some(heap) = heap {
                    zero(heap, manifest.covered.min(heap.capacity()));
                }
                // The report names what made the newest checkpoint unusable (older ones may
                // fail only because an earlier fallback left them behind); the log must
                // still reach as far as every skipped checkpoint did.
                let required_lsn = manifest.max_lsn().max(fallback.as_ref().map_or(0, |f| f.required_lsn));
                let first = fallback.get_or_insert(Fallback { kind: FileKind::CheckpointImage, path: image, reason, required_lsn });
                first.required_lsn = required_lsn;
            }
        }
    }
    // No usable checkpoint but a damaged one: only the whole log can stand in for it, and
    // the replay checks that it does.
    Ok(fallback.map(|f| LoadedCheckpoint {
        manifest: Manifest { epoch: 0, chunk_size: 1 << 20, covered: 0, chunks: Vec::new() },
        path: PathBuf::new(),
        previous: None,
        fallback: Some(f),
    }))
}

fn zero(heap: &Heap, len: u64) {
    let mut off = 0;
    while off + 8 <= len {
        heap.store_word(off, 0);
        off += 8;
    }
}

/// Bytes one loader reads at once: images that lie next to each other in a segment are read
/// together, so that a full checkpoint streams in large reads.
const READ_BYTES: u64 = 8 << 20;

/// Heap bytes backed per `madvise` by the prefault thread (small enough that a failed load
/// stops it soon).
const PREFAULT_STEP: u64 = 32 << 20;

/// Images read by one pread: chunks `chunks`, from `offset` of segment `segment`.
pub(crate) struct Run {
    pub(crate) segment: usize,
    pub(crate) offset: u64,
    pub(crate) chunks: Vec<u64>,
}

/// The reads that load `manifest`: its images in segment order, neighbours merged.
pub(crate) fn plan_runs(manifest: &Manifest, segments: &[u64]) -> Vec<Run> {
    let image = image_size(manifest.chunk_size);
    let per_run = (READ_BYTES / image).max(1) as usize;
    let mut order: Vec<u64> = (0..manifest.chunks.len() as u64).collect();
    order.sort_unstable_by_key(|&i| {
        let e = &manifest.chunks[i as usize];
        (e.image_epoch, e.offset)
    });
    let mut runs: Vec<Run> = Vec::new();
    for index in order {
        let e = &manifest.chunks[index as usize];
        let segment = segments.binary_search(&e.image_epoch).expect("segments come from the manifest");
        match runs.last_mut() {
            Some(r) if r.segment == segment && r.chunks.len() < per_run && r.offset + image * r.chunks.len() as u64 == e.offset => {
                r.chunks.push(index)
            }
            _ => runs.push(Run { segment, offset: e.offset, chunks: vec![index] }),
        }
    }
    runs
}

/// Loads every image of `manifest` in parallel. On failure: the file and why.
fn load_images(dir: &Path, manifest: &Manifest, heap: Option<&Heap>) -> Result<(), (PathBuf, String)> {
    let segments = manifest.segments();
    let mut files = Vec::with_capacity(segments.len());
    for &epoch in &segments {
        let path = image_segment_path(dir, epoch);
        let file = open_direct_read(&path).map_err(|e| (path.clone(), format!("cannot open: {e}")))?;
        let len = file.metadata().map_err(|e| (path.clone(), format!("cannot stat: {e}")))?.len();
        files.push((path, file, len));
    }
    let runs = plan_runs(manifest, &segments);
    let next = AtomicUsize::new(0);
    // Loads wait on the disk as much as they use the CPU: twice as many loaders as cores
    // keep the device busy.
    let workers = (2 * std::thread::available_parallelism().map_or(1, |n| n.get())).max(4).min(runs.len().max(1));
    let image = image_size(manifest.chunk_size);
    let failed = AtomicBool::new(false);
    let failures: Vec<(PathBuf, String)> = std::thread::scope(|s| {
        // The kernel zeroes each fresh page of the heap on first touch (~0.4 s per GiB, the
        // largest cost of a load in the profile): back the covered range now, on a thread of
        // its own, while the loaders wait on the disk, instead of inside their copies.
        if let Some(heap) = heap {
            let covered = manifest.covered.min(heap.capacity());
            let failed = &failed;
            s.spawn(move || {
                let mut at = 0;
                while at < covered && !failed.load(Ordering::Relaxed) {
                    let len = PREFAULT_STEP.min(covered - at);
                    heap.prefault(at, len);
                    at += len;
                }
            });
        }
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = AlignedBuf::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let run = runs.get(i)?;
                        let (path, file, file_len) = &files[run.segment];
                        if let Err(reason) = load_run(file, *file_len, run, manifest, heap, image, &mut buf) {
                            next.store(usize::MAX / 2, Ordering::Relaxed);
                            failed.store(true, Ordering::Relaxed);
                            return Some((path.clone(), reason));
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().expect("chunk loader panicked")).collect()
    });
    match failures.into_iter().next() {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// Reads one run of images, checks each against the manifest and stores it into the heap.
fn load_run(file: &std::fs::File, file_len: u64, run: &Run, manifest: &Manifest, heap: Option<&Heap>, image: u64, buf: &mut AlignedBuf) -> Result<(), String> {
    let len = image * run.chunks.len() as u64;
    if run.offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(format!("segment of {file_len} bytes ends before the images at {}..{}", run.offset, run.offset.saturating_add(len)));
    }
    if buf.len() < len as usize {
        buf.clear();
        buf.extend_zeros(len as usize);
    }
    let bytes = &mut buf.as_mut_slice()[..len as usize];
    let got = pread_full(file.as_raw_fd(), run.offset, bytes).map_err(|e| format!("cannot read at {}: {e}", run.offset))?;
    if got != bytes.len() {
        return Err(format!("short read at {}: {got} of {} bytes", run.offset, bytes.len()));
    }
    for (k, &index) in run.chunks.iter().enumerate() {
        let at = k * image as usize;
        let offset = run.offset + at as u64;
        check_and_store(&bytes[at..at + image as usize], index, &manifest.chunks[index as usize], manifest.chunk_size, heap)
            .map_err(|reason| format!("image at offset {offset} (chunk {index}): {reason}"))?;
    }
    Ok(())
}

fn check_and_store(bytes: &[u8], index: u64, entry: &ChunkEntry, chunk_size: u64, heap: Option<&Heap>) -> Result<(), String> {
    let data = check_image(bytes, index, entry, chunk_size)?;
    let Some(heap) = heap else { return Ok(()) };
    let start = index * chunk_size;
    let end = (start + chunk_size).min(heap.capacity());
    let data = &data[..(end - start) as usize];
    // The heap is zero on entry: an all-zero image leaves its pages untouched (unbacked).
    // Otherwise one bulk copy (the loaders own disjoint chunks and nothing else runs yet).
    if data.chunks(64).any(|line| line.iter().fold(0u8, |acc, &b| acc | b) != 0) {
        heap.copy_in(start, data);
    }
    Ok(())
}

/// Checks one image (`bytes`: its header block and data) against its manifest entry;
/// returns its data.
pub(crate) fn check_image<'b>(bytes: &'b [u8], index: u64, entry: &ChunkEntry, chunk_size: u64) -> Result<&'b [u8], String> {
    let data = &bytes[CHUNK_HEADER_SIZE..];
    check_header(bytes, index, entry, chunk_size)?.check_data(data)?;
    Ok(data)
}

/// Decodes the header at the start of `bytes` and checks that it is `entry`'s, the image of
/// chunk `index`: what an image's data is then checked against, whole or a block at a time.
pub(crate) fn check_header(bytes: &[u8], index: u64, entry: &ChunkEntry, chunk_size: u64) -> Result<ChunkHeader, String> {
    let header = ChunkHeader::decode(bytes)?;
    if header.index != index || header.epoch != entry.image_epoch || header.lsn != entry.lsn {
        return Err(format!(
            "image says chunk {} epoch {} LSN {}, the manifest expects chunk {index} epoch {} LSN {}",
            header.index, header.epoch, header.lsn, entry.image_epoch, entry.lsn
        ));
    }
    if header.len != chunk_size {
        return Err(format!("image holds {} bytes, chunks are {chunk_size}", header.len));
    }
    if header.crc != entry.crc {
        return Err("chunk image checksum mismatch (header and manifest differ)".into());
    }
    if let Some(t) = header.blocks.as_ref().filter(|t| t.block_size != block_size(chunk_size)) {
        return Err(format!("blocks of {} bytes, this build reads blocks of {}", t.block_size, block_size(chunk_size)));
    }
    Ok(header)
}
