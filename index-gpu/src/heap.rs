//! The heap access the indexes are written against.
//!
//! Index code never touches `Transaction` directly: reads go through [`HeapRead`] and updates
//! through [`HeapWrite`]. The transaction implements both; a read-only image of the heap (the
//! snapshots and the GPU mirror's CPU fallback) needs only [`HeapRead`] to reuse every
//! read path (`get`, `range`, `count`, `sum`, `check`) unchanged.

use tusk_storage::HeapPtr;
use tusk_txn::{Transaction, TxnError};

use crate::btree::posts::PendingPosts;

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

    /// Whether reads join a transaction's read set (and, in place, take its locks), so that a
    /// read the caller can validate otherwise is cheaper through [`HeapRead::peek_words`]. An
    /// image's reads are plain loads either way: no.
    fn tracks_reads(&self) -> bool {
        false
    }

    /// Reads `out.len()` words at `off` as the transaction sees them (its own writes
    /// included) without noting them: no read set, no lock, no validation at commit. What it
    /// returns may be stale, or torn by a concurrent commit; only for reads whose use is
    /// proven otherwise (a B-link descent's internal nodes: the leaf it lands on proves itself,
    /// see `btree/search.rs`). Returns false, reading nothing, where the words leave the heap,
    /// so a peeked offset is never followed into a panic. The default reads as `load_words`.
    fn peek_words(&mut self, off: u64, out: &mut [u64]) -> Result<bool, TxnError> {
        if !self.contains(off, 8 * out.len() as u64) {
            return Ok(false);
        }
        self.load_words(off, out)?;
        Ok(true)
    }

    /// Whether `[off, off + len)` lies inside the heap. Validators ask before following an
    /// offset read from possibly damaged data, since a load outside the heap is a bug (it
    /// panics) rather than an error. An image that cannot tell says yes.
    fn contains(&self, off: u64, len: u64) -> bool {
        let _ = (off, len);
        true
    }

    /// The separators of the B-link tree at `meta` that this transaction left to its commit
    /// (`btree/posts.rs`); none elsewhere.
    fn pending_posts(&self, meta: u64) -> Option<&PendingPosts> {
        let _ = meta;
        None
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

    /// Leaves the separator of `node`, split off a node of `level` of the B-link tree at
    /// `meta`, to the commit (`btree/posts.rs`); false where the heap cannot, and the caller
    /// posts it at once.
    fn defer_post(&mut self, meta: u64, level: u32, separator: u64, node: u64) -> bool {
        let _ = (meta, level, separator, node);
        false
    }

    /// Posts the separators of the tree at `meta` left to the commit now.
    fn finish_posts(&mut self, meta: u64) -> Result<(), TxnError> {
        let _ = meta;
        Ok(())
    }
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

    fn tracks_reads(&self) -> bool {
        true
    }

    #[inline]
    fn peek_words(&mut self, off: u64, out: &mut [u64]) -> Result<bool, TxnError> {
        Ok(Transaction::peek_words(self, off, out))
    }

    fn pending_posts(&self, meta: u64) -> Option<&PendingPosts> {
        self.deferred(meta)
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

    fn defer_post(&mut self, meta: u64, level: u32, separator: u64, node: u64) -> bool {
        self.defer(meta, || PendingPosts::new(meta)).is_some_and(|posts| posts.add(level, separator, node))
    }

    fn finish_posts(&mut self, meta: u64) -> Result<(), TxnError> {
        self.finish_deferred(meta)
    }
}
