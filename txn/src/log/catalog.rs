//! The catalog of log segments on disk: their LSN ranges and sizes, kept up to date by the
//! writer, read by the checkpointer to trim the log and to bound its size.

use parking_lot::Mutex;
use tusk_storage::log_files::{sync_dir, SegmentInfo};
use tusk_storage::StorageError;

#[derive(Default)]
pub struct SegmentCatalog {
    segments: Mutex<Vec<SegmentInfo>>,
}

impl SegmentCatalog {
    /// Starts from the segments recovery found (all closed: the writer opens new ones).
    pub fn new(found: Vec<SegmentInfo>) -> SegmentCatalog {
        let segments = found.into_iter().map(|s| SegmentInfo { open: false, ..s }).collect();
        SegmentCatalog { segments: Mutex::new(segments) }
    }

    pub(crate) fn opened(&self, partition: u32, seq: u64, path: std::path::PathBuf) {
        let mut segs = self.segments.lock();
        for s in segs.iter_mut().filter(|s| s.partition == partition) {
            s.open = false;
        }
        segs.push(SegmentInfo { partition, seq, path, min_lsn: 0, max_lsn: 0, bytes: 0, open: true });
    }

    pub(crate) fn flushed(&self, partition: u32, first: u64, last: u64, bytes: u64) {
        let mut segs = self.segments.lock();
        if let Some(s) = segs.iter_mut().rev().find(|s| s.partition == partition && s.open) {
            if s.min_lsn == 0 {
                s.min_lsn = first;
            }
            s.max_lsn = s.max_lsn.max(last);
            s.bytes += bytes;
        }
    }

    pub fn snapshot(&self) -> Vec<SegmentInfo> {
        self.segments.lock().clone()
    }

    /// Bytes of log on disk.
    pub fn total_bytes(&self) -> u64 {
        self.segments.lock().iter().map(|s| s.bytes).sum()
    }

    /// Bytes that must stay on disk while a checkpoint needs every LSN above `lsn`.
    pub fn bytes_needed_after(&self, lsn: u64) -> u64 {
        self.segments.lock().iter().filter(|s| s.open || s.max_lsn > lsn).map(|s| s.bytes).sum()
    }

    /// Deletes every closed segment whose records all have LSNs ≤ `lsn`. Returns the number
    /// of files and bytes removed.
    pub fn trim(&self, lsn: u64) -> Result<(usize, u64), StorageError> {
        let doomed: Vec<SegmentInfo> = {
            let mut segs = self.segments.lock();
            let (gone, keep): (Vec<_>, Vec<_>) = segs.drain(..).partition(|s| !s.open && s.max_lsn <= lsn);
            *segs = keep;
            gone
        };
        let mut dirs = Vec::new();
        let mut bytes = 0;
        for s in &doomed {
            match std::fs::remove_file(&s.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&s.path, e)),
            }
            bytes += s.bytes;
            if let Some(d) = s.path.parent() {
                if !dirs.contains(&d.to_path_buf()) {
                    dirs.push(d.to_path_buf());
                }
            }
        }
        for d in dirs {
            sync_dir(&d)?;
        }
        Ok((doomed.len(), bytes))
    }
}
