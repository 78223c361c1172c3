//! The B-link tree handle (u64 keys → u64 values).

use std::ops::RangeBounds;

use tusk_index::btree::Range as TreeRange;
use tusk_storage::HeapPtr;

use crate::{Error, Transaction};

pub use tusk_index::btree::{BatchOutcome, Op as BTreeOp, TreeStats as BTreeStats};

impl<'s> Transaction<'s> {
    /// The B-link tree (u64 keys → u64 values) under the root `name`, created empty if the root
    /// does not exist yet. Fails with [`Error::NotAnIndex`] if the root holds something else.
    pub fn btree(&mut self, name: &str) -> Result<BTree<'_, 's>, Error> {
        let tree = tusk_index::BTree::named(&mut self.inner, name)?;
        Ok(BTree { tx: self, tree })
    }

    /// The B-link tree whose descriptor is at `ptr` (as returned by [`BTree::ptr`]).
    pub fn btree_at(&mut self, ptr: HeapPtr) -> Result<BTree<'_, 's>, Error> {
        let tree = tusk_index::BTree::open(&mut self.inner, ptr)?;
        Ok(BTree { tx: self, tree })
    }
}

/// A B-link tree of u64 keys and u64 values, seen through one transaction.
pub struct BTree<'t, 's> {
    tx: &'t mut Transaction<'s>,
    tree: tusk_index::BTree,
}

impl<'s> BTree<'_, 's> {
    /// The tree's descriptor, to keep in another object and reopen with
    /// [`Transaction::btree_at`].
    pub fn ptr(&self) -> HeapPtr {
        self.tree.ptr()
    }

    /// Number of keys (O(1)).
    pub fn len(&mut self) -> Result<u64, Error> {
        Ok(self.tree.len(&mut self.tx.inner)?)
    }

    /// Whether the tree holds no key.
    pub fn is_empty(&mut self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// The value under `key`.
    pub fn get(&mut self, key: u64) -> Result<Option<u64>, Error> {
        Ok(self.tree.get(&mut self.tx.inner, key)?)
    }

    /// The values under `keys`, in order. Gives what `get` gives for each key, faster: the
    /// descents of 16 keys at a time run side by side, so their cache misses overlap (about
    /// 2x the lookups per second of `get` after `get` on a tree larger than the caches).
    ///
    /// ```
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = tusk::Store::open(dir.path(), tusk::Options { heap_capacity: 64 << 20, ..tusk::Options::default() })?;
    /// store.transact(tusk::Commit::Async, |tx| {
    ///     let mut prices = tx.btree("prices")?;
    ///     prices.insert(3, 30)?;
    ///     prices.insert(5, 50)?;
    ///     assert_eq!(prices.get_many(&[5, 4, 3])?, [Some(50), None, Some(30)]);
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn get_many(&mut self, keys: &[u64]) -> Result<Vec<Option<u64>>, Error> {
        Ok(self.tree.get_many(&mut self.tx.inner, keys)?)
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub fn insert(&mut self, key: u64, value: u64) -> Result<Option<u64>, Error> {
        Ok(self.tree.insert(&mut self.tx.inner, key, value)?)
    }

    /// Sets `key` to `value(old)`, where `old` is its value (`None` when absent), with one
    /// descent of the tree: a read-modify-write costs what one `insert` does, not a `get` and
    /// an `insert`. Returns `old`.
    ///
    /// ```
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = tusk::Store::open(dir.path(), tusk::Options { heap_capacity: 64 << 20, ..tusk::Options::default() })?;
    /// store.transact(tusk::Commit::Async, |tx| {
    ///     let mut hits = tx.btree("hits")?;
    ///     hits.update(7, |old| old.unwrap_or(0) + 1)?; // absent: becomes 1
    ///     let old = hits.update(7, |old| old.unwrap_or(0) + 1)?;
    ///     assert_eq!((old, hits.get(7)?), (Some(1), Some(2)));
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn update(&mut self, key: u64, value: impl FnOnce(Option<u64>) -> u64) -> Result<Option<u64>, Error> {
        Ok(self.tree.update(&mut self.tx.inner, key, value)?)
    }

    /// Removes `key`; returns the value it had.
    pub fn remove(&mut self, key: u64) -> Result<Option<u64>, Error> {
        Ok(self.tree.remove(&mut self.tx.inner, key)?)
    }

    /// Applies a batch of upserts and removes: sorted by key (stably, so the last operation on
    /// a key wins), with one descent per touched leaf. Equals applying them one by one.
    pub fn apply_batch(&mut self, ops: &[BTreeOp]) -> Result<BatchOutcome, Error> {
        Ok(self.tree.apply_batch(&mut self.tx.inner, ops)?)
    }

    /// Fills an empty tree from strictly ascending pairs, bottom-up, nodes filled to `fill`
    /// (0.5 to 1.0 of their capacity; 1.0 for read-mostly trees, less to leave room for
    /// inserts). Returns the keys loaded. Fails with [`Error::BulkLoadNotEmpty`] or
    /// [`Error::BulkLoadNotSorted`], leaving the tree empty.
    pub fn bulk_load(&mut self, pairs: impl IntoIterator<Item = (u64, u64)>, fill: f64) -> Result<u64, Error> {
        Ok(self.tree.bulk_load(&mut self.tx.inner, pairs, fill)?)
    }

    /// The entries with keys in `range`, in key order (one descent, then the leaf chain).
    pub fn range(&mut self, range: impl RangeBounds<u64>) -> Result<BTreeRange<'_, 's>, Error> {
        Ok(BTreeRange { inner: self.tree.range(&mut self.tx.inner, range)? })
    }

    /// Number of keys in `range`.
    pub fn count(&mut self, range: impl RangeBounds<u64>) -> Result<u64, Error> {
        Ok(self.tree.count(&mut self.tx.inner, range)?)
    }

    /// Sum of the values of the keys in `range`.
    pub fn sum(&mut self, range: impl RangeBounds<u64>) -> Result<u128, Error> {
        Ok(self.tree.sum(&mut self.tx.inner, range)?)
    }

    /// Walks the whole tree and verifies every invariant; returns its shape.
    pub fn check(&mut self) -> Result<BTreeStats, Error> {
        Ok(self.tree.check(&mut self.tx.inner)?)
    }
}

/// Iterator over a range of a [`BTree`]: `(key, value)` in key order.
pub struct BTreeRange<'t, 's> {
    inner: TreeRange<'t, tusk_txn::Transaction<'s>>,
}

impl Iterator for BTreeRange<'_, '_> {
    type Item = Result<(u64, u64), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map_err(Error::from))
    }
}
