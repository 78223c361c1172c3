//! The checkpointer: incremental, chunked checkpoints that bound recovery time and log size.
//!
//! A checkpoint copies every chunk of the allocated heap that changed since the previous
//! one, each inside [`Engine::copy_consistent`] (so it carries a chunk LSN and needs no pause
//! of other transactions), writes the images back to back into one new segment file (large
//! sequential writes, one fdatasync after the last, no file per chunk), waits until the largest chunk LSN is
//! durable, and then switches the manifest atomically (temp file, fsync, rename, fsync of
//! the directory). Clean chunks keep their earlier image, unless that image is so old that
//! the log it needs would exceed half of `max_log_bytes`, or its segment is mostly dead (see
//! [`COMPACT_BELOW`]). Afterwards the previous checkpoint is kept (recovery falls back to it
//! if an image of the new one is lost), everything older is deleted, segments no kept
//! manifest names are deleted (the newest of them is kept as the spare, which the next
//! checkpoint renames and writes over: no unlink of a large file and no fresh allocation on
//! the checkpoint's path), and log segments whose records are all older than both
//! checkpoints' oldest chunk LSN are removed.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tusk_storage::checkpoint_format::{
    checkpoint_dir, image_segment_path, image_size, list_image_segments, list_manifests, manifest_path,
    spare_segment_path, ChunkEntry, ChunkHeader, Manifest, CHUNK_HEADER_SIZE,
};
use tusk_storage::io::{open_backend, open_direct, AlignedBuf, FaultPlan, Io, IoBackend, WriteSync};
use tusk_storage::layout::BRK_OFF;
use tusk_storage::log_files::sync_dir;
use tusk_storage::{StorageError, PAGE_SIZE};

use crate::engine::Engine;
use crate::TxnError;

/// Bytes of images written by one request: large enough that the device streams, small
/// enough that copying the next batch overlaps writing this one. The writes are not synced
/// one by one: the segment gets one fdatasync after its last image, before the manifest
/// that names it (a crash before that leaves a segment no manifest names, deleted as
/// garbage), so the device is not drained 128 times per GiB.
const BATCH_BYTES: u64 = 8 << 20;

/// Batch buffers kept between checkpoints: one being copied into, one queued, one written.
const POOL_BUFFERS: usize = 3;

/// A segment whose images the newest checkpoint still uses for less than this fraction of
/// its slots is compacted: its live chunks (all clean) are copied again into the new
/// segment, so that it can be deleted once the previous checkpoint no longer needs it. Every
/// segment a manifest names is thus at least this full, bounding the space dead images pin
/// to about `1 / COMPACT_BELOW` times the covered heap (plus the previous checkpoint's).
pub const COMPACT_BELOW: f64 = 0.5;

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
    /// The checkpoint's number (its manifest is `MANIFEST-<epoch>`, its segment
    /// `ckpt/seg-<epoch>.ckpt`).
    pub epoch: u64,
    /// Chunks the checkpoint covers.
    pub chunks: u64,
    /// Chunks copied and written by this checkpoint.
    pub written: u64,
    /// Clean chunks whose earlier image was kept.
    pub reused: u64,
    /// Clean chunks rewritten because their image pinned too much log.
    pub rewritten_for_log: u64,
    /// Clean chunks rewritten because their segment was mostly dead (compaction).
    pub rewritten_for_space: u64,
    /// Bytes of chunk images written (headers included).
    pub bytes_written: u64,
    /// Oldest chunk LSN: recovery replays the log after it.
    pub min_lsn: u64,
    /// Newest chunk LSN: the checkpoint became valid once it was durable.
    pub max_lsn: u64,
    /// Image segments no kept checkpoint refers to any more, deleted (or the newest of them
    /// kept as the spare).
    pub deleted_segments: u64,
    /// Bytes of the image segments the kept checkpoints use, on disk afterwards.
    pub segment_bytes: u64,
    /// Bytes of the spare segment the next checkpoint writes over (0 if none).
    pub spare_bytes: u64,
    /// Log segments deleted, and their bytes.
    pub trimmed_segments: u64,
    pub trimmed_bytes: u64,
    /// Log bytes on disk after trimming.
    pub log_bytes: u64,
    /// Wall time until the checkpoint was valid (its manifest durable): the images written
    /// and synced, the chunk LSNs durable, the manifest switched.
    pub valid_after: Duration,
    /// Wall time of the whole checkpoint: `valid_after`, then deleting what no kept
    /// checkpoint needs (old image segments, trimmed log segments).
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
    /// Image slots of each segment on disk (learnt when written, or from its length).
    slots: HashMap<u64, u64>,
    /// Batch buffers reused across batches and checkpoints (no zeroing, no page faults).
    pool: Vec<AlignedBuf>,
}

fn io_err(path: &std::path::Path, e: std::io::Error) -> TxnError {
    TxnError::Storage(StorageError::io(path, e))
}

/// One batch of images on its way to the segment: `count` images from slot `first_slot`.
struct Batch {
    buf: AlignedBuf,
    first_slot: u64,
    count: u64,
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
        Ok(Checkpointer { config, backend, last, previous, clean_through, slots: HashMap::new(), pool: Vec::new() })
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
        let image = image_size(chunk);
        let per_batch = (BATCH_BYTES / image).max(1);
        let epoch = self.last.as_ref().map_or(0, |m| m.epoch).max(self.newest_manifest_on_disk()) + 1;
        let ended = engine.advance_dirty_epoch();
        let mut report = CheckpointReport { epoch, ..CheckpointReport::default() };
        let catalog = log.catalog();
        let heap = engine.heap();

        // Chunk 0 first, into slot 0 of the first batch: its copy fixes how much of the heap
        // this checkpoint covers. A heap smaller than one chunk: the image's tail past the
        // heap's end stays zero.
        let mut first = Batch { buf: self.pool.pop().unwrap_or_else(|| batch_buffer(image, per_batch)), first_slot: 0, count: 0 };
        let lsn0 = copy_chunk(engine, 0, chunk, image_at(&mut first.buf, 0, image))?;
        let brk_at = CHUNK_HEADER_SIZE + BRK_OFF as usize;
        // Exactly the allocated bytes (not rounded up to a chunk), so that a reopen with any
        // heap that holds them is accepted.
        let covered = u64::from_le_bytes(first.buf.as_slice()[brk_at..brk_at + 8].try_into().unwrap());
        let count = covered.div_ceil(chunk).max(1);

        // Which earlier images stay: decided up front, so the copy loop below needs only the
        // engine while the image writer owns the I/O backend, and every written chunk's
        // slot in the segment is known.
        let mut entries: Vec<Option<ChunkEntry>> = Vec::with_capacity(count as usize);
        entries.push(None);
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
            entries.push(reuse);
        }
        report.rewritten_for_space = self.compact(&mut entries);
        // A chunk whose image a reopen on demand found damaged holds zeros, not data: its
        // image stays referenced as it is (and the log it pins stays), never rewritten from
        // the zeros in its place.
        for (index, _) in heap.damaged_chunks() {
            if let (Some(slot), Some(old)) = (entries.get_mut(index as usize), self.last.as_ref().and_then(|m| m.chunks.get(index as usize))) {
                *slot = Some(*old);
            }
        }
        report.reused = entries.iter().filter(|e| e.is_some()).count() as u64;
        let to_write: Vec<u64> = (0..count).filter(|&i| entries[i as usize].is_none()).collect();

        let seg_path = image_segment_path(&self.config.dir, epoch);
        let segment = self.create_segment(&seg_path)?;

        // Copying overlaps writing: this thread copies the next batch of chunks while the
        // image writer thread has the previous one in flight.
        let mut pool = std::mem::take(&mut self.pool);
        let backend = &mut self.backend;
        let fd = segment.as_raw_fd();
        let mut sealed: Vec<(u64, ChunkEntry)> = Vec::with_capacity(to_write.len());
        let written = std::thread::scope(|scope| -> Result<(u64, u64), TxnError> {
            let (to_writer, batches) = crossbeam_channel::bounded::<Batch>(1);
            let (to_copier, returned) = crossbeam_channel::unbounded::<AlignedBuf>();
            let seg_path = &seg_path;
            let writer = scope.spawn(move || -> Result<(u64, u64), TxnError> {
                let (mut images, mut bytes) = (0, 0);
                for batch in batches {
                    let len = (batch.count * image) as usize;
                    let req = WriteSync { fd, offset: batch.first_slot * image, data: &batch.buf.as_slice()[..len] };
                    backend.write(&req).map_err(|e| io_err(seg_path, e))?;
                    images += batch.count;
                    bytes += len as u64;
                    // The copier may be gone after an error of its own; the buffer then drops.
                    let _ = to_copier.send(batch.buf);
                }
                Ok((images, bytes))
            });
            let copied = (|| -> Result<(), TxnError> {
                let mut batch = first;
                for (slot, &index) in to_write.iter().enumerate() {
                    let slot = slot as u64;
                    if batch.count == per_batch {
                        let next_first = batch.first_slot + batch.count;
                        if to_writer.send(batch).is_err() {
                            // The writer stopped on an error, which join reports below.
                            return Ok(());
                        }
                        pool.extend(returned.try_iter());
                        let buf = pool.pop().unwrap_or_else(|| batch_buffer(image, per_batch));
                        batch = Batch { buf, first_slot: next_first, count: 0 };
                    }
                    let at = slot - batch.first_slot;
                    // Chunk 0 was copied before the loop (it is always written, in slot 0).
                    let lsn = if index == 0 { lsn0 } else { copy_chunk(engine, index, chunk, image_at(&mut batch.buf, at, image))? };
                    sealed.push((index, seal_image(image_at(&mut batch.buf, at, image), index, epoch, lsn, slot * image)));
                    batch.count += 1;
                }
                if batch.count > 0 {
                    let _ = to_writer.send(batch);
                }
                Ok(())
            })();
            drop(to_writer);
            let written = writer.join().expect("the image writer does not panic");
            pool.extend(returned.try_iter());
            copied?;
            written
        });
        pool.truncate(POOL_BUFFERS);
        self.pool = pool;
        let (images, bytes) = written?;
        self.finish_segment(&segment, &seg_path, to_write.len() as u64 * image)?;
        self.backend.sync(fd).map_err(|e| io_err(&seg_path, e))?;
        drop(segment);
        self.slots.insert(epoch, to_write.len() as u64);
        for (index, entry) in sealed {
            entries[index as usize] = Some(entry);
        }
        report.written = images;
        report.bytes_written = bytes;
        report.chunks = count;

        let entries = entries.into_iter().map(|e| e.expect("every chunk is reused or written")).collect();
        let manifest = Manifest { epoch, chunk_size: chunk, covered, chunks: entries };
        report.min_lsn = manifest.min_lsn();
        report.max_lsn = manifest.max_lsn();
        // Valid only once every chunk LSN is durable.
        log.wait_durable(report.max_lsn)?;
        self.write_manifest(&manifest)?;
        report.valid_after = started.elapsed();

        self.previous = self.last.replace(manifest);
        self.clean_through = Some(ended);
        self.collect_garbage(&mut report, catalog, heap.absent_chunks() > 0)?;
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

    /// Drops the reuse of images in segments that the new checkpoint would use for less
    /// than [`COMPACT_BELOW`] of their slots (they are written again from the heap, which
    /// holds the same bytes: the chunks are clean). Returns how many.
    fn compact(&mut self, entries: &mut [Option<ChunkEntry>]) -> u64 {
        let mut live: HashMap<u64, u64> = HashMap::new();
        for e in entries.iter().flatten() {
            *live.entry(e.image_epoch).or_default() += 1;
        }
        let image = image_size(self.config.chunk_size);
        let sparse: HashSet<u64> = live
            .into_iter()
            .filter(|&(segment, used)| {
                let slots = *self.slots.entry(segment).or_insert_with(|| {
                    // A segment this process did not write: its length tells (a missing one
                    // counts as full; reusing it fails no worse than before).
                    let path = image_segment_path(&self.config.dir, segment);
                    std::fs::metadata(&path).map_or(used, |m| m.len() / image)
                });
                (used as f64) < COMPACT_BELOW * slots as f64
            })
            .map(|(segment, _)| segment)
            .collect();
        let mut rewritten = 0;
        for e in entries.iter_mut() {
            if e.is_some_and(|e| sparse.contains(&e.image_epoch)) {
                *e = None;
                rewritten += 1;
            }
        }
        rewritten
    }

    /// Creates this checkpoint's segment, its directory entry durable before any image is
    /// written into it: the spare renamed, or a new file. A recycled spare keeps its old
    /// bytes past what this checkpoint writes until [`Checkpointer::finish_segment`] cuts
    /// them; no manifest names it before then.
    fn create_segment(&self, path: &std::path::Path) -> Result<std::fs::File, TxnError> {
        self.step(path)?;
        let spare = spare_segment_path(&self.config.dir);
        let file = if spare.exists() {
            std::fs::rename(&spare, path).map_err(|e| io_err(path, e))?;
            open_direct(path, false).map_err(|e| io_err(path, e))?
        } else {
            // A failed earlier attempt at this epoch may have left the file behind.
            let _ = std::fs::remove_file(path);
            open_direct(path, true).map_err(|e| io_err(path, e))?
        };
        let dir = checkpoint_dir(&self.config.dir);
        self.step(&dir)?;
        sync_dir(&dir)?;
        Ok(file)
    }

    /// Cuts a recycled segment's old bytes beyond the `len` just written (before the segment's
    /// fdatasync, which makes the length durable with the images).
    fn finish_segment(&self, file: &std::fs::File, path: &std::path::Path, len: u64) -> Result<(), TxnError> {
        let on_disk = file.metadata().map_err(|e| io_err(path, e))?.len();
        if on_disk > len {
            self.step(path)?;
            file.set_len(len).map_err(|e| io_err(path, e))?;
        }
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

    /// Deletes manifests older than the two kept, segments neither references, and the log
    /// both no longer need. While a reopen on demand still reads images (`loading`), no
    /// segment becomes the spare: a file it reads is never written over, only unlinked (its
    /// open descriptor keeps the bytes). An image it still needs lies in a segment the newest
    /// manifest references anyway: its chunk was never written, so no checkpoint since
    /// rewrote it (a rewrite copies from the heap, which reads the image first).
    fn collect_garbage(&mut self, report: &mut CheckpointReport, catalog: &crate::log::catalog::SegmentCatalog, loading: bool) -> Result<(), TxnError> {
        let kept: Vec<&Manifest> = self.last.iter().chain(self.previous.iter()).collect();
        let oldest_kept = kept.iter().map(|m| m.epoch).min().unwrap_or(0);
        for (epoch, path) in list_manifests(&self.config.dir).map_err(|e| io_err(&self.config.dir, e))? {
            if epoch < oldest_kept {
                std::fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
            }
        }
        let referenced: HashSet<u64> = kept.iter().flat_map(|m| m.segments()).collect();
        let dir = checkpoint_dir(&self.config.dir);
        let spare = spare_segment_path(&self.config.dir);
        let mut keep_spare = !spare.exists() && !loading;
        let mut left = 0;
        // Newest first: the newest unreferenced segment becomes the spare (it is about the
        // size the next checkpoint writes), older ones are deleted.
        for (epoch, path) in list_image_segments(&self.config.dir).map_err(|e| io_err(&dir, e))?.into_iter().rev() {
            if referenced.contains(&epoch) {
                left += std::fs::metadata(&path).map_or(0, |m| m.len());
                continue;
            }
            // A segment another name shares (a heap installed from a file kept elsewhere,
            // `tusk::install_heap`) is only unlinked: writing over it would change that file.
            if keep_spare && !shared_with_another_name(&path) {
                self.step(&spare)?;
                std::fs::rename(&path, &spare).map_err(|e| io_err(&path, e))?;
                keep_spare = false;
            } else {
                std::fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
            }
            self.slots.remove(&epoch);
            report.deleted_segments += 1;
        }
        report.segment_bytes = left;
        report.spare_bytes = std::fs::metadata(&spare).map_or(0, |m| m.len());
        if report.deleted_segments > 0 {
            sync_dir(&dir)?;
        }
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

/// A buffer for `per_batch` images laid out as in the segment.
fn batch_buffer(image: u64, per_batch: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::new();
    buf.extend_zeros((image * per_batch) as usize);
    buf
}

/// The `slot`-th image (header and chunk) of a batch buffer.
fn image_at(buf: &mut AlignedBuf, slot: u64, image: u64) -> &mut [u8] {
    let start = (slot * image) as usize;
    &mut buf.as_mut_slice()[start..start + image as usize]
}

/// Copies chunk `index` into `out` (an image, after the header room) and returns its chunk
/// LSN. The part of a last chunk beyond the heap's capacity is zero.
fn copy_chunk(engine: &Engine, index: u64, chunk: u64, out: &mut [u8]) -> Result<u64, TxnError> {
    debug_assert_eq!(out.len(), CHUNK_HEADER_SIZE + chunk as usize);
    let len = chunk.min(engine.heap().capacity() - index * chunk) as usize;
    engine.heap().ready(index * chunk, len as u64).map_err(TxnError::DamagedChunk)?;
    let body = &mut out[CHUNK_HEADER_SIZE..];
    body[len..].fill(0);
    engine.copy_consistent(index * chunk, &mut body[..len])
}

/// Writes the header (with its blocks' checksums) into a copied image and returns its
/// manifest entry.
fn seal_image(out: &mut [u8], index: u64, epoch: u64, lsn: u64, offset: u64) -> ChunkEntry {
    let header = ChunkHeader::of(index, epoch, lsn, &out[CHUNK_HEADER_SIZE..]);
    header.encode_into(out);
    ChunkEntry { image_epoch: epoch, offset, lsn, crc: header.crc }
}

/// Whether `path` has another name (a hard link) besides this one.
fn shared_with_another_name(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).is_ok_and(|m| m.nlink() > 1)
}
