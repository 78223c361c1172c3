//! The writer's open segment file per partition: where the next buffer goes, and rolling
//! over to a new segment once one passes `segment_bytes`.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;

use tusk_storage::io::open_direct;
use tusk_storage::log_files::{list_partitions, list_segments, log_dir, partition_dir, segment_path, sync_dir};
use tusk_storage::log_format::{SegmentHeader, SEGMENT_HEADER_SIZE};
use tusk_storage::StorageError;

use super::catalog::SegmentCatalog;
use crate::log::LogConfig;
use crate::TxnError;

struct OpenSegment {
    file: File,
    path: PathBuf,
    seq: u64,
    /// Bytes written so far (a multiple of the flush alignment).
    len: u64,
}

pub struct SegmentFiles {
    dir: PathBuf,
    segment_bytes: u64,
    open: Vec<Option<OpenSegment>>,
    next_seq: Vec<u64>,
}

impl SegmentFiles {
    pub fn open(config: &LogConfig) -> Result<SegmentFiles, TxnError> {
        let dir = config.dir.clone();
        std::fs::create_dir_all(log_dir(&dir)).map_err(|e| StorageError::io(log_dir(&dir), e))?;
        sync_dir(&dir)?;
        let existing = list_partitions(&dir)?;
        let count = config.partitions.max(existing.last().map_or(0, |&p| p as usize + 1));
        let mut next_seq = vec![1; count];
        for p in existing {
            if let Some((seq, _)) = list_segments(&dir, p)?.last() {
                next_seq[p as usize] = seq + 1;
            }
        }
        Ok(SegmentFiles { dir, segment_bytes: config.segment_bytes, open: (0..count).map(|_| None).collect(), next_seq })
    }

    /// Where the next flush of `len` bytes of `partition` goes: descriptor, offset, and the
    /// segment header to put in front when the flush opens a new segment.
    pub fn target(
        &mut self,
        partition: usize,
        len: usize,
        catalog: &SegmentCatalog,
    ) -> Result<(RawFd, u64, Option<[u8; SEGMENT_HEADER_SIZE]>), StorageError> {
        let full = match &self.open[partition] {
            Some(seg) => seg.len > 0 && seg.len + len as u64 > self.segment_bytes,
            None => true,
        };
        if full {
            self.roll(partition)?;
            let seg = self.open[partition].as_ref().expect("just rolled");
            catalog.opened(partition as u32, seg.seq, seg.path.clone());
        }
        let seg = self.open[partition].as_ref().expect("rolled above");
        let header = (seg.len == 0).then(|| SegmentHeader { partition: partition as u32, seq: seg.seq }.encode());
        Ok((seg.file.as_raw_fd(), seg.len, header))
    }

    /// `len` bytes landed at the end of `partition`'s segment.
    pub fn advance(&mut self, partition: usize, len: usize) {
        if let Some(seg) = &mut self.open[partition] {
            seg.len += len as u64;
        }
    }

    pub fn path(&self, partition: usize) -> PathBuf {
        self.open[partition].as_ref().map_or_else(|| partition_dir(&self.dir, partition as u32), |s| s.path.clone())
    }

    fn roll(&mut self, partition: usize) -> Result<(), StorageError> {
        let p = partition as u32;
        let pdir = partition_dir(&self.dir, p);
        if !pdir.exists() {
            std::fs::create_dir_all(&pdir).map_err(|e| StorageError::io(&pdir, e))?;
            sync_dir(&log_dir(&self.dir))?;
        }
        let seq = self.next_seq[partition];
        let path = segment_path(&self.dir, p, seq);
        let file: File = open_direct(&path, true).map_err(|e| StorageError::io(&path, e))?;
        // The header goes out with the segment's first flush; the new name is durable now.
        sync_dir(&pdir)?;
        self.next_seq[partition] = seq + 1;
        self.open[partition] = Some(OpenSegment { file, path, seq, len: 0 });
        Ok(())
    }
}
