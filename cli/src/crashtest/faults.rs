//! Fault models the parent applies to a crashed child's store directory: the power cut (from
//! the recording backend's journal), a torn log tail, and a flipped bit. Kill and eio need
//! nothing here: the kill is the crash, and eio happens inside the child.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::Rng;
use tusk_storage::checkpoint_format::{checkpoint_dir, parse_image_segment_name, parse_manifest_name};
use tusk_storage::io::{power_cut, PowerCut};
use tusk_storage::log_files::{list_partitions, list_segments};
use tusk_storage::log_format::{decode_frame, Frame, FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE};

use super::CrashtestError;

/// Cuts the power as the journal describes. Per cut, one of three choosers: keep no
/// unsynced sector, keep all, or keep each with probability ½.
pub fn apply_power_cut(journal: &Path, rng: &mut SmallRng) -> Result<PowerCut, CrashtestError> {
    let policy = rng.random_range(0..3u8);
    let cut = power_cut(journal, &mut |_, _| match policy {
        0 => false,
        1 => true,
        _ => rng.random_bool(0.5),
    })?;
    Ok(cut)
}

/// A record found in a segment: offset, framed length, LSN, whether it is a marker.
#[derive(Clone, Copy, Debug)]
struct Rec {
    offset: u64,
    len: u64,
    lsn: u64,
    marker: bool,
}

/// The valid records at the start of a segment (up to the first invalid frame), and where
/// its last flush ends if the frames after it are only the end of the file or zeros
/// written ahead (`None`: the tail is torn already).
fn records(data: &[u8]) -> (Vec<Rec>, Option<u64>) {
    let mut out = Vec::new();
    let mut at = SEGMENT_HEADER_SIZE;
    if data.len() < SEGMENT_HEADER_SIZE {
        return (out, None);
    }
    loop {
        match decode_frame(data, at) {
            Frame::Record(view, next) => {
                out.push(Rec { offset: at as u64, len: (next - at) as u64, lsn: view.header.lsn, marker: view.header.void.is_some() });
                at = next;
            }
            Frame::Pad(next) => at = next,
            Frame::End | Frame::Zeros => return (out, Some(at as u64)),
            Frame::Invalid(_) => return (out, None),
        }
    }
}

/// Bytes of a record's frame (header and payload), without the alignment bytes after it.
fn frame_len(data: &[u8], r: &Rec) -> u64 {
    let at = r.offset as usize;
    let payload = data.get(at + 4..at + 8).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    (FRAME_HEADER_SIZE as u64 + u64::from(payload)).min(r.len)
}

/// How a torn tail was made, and where recovery must report it.
#[derive(Clone, Debug)]
pub struct TornPlan {
    /// The log segment whose tail was damaged.
    pub path: PathBuf,
    /// Where recovery must find the tail torn (the end of the last flush, or where the cut
    /// went); `None`: only zeros follow the last flush, which is no tear (the writer zeroes
    /// space ahead of its flushes) and must not be reported as one.
    pub expect_offset: Option<u64>,
    /// What was done to the tail, in words (for the cycle's detail and failure messages).
    pub how: &'static str,
}

/// The largest chunk LSN of every manifest on disk: a checkpoint is written only once its
/// LSNs are durable, so no crash can tear the log below it.
pub fn checkpointed_lsn(dir: &Path) -> u64 {
    let manifests = tusk_storage::checkpoint_format::list_manifests(dir).unwrap_or_default();
    manifests.iter().filter_map(|(_, path)| tusk_recovery::checkpoint::read_manifest(path).ok()).map(|m| m.max_lsn()).max().unwrap_or(0)
}

/// Damages the tail of the last segment of a random partition, never touching a record
/// that must survive: records of this cycle (LSN ≥ `first_lsn`) above `required_lsn` that
/// are not in `keep` (the acknowledged Partition commits). Kinds: garbage or zeros after
/// the end, a cut inside a record, a damaged last record.
pub fn tear_tail(dir: &Path, rng: &mut SmallRng, first_lsn: u64, required_lsn: u64, keep: &[u64]) -> Result<Option<TornPlan>, CrashtestError> {
    let mut lasts = Vec::new();
    for p in list_partitions(dir)? {
        if let Some((_, path)) = list_segments(dir, p)?.pop() {
            lasts.push(path);
        }
    }
    if lasts.is_empty() {
        return Ok(None);
    }
    let path = lasts[rng.random_range(0..lasts.len())].clone();
    let data = std::fs::read(&path).map_err(|e| CrashtestError::io(&path, e))?;
    if data.len() < SEGMENT_HEADER_SIZE {
        // A segment whose header never made it: recovery removes it whatever we add.
        return Ok(None);
    }
    let (recs, flush_end) = records(&data);
    let Some(len) = flush_end else {
        // The crash left the tail torn already (a power cut): leave it to recovery.
        return Ok(None);
    };
    let expendable = |r: &Rec| !r.marker && r.lsn >= first_lsn && r.lsn > required_lsn && !keep.contains(&r.lsn);
    let suffix_start = recs.iter().rposition(|r| !expendable(r)).map_or(0, |i| i + 1);
    let suffix = &recs[suffix_start..];
    let file = OpenOptions::new().write(true).open(&path).map_err(|e| CrashtestError::io(&path, e))?;
    let kind = if suffix.is_empty() { rng.random_range(0..2u8) } else { rng.random_range(0..4u8) };
    let plan = match kind {
        0 => {
            let garbage: Vec<u8> = (0..rng.random_range(1..600)).map(|_| rng.random::<u8>() | 1).collect();
            file.write_all_at(&garbage, len).map_err(|e| CrashtestError::io(&path, e))?;
            TornPlan { path: path.clone(), expect_offset: Some(len), how: "garbage after the end" }
        }
        1 => {
            let zeros = vec![0u8; 512 * rng.random_range(1..9)];
            file.write_all_at(&zeros, len).map_err(|e| CrashtestError::io(&path, e))?;
            TornPlan { path: path.clone(), expect_offset: None, how: "zeros after the end" }
        }
        2 => {
            let victim = suffix[rng.random_range(0..suffix.len())];
            // Inside the frame: a cut in the alignment bytes after it leaves the record whole.
            let cut = victim.offset + rng.random_range(1..frame_len(&data, &victim).max(2));
            file.set_len(cut).map_err(|e| CrashtestError::io(&path, e))?;
            TornPlan { path: path.clone(), expect_offset: Some(victim.offset), how: "cut inside a record" }
        }
        _ => {
            // Only the last record: damage followed by a later flush is an error, not a tear.
            let victim = *suffix.last().expect("non-empty suffix");
            // Inside the frame (header and payload), not the alignment bytes after it, which
            // carry nothing and are not checked.
            let at = victim.offset + rng.random_range(0..frame_len(&data, &victim));
            let mut byte = [data[at as usize]];
            byte[0] ^= 1 << rng.random_range(0..8);
            file.write_all_at(&byte, at).map_err(|e| CrashtestError::io(&path, e))?;
            TornPlan { path: path.clone(), expect_offset: Some(victim.offset), how: "last record damaged" }
        }
    };
    file.sync_all().map_err(|e| CrashtestError::io(&path, e))?;
    Ok(Some(plan))
}

/// The files a bit flip may hit: log segments, checkpoint image segments, manifests.
fn flippable(dir: &Path) -> Result<Vec<PathBuf>, CrashtestError> {
    let mut out = Vec::new();
    for p in list_partitions(dir)? {
        out.extend(list_segments(dir, p)?.into_iter().map(|(_, path)| path));
    }
    for (d, is_ours) in [(checkpoint_dir(dir), parse_image_segment_name as fn(&str) -> Option<u64>), (dir.to_path_buf(), parse_manifest_name)] {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(CrashtestError::io(&d, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| CrashtestError::io(&d, e))?;
            if is_ours(&entry.file_name().to_string_lossy()).is_some() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A flipped bit: the file and the byte.
#[derive(Clone, Debug)]
pub struct Flip {
    /// The file the bit was flipped in.
    pub path: PathBuf,
    /// Offset of the byte in the file.
    pub offset: u64,
    /// The bit of that byte flipped (0: the least significant).
    pub bit: u8,
}

/// Flips one random bit of one random non-empty file.
pub fn flip_bit(dir: &Path, rng: &mut SmallRng) -> Result<Option<Flip>, CrashtestError> {
    flip_bit_in(dir, rng, |_| true)
}

/// Flips one random bit of one random non-empty file of those `eligible` keeps.
pub fn flip_bit_in(dir: &Path, rng: &mut SmallRng, eligible: impl Fn(&Path) -> bool) -> Result<Option<Flip>, CrashtestError> {
    let mut files = Vec::new();
    for path in flippable(dir)?.into_iter().filter(|p| eligible(p)) {
        let len = std::fs::metadata(&path).map_err(|e| CrashtestError::io(&path, e))?.len();
        if len > 0 {
            files.push((path, len));
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    let (path, len) = files[rng.random_range(0..files.len())].clone();
    let offset = rng.random_range(0..len);
    let bit = rng.random_range(0..8u8);
    let mut data = std::fs::read(&path).map_err(|e| CrashtestError::io(&path, e))?;
    data[offset as usize] ^= 1 << bit;
    std::fs::write(&path, &data).map_err(|e| CrashtestError::io(&path, e))?;
    Ok(Some(Flip { path, offset, bit }))
}

/// Copies a store directory (its regular files, recursively; not the lock file).
pub fn copy_store(from: &Path, to: &Path) -> Result<(), CrashtestError> {
    std::fs::create_dir_all(to).map_err(|e| CrashtestError::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| CrashtestError::io(from, e))? {
        let entry = entry.map_err(|e| CrashtestError::io(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(|e| CrashtestError::io(&src, e))?;
        if kind.is_dir() {
            copy_store(&src, &dst)?;
        } else if kind.is_file() && entry.file_name() != "LOCK" {
            std::fs::copy(&src, &dst).map_err(|e| CrashtestError::io(&src, e))?;
        }
    }
    Ok(())
}
