//! The checkpointer: incremental, chunked checkpoints that bound recovery time and log size.
//!
//! A checkpoint copies every chunk of the allocated heap that changed since the previous
//! one, each inside [`Engine::copy_consistent`] (so it carries a chunk LSN and needs no pause
//! of other transactions), writes the images through the I/O backend, waits until the
//! largest chunk LSN is durable, and then switches the manifest atomically (temp file,
//! fsync, rename, fsync of the directory). Clean chunks keep their earlier image, unless
//! that image is so old that the log it needs would exceed half of `max_log_bytes`.
//! Afterwards the previous checkpoint is kept (recovery falls back to it if an image of the
//! new one is lost), everything older is deleted, and log segments whose records are all
//! older than both checkpoints' oldest chunk LSN are removed.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tusk_storage::checkpoint_format::{
    checkpoint_dir, chunk_path, list_manifests, manifest_path, parse_chunk_name, ChunkEntry, ChunkHeader, Manifest,
    CHUNK_HEADER_SIZE,
};
use tusk_storage::io::{open_backend, open_direct, AlignedBuf, FaultPlan, Io, IoBackend, WriteSync};
use tusk_storage::layout::BRK_OFF;
use tusk_storage::log_files::sync_dir;
use tusk_storage::{StorageError, PAGE_SIZE};

use crate::engine::Engine;
use crate::TxnError;

/// Chunk images written together (in flight at once).
const BATCH: usize = 8;

/// Chunk buffers kept between checkpoints: two batches, one being copied while the other
/// is written.
const POOL_BUFFERS: usize = 2 * BATCH + 1;

#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    /// Bytes per chunk (a multiple of 4096).
    pub chunk_size: u64,
    /// Log bytes a checkpoint may leave pinned before clean chunks are rewritten anyway.
    pub max_log_bytes: u64,
    pub io: Io,
    /// Fails checkpoint I/O on purpose (tests of crashes during checkpoints).
    pub faults: Option<Arc<FaultPlan>>,
}

/// What one checkpoint did.
#[derive(Clone, Debug, Default)]
pub struct CheckpointReport {
    /// The checkpoint's number (its manifest is `MANIFEST-<epoch>`).
    pub epoch: u64,
    /// Chunks the checkpoint covers.
    pub chunks: u64,
    /// Chunks copied and written by this checkpoint.
    pub written: u64,
    /// Clean chunks whose earlier image was kept.
    pub reused: u64,
    /// Clean chunks rewritten because their image pinned too much log.
    pub rewritten_for_log: u64,
    /// Bytes of chunk images written (headers included).
    pub bytes_written: u64,
    /// Oldest chunk LSN: recovery replays the log after it.
    pub min_lsn: u64,
    /// Newest chunk LSN: the checkpoint became valid once it was durable.
    pub max_lsn: u64,
    /// Chunk images no kept checkpoint refers to any more, deleted.
    pub deleted_images: u64,
    /// Log segments deleted, and their bytes.
    pub trimmed_segments: u64,
    pub trimmed_bytes: u64,
    /// Log bytes on disk after trimming.
    pub log_bytes: u64,
    /// Wall time of the whole checkpoint.
    pub elapsed: Duration,
}

pub struct Checkpointer {
    config: CheckpointConfig,
    backend: Box<dyn IoBackend>,
    /// The newest valid checkpoint and the one before it.
    last: Option<Manifest>,
    previous: Option<Manifest>,
    /// Pages whose dirty epoch is ≤ this are unchanged since `last`'s images.
    clean_through: Option<u64>,
    /// Chunk buffers reused across chunks and checkpoints (no zeroing, no page faults).
    pool: Vec<AlignedBuf>,
}

fn io_err(path: &std::path::Path, e: std::io::Error) -> TxnError {
    TxnError::Storage(StorageError::io(path, e))
}

impl Checkpointer {
    /// `last`/`previous`: the checkpoints recovery loaded (newest first). After recovery,
    /// pages recovery wrote carry dirty epoch 1 and all others epoch 0, so `last`'s images
    /// are current for epoch-0 pages.
    pub fn new(config: CheckpointConfig, last: Option<Manifest>, previous: Option<Manifest>) -> Result<Checkpointer, TxnError> {
        let backend = match &config.faults {
            Some(plan) => open_backend(&Io::Faulty(plan.clone())),
            None => open_backend(&config.io),
        }
        .map_err(|e| io_err(&config.dir, e))?;
        let dir = checkpoint_dir(&config.dir);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let clean_through = last.as_ref().map(|_| 0);
        Ok(Checkpointer { config, backend, last, previous, clean_through, pool: Vec::new() })
    }

    pub fn last(&self) -> Option<&Manifest> {
        self.last.as_ref()
    }

    fn step(&self, path: &std::path::Path) -> Result<(), TxnError> {
        fault_step(&self.config, path)
    }

    /// Takes one checkpoint. Its outcome also tells committers stalled on the log space
    /// bound whether to keep waiting.
    pub fn run(&mut self, engine: &Engine) -> Result<CheckpointReport, TxnError> {
        let result = self.take(engine);
        if let Some(log) = engine.log() {
            log.catalog().set_trim_failure(result.as_ref().err().map(|e| e.to_string()));
        }
        result
    }

    fn take(&mut self, engine: &Engine) -> Result<CheckpointReport, TxnError> {
        let started = Instant::now();
        let Some(log) = engine.log() else {
            return Err(TxnError::LogFailed("checkpoints need durability on".into()));
        };
        let chunk = self.config.chunk_size;
        let epoch = self.last.as_ref().map_or(0, |m| m.epoch).max(self.newest_manifest_on_disk()) + 1;
        let ended = engine.advance_dirty_epoch();
        let mut report = CheckpointReport { epoch, ..CheckpointReport::default() };
        let catalog = log.catalog();
        let heap = engine.heap();

        // Chunk 0 first: its copy fixes how much of the heap this checkpoint covers.
        // A heap smaller than one chunk: the image's tail past the heap's end stays zero.
        let mut first = self.pool.pop().unwrap_or_else(|| chunk_buffer(chunk));
        let lsn0 = copy_chunk(engine, 0, chunk, &mut first)?;
        let brk_at = CHUNK_HEADER_SIZE + BRK_OFF as usize;
        // Exactly the allocated bytes (not rounded up to a chunk), so that a reopen with any
        // heap that holds them is accepted.
        let covered = u64::from_le_bytes(first.as_slice()[brk_at..brk_at + 8].try_into().unwrap());
        let count = covered.div_ceil(chunk).max(1);

        // Which earlier images stay: decided up front, so the copy loop below needs only the
        // engine while the image writer owns the I/O backend.
        let mut entries: Vec<ChunkEntry> = Vec::with_capacity(count as usize);
        entries.push(ChunkEntry { image_epoch: epoch, lsn: lsn0, crc: 0 });
        for index in 1..count {
            let reuse = self.reusable(index, heap).filter(|old| {
                let pinned = catalog.bytes_needed_after(old.lsn);
                if pinned > self.config.max_log_bytes / 2 {
                    report.rewritten_for_log += 1;
                    false
                } else {
                    true
                }
            });
            match reuse {
                Some(old) => {
                    entries.push(old);
                    report.reused += 1;
                }
                // Filled in when the chunk is copied.
                None => entries.push(ChunkEntry { image_epoch: epoch, lsn: 0, crc: 0 }),
            }
        }

        // Copying overlaps writing: this thread copies the next batch of chunks while the
        // image writer thread has the previous one in flight.
        let mut pool = std::mem::take(&mut self.pool);
        let config = &self.config;
        let backend = &mut self.backend;
        let written = std::thread::scope(|scope| -> Result<(u64, u64), TxnError> {
            let (to_writer, batches) = crossbeam_channel::bounded::<Vec<(u64, AlignedBuf)>>(1);
            let (to_copier, returned) = crossbeam_channel::unbounded::<Vec<(u64, AlignedBuf)>>();
            let writer = scope.spawn(move || -> Result<(u64, u64), TxnError> {
                let (mut images, mut bytes) = (0, 0);
                for batch in batches {
                    write_images(backend.as_mut(), config, epoch, &batch)?;
                    images += batch.len() as u64;
                    bytes += batch.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
                    // The copier may be gone after an error of its own; the buffers then just drop.
                    let _ = to_copier.send(batch);
                }
                Ok((images, bytes))
            });
            let mut batch: Vec<(u64, AlignedBuf)> = Vec::with_capacity(BATCH);
            seal_image(&mut first, 0, epoch, lsn0, &mut entries[0]);
            batch.push((0, first));
            let copied = (|| -> Result<(), TxnError> {
                for index in 1..count {
                    if entries[index as usize].image_epoch != epoch {
                        continue;
                    }
                    for (_, buf) in returned.try_iter().flatten() {
                        pool.push(buf);
                    }
                    let mut buf = pool.pop().unwrap_or_else(|| chunk_buffer(chunk));
                    let lsn = copy_chunk(engine, index, chunk, &mut buf)?;
                    seal_image(&mut buf, index, epoch, lsn, &mut entries[index as usize]);
                    batch.push((index, buf));
                    if batch.len() == BATCH && to_writer.send(std::mem::take(&mut batch)).is_err() {
                        // The writer stopped on an error, which join reports below.
                        break;
                    }
                }
                if !batch.is_empty() {
                    let _ = to_writer.send(std::mem::take(&mut batch));
                }
                Ok(())
            })();
            drop(to_writer);
            let written = writer.join().expect("the image writer does not panic");
            for (_, buf) in returned.try_iter().flatten() {
                pool.push(buf);
            }
            copied?;
            written
        });
        pool.truncate(POOL_BUFFERS);
        self.pool = pool;
        let (images, bytes) = written?;
        report.written = images;
        report.bytes_written = bytes;
        report.chunks = count;

        let manifest = Manifest { epoch, chunk_size: chunk, covered, chunks: entries };
        report.min_lsn = manifest.min_lsn();
        report.max_lsn = manifest.max_lsn();
        // Valid only once every chunk LSN is durable.
        log.wait_durable(report.max_lsn)?;
        self.write_manifest(&manifest)?;

        self.previous = self.last.replace(manifest);
        self.clean_through = Some(ended);
        self.collect_garbage(&mut report, catalog)?;
        report.log_bytes = catalog.total_bytes();
        report.elapsed = started.elapsed();
        Ok(report)
    }

    fn newest_manifest_on_disk(&self) -> u64 {
        list_manifests(&self.config.dir).ok().and_then(|m| m.first().map(|(e, _)| *e)).unwrap_or(0)
    }

    /// The earlier image of chunk `index`, if the chunk has not changed since.
    fn reusable(&self, index: u64, heap: &tusk_storage::Heap) -> Option<ChunkEntry> {
        let last = self.last.as_ref()?;
        let clean_through = self.clean_through?;
        if last.chunk_size != self.config.chunk_size {
            return None;
        }
        let entry = *last.chunks.get(index as usize)?;
        let first_page = index * self.config.chunk_size / PAGE_SIZE;
        let pages = self.config.chunk_size / PAGE_SIZE;
        let clean = (first_page..(first_page + pages).min(heap.pages())).all(|p| heap.page_epoch(p) <= clean_through);
        clean.then_some(entry)
    }

    fn write_manifest(&self, manifest: &Manifest) -> Result<(), TxnError> {
        use std::io::Write;
        let path = manifest_path(&self.config.dir, manifest.epoch);
        let tmp = path.with_extension("tmp");
        self.step(&tmp)?;
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        f.write_all(&manifest.encode()).map_err(|e| io_err(&tmp, e))?;
        self.step(&tmp)?;
        f.sync_all().map_err(|e| io_err(&tmp, e))?;
        self.step(&path)?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))?;
        self.step(&self.config.dir)?;
        sync_dir(&self.config.dir)?;
        Ok(())
    }

    /// Deletes manifests older than the two kept, chunk images neither references, and the
    /// log both no longer need.
    fn collect_garbage(&self, report: &mut CheckpointReport, catalog: &crate::log::catalog::SegmentCatalog) -> Result<(), TxnError> {
        let kept: Vec<&Manifest> = self.last.iter().chain(self.previous.iter()).collect();
        let oldest_kept = kept.iter().map(|m| m.epoch).min().unwrap_or(0);
        for (epoch, path) in list_manifests(&self.config.dir).map_err(|e| io_err(&self.config.dir, e))? {
            if epoch < oldest_kept {
                std::fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
            }
        }
        let referenced: HashSet<(u64, u64)> =
            kept.iter().flat_map(|m| m.chunks.iter().enumerate().map(|(i, c)| (i as u64, c.image_epoch))).collect();
        let dir = checkpoint_dir(&self.config.dir);
        for entry in std::fs::read_dir(&dir).map_err(|e| io_err(&dir, e))? {
            let entry = entry.map_err(|e| io_err(&dir, e))?;
            let name = entry.file_name();
            if let Some(key) = parse_chunk_name(&name.to_string_lossy()) {
                if !referenced.contains(&key) {
                    std::fs::remove_file(entry.path()).map_err(|e| io_err(&entry.path(), e))?;
                    report.deleted_images += 1;
                }
            }
        }
        sync_dir(&dir)?;
        let trim_to = kept.iter().map(|m| m.min_lsn()).min().unwrap_or(0);
        let (files, bytes) = catalog.trim(trim_to)?;
        report.trimmed_segments = files as u64;
        report.trimmed_bytes = bytes;
        Ok(())
    }
}

/// An I/O step outside the backend (file creation, rename, directory sync) that the fault
/// plan may fail.
fn fault_step(config: &CheckpointConfig, path: &std::path::Path) -> Result<(), TxnError> {
    match &config.faults {
        Some(plan) => plan.check().map_err(|e| io_err(path, e)),
        None => Ok(()),
    }
}

/// A buffer for one chunk image: header plus a whole chunk.
fn chunk_buffer(chunk: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::new();
    buf.extend_zeros(CHUNK_HEADER_SIZE + chunk as usize);
    buf
}

/// Copies chunk `index` into `buf` (after the header room) and returns its chunk LSN. The
/// part of a last chunk beyond the heap's capacity is zero.
fn copy_chunk(engine: &Engine, index: u64, chunk: u64, buf: &mut AlignedBuf) -> Result<u64, TxnError> {
    debug_assert_eq!(buf.len(), CHUNK_HEADER_SIZE + chunk as usize);
    let len = chunk.min(engine.heap().capacity() - index * chunk) as usize;
    let body = &mut buf.as_mut_slice()[CHUNK_HEADER_SIZE..];
    body[len..].fill(0);
    engine.copy_consistent(index * chunk, &mut body[..len])
}

/// Writes the header (with the body's crc) into a copied image and records it in `entry`.
fn seal_image(buf: &mut AlignedBuf, index: u64, epoch: u64, lsn: u64, entry: &mut ChunkEntry) {
    let crc = crc32fast::hash(&buf.as_slice()[CHUNK_HEADER_SIZE..]);
    let len = (buf.len() - CHUNK_HEADER_SIZE) as u64;
    let header = ChunkHeader { index, epoch, lsn, len, crc };
    buf.as_mut_slice()[..CHUNK_HEADER_SIZE].copy_from_slice(&header.encode());
    *entry = ChunkEntry { image_epoch: epoch, lsn, crc };
}

/// Writes a batch of sealed images, one file each, and makes them and their directory
/// entries durable.
fn write_images(backend: &mut dyn IoBackend, config: &CheckpointConfig, epoch: u64, batch: &[(u64, AlignedBuf)]) -> Result<(), TxnError> {
    let mut files = Vec::with_capacity(batch.len());
    for (index, _) in batch {
        let path = chunk_path(&config.dir, *index, epoch);
        fault_step(config, &path)?;
        // A failed earlier attempt at this epoch may have left the file behind.
        let _ = std::fs::remove_file(&path);
        files.push((open_direct(&path, true).map_err(|e| io_err(&path, e))?, path));
    }
    let reqs: Vec<WriteSync> = batch
        .iter()
        .zip(&files)
        .map(|((_, buf), (f, _))| WriteSync { fd: std::os::fd::AsRawFd::as_raw_fd(f), offset: 0, data: buf.as_slice() })
        .collect();
    let results = backend.write_and_sync(&reqs);
    for (r, (_, path)) in results.into_iter().zip(&files) {
        r.map_err(|e| io_err(path, e))?;
    }
    let dir = checkpoint_dir(&config.dir);
    fault_step(config, &dir)?;
    sync_dir(&dir)?;
    Ok(())
}
