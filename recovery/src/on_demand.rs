//! The checkpoint's images as a [`ChunkSource`]: a heap opened on demand reads each chunk's
//! image from here when first used, and background loaders read the rest in the large
//! sequential reads of a whole load (see tusk-storage's `on_demand`).
//!
//! Opening checks only what costs no image read: every segment the manifest names opens and
//! is long enough for its images. Each image's header and checksum are checked when it is
//! read, before its bytes reach the heap.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use tusk_storage::checkpoint_format::{image_segment_path, image_size, Manifest};
use tusk_storage::io::sync::pread_full;
use tusk_storage::io::{open_direct_read, AlignedBuf};
use tusk_storage::on_demand::TakeImage;
use tusk_storage::{ChunkDamage, ChunkSource};

use crate::checkpoint::{check_image, plan_runs};

/// The image segments of one manifest, open.
pub struct ImageSource {
    manifest: Manifest,
    /// The manifest's segments (ascending epochs) and their files.
    segments: Vec<u64>,
    files: Vec<(PathBuf, std::fs::File)>,
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
        Ok(ImageSource { manifest: manifest.clone(), segments, files })
    }
}

impl ChunkSource for ImageSource {
    fn read(&self, run: &[u64], wanted: &[bool], take: &mut TakeImage<'_>) {
        let image = image_size(self.manifest.chunk_size);
        let first = &self.manifest.chunks[run[0] as usize];
        for (k, &chunk) in run.iter().enumerate() {
            let entry = &self.manifest.chunks[chunk as usize];
            assert!(entry.image_epoch == first.image_epoch && entry.offset == first.offset + k as u64 * image, "a run's images lie next to each other");
        }
        let len = (image * run.len() as u64) as usize;
        BUFFER.with_borrow_mut(|buf| {
            if buf.len() < len {
                buf.clear();
                buf.extend_zeros(len);
            }
            self.check_run(run, wanted, &mut buf.as_mut_slice()[..len], take)
        });
    }

    fn runs(&self) -> Vec<Vec<u64>> {
        plan_runs(&self.manifest, &self.segments).into_iter().map(|r| r.chunks).collect()
    }
}

thread_local! {
    /// Each reading thread's buffer, kept (the largest run it read, 8 MiB at most for a
    /// background loader, one image for a thread that reached an absent chunk): an
    /// allocation and its page faults per read cost the background loaders a third of their
    /// rate.
    static BUFFER: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::new());
}

impl ImageSource {
    /// Reads `run`'s images into `bytes` and hands the `wanted` ones to `take`, checked.
    fn check_run(&self, run: &[u64], wanted: &[bool], bytes: &mut [u8], take: &mut TakeImage<'_>) {
        let chunk_size = self.manifest.chunk_size;
        let image = image_size(chunk_size);
        let first = &self.manifest.chunks[run[0] as usize];
        let (path, file) = &self.files[self.segments.binary_search(&first.image_epoch).expect("segments come from the manifest")];
        let damage = |chunk: u64, offset: u64, reason: String| ChunkDamage {
            path: path.clone(),
            offset,
            reason,
            heap: chunk * chunk_size..(chunk + 1) * chunk_size,
        };
        let len = bytes.len();
        let read = match pread_full(file.as_raw_fd(), first.offset, bytes) {
            Ok(got) if got == bytes.len() => Ok(()),
            Ok(got) => Err(format!("short read: {got} of {len} bytes")),
            Err(e) => Err(format!("cannot read: {e}")),
        };
        for (k, (&chunk, _)) in run.iter().zip(wanted).enumerate().filter(|(_, (_, &w))| w) {
            let offset = first.offset + k as u64 * image;
            let checked = match &read {
                Ok(()) => {
                    let at = k * image as usize;
                    check_image(&bytes[at..at + image as usize], chunk, &self.manifest.chunks[chunk as usize], chunk_size)
                        .map_err(|reason| damage(chunk, offset, format!("chunk {chunk}: {reason}")))
                }
                Err(reason) => Err(damage(chunk, offset, reason.clone())),
            };
            take(chunk, checked);
        }
    }
}
