use std::path::PathBuf;

use tusk_recovery::{FileKind, RecoveryError};
use tusk_storage::StorageError;
use tusk_txn::TxnError;

/// Everything that can go wrong in tusk.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A record handed to [`crate::Store::apply_replicated`] is not one a log appended
    /// (checksum, framing), or writes the node's own replica line.
    #[error("replicated record {index}: {reason}")]
    BadReplicatedRecord {
        /// Its position among the records of the call.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The store refuses transactions that write ([`crate::Store::refuse_updates`]: a
    /// replicated follower's store); nothing was written.
    #[error("this store takes no updates (a replicated follower: update on the leader)")]
    UpdatesRefused,
    /// Another transaction changed what this one read or wrote. [`crate::Store::transact`]
    /// retries on it, so only callers of [`crate::Store::begin`] see it.
    #[error("transaction conflict")]
    Conflict,
    /// No room left in the heap (raise [`crate::Options::heap_capacity`]).
    #[error("heap exhausted: cannot allocate {requested} bytes in a heap of {capacity} bytes")]
    HeapExhausted {
        /// Bytes asked for.
        requested: u64,
        /// The heap's capacity in bytes.
        capacity: u64,
    },
    /// An access outside the allocation it names.
    #[error("out of bounds: {len} bytes at offset {offset} of the allocation at {ptr} ({alloc_len} bytes)")]
    OutOfBounds {
        /// The allocation's pointer.
        ptr: u64,
        /// Offset of the access inside the allocation.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Length of the allocation.
        alloc_len: u64,
    },
    /// The pointer is not the start of a live allocation.
    #[error("invalid heap pointer {0}: not the start of a live allocation")]
    InvalidPointer(u64),
    /// The allocation was freed already.
    #[error("double free of the allocation at {0}")]
    DoubleFree(u64),
    /// A root name longer than [`crate::ROOT_NAME_MAX`] bytes.
    #[error("root name of {len} bytes is longer than the maximum of {max}")]
    RootNameTooLong {
        /// Length of the given name in bytes.
        len: usize,
        /// The longest name allowed.
        max: usize,
    },
    /// An empty root name.
    #[error("root names must not be empty")]
    RootNameEmpty,
    /// All root slots are taken.
    #[error("the root table is full ({0} roots)")]
    RootTableFull(u64),
    /// Writing the log failed (disk full, EIO): the store refuses further commits; what was
    /// acknowledged before is on disk.
    #[error("the log failed and the store refuses commits: {0}")]
    LogFailed(String),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// The transaction wrote more 64-byte lines than one redo record holds (about 2.4 GiB of
    /// changed heap); nothing of it was written. Split the work into several transactions.
    #[error("transaction too large: it wrote more than {max} lines of 64 bytes, the most one redo record holds")]
    TransactionTooLarge {
        /// The most lines a transaction may write.
        max: u64,
    },
    /// A snapshot or a GPU mirror sync was asked for from inside a transaction (on its
    /// thread) that runs in place: it would wait for that transaction to end, which waits for
    /// it. Take snapshots before or after such a transaction.
    #[error("a snapshot or mirror sync inside a transaction running in place would wait for that transaction forever; take it before or after")]
    SnapshotInsideLargeTransaction,
    /// The store path exists and is not a directory.
    #[error("{0}: not a directory")]
    NotADirectory(PathBuf),
    /// Another open store (in this or another process) holds the directory: its lock stayed
    /// held through the second `Store::open` waits for it (a lock whose store closed can be
    /// held for a moment longer by a child process forked while it was open).
    #[error("{0}: locked by another open store")]
    Locked(PathBuf),
    /// A file of the store is damaged. The message names the kind of file, its path once, the
    /// offset where one applies, what is wrong and what tusk did. Found while opening, beyond
    /// what recovery may repair: the store was not opened (`log segment log/p0000/…seg, offset
    /// 8192: LSN 9 after LSN 12: a partition's LSNs ascend; refused to open the store`). Found
    /// in a checkpoint image that a store opened on demand read later, when first used
    /// ([`crate::HeapLoad::OnDemand`]): the access failed, and the store stays open for
    /// everything outside that chunk (`…; the store stays open, but heap bytes 1048576..2097152
    /// cannot be read or written`).
    #[error("{kind} {path}{}: {reason}", tusk_recovery::error::at_offset(offset))]
    Corrupt {
        /// What kind of file it is.
        kind: FileKind,
        /// The damaged file.
        path: PathBuf,
        /// Where in the file the damage starts, where it has a place (a manifest's checksum
        /// covers the whole file; a log that ends too early has none).
        offset: Option<u64>,
        /// What is wrong there.
        reason: String,
    },
    /// The store's checkpoint was written in a format this build does not read (an older
    /// release's layout); nothing was changed on disk.
    #[error("{path}: checkpoint format version {version}, this build reads version {supported}; open the store with the build that wrote it")]
    OldCheckpointFormat {
        /// The manifest in the old format.
        path: PathBuf,
        /// Its format version.
        version: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// Two log records claim the same LSN.
    #[error("LSN {lsn} appears twice: {first} and {second}")]
    DuplicateLsn {
        /// The LSN.
        lsn: u64,
        /// One file holding it.
        first: PathBuf,
        /// The other file holding it.
        second: PathBuf,
    },
    /// The store needs a larger heap than [`crate::Options::heap_capacity`].
    #[error("{path}: the store needs {needed} bytes of heap, the options give {capacity}; open with a larger heap_capacity")]
    CapacityTooSmall {
        /// The store (or log file) that needs more.
        path: PathBuf,
        /// Heap bytes needed.
        needed: u64,
        /// Heap bytes the options give.
        capacity: u64,
    },
    /// The root (or pointer) does not lead to an index of the kind asked for.
    #[error("the object at heap offset {offset} is not a {kind}")]
    NotAnIndex {
        /// Heap offset of the object.
        offset: u64,
        /// The kind of index expected.
        kind: &'static str,
    },
    /// An index validator (`check()`) found a broken invariant.
    #[error("index damaged at node {node}: {what}")]
    IndexDamaged {
        /// Heap offset of the node at fault.
        node: u64,
        /// What is wrong there.
        what: String,
    },
    /// An ART key longer than [`crate::ART_MAX_KEY_LEN`].
    #[error("key of {len} bytes is longer than the maximum of {max}")]
    KeyTooLong {
        /// Length of the key given.
        len: usize,
        /// The longest key allowed.
        max: usize,
    },
    /// `bulk_load` into a tree that already holds keys.
    #[error("bulk load needs an empty tree")]
    BulkLoadNotEmpty,
    /// `bulk_load` input not strictly ascending.
    #[error("bulk load input is not strictly ascending at pair {at_index} (0-based)")]
    BulkLoadNotSorted {
        /// Index of the first pair not above its predecessor.
        at_index: u64,
    },
    /// A snapshot has no root of this name.
    #[error("no root named {0:?} in the snapshot")]
    NoSuchRoot(String),
    /// A fork snapshot's child process is gone (killed, crashed) or answered nonsense; the
    /// snapshot cannot answer any more (take a new one).
    #[error("the fork snapshot's child process (pid {pid}) {reason}")]
    SnapshotChild {
        /// The child's process id.
        pid: i32,
        /// What happened to it.
        reason: String,
    },
    /// A query on a fork snapshot failed in the child with an error that has no variant here.
    #[error("snapshot query failed: {0}")]
    SnapshotQuery(String),
    /// A memcpy snapshot needs more memory than is free (or than
    /// [`crate::SnapshotOptions::memory_limit`] allows); nothing was copied.
    #[error("a snapshot needs {needed} more bytes of memory, only {available} are available")]
    SnapshotMemory {
        /// Bytes the copy would add.
        needed: u64,
        /// Bytes available (MemAvailable, or the configured limit if lower).
        available: u64,
    },
    /// A GPU mirror was asked for with `GpuBackend::Cuda` and none is usable here (no CUDA
    /// driver, no device, or NVRTC missing or failing). `GpuBackend::Auto` falls back to the
    /// CPU engine instead.
    #[error("no usable GPU: {0}")]
    GpuUnavailable(String),
    /// The GPU ran out of memory for the mirror or a batch.
    #[error("out of GPU memory: {bytes} bytes requested")]
    GpuOutOfMemory {
        /// Bytes the failed allocation asked for.
        bytes: u64,
    },
    /// The mirror would need more device memory than `GpuOptions::device_memory_limit`.
    #[error("the GPU mirror needs {bytes} bytes of device memory, over its limit of {limit} (MirrorContents::Indexes mirrors only the indexes)")]
    GpuOverLimit {
        /// Bytes the mirror needs.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A CUDA driver error during a sync or a query.
    #[error("GPU error: {0}")]
    Gpu(String),
    /// An I/O error on a file of the store.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Error {
        match e {
            StorageError::Io { path, source } => Error::Io { path, source },
            StorageError::Reserve { capacity, source } => {
                Error::Io { path: PathBuf::from(format!("<heap of {capacity} bytes>")), source }
            }
        }
    }
}

impl From<TxnError> for Error {
    fn from(e: TxnError) -> Error {
        match e {
            TxnError::Conflict => Error::Conflict,
            TxnError::HeapExhausted { requested, capacity } => Error::HeapExhausted { requested, capacity },
            TxnError::OutOfBounds { ptr, offset, len, alloc_len } => Error::OutOfBounds { ptr, offset, len, alloc_len },
            TxnError::InvalidPointer(p) => Error::InvalidPointer(p),
            TxnError::DoubleFree(p) => Error::DoubleFree(p),
            TxnError::RootNameTooLong { len, max } => Error::RootNameTooLong { len, max },
            TxnError::RootNameEmpty => Error::RootNameEmpty,
            TxnError::RootTableFull(n) => Error::RootTableFull(n),
            TxnError::LogFailed(why) => Error::LogFailed(why),
            TxnError::Closed => Error::Closed,
            TxnError::TooLarge { max } => Error::TransactionTooLarge { max },
            TxnError::InsideInPlaceTransaction => Error::SnapshotInsideLargeTransaction,
            TxnError::Storage(s) => s.into(),
            TxnError::DamagedChunk(damage) => Error::Corrupt {
                kind: FileKind::CheckpointImage,
                path: damage.path,
                offset: Some(damage.offset),
                reason: format!(
                    "{}; the store stays open, but heap bytes {}..{} cannot be read or written",
                    damage.reason, damage.heap.start, damage.heap.end
                ),
            },
        }
    }
}

/// What the store did about damage found while opening.
const REFUSED: &str = "refused to open the store";

impl From<RecoveryError> for Error {
    fn from(e: RecoveryError) -> Error {
        match e {
            RecoveryError::Corrupt { kind, path, offset, reason } => Error::Corrupt { kind, path, offset, reason: format!("{reason}; {REFUSED}") },
            RecoveryError::DamagedOnDemand { path, offset, reason } => {
                Error::Corrupt { kind: FileKind::CheckpointImage, path, offset: Some(offset), reason: format!("{reason}; {REFUSED}") }
            }
            RecoveryError::DuplicateLsn { lsn, first, second } => Error::DuplicateLsn { lsn, first, second },
            RecoveryError::CapacityTooSmall { path, needed, capacity, .. } => Error::CapacityTooSmall { path, needed, capacity },
            RecoveryError::OldCheckpointFormat { path, version, supported } => Error::OldCheckpointFormat { path, version, supported },
            RecoveryError::Storage(s) => s.into(),
        }
    }
}
