//! One partition's open segment file: where the partition's next flush goes, and rolling
//! over to a new segment once one passes `segment_bytes`. Each partition has its own, owned
//! by its flush slot, so partitions flush independently.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use tusk_storage::io::open_direct;
use tusk_storage::io::sync::prefer_in_place_writes;
use tusk_storage::log_files::{list_partitions, list_segments, log_dir, partition_dir, segment_path, sync_dir};
use tusk_storage::log_seal::{file_tail_crc, SegmentSeal, SEAL_MARK_STEP};
use tusk_storage::log_format::{SegmentHeader, FLUSH_ALIGN, SEGMENT_HEADER_SIZE, ZERO_AHEAD, ZERO_AHEAD_MAX_FLUSH};
use tusk_storage::StorageError;

use super::catalog::SegmentCatalog;
use crate::TxnError;

struct OpenSegment {
    file: File,
    path: PathBuf,
    seq: u64,
    /// Bytes of flushes written so far (a multiple of the flush alignment).
    len: u64,
    /// The file's length: `len` plus the zeros written ahead of the last flush.
    allocated: u64,
    /// Marks for the seal of a clean close (see tusk-storage's `log_seal`).
    marks: Vec<(u64, u64)>,
}

/// Changes to the log's files that a reopen after a crash left to a thread of its own (the
/// zeros or torn tail after a partition's last flush cut off, a segment that never got its
/// header removed): until they are done no new segment is made, since the segment they
/// change would then no longer be its partition's last, where zeros and a torn tail are
/// damage. Done: how it went.
#[derive(Debug, Default)]
pub struct PendingRepairs(std::sync::OnceLock<Result<(), String>>);

impl PendingRepairs {
    pub fn finish(&self, result: Result<(), String>) {
        let _ = self.0.set(result);
    }

    /// Waits for the repairs; their error, if they failed.
    pub fn wait(&self) -> Result<(), String> {
        self.0.wait().clone()
    }
}

pub struct SegmentFile {
    dir: PathBuf,
    /// Repairs a new segment waits for (see [`PendingRepairs`]), until the first one is made.
    repairs: Option<std::sync::Arc<PendingRepairs>>,
    partition: u32,
    segment_bytes: u64,
    open: Option<OpenSegment>,
    /// The segment last closed (its zeros cut), with its marks, until the next one opens.
    closed: Option<SegmentSeal>,
    next_seq: u64,
}

/// Creates the log directory (durably) before any partition opens its segments.
pub fn prepare_log_dir(dir: &Path) -> Result<(), TxnError> {
    let log = log_dir(dir);
    std::fs::create_dir_all(&log).map_err(|e| StorageError::io(&log, e))?;
    // On btrfs, segments created from now on are overwritten in place (see the function);
    // those of an earlier open keep what they had.
    prefer_in_place_writes(&log).map_err(|e| StorageError::io(&log, e))?;
    // A partition folder is only ever made after this sync returned, in the open that made
    // it: where one exists, the log folder is durable already. A reopen skips the sync,
    // which cost a file-system journal commit (5 ms on this machine right after a close).
    if list_partitions(dir)?.is_empty() {
        sync_dir(dir)?;
    }
    Ok(())
}

impl SegmentFile {
    /// New segments of `partition` go after the existing ones (never appended to).
    pub fn open(dir: &Path, partition: u32, segment_bytes: u64, repairs: Option<std::sync::Arc<PendingRepairs>>) -> Result<SegmentFile, TxnError> {
        let next_seq = list_segments(dir, partition)?.last().map_or(1, |(seq, _)| seq + 1);
        Ok(SegmentFile { dir: dir.to_path_buf(), repairs, partition, segment_bytes, open: None, closed: None, next_seq })
    }

    /// Where the next flush of `len` bytes goes: descriptor, offset, and the segment header
    /// to put in front when the flush opens a new segment.
    pub fn target(
        &mut self,
        len: usize,
        catalog: &SegmentCatalog,
    ) -> Result<(RawFd, u64, Option<[u8; SEGMENT_HEADER_SIZE]>), StorageError> {
        let full = match &self.open {
            Some(seg) => seg.len > 0 && seg.len + len as u64 > self.segment_bytes,
            None => true,
        };
        if full {
            self.roll()?;
            let seg = self.open.as_ref().expect("just rolled");
            catalog.opened(self.partition, seg.seq, seg.path.clone());
        }
        let seg = self.open.as_ref().expect("rolled above");
        let header = (seg.len == 0).then(|| SegmentHeader { partition: self.partition, seq: seg.seq }.encode());
        Ok((seg.file.as_raw_fd(), seg.len, header))
    }

    /// How many zeros to write after a flush of `len` bytes at `offset` (see
    /// [`ZERO_AHEAD`]): none unless the flush is small and runs past the zeros written
    /// ahead already; never past the segment's size bound.
    pub fn zeros_after(&self, offset: u64, len: usize) -> usize {
        let Some(seg) = &self.open else { return 0 };
        let end = offset + len as u64;
        if len as u64 > ZERO_AHEAD_MAX_FLUSH || end <= seg.allocated {
            return 0;
        }
        let ahead = (end + ZERO_AHEAD).min(self.segment_bytes.next_multiple_of(FLUSH_ALIGN)).saturating_sub(end);
        debug_assert_eq!(ahead % FLUSH_ALIGN, 0);
        ahead as usize
    }

    /// A flush of `len` bytes, followed by `zeros` zero bytes, landed at the end of the open
    /// segment; its first record, LSN `first`, at `records_at`.
    pub fn advance(&mut self, len: usize, zeros: usize, first: u64, records_at: u64) {
        if let Some(seg) = &mut self.open {
            let far_enough = seg.marks.last().is_none_or(|&(lsn, at)| first > lsn && records_at >= at + SEAL_MARK_STEP);
            if first > 0 && records_at < seg.len + len as u64 && far_enough {
                seg.marks.push((first, records_at));
            }
            seg.len += len as u64;
            seg.allocated = seg.allocated.max(seg.len + zeros as u64);
        }
    }

    pub fn path(&self) -> PathBuf {
        self.open.as_ref().map_or_else(|| partition_dir(&self.dir, self.partition), |s| s.path.clone())
    }

    /// Closes the open segment once a flush has filled it to `segment_bytes` (or past it: a
    /// record larger than a segment is alone in one), instead of at the next flush: a closed
    /// segment may be deleted once checkpoints cover its records, and a partition that
    /// flushes nothing after a huge record would otherwise keep it open, and on disk, for
    /// good (its bytes over `max_log_bytes` stalled every committer: a 64 M-key load did).
    pub fn close_if_full(&mut self, catalog: &SegmentCatalog) -> Result<(), StorageError> {
        if self.open.as_ref().is_some_and(|seg| seg.len >= self.segment_bytes) {
            self.close_open()?;
            catalog.closed(self.partition);
        }
        Ok(())
    }

    /// Closes the open segment at a clean close, its zeros cut off: a reopen then finds
    /// nothing to repair (a cut costs a file-system journal commit, about 10 ms). Returns the
    /// seal of the partition's last segment, if one was written since the store opened.
    pub fn close(&mut self, catalog: &SegmentCatalog) -> Result<Option<SegmentSeal>, StorageError> {
        if self.open.is_some() {
            self.close_open()?;
            catalog.closed(self.partition);
        }
        let Some(mut seal) = self.closed.clone() else { return Ok(None) };
        // A segment closed when full may have been trimmed since (a checkpoint covered it):
        // the partition then has no segment to seal.
        match file_tail_crc(&segment_path(&self.dir, self.partition, seal.seq), seal.len) {
            Ok(crc) => seal.tail_crc = crc,
            Err(StorageError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        Ok(Some(seal))
    }

    /// Takes the open segment out of use. Only a partition's last segment may end in zeros
    /// (recovery reads zeros anywhere else as damage): they are cut off, durably, before a
    /// next segment can exist.
    fn close_open(&mut self) -> Result<(), StorageError> {
        if let Some(seg) = self.open.take() {
            if seg.allocated > seg.len {
                seg.file.set_len(seg.len).map_err(|e| StorageError::io(&seg.path, e))?;
                seg.file.sync_data().map_err(|e| StorageError::io(&seg.path, e))?;
            }
            self.closed = (seg.len > 0).then_some(SegmentSeal { partition: self.partition, seq: seg.seq, len: seg.len, tail_crc: 0, marks: seg.marks });
        }
        Ok(())
    }

    fn roll(&mut self) -> Result<(), StorageError> {
        if let Some(repairs) = &self.repairs {
            // Kept until they succeeded: a later roll must not pass a failed repair by.
            repairs.wait().map_err(|reason| StorageError::io(log_dir(&self.dir), std::io::Error::other(format!("the log's repair after a crash failed: {reason}"))))?;
            self.repairs = None;
        }
        self.close_open()?;
        let pdir = partition_dir(&self.dir, self.partition);
        if !pdir.exists() {
            std::fs::create_dir_all(&pdir).map_err(|e| StorageError::io(&pdir, e))?;
            sync_dir(&log_dir(&self.dir))?;
        }
        let seq = self.next_seq;
        let path = segment_path(&self.dir, self.partition, seq);
        let file: File = open_direct(&path, true).map_err(|e| StorageError::io(&path, e))?;
        // The header goes out with the segment's first flush; the new name is durable now.
        sync_dir(&pdir)?;
        self.next_seq = seq + 1;
        self.closed = None;
        self.open = Some(OpenSegment { file, path, seq, len: 0, allocated: 0, marks: Vec::new() });
        Ok(())
    }
}
