//! The log's seal: what a clean close knew of each partition's last segment, so that a
//! reopen need not read what the checkpoint already holds. A scan must read a partition's
//! last segment to find where its log ends, and without this it reads all of it: after a
//! checkpoint at close, tens of MiB of records that replay then skips (30 ms of a cold
//! reopen's 50 ms on the 2-core development machine).
//!
//! `DIR/log/sealed`, rewritten (through a temporary file and a rename) at every clean
//! close:
//!
//! ```text
//! magic "TKSL" u32, version u32, partitions u32
//! per partition: partition u32, seq u64, len u64, tail crc32 u32, marks u32,
//!                marks × (lsn u64, offset u64)
//! crc32 u32 of everything before it
//! ```
//!
//! A mark `(lsn, offset)`: the record at `offset` has LSN `lsn`, so every record before it
//! has a lower one. The writer marks a flush's first record about every
//! [`SEAL_MARK_STEP`] bytes. A seal speaks for a segment only while the file has the same
//! sequence number, length and last 4 KiB (their crc32), and only while it is its partition's
//! last segment: segments are never appended to after a close, so such a file holds what the
//! close wrote (damage in the part skipped goes unseen, as in the segments a scan skips below
//! a checkpoint). A seal that is damaged, missing or stale is ignored and the scan reads the
//! whole segment.

use std::path::{Path, PathBuf};

use crate::log_files::log_dir;
use crate::StorageError;

/// Bytes between a segment's marks, at least: a reopen reads up to this much of each
/// partition's last segment that the checkpoint holds already (16 partitions on 16 cores).
/// A 64 MiB segment keeps 1,024 marks, 16 KiB of seal.
pub const SEAL_MARK_STEP: u64 = 64 << 10;

/// The end of a segment a seal checks: its last flush's last block.
pub const SEAL_TAIL: usize = 4096;

/// crc32 of the last [`SEAL_TAIL`] bytes of `file` (all of a shorter one).
pub fn tail_crc(file: &[u8]) -> u32 {
    crc32fast::hash(&file[file.len().saturating_sub(SEAL_TAIL)..])
}

const SEAL_MAGIC: u32 = u32::from_le_bytes(*b"TKSL");
const SEAL_VERSION: u32 = 1;
/// As many marks as a segment of 4 GiB (the most a scan takes) could carry: a count above it
/// is damage.
const MAX_MARKS: u32 = ((4u64 << 30) / SEAL_MARK_STEP) as u32;

/// One partition's last segment as a clean close left it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentSeal {
    pub partition: u32,
    pub seq: u64,
    pub len: u64,
    /// crc32 of the file's last [`SEAL_TAIL`] bytes ([`tail_crc`]).
    pub tail_crc: u32,
    /// Ascending in both LSN and offset; the first is the segment's first record.
    pub marks: Vec<(u64, u64)>,
}

impl SegmentSeal {
    /// Where a scan that needs only records above `covered` may start reading segment `seq`
    /// of `len` bytes whose tail has crc32 `tail` ([`tail_crc`]): the last mark at or below
    /// `covered + 1`, with its LSN. `None`: the seal does not speak for that file, or no mark
    /// helps.
    pub fn start_for(&self, seq: u64, len: u64, tail: u32, covered: u64) -> Option<(u64, u64)> {
        if self.seq != seq || self.len != len || self.tail_crc != tail {
            return None;
        }
        self.marks.iter().rev().find(|&&(lsn, _)| lsn <= covered.saturating_add(1)).copied()
    }
}

/// The seal of `partition`'s last segment among `seals`.
pub fn of_partition(seals: &[SegmentSeal], partition: u32) -> Option<&SegmentSeal> {
    seals.iter().find(|s| s.partition == partition)
}

pub fn seal_path(store_dir: &Path) -> PathBuf {
    log_dir(store_dir).join("sealed")
}

pub fn encode(seals: &[SegmentSeal]) -> Vec<u8> {
    let mut out = Vec::new();
    let put32 = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    put32(&mut out, SEAL_MAGIC);
    put32(&mut out, SEAL_VERSION);
    put32(&mut out, seals.len() as u32);
    for s in seals {
        put32(&mut out, s.partition);
        out.extend_from_slice(&s.seq.to_le_bytes());
        out.extend_from_slice(&s.len.to_le_bytes());
        put32(&mut out, s.tail_crc);
        put32(&mut out, s.marks.len() as u32);
        for &(lsn, offset) in &s.marks {
            out.extend_from_slice(&lsn.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    put32(&mut out, crc);
    out
}

pub fn decode(bytes: &[u8]) -> Result<Vec<SegmentSeal>, String> {
    let body = bytes.len().checked_sub(4).map(|n| &bytes[..n]).ok_or("seal shorter than its checksum")?;
    if crc32fast::hash(body).to_le_bytes() != bytes[body.len()..] {
        return Err("seal checksum mismatch".into());
    }
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let got = body.get(at..at + n).ok_or("seal ends early")?;
        at += n;
        Ok(got)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    if u32_of(take(4)?) != SEAL_MAGIC {
        return Err("not a tusk log seal (bad magic)".into());
    }
    let version = u32_of(take(4)?);
    if version != SEAL_VERSION {
        return Err(format!("seal version {version}, this build reads {SEAL_VERSION}"));
    }
    let count = u32_of(take(4)?);
    let mut seals = Vec::new();
    for _ in 0..count {
        let partition = u32_of(take(4)?);
        let seq = u64_of(take(8)?);
        let len = u64_of(take(8)?);
        let tail_crc = u32_of(take(4)?);
        let marks = u32_of(take(4)?);
        if marks > MAX_MARKS {
            return Err(format!("{marks} marks in one segment's seal"));
        }
        let marks = (0..marks).map(|_| Ok((u64_of(take(8)?), u64_of(take(8)?)))).collect::<Result<Vec<_>, String>>()?;
        if !marks.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1) || marks.iter().any(|&(_, offset)| offset >= len) {
            return Err(format!("marks of partition {partition} segment {seq} out of order or past its end"));
        }
        seals.push(SegmentSeal { partition, seq, len, tail_crc, marks });
    }
    if take(1).is_ok() {
        return Err("bytes after the seal's last partition".into());
    }
    Ok(seals)
}

/// Writes the seal of a clean close, replacing any earlier one. Not synced: a seal lost to a
/// crash only costs the next reopen its full read.
pub fn write(store_dir: &Path, seals: &[SegmentSeal]) -> Result<(), StorageError> {
    let path = seal_path(store_dir);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, encode(seals)).map_err(|e| StorageError::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| StorageError::io(&path, e))
}

/// crc32 of the last [`SEAL_TAIL`] bytes of the file at `path`, `len` bytes long.
pub fn file_tail_crc(path: &Path, len: u64) -> Result<u32, StorageError> {
    use std::os::unix::fs::FileExt;
    let n = len.min(SEAL_TAIL as u64);
    let mut tail = vec![0u8; n as usize];
    let file = std::fs::File::open(path).map_err(|e| StorageError::io(path, e))?;
    file.read_exact_at(&mut tail, len - n).map_err(|e| StorageError::io(path, e))?;
    Ok(tail_crc(&tail))
}

/// The seals of the last clean close (empty when there is none or it does not read).
pub fn read(store_dir: &Path) -> Vec<SegmentSeal> {
    std::fs::read(seal_path(store_dir)).ok().and_then(|bytes| decode(&bytes).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment file's bytes, distinct in its last block.
    fn file(len: usize, salt: u8) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        bytes[len - 1] = salt;
        bytes
    }

    fn seals() -> Vec<SegmentSeal> {
        vec![
            SegmentSeal { partition: 0, seq: 3, len: 8 << 20, tail_crc: tail_crc(&file(8 << 20, 1)), marks: vec![(4, 4096), (900, 1 << 20), (2000, 5 << 20)] },
            SegmentSeal { partition: 7, seq: 1, len: 8192, tail_crc: 7, marks: vec![(5, 4096)] },
            SegmentSeal { partition: 9, seq: 2, len: 4096, tail_crc: 9, marks: Vec::new() },
        ]
    }

    #[test]
    fn a_seal_reads_back_and_any_flipped_bit_is_refused() {
        let bytes = encode(&seals());
        assert_eq!(decode(&bytes).unwrap(), seals());
        for bit in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&bad).is_err(), "bit {bit}");
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn a_scan_starts_at_the_last_mark_it_may_skip_to_and_only_in_the_sealed_file() {
        let s = &seals()[0];
        let start = |seq: u64, f: &[u8], covered: u64| s.start_for(seq, f.len() as u64, tail_crc(f), covered);
        let f = file(8 << 20, 1);
        assert_eq!(start(3, &f, 0), None, "nothing is covered: no mark at or below LSN 1");
        assert_eq!(start(3, &f, 3), Some((4, 4096)));
        assert_eq!(start(3, &f, 899), Some((900, 1 << 20)), "LSN 900 is the first needed");
        assert_eq!(start(3, &f, 1999), Some((2000, 5 << 20)));
        assert_eq!(start(3, &f, u64::MAX), Some((2000, 5 << 20)));
        assert_eq!(start(4, &f, 1999), None, "another segment");
        assert_eq!(start(3, &file((8 << 20) - 4096, 1), 1999), None, "the file changed length");
        assert_eq!(start(3, &file(8 << 20, 2), 1999), None, "the file's last block changed");
    }

    #[test]
    fn written_seals_are_read_and_a_missing_or_damaged_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(log_dir(dir.path())).unwrap();
        assert!(read(dir.path()).is_empty());
        write(dir.path(), &seals()).unwrap();
        assert_eq!(read(dir.path()), seals());
        let mut bytes = std::fs::read(seal_path(dir.path())).unwrap();
        bytes[20] ^= 4;
        std::fs::write(seal_path(dir.path()), bytes).unwrap();
        assert!(read(dir.path()).is_empty());
    }
}
