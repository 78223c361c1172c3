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
        Ok(Checkpointer { config, backend, last, previous, clean_through })
    }

    pub fn last(&self) -> Option<&Manifest> {
        self.last.as_ref()
    }

    /// An I/O step outside the backend (file creation, rename, directory sync) that the
    /// fault plan may fail.
    fn step(&self, path: &std::path::Path) -> Result<(), TxnError> {
        match &self.config.faults {
            Some(plan) => plan.check().map_err(|e| io_err(path, e)),
            None => Ok(()),
        }
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

        // Chunk 0 first: its copy fixes how much of the heap this checkpoint covers.
        let mut pending: Vec<(u64, AlignedBuf, u64)> = Vec::new();
        let mut first = AlignedBuf::new();
        first.extend_zeros(CHUNK_HEADER_SIZE + chunk as usize);
        // A heap smaller than one chunk: the image's tail past the heap's end stays zero.
        let len0 = chunk.min(engine.heap().capacity()) as usize;
        let lsn0 = engine.copy_consistent(0, &mut first.as_mut_slice()[CHUNK_HEADER_SIZE..CHUNK_HEADER_SIZE + len0])?;
        let brk_at = CHUNK_HEADER_SIZE + BRK_OFF as usize;
        // Exactly the allocated bytes (not rounded up to a chunk), so that a reopen with any
        // heap that holds them is accepted.
        let covered = u64::from_le_bytes(first.as_slice()[brk_at..brk_at + 8].try_into().unwrap());
        let count = covered.div_ceil(chunk).max(1);
        let mut entries: Vec<ChunkEntry> = Vec::with_capacity(count as usize);
        entries.push(ChunkEntry { image_epoch: epoch, lsn: lsn0, crc: 0 });
        pending.push((0, first, lsn0));

        let catalog = log.catalog();
        let heap = engine.heap();
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
            if let Some(old) = reuse {
                entries.push(old);
                report.reused += 1;
                continue;
            }
            let mut buf = AlignedBuf::new();
            buf.extend_zeros(CHUNK_HEADER_SIZE + chunk as usize);
            let len = chunk.min(heap.capacity() - index * chunk) as usize;
            let lsn = engine.copy_consistent(index * chunk, &mut buf.as_mut_slice()[CHUNK_HEADER_SIZE..CHUNK_HEADER_SIZE + len])?;
            entries.push(ChunkEntry { image_epoch: epoch, lsn, crc: 0 });
            pending.push((index, buf, lsn));
            if pending.len() == BATCH {
                self.write_images(epoch, &mut pending, &mut entries, &mut report)?;
            }
        }
        self.write_images(epoch, &mut pending, &mut entries, &mut report)?;
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

    fn write_images(
        &mut self,
        epoch: u64,
        pending: &mut Vec<(u64, AlignedBuf, u64)>,
        entries: &mut [ChunkEntry],
        report: &mut CheckpointReport,
    ) -> Result<(), TxnError> {
        if pending.is_empty() {
            return Ok(());
        }
        let mut files = Vec::with_capacity(pending.len());
        for (index, buf, lsn) in pending.iter_mut() {
            let data = &buf.as_slice()[CHUNK_HEADER_SIZE..];
            let crc = crc32fast::hash(data);
            let header = ChunkHeader { index: *index, epoch, lsn: *lsn, len: data.len() as u64, crc };
            buf.as_mut_slice()[..CHUNK_HEADER_SIZE].copy_from_slice(&header.encode());
            entries[*index as usize].crc = crc;
            let path = chunk_path(&self.config.dir, *index, epoch);
            self.step(&path)?;
            // A failed earlier attempt at this epoch may have left the file behind.
            let _ = std::fs::remove_file(&path);
            files.push((open_direct(&path, true).map_err(|e| io_err(&path, e))?, path));
        }
        let reqs: Vec<WriteSync> = pending
            .iter()
            .zip(&files)
            .map(|((_, buf, _), (f, _))| WriteSync { fd: std::os::fd::AsRawFd::as_raw_fd(f), offset: 0, data: buf.as_slice() })
            .collect();
        let results = self.backend.write_and_sync(&reqs);
        for (r, (_, path)) in results.into_iter().zip(&files) {
            r.map_err(|e| io_err(path, e))?;
        }
        for (_, buf, _) in pending.iter() {
            report.bytes_written += buf.len() as u64;
        }
        report.written += pending.len() as u64;
        pending.clear();
        let dir = checkpoint_dir(&self.config.dir);
        self.step(&dir)?;
        sync_dir(&dir)?;
        Ok(())
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
