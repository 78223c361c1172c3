//! Helpers shared by the integration tests (each test file includes this module).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tusk::{Commit, Durability, HeapPtr, Options, Store};
use tusk_storage::log_format::{decode_frame, Frame, SEGMENT_HEADER_SIZE};

/// Small heap, few stripes, one log partition unless a test says otherwise.
pub fn small_opts() -> Options {
    Options { heap_capacity: 64 << 20, stripes_log2: 14, log_partitions: 1, ..Options::default() }
}

/// Checkpoint tests: a small heap in small chunks, one partition, small segments (so that
/// trimming has whole segments to delete), and checkpoints only when the test takes them.
pub fn checkpoint_opts(heap_capacity: u64, chunk_size: u64) -> Options {
    Options {
        heap_capacity,
        stripes_log2: 12,
        log_partitions: 1,
        chunk_size,
        segment_bytes: 1 << 16,
        checkpoint_interval: None,
        ..Options::default()
    }
}

/// Allocates `bytes` under the root "data" in one Sync transaction.
pub fn alloc_data_root(store: &Store, bytes: u64) -> HeapPtr {
    let (p, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(bytes)?;
            tx.set_root("data", p)?;
            Ok(p)
        })
        .unwrap();
    p
}

pub fn opts_off() -> Options {
    Options { durability: Durability::Off, ..small_opts() }
}

/// The segments of partition `p` under `dir/log/pNNNN/`, in name order.
pub fn segments(dir: &Path, p: u32) -> Vec<PathBuf> {
    let pdir = dir.join("log").join(format!("p{p:04}"));
    let mut out: Vec<PathBuf> = match std::fs::read_dir(&pdir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "seg"))
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// A record found in a segment file: its offset, framed length, LSN and flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rec {
    pub offset: u64,
    pub len: u64,
    pub lsn: u64,
    pub flags: u32,
    pub marker: bool,
}

/// Decodes every record of a segment file (panics on damage: only for intact files).
pub fn records(path: &Path) -> Vec<Rec> {
    let data = std::fs::read(path).unwrap();
    let mut at = SEGMENT_HEADER_SIZE;
    let mut out = Vec::new();
    loop {
        match decode_frame(&data, at) {
            Frame::Record(view, next) => {
                out.push(Rec {
                    offset: at as u64,
                    len: (next - at) as u64,
                    lsn: view.header.lsn,
                    flags: view.header.flags,
                    marker: view.header.void.is_some(),
                });
                at = next;
            }
            Frame::Pad(next) => at = next,
            Frame::End | Frame::Zeros => return out,
            Frame::Invalid(why) => panic!("{}: invalid record at {at}: {why}", path.display()),
        }
    }
}

/// Where a segment's last flush ends: the end of the file, or where the zeros the writer
/// wrote ahead of its flushes begin (panics on damage: only for intact files).
pub fn flush_end(path: &Path) -> u64 {
    let data = std::fs::read(path).unwrap();
    let mut at = SEGMENT_HEADER_SIZE;
    loop {
        match decode_frame(&data, at) {
            Frame::Record(_, next) | Frame::Pad(next) => at = next,
            Frame::End | Frame::Zeros => return at as u64,
            Frame::Invalid(why) => panic!("{}: invalid frame at {at}: {why}", path.display()),
        }
    }
}

/// The partition (0 or 1 ...) whose log holds `lsn`, if any.
pub fn partition_of_lsn(dir: &Path, partitions: u32, lsn: u64) -> Option<u32> {
    (0..partitions).find(|&p| segments(dir, p).iter().any(|s| records(s).iter().any(|r| r.lsn == lsn)))
}

/// Where the image of chunk `index` lies that checkpoint `epoch` uses: its segment file, the
/// offset there, and the image's length (header and chunk).
pub fn image_location(dir: &Path, epoch: u64, index: u64) -> (PathBuf, u64, u64) {
    use tusk_storage::checkpoint_format::{image_segment_path, image_size, manifest_path, Manifest};
    let manifest = Manifest::decode(&std::fs::read(manifest_path(dir, epoch)).unwrap()).unwrap();
    let entry = manifest.chunks[index as usize];
    (image_segment_path(dir, entry.image_epoch), entry.offset, image_size(manifest.chunk_size))
}

/// XORs `mask` into the byte at `at` of `path`.
pub fn flip_byte(path: &Path, at: u64, mask: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= mask;
    std::fs::write(path, bytes).unwrap();
}

/// Writes `f(i)` into word `i` at `p` for every `i` of `words`, `per_txn` words to an `Async`
/// transaction.
pub fn fill_words(store: &Store, p: HeapPtr, words: std::ops::Range<u64>, per_txn: u64, f: impl Fn(u64) -> u64) {
    let end = words.end;
    for start in words.step_by(per_txn as usize) {
        store
            .transact(Commit::Async, |tx| {
                for i in start..(start + per_txn).min(end) {
                    tx.write_u64_at(p, i * 8, f(i))?;
                }
                Ok(())
            })
            .unwrap();
    }
}

/// Copies a closed store's directory, its lock file left out (to open it two ways).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
