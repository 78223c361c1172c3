//! The heap access the indexes are written against.
//!
//! Index code never touches `Transaction` directly: reads go through [`HeapRead`] and updates
//! through [`HeapWrite`]. The transaction implements both; a read-only image of the heap (the
//! snapshots and the GPU fallback of later issues) needs only [`HeapRead`] to reuse every
//! read path (`get`, `range`, `count`, `sum`, `check`) unchanged.

use tusk_storage::HeapPtr;
use tusk_txn::{Transaction, TxnError};

/// Reads of 8-aligned u64 words at heap offsets.
pub trait HeapRead {
    fn load(&mut self, off: u64) -> Result<u64, TxnError>;

    /// Whether `[off, off + len)` lies inside the heap. Validators ask before following an
    /// offset read from possibly damaged data, since a load outside the heap is a bug (it
    /// panics) rather than an error. An image that cannot tell says yes.
    fn contains(&self, off: u64, len: u64) -> bool {
        let _ = (off, len);
        true
    }
}

/// Writes and allocation, on top of reads.
pub trait HeapWrite: HeapRead {
    fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError>;
    /// Allocates `len` zeroed bytes; returns the heap offset of the first.
    fn alloc(&mut self, len: u64) -> Result<u64, TxnError>;
}

impl HeapRead for Transaction<'_> {
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        Transaction::load(self, off)
    }

    fn contains(&self, off: u64, len: u64) -> bool {
        self.engine().heap().contains(off, len)
    }
}

impl HeapWrite for Transaction<'_> {
    fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError> {
        Transaction::store(self, off, value)
    }

    fn alloc(&mut self, len: u64) -> Result<u64, TxnError> {
        Transaction::alloc(self, len).map(HeapPtr::offset)
    }
}
