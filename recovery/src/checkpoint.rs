//! Loading a checkpoint: the newest manifest whose chunk images are all present and intact,
//! loaded in parallel. A damaged or missing image makes recovery fall back to the previous
//! checkpoint (whose log the checkpointer keeps); the replay then checks that the log really
//! reaches as far as the newer checkpoint did.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tusk_storage::checkpoint_format::{chunk_path, list_manifests, ChunkHeader, Manifest, CHUNK_HEADER_SIZE};
use std::os::fd::AsRawFd;

use tusk_storage::io::sync::pread_full;
use tusk_storage::io::{open_direct_read, AlignedBuf};
use tusk_storage::{Heap, StorageError};

use crate::RecoveryError;

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
    pub path: PathBuf,
    pub reason: String,
    pub required_lsn: u64,
}

impl LoadedCheckpoint {
    /// The chunk LSN of chunk `index` (chunks past the covered range hold nothing older than
    /// chunk 0's copy).
    pub fn chunk_lsn(&self, index: u64) -> u64 {
        let chunks = &self.manifest.chunks;
        chunks.get(index as usize).map_or_else(|| chunks.first().map_or(0, |c| c.lsn), |c| c.lsn)
    }
}

fn corrupt(path: &Path, reason: impl Into<String>) -> RecoveryError {
    RecoveryError::Corrupt { path: path.to_path_buf(), offset: 0, reason: reason.into() }
}

/// Reads and checks one manifest.
pub fn read_manifest(path: &Path) -> Result<Manifest, RecoveryError> {
    let bytes = std::fs::read(path).map_err(|e| StorageError::io(path, e))?;
    Manifest::decode(&bytes).map_err(|reason| corrupt(path, reason))
}

/// Loads the newest usable checkpoint into `heap` (zero on entry); without a heap, only
/// checks its images (what `inspect` does). `None` when there is none.
pub fn load_checkpoint(dir: &Path, heap: Option<&Heap>) -> Result<Option<LoadedCheckpoint>, RecoveryError> {
    let manifests = list_manifests(dir).map_err(|e| StorageError::io(dir, e))?;
    let mut fallback: Option<Fallback> = None;
    for (i, (_, path)) in manifests.iter().enumerate() {
        let manifest = match read_manifest(path) {
            Ok(m) => m,
            Err(RecoveryError::Corrupt { reason, .. }) if reason.contains("newer") => return Err(corrupt(path, reason)),
            Err(e) => {
                // A manifest is renamed into place only when complete: damage is media damage.
                fallback.get_or_insert(Fallback { path: path.clone(), reason: e.to_string(), required_lsn: 0 });
                continue;
            }
        };
        if let Some(heap) = heap.filter(|h| manifest.covered > h.capacity()) {
            return Err(RecoveryError::CapacityTooSmall { path: path.clone(), offset: 0, needed: manifest.covered, capacity: heap.capacity() });
        }
        match load_images(dir, &manifest, heap) {
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
                let first = fallback.get_or_insert(Fallback { path: image, reason, required_lsn });
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

/// Loads every image of `manifest` in parallel. On failure: the image's path and why.
fn load_images(dir: &Path, manifest: &Manifest, heap: Option<&Heap>) -> Result<(), (PathBuf, String)> {
    let next = AtomicUsize::new(0);
    // Loads wait on the disk as much as they use the CPU: twice as many loaders as cores
    // keep the device busy.
    let workers = (2 * std::thread::available_parallelism().map_or(1, |n| n.get())).max(4).min(manifest.chunks.len().max(1));
    let failures: Vec<(PathBuf, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = AlignedBuf::new();
                    buf.extend_zeros(CHUNK_HEADER_SIZE + manifest.chunk_size as usize);
                    loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(entry) = manifest.chunks.get(i) else { return None };
                    let path = chunk_path(dir, i as u64, entry.image_epoch);
                    if let Err(reason) = load_image(&path, i as u64, entry, manifest.chunk_size, heap, &mut buf) {
                        next.store(usize::MAX / 2, Ordering::Relaxed);
                        return Some((path, reason));
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

fn load_image(
    path: &Path,
    index: u64,
    entry: &tusk_storage::checkpoint_format::ChunkEntry,
    chunk_size: u64,
    heap: Option<&Heap>,
    buf: &mut AlignedBuf,
) -> Result<(), String> {
    let file = open_direct_read(path).map_err(|e| format!("cannot open: {e}"))?;
    let file_len = file.metadata().map_err(|e| format!("cannot stat: {e}"))?.len();
    if file_len != buf.len() as u64 {
        return Err(format!("image file of {file_len} bytes, expected {}", buf.len()));
    }
    let got = pread_full(file.as_raw_fd(), 0, buf.as_mut_slice()).map_err(|e| format!("cannot read: {e}"))?;
    let bytes = &buf.as_slice()[..got];
    let header = ChunkHeader::decode(bytes)?;
    let data = &bytes[CHUNK_HEADER_SIZE..];
    if header.index != index || header.epoch != entry.image_epoch || header.lsn != entry.lsn {
        return Err(format!(
            "image says chunk {} epoch {} LSN {}, the manifest expects chunk {index} epoch {} LSN {}",
            header.index, header.epoch, header.lsn, entry.image_epoch, entry.lsn
        ));
    }
    if header.len != chunk_size || data.len() as u64 != chunk_size {
        return Err(format!("image holds {} bytes, chunks are {chunk_size}", data.len()));
    }
    let crc = crc32fast::hash(data);
    if crc != header.crc || crc != entry.crc {
        return Err("chunk image checksum mismatch".into());
    }
    let Some(heap) = heap else { return Ok(()) };
    let start = index * chunk_size;
    let end = (start + chunk_size).min(heap.capacity());
    for (i, word) in data[..(end - start) as usize].chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(word.try_into().unwrap());
        if w != 0 {
            heap.store_word(start + 8 * i as u64, w);
        }
    }
    Ok(())
}
