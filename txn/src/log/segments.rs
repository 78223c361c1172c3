//! The writer's open segment file per partition: where the next buffer goes, and rolling
//! over to a new segment once one passes `segment_bytes`.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;

use tusk_storage::io::sync::pwrite_all;
use tusk_storage::log_files::{list_partitions, list_segments, log_dir, partition_dir, segment_path, sync_dir};
use tusk_storage::log_format::{SegmentHeader, SEGMENT_HEADER_SIZE};
use tusk_storage::StorageError;

use crate::engine::LogConfig;
use crate::TxnError;

struct OpenSegment {
    file: File,
    path: PathBuf,
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

    /// The descriptor and offset where `len` more bytes of `partition` go.
    pub fn target(&mut self, partition: usize, len: usize) -> Result<(RawFd, u64), StorageError> {
        let full = match &self.open[partition] {
            Some(seg) => seg.len > SEGMENT_HEADER_SIZE as u64 && seg.len + len as u64 > self.segment_bytes,
            None => true,
        };
        if full {
            self.roll(partition)?;
        }
        let seg = self.open[partition].as_ref().expect("rolled above");
        Ok((seg.file.as_raw_fd(), seg.len))
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
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| StorageError::io(&path, e))?;
        // The header becomes durable with the first data's fdatasync; the new name with this.
        pwrite_all(file.as_raw_fd(), 0, &SegmentHeader { partition: p, seq }.encode())
            .map_err(|e| StorageError::io(&path, e))?;
        sync_dir(&pdir)?;
        self.next_seq[partition] = seq + 1;
        self.open[partition] = Some(OpenSegment { file, path, len: SEGMENT_HEADER_SIZE as u64 });
        Ok(())
    }
}
