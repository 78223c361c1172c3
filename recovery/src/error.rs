use std::path::PathBuf;

use tusk_storage::StorageError;

/// The kind of file a recovery message is about: every message names it before the path, so
/// a reader knows whether a log, a manifest or an image broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// One log segment file (`log/pNNNN/*.seg`).
    LogSegment,
    /// The log as a whole (`log/`): what the segments together must reach.
    Log,
    /// A checkpoint manifest (`ckpt/MANIFEST-*`).
    Manifest,
    /// A checkpoint image segment (`ckpt/*.ckpt`).
    CheckpointImage,
    /// The store as recovered (its superblock).
    Store,
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::LogSegment => "log segment",
            FileKind::Log => "log",
            FileKind::Manifest => "checkpoint manifest",
            FileKind::CheckpointImage => "checkpoint image",
            FileKind::Store => "store",
        })
    }
}

/// `", offset N"` where the damage has a place in the file, else nothing.
pub fn at_offset(offset: &Option<u64>) -> String {
    offset.map_or(String::new(), |o| format!(", offset {o}"))
}

/// Errors of recovery: the directory cannot be recovered as it is.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// A file is damaged in a way recovery may not repair (anything but a torn tail, or a
    /// checkpoint with nothing left to stand in for it): the store is not opened.
    #[error("{kind} {path}{}: {reason}; refused to open the store", at_offset(offset))]
    Corrupt { kind: FileKind, path: PathBuf, offset: Option<u64>, reason: String },
    /// Two records claim the same LSN.
    #[error("LSN {lsn} appears twice: {first} and {second}")]
    DuplicateLsn { lsn: u64, first: PathBuf, second: PathBuf },
    /// Opening on demand met a damaged checkpoint image (recover_heap then loads whole,
    /// falling back to the checkpoint before it).
    #[error("checkpoint image {path}, offset {offset}: {reason}; found while opening on demand")]
    DamagedOnDemand { path: PathBuf, offset: u64, reason: String },
    /// A record writes beyond the heap capacity given in the options.
    #[error("{path}: record at offset {offset} writes up to byte {needed}, beyond the heap capacity of {capacity} bytes; open with a larger heap_capacity")]
    CapacityTooSmall { path: PathBuf, offset: u64, needed: u64, capacity: u64 },
    /// A checkpoint written in a format this build does not read.
    #[error("{path}: checkpoint format version {version}, this build reads version {supported}; open the store with the build that wrote it")]
    OldCheckpointFormat { path: PathBuf, version: u32, supported: u32 },
    #[error(transparent)]
    Storage(#[from] StorageError),
}
