//! The checkpoint's images as a [`ChunkSource`]: a heap opened on demand reads each chunk's
//! image from here when first used, and background loaders read the rest in the large
//! sequential reads of a whole load (see tusk-storage's `on_demand`).
//!
//! Opening checks only what costs no image read: every segment the manifest names opens and
//! is long enough for its images. Each image's header is checked when it is read, and each
//! block against its checksum before its bytes reach the heap (an image of version 2, without
//! block checksums, is read and checked whole). A block read alone costs two 4 KiB reads the
//! first time in its chunk (the header, kept, then the block), one after; near the image's
//! start (`WITH_HEADER_WITHIN`) the first time is one read of both.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use std::ops::Range;
use std::sync::OnceLock;

use tusk_storage::checkpoint_format::{image_segment_path, image_size, ChunkEntry, ChunkHeader, Manifest, CHUNK_HEADER_SIZE};
use tusk_storage::io::sync::pread_full;
use tusk_storage::io::{open_direct_read, AlignedBuf};
use tusk_storage::on_demand::{Image, TakeImage};
use tusk_storage::{ChunkDamage, ChunkSource};

use crate::checkpoint::{check_header, plan_runs};

/// The image segments of one manifest, open.
pub struct ImageSource {
    manifest: Manifest,
    /// The manifest's segments (ascending epochs) and their files.
    segments: Vec<u64>,
    files: Vec<(PathBuf, std::fs::File)>,
    /// Per chunk, its image's header once a block of it was read alone (or why it is unusable).
    headers: Box<[OnceLock<Result<ChunkHeader, ChunkDamage>>]>,
}

impl ImageSource {
    /// Opens every segment `manifest` names and checks that each holds its images' bytes.
    /// On failure: the file and why (recovery then falls back as for a damaged image).
    pub fn open(dir: &Path, manifest: &Manifest) -> Result<ImageSource, (PathBuf, String)> {
        let segments = manifest.segments();
        let image = image_size(manifest.chunk_size);
        let mut needed = vec![0u64; segments.len()];
        for c in &manifest.chunks {
            let s = segments.binary_search(&c.image_epoch).expect("segments come from the manifest");
            needed[s] = needed[s].max(c.offset + image);
        }
        let mut files = Vec::with_capacity(segments.len());
        for (&epoch, &needed) in segments.iter().zip(&needed) {
            let path = image_segment_path(dir, epoch);
            let file = open_direct_read(&path).map_err(|e| (path.clone(), format!("cannot open: {e}")))?;
            let len = file.metadata().map_err(|e| (path.clone(), format!("cannot stat: {e}")))?.len();
            if needed > len {
                return Err((path, format!("segment of {len} bytes ends before the images up to {needed}")));
            }
            files.push((path, file));
        }
        let headers = manifest.chunks.iter().map(|_| OnceLock::new()).collect();
        Ok(ImageSource { manifest: manifest.clone(), segments, files, headers })
    }
}

impl ChunkSource for ImageSource {
    fn read(&self, run: &[u64], take: &mut TakeImage<'_>) {
        let image = image_size(self.manifest.chunk_size);
        let first = &self.manifest.chunks[run[0] as usize];
        for (k, &chunk) in run.iter().enumerate() {
            let entry = &self.manifest.chunks[chunk as usize];
            assert!(entry.image_epoch == first.image_epoch && entry.offset == first.offset + k as u64 * image, "a run's images lie next to each other");
        }
        let len = (image * run.len() as u64) as usize;
        with_buffer(len, |bytes| self.check_run(run, bytes, take));
    }

    fn read_blocks(&self, chunk: u64, range: Range<u64>, take: &mut TakeImage<'_>) {
        let entry = &self.manifest.chunks[chunk as usize];
        let (path, file) = self.file_of(entry);
        let base = chunk * self.manifest.chunk_size;
        let end = range.end.min(self.manifest.chunk_size);
        if self.headers[chunk as usize].get().is_none() && CHUNK_HEADER_SIZE as u64 + end <= WITH_HEADER_WITHIN {
            match self.read_with_header(chunk, range.start..end, take) {
                WithHeader::Handed => return,
                WithHeader::NoBlockChecksums => return self.read(&[chunk], take),
                // The one read failed: the header and the blocks are read apart below, so
                // that the damage names the one that fails.
                WithHeader::Unread => {}
            }
        }
        let header = match self.headers[chunk as usize].get() {
            Some(header) => header,
            None => match with_buffer(CHUNK_HEADER_SIZE, |bytes| read_exact(file, entry.offset, bytes).map(|()| self.keep_header(chunk, bytes))) {
                Ok(header) => header,
                // Not kept: the blocks asked for fail, and a later read of others tries again.
                Err(reason) => return take(chunk, Err(ChunkDamage { heap: base + range.start..base + end, ..self.header_damage(chunk, reason) })),
            },
        };
        let blocks = match header {
            Err(damage) => return take(chunk, Err(damage.clone())),
            // No block checksums: read and check it whole.
            Ok(h) if h.blocks.is_none() => return self.read(&[chunk], take),
            Ok(h) => h.blocks.as_ref().expect("checked above"),
        };
        let data_offset = entry.offset + CHUNK_HEADER_SIZE as u64;
        with_buffer((end - range.start) as usize, |bytes| match read_exact(file, data_offset + range.start, bytes) {
            Ok(()) => take(chunk, Ok(Image { from: range.start, bytes, blocks: Some(blocks), path, data_offset })),
            Err(reason) => {
                let damage = ChunkDamage { heap: base + range.start..base + end, ..self.damage(chunk, data_offset + range.start, reason) };
                take(chunk, Err(damage))
            }
        });
    }

    fn runs(&self) -> Vec<Vec<u64>> {
        plan_runs(&self.manifest, &self.segments).into_iter().map(|r| r.chunks).collect()
    }
}

/// Blocks read alone that end this near their image's start (its first bytes) are read in
/// one read with the image's header, where it is not kept yet: a chunk's first use then costs
/// one read, not two — the superblock's blocks at every open among them. A read's time on a
/// disk hardly grows over these few pages.
const WITH_HEADER_WITHIN: u64 = 64 << 10;

thread_local! {
    /// Each reading thread's buffer, kept (the largest run it read, 8 MiB at most for a
    /// background loader, a few blocks or an image for a thread that reached an absent
    /// block): an allocation and its page faults per read cost the background loaders a
    /// third of their rate.
    static BUFFER: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::new());
}

/// Runs `f` on this thread's read buffer, `len` bytes long.
fn with_buffer<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUFFER.with_borrow_mut(|buf| {
        if buf.len() < len {
            buf.clear();
            buf.extend_zeros(len);
        }
        f(&mut buf.as_mut_slice()[..len])
    })
}

/// Fills `bytes` from `offset` of `file`, or says why not.
fn read_exact(file: &std::fs::File, offset: u64, bytes: &mut [u8]) -> Result<(), String> {
    match pread_full(file.as_raw_fd(), offset, bytes) {
        Ok(got) if got == bytes.len() => Ok(()),
        Ok(got) => Err(format!("short read: {got} of {} bytes", bytes.len())),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

/// How a read of an image's header with its first blocks went.
enum WithHeader {
    /// The blocks (or the header's damage) went to `take`.
    Handed,
    /// A version-2 image: to be read whole.
    NoBlockChecksums,
    /// The read failed; nothing went to `take`.
    Unread,
}

impl ImageSource {
    fn file_of(&self, entry: &ChunkEntry) -> (&Path, &std::fs::File) {
        let (path, file) = &self.files[self.segments.binary_search(&entry.image_epoch).expect("segments come from the manifest")];
        (path, file)
    }

    /// The damage of `chunk`'s image found at `offset` of its file.
    fn damage(&self, chunk: u64, offset: u64, reason: String) -> ChunkDamage {
        let entry = &self.manifest.chunks[chunk as usize];
        let chunk_size = self.manifest.chunk_size;
        ChunkDamage { path: self.file_of(entry).0.to_path_buf(), offset, reason, heap: chunk * chunk_size..(chunk + 1) * chunk_size }
    }

    /// The damage of `chunk`'s image header, for `reason`.
    fn header_damage(&self, chunk: u64, reason: String) -> ChunkDamage {
        self.damage(chunk, self.manifest.chunks[chunk as usize].offset, format!("chunk {chunk}: {reason}"))
    }

    /// Checks `bytes` as `chunk`'s image header and keeps the outcome for the chunk's later
    /// block reads: the header, or, where it fails its checks, the damage that fails every
    /// block of the chunk. Kept once (a thread that read it too gets the first outcome).
    fn keep_header(&self, chunk: u64, bytes: &[u8]) -> &Result<ChunkHeader, ChunkDamage> {
        let entry = &self.manifest.chunks[chunk as usize];
        self.headers[chunk as usize]
            .get_or_init(|| check_header(bytes, chunk, entry, self.manifest.chunk_size).map_err(|reason| self.header_damage(chunk, reason)))
    }

    /// Reads `chunk`'s image from its start to the end of `range` (of its data), keeps its
    /// header as [`ChunkSource::read_blocks`] does and hands the blocks over, unless the read
    /// fails or the image has no block checksums (the caller then reads otherwise).
    fn read_with_header(&self, chunk: u64, range: Range<u64>, take: &mut TakeImage<'_>) -> WithHeader {
        let entry = &self.manifest.chunks[chunk as usize];
        let (path, file) = self.file_of(entry);
        let data_offset = entry.offset + CHUNK_HEADER_SIZE as u64;
        with_buffer(CHUNK_HEADER_SIZE + range.end as usize, |bytes| {
            if read_exact(file, entry.offset, bytes).is_err() {
                return WithHeader::Unread;
            }
            let (header, data) = bytes.split_at(CHUNK_HEADER_SIZE);
            match self.keep_header(chunk, header) {
                Err(damage) => take(chunk, Err(damage.clone())),
                Ok(h) => match h.blocks.as_ref() {
                    None => return WithHeader::NoBlockChecksums,
                    Some(blocks) => {
                        let bytes = &data[range.start as usize..];
                        take(chunk, Ok(Image { from: range.start, bytes, blocks: Some(blocks), path, data_offset }))
                    }
                },
            }
            WithHeader::Handed
        })
    }

    /// Reads `run`'s images into `bytes` and hands each to `take`, its header checked (and
    /// all its data, where it has no block checksums).
    fn check_run(&self, run: &[u64], bytes: &mut [u8], take: &mut TakeImage<'_>) {
        let chunk_size = self.manifest.chunk_size;
        let image = image_size(chunk_size);
        let first = &self.manifest.chunks[run[0] as usize];
        let (path, file) = self.file_of(first);
        let read = read_exact(file, first.offset, bytes);
        for (k, &chunk) in run.iter().enumerate() {
            let offset = first.offset + k as u64 * image;
            let at = k * image as usize;
            let checked = read.clone().and_then(|()| {
                let image = &bytes[at..at + image as usize];
                let header = check_header(image, chunk, &self.manifest.chunks[chunk as usize], chunk_size)?;
                let data = &image[CHUNK_HEADER_SIZE..];
                if header.blocks.is_none() {
                    header.check_data(data)?;
                }
                Ok((header, data))
            });
            match checked {
                Ok((header, data)) => {
                    let data_offset = offset + CHUNK_HEADER_SIZE as u64;
                    take(chunk, Ok(Image { from: 0, bytes: data, blocks: header.blocks.as_ref(), path, data_offset }))
                }
                Err(reason) => take(chunk, Err(self.damage(chunk, offset, format!("chunk {chunk}: {reason}")))),
            }
        }
    }
}
