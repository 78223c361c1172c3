use std::path::PathBuf;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The heap's address space could not be reserved.
    #[error("cannot reserve a heap of {capacity} bytes: {source}")]
    Reserve { capacity: u64, source: std::io::Error },
    /// An I/O operation on a file failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

impl StorageError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io { path: path.into(), source }
    }
}
