use std::path::PathBuf;

use tusk_storage::StorageError;

/// Errors of recovery: the directory cannot be recovered as it is.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// A log file is damaged somewhere other than its tail.
    #[error("{path}: corrupt log at offset {offset}: {reason}")]
    Corrupt { path: PathBuf, offset: u64, reason: String },
    /// Two records claim the same LSN.
    #[error("LSN {lsn} appears twice: {first} and {second}")]
    DuplicateLsn { lsn: u64, first: PathBuf, second: PathBuf },
    /// A record writes beyond the heap capacity given in the options.
    #[error("{path}: record at offset {offset} writes up to byte {needed}, beyond the heap capacity of {capacity} bytes; open with a larger heap_capacity")]
    CapacityTooSmall { path: PathBuf, offset: u64, needed: u64, capacity: u64 },
    /// A checkpoint written in a format this build does not read.
    #[error("{path}: checkpoint format version {version}, this build reads version {supported}; open the store with the build that wrote it")]
    OldCheckpointFormat { path: PathBuf, version: u32, supported: u32 },
    #[error(transparent)]
    Storage(#[from] StorageError),
}
