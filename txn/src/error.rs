use tusk_storage::StorageError;

/// Errors of transactions and the log.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// Another transaction changed what this one read or wants to write; retry.
    #[error("transaction conflict")]
    Conflict,
    /// No space is left in the heap for the allocation.
    #[error("heap exhausted: cannot allocate {requested} bytes in a heap of {capacity} bytes")]
    HeapExhausted { requested: u64, capacity: u64 },
    /// An access outside the allocation it names.
    #[error("out of bounds: {len} bytes at offset {offset} of the allocation at {ptr} ({alloc_len} bytes)")]
    OutOfBounds { ptr: u64, offset: u64, len: u64, alloc_len: u64 },
    /// The pointer is not the start of a live allocation.
    #[error("invalid heap pointer {0}: not the start of an allocation")]
    InvalidPointer(u64),
    /// The allocation was already freed.
    #[error("double free of the allocation at {0}")]
    DoubleFree(u64),
    /// A root name is longer than the table allows.
    #[error("root name of {len} bytes is longer than the maximum of {max}")]
    RootNameTooLong { len: usize, max: usize },
    /// A root name is empty.
    #[error("root names must not be empty")]
    RootNameEmpty,
    /// Every slot of the root table is taken.
    #[error("the root table is full ({0} roots)")]
    RootTableFull(u64),
    /// The log could not be written; the store refuses further commits.
    #[error("the log failed and the store refuses commits: {0}")]
    LogFailed(String),
    /// The store is closed.
    #[error("the store is closed")]
    Closed,
    /// The transaction wrote more 64-byte lines than one redo record holds; nothing of it
    /// was written.
    #[error("transaction too large: it wrote more than {max} lines of 64 bytes, the most one redo record holds")]
    TooLarge { max: u64 },
    /// A snapshot (or a mirror sync) was asked for on the thread of a transaction running in
    /// place: it would wait for that transaction, which waits for it.
    #[error("a snapshot or mirror sync inside a transaction running in place would wait for that transaction forever; take it before or after")]
    InsideInPlaceTransaction,
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A checkpoint image read on demand after the store opened is damaged: the access of its
    /// chunk failed (see tusk-storage's `on_demand`).
    #[error("checkpoint image {}, offset {}: {}", .0.path.display(), .0.offset, .0.reason)]
    DamagedChunk(tusk_storage::ChunkDamage),
}
