//! One partition's open segment file: where the partition's next flush goes, and rolling
//! over to a new segment once one passes `segment_bytes`. Each partition has its own, owned
//! by its flush slot, so partitions flush independently.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use tusk_storage::io::open_direct;
use tusk_storage::log_files::{list_segments, log_dir, partition_dir, segment_path, sync_dir};
use tusk_storage::log_format::{SegmentHeader, SEGMENT_HEADER_SIZE};
use tusk_storage::StorageError;

use super::catalog::SegmentCatalog;
use crate::TxnError;

struct OpenSegment {
    file: File,
    path: PathBuf,
    seq: u64,
    /// Bytes written so far (a multiple of the flush alignment).
    len: u64,
}

pub struct SegmentFile {
    dir: PathBuf,
    partition: u32,
    segment_bytes: u64,
    open: Option<OpenSegment>,
    next_seq: u64,
}

/// Creates the log directory (durably) before any partition opens its segments.
pub fn prepare_log_dir(dir: &Path) -> Result<(), TxnError> {
    std::fs::create_dir_all(log_dir(dir)).map_err(|e| StorageError::io(log_dir(dir), e))?;
    sync_dir(dir)?;
    Ok(())
}

impl SegmentFile {
    /// New segments of `partition` go after the existing ones (never appended to).
    pub fn open(dir: &Path, partition: u32, segment_bytes: u64) -> Result<SegmentFile, TxnError> {
        let next_seq = list_segments(dir, partition)?.last().map_or(1, |(seq, _)| seq + 1);
        Ok(SegmentFile { dir: dir.to_path_buf(), partition, segment_bytes, open: None, next_seq })
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

    /// `len` bytes landed at the end of the open segment.
    pub fn advance(&mut self, len: usize) {
        if let Some(seg) = &mut self.open {
            seg.len += len as u64;
        }
    }

    pub fn path(&self) -> PathBuf {
        self.open.as_ref().map_or_else(|| partition_dir(&self.dir, self.partition), |s| s.path.clone())
    }

    fn roll(&mut self) -> Result<(), StorageError> {
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
        self.open = Some(OpenSegment { file, path, seq, len: 0 });
        Ok(())
    }
}
