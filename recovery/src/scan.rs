//! Reading the log: every partition's segments, validated frame by frame.
//!
//! A record that fails to decode is a torn tail when it lies in the last segment of its
//! partition and no later flush follows it (a pad frame, then a valid record): the writer
//! only ever has the last flush of the last segment in flight, so a crash can damage
//! nothing else. The tail is cut off (the file is
//! truncated there) and reported. Damage anywhere else is an error.

use std::path::{Path, PathBuf};

use tusk_storage::log_files::{list_partitions, list_segments, SegmentInfo};
use tusk_storage::log_format::{decode_frame, later_flush_after, Frame, SegmentHeader, SEGMENT_HEADER_SIZE};
use tusk_storage::mapped::MappedFile;
use tusk_storage::StorageError;

use crate::RecoveryError;

/// A torn tail found (and, when repairing, cut off) during the scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment file.
    pub path: PathBuf,
    /// Where the damaged bytes start (the file's new length after the cut).
    pub offset: u64,
    /// How many bytes were cut.
    pub bytes: u64,
    /// What made the tail invalid.
    pub reason: String,
}

/// A segment's bytes in memory.
pub struct Segment {
    pub path: PathBuf,
    pub partition: u32,
    map: MappedFile,
    /// Valid bytes (a torn tail is cut off).
    len: usize,
}

impl Segment {
    pub fn data(&self) -> &[u8] {
        &self.map.as_slice()[..self.len]
    }
}

/// Where a record lies.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef {
    pub lsn: u64,
    pub flags: u32,
    pub void: Option<(u64, u64)>,
    pub segment: u32,
    pub offset: u32,
}

#[derive(Default)]
pub struct Scan {
    pub segments: Vec<Segment>,
    /// Per segment read: its LSN range and size, in `segments` order.
    pub infos: Vec<SegmentInfo>,
    pub records: Vec<RecordRef>,
    pub torn: Vec<TornTail>,
    pub log_bytes: u64,
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> RecoveryError {
    RecoveryError::Corrupt { path: path.to_path_buf(), offset, reason: reason.into() }
}

/// Reads all segments under `dir/log`, one thread per partition. With `repair`, torn tails
/// are cut off on disk.
pub fn scan(dir: &Path, repair: bool) -> Result<Scan, RecoveryError> {
    let partitions = list_partitions(dir)?;
    let scans: Vec<Result<Scan, RecoveryError>> = std::thread::scope(|s| {
        let handles: Vec<_> = partitions.iter().map(|&p| s.spawn(move || scan_partition(dir, p, repair))).collect();
        handles.into_iter().map(|h| h.join().expect("log scan thread panicked")).collect()
    });
    let mut out = Scan::default();
    for part in scans {
        let part = part?;
        let shift = out.segments.len() as u32;
        out.records.extend(part.records.into_iter().map(|r| RecordRef { segment: r.segment + shift, ..r }));
        out.segments.extend(part.segments);
        out.infos.extend(part.infos);
        out.torn.extend(part.torn);
        out.log_bytes += part.log_bytes;
    }
    Ok(out)
}

/// Cuts a segment's file at `len`, durably.
fn cut(path: &Path, len: usize) -> Result<(), RecoveryError> {
    let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| StorageError::io(path, e))?;
    f.set_len(len as u64).map_err(|e| StorageError::io(path, e))?;
    f.sync_all().map_err(|e| StorageError::io(path, e))?;
    Ok(())
}

fn scan_partition(dir: &Path, partition: u32, repair: bool) -> Result<Scan, RecoveryError> {
    let mut out = Scan::default();
    {
        let segments = list_segments(dir, partition)?;
        let count = segments.len();
        for (i, (seq, path)) in segments.into_iter().enumerate() {
            let is_last = i + 1 == count;
            let map = MappedFile::open(&path)?;
            let data = map.as_slice();
            out.log_bytes += data.len() as u64;
            let header = SegmentHeader::decode(&data);
            let header = match header {
                Ok(h) => h,
                // A segment created just before a crash: its header never became durable, so
                // no fdatasync of it completed and nothing in it was acknowledged.
                Err(reason)
                    if is_last && (data.len() < SEGMENT_HEADER_SIZE || data[..SEGMENT_HEADER_SIZE].iter().all(|&b| b == 0)) =>
                {
                    out.torn.push(TornTail { path: path.clone(), offset: 0, bytes: data.len() as u64, reason });
                    if repair {
                        std::fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
                    }
                    continue;
                }
                Err(reason) => return Err(corrupt(&path, 0, reason)),
            };
            let data = map.as_slice();
            if header.partition != partition || header.seq != seq {
                return Err(corrupt(
                    &path,
                    0,
                    format!("header says partition {} segment {}, the file name says {partition} / {seq}", header.partition, header.seq),
                ));
            }
            let segment_index = out.segments.len() as u32;
            let mut at = SEGMENT_HEADER_SIZE;
            let end = loop {
                match decode_frame(data, at) {
                    Frame::Record(view, next) => {
                        if view.header.partition != partition {
                            return Err(corrupt(&path, at as u64, format!("record of partition {} in partition {partition}", view.header.partition)));
                        }
                        out.records.push(RecordRef {
                            lsn: view.header.lsn,
                            flags: view.header.flags,
                            void: view.header.void,
                            segment: segment_index,
                            offset: u32::try_from(at).map_err(|_| corrupt(&path, at as u64, "segment larger than 4 GiB"))?,
                        });
                        at = next;
                    }
                    Frame::Pad(next) => at = next,
                    Frame::End => break data.len(),
                    // Space the writer zeroed ahead of its last flush; it cuts the zeros off
                    // a segment before starting the next, so only the last may end so.
                    Frame::Zeros if is_last => {
                        if repair {
                            cut(&path, at)?;
                        }
                        break at;
                    }
                    Frame::Zeros => {
                        return Err(corrupt(&path, at as u64, "zeros from here to the end of a segment that is not the partition's last"));
                    }
                    Frame::Invalid(reason) => {
                        if !is_last {
                            return Err(corrupt(&path, at as u64, format!("{reason} (in a segment that is not the partition's last)")));
                        }
                        if let Some(valid) = later_flush_after(data, at + 8) {
                            return Err(corrupt(&path, at as u64, format!("{reason}; a later flush follows at offset {valid}")));
                        }
                        out.torn.push(TornTail { path: path.clone(), offset: at as u64, bytes: (data.len() - at) as u64, reason });
                        if repair {
                            cut(&path, at)?;
                        }
                        break at;
                    }
                }
            };
            let mine = &out.records[out.records.iter().rposition(|r| r.segment != segment_index).map_or(0, |i| i + 1)..];
            out.infos.push(SegmentInfo {
                partition,
                seq,
                path: path.clone(),
                min_lsn: mine.iter().map(|r| r.lsn).min().unwrap_or(0),
                max_lsn: mine.iter().map(|r| r.lsn).max().unwrap_or(0),
                bytes: end as u64,
                open: false,
            });
            out.segments.push(Segment { path, partition, map, len: end });
        }
    }
    Ok(out)
}
