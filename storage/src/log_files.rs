//! Naming of the log's files: `DIR/log/pNNNN/SSSSSSSSSSSSSSSSSSSS.seg`, one folder per
//! partition, segments numbered from 1 in the order they were written.

use std::path::{Path, PathBuf};

use crate::StorageError;

pub fn log_dir(store_dir: &Path) -> PathBuf {
    store_dir.join("log")
}

pub fn partition_dir(store_dir: &Path, partition: u32) -> PathBuf {
    log_dir(store_dir).join(format!("p{partition:04}"))
}

pub fn segment_path(store_dir: &Path, partition: u32, seq: u64) -> PathBuf {
    partition_dir(store_dir, partition).join(format!("{seq:020}.seg"))
}

/// The partitions present under `DIR/log`, ascending.
pub fn list_partitions(store_dir: &Path) -> Result<Vec<u32>, StorageError> {
    let dir = log_dir(store_dir);
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(StorageError::io(&dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io(&dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name.strip_prefix('p').and_then(|n| n.parse::<u32>().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The segments of one partition as (seq, path), ascending by seq. Files that do not follow
/// the naming scheme are ignored.
pub fn list_segments(store_dir: &Path, partition: u32) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let dir = partition_dir(store_dir, partition);
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(StorageError::io(&dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io(&dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(seq) = name.strip_suffix(".seg").and_then(|n| n.parse::<u64>().ok()) {
            out.push((seq, entry.path()));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// fsync of a directory, so that entries created in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    let f = std::fs::File::open(dir).map_err(|e| StorageError::io(dir, e))?;
    f.sync_all().map_err(|e| StorageError::io(dir, e))
}

/// What is known of one segment file: enough to decide whether it may be deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub partition: u32,
    pub seq: u64,
    pub path: PathBuf,
    /// LSN range of its records (0, 0 when it holds none).
    pub min_lsn: u64,
    pub max_lsn: u64,
    pub bytes: u64,
    /// The writer still appends to it.
    pub open: bool,
}
