use tusk_storage::HeapPtr;
use tusk_txn::{Commit, Lsn};

use crate::Error;

/// A serializable transaction over the heap. Reads see a consistent state (opacity); writes
/// are buffered until commit. Obtain one from [`crate::Store::transact`] or
/// [`crate::Store::begin`].
///
/// Pointers name allocations: `read`/`write` address an allocation from its start,
/// the `_at` forms at an offset inside it; every access is checked against the allocation's
/// length.
pub struct Transaction<'s> {
    pub(crate) inner: tusk_txn::Transaction<'s>,
    /// The store's [`crate::Store::refuse_updates`] switch.
    pub(crate) updates_refused: &'s std::sync::atomic::AtomicBool,
}

impl Transaction<'_> {
    /// Allocates `len` zeroed bytes.
    pub fn alloc(&mut self, len: u64) -> Result<HeapPtr, Error> {
        Ok(self.inner.alloc(len)?)
    }

    /// Frees the allocation at `p`.
    pub fn free(&mut self, p: HeapPtr) -> Result<(), Error> {
        Ok(self.inner.free(p)?)
    }

    /// The length of the allocation at `p`, as requested from [`Transaction::alloc`].
    pub fn len(&mut self, p: HeapPtr) -> Result<u64, Error> {
        Ok(self.inner.len(p)?)
    }

    /// Reads `buf.len()` bytes from the start of the allocation at `p`.
    pub fn read(&mut self, p: HeapPtr, buf: &mut [u8]) -> Result<(), Error> {
        Ok(self.inner.read(p, buf)?)
    }

    /// Reads `buf.len()` bytes at `offset` inside the allocation at `p`.
    pub fn read_at(&mut self, p: HeapPtr, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        Ok(self.inner.read_at(p, offset, buf)?)
    }

    /// Writes `data` at the start of the allocation at `p`.
    pub fn write(&mut self, p: HeapPtr, data: &[u8]) -> Result<(), Error> {
        Ok(self.inner.write(p, data)?)
    }

    /// Writes `data` at `offset` inside the allocation at `p`.
    pub fn write_at(&mut self, p: HeapPtr, offset: u64, data: &[u8]) -> Result<(), Error> {
        Ok(self.inner.write_at(p, offset, data)?)
    }

    /// Reads the little-endian u64 at the start of the allocation at `p`.
    pub fn read_u64(&mut self, p: HeapPtr) -> Result<u64, Error> {
        Ok(self.inner.read_u64_at(p, 0)?)
    }

    /// Writes a little-endian u64 at the start of the allocation at `p`.
    pub fn write_u64(&mut self, p: HeapPtr, value: u64) -> Result<(), Error> {
        Ok(self.inner.write_u64_at(p, 0, value)?)
    }

    /// Reads the little-endian u64 at `offset` inside the allocation at `p`.
    pub fn read_u64_at(&mut self, p: HeapPtr, offset: u64) -> Result<u64, Error> {
        Ok(self.inner.read_u64_at(p, offset)?)
    }

    /// Writes a little-endian u64 at `offset` inside the allocation at `p`.
    pub fn write_u64_at(&mut self, p: HeapPtr, offset: u64, value: u64) -> Result<(), Error> {
        Ok(self.inner.write_u64_at(p, offset, value)?)
    }

    /// Hints that `offset` inside the allocation at `p` will be read or written soon (fetches
    /// the memory and its lock into cache). Transactions that know several random addresses
    /// up front overlap their cache misses this way. Changes nothing.
    pub fn prefetch(&self, p: HeapPtr, offset: u64) {
        self.inner.prefetch(p, offset)
    }

    /// Points the named root at `p` (names are 1 to [`crate::ROOT_NAME_MAX`] bytes).
    pub fn set_root(&mut self, name: &str, p: HeapPtr) -> Result<(), Error> {
        Ok(self.inner.set_root(name, p)?)
    }

    /// The pointer stored under the named root.
    pub fn root(&mut self, name: &str) -> Result<Option<HeapPtr>, Error> {
        Ok(self.inner.root(name)?)
    }

    /// Removes the named root; returns whether it existed.
    pub fn remove_root(&mut self, name: &str) -> Result<bool, Error> {
        Ok(self.inner.remove_root(name)?)
    }

    /// Commits with `mode`. Returns the LSN, or `None` for a read-only transaction. On
    /// [`Error::Conflict`] nothing was written; call [`Transaction::restart`] and run again.
    pub fn commit(&mut self, mode: Commit) -> Result<Option<Lsn>, Error> {
        if !self.inner.is_read_only() && self.updates_refused.load(std::sync::atomic::Ordering::SeqCst) {
            // Its writes undone (a run in place) or dropped (buffered); it starts over.
            self.inner.restart();
            return Err(Error::UpdatesRefused);
        }
        Ok(self.inner.commit(mode)?)
    }

    /// Forgets everything read and written so far and starts over at the current state.
    pub fn restart(&mut self) {
        self.inner.restart()
    }

    /// Abandons the transaction: nothing it wrote becomes visible.
    pub fn abort(self) {
        self.inner.abort()
    }

    /// Whether the transaction runs in place: once it has written more than 4096 lines of
    /// 64 bytes it locks what it touches and writes the heap directly (README, "Transactions
    /// of any size").
    pub fn is_in_place(&self) -> bool {
        self.inner.is_in_place()
    }
}
