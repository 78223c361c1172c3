//! The heap access the indexes are written against.
//!
//! Index code never touches `Transaction` directly: reads go through [`HeapRead`] and updates
//! through [`HeapWrite`]. The transaction implements both; a read-only image of the heap (the
//! snapshots and the GPU mirror's CPU fallback) needs only [`HeapRead`] to reuse every
//! read path (`get`, `range`, `count`, `sum`, `check`) unchanged.

use tusk_storage::HeapPtr;
use tusk_txn::{Transaction, TxnError};

/// Reads of 8-aligned u64 words at heap offsets.
pub trait HeapRead {
    fn load(&mut self, off: u64) -> Result<u64, TxnError>;

    /// Reads `out.len()` consecutive words from `off` (a node header, a key array).
    #[inline]
    fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.load(off + 8 * i as u64)?;
        }
        Ok(())
    }

    /// Hints that the `len` bytes at `off` will be read soon. Index descents call it on a
    /// node as soon as they know its offset, so the node's cache lines (and, in a
    /// transaction, their stripe locks) arrive in parallel rather than one miss per probe of
    /// the in-node search. Changes nothing; the default does nothing.
    #[inline]
    fn prefetch(&self, off: u64, len: u64) {
        let _ = (off, len);
    }

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

    /// Writes `values` to the consecutive words from `off` (a node's shifted keys): the same
    /// as storing them one by one.
    #[inline]
    fn store_words(&mut self, off: u64, values: &[u64]) -> Result<(), TxnError> {
        for (i, &v) in values.iter().enumerate() {
            self.store(off + 8 * i as u64, v)?;
        }
        Ok(())
    }

    /// Allocates `len` zeroed bytes; returns the heap offset of the first.
    fn alloc(&mut self, len: u64) -> Result<u64, TxnError>;
}

impl HeapRead for Transaction<'_> {
    #[inline]
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        Transaction::load(self, off)
    }

    #[inline]
    fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        Transaction::load_words(self, off, out)
    }

    #[inline]
    fn prefetch(&self, off: u64, len: u64) {
        Transaction::prefetch_range(self, off, len)
    }

    fn contains(&self, off: u64, len: u64) -> bool {
        self.engine().heap().contains(off, len)
    }
}

impl HeapWrite for Transaction<'_> {
    #[inline]
    fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError> {
        Transaction::store(self, off, value)
    }

    #[inline]
    fn store_words(&mut self, off: u64, values: &[u64]) -> Result<(), TxnError> {
        Transaction::store_words(self, off, values)
    }

    fn alloc(&mut self, len: u64) -> Result<u64, TxnError> {
        Transaction::alloc(self, len).map(HeapPtr::offset)
    }
}
