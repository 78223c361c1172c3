//! The Adaptive Radix Tree handle (byte-string keys → u64 values).

use std::ops::RangeBounds;

use tusk_index::ArtIter;
use tusk_storage::HeapPtr;

use crate::{BatchOutcome, Error, Transaction};

pub use tusk_index::{ArtOp, ArtStats};

impl<'s> Transaction<'s> {
    /// The ART under the root `name`, created empty if the root does not exist yet. Fails with
    /// [`Error::NotAnIndex`] if the root holds something else.
    pub fn art(&mut self, name: &str) -> Result<Art<'_, 's>, Error> {
        let tree = tusk_index::Art::named(&mut self.inner, name)?;
        Ok(Art { tx: self, tree })
    }

    /// The ART whose descriptor is at `ptr` (as returned by [`Art::ptr`]).
    pub fn art_at(&mut self, ptr: HeapPtr) -> Result<Art<'_, 's>, Error> {
        let tree = tusk_index::Art::open(&mut self.inner, ptr)?;
        Ok(Art { tx: self, tree })
    }
}

/// An Adaptive Radix Tree of byte-string keys (0 to [`crate::ART_MAX_KEY_LEN`] bytes, ordered
/// lexicographically, a prefix before its extensions) and u64 values, seen through one
/// transaction.
pub struct Art<'t, 's> {
    tx: &'t mut Transaction<'s>,
    tree: tusk_index::Art,
}

impl<'s> Art<'_, 's> {
    /// The tree's descriptor, to keep in another object and reopen with
    /// [`Transaction::art_at`].
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
    pub fn get(&mut self, key: &[u8]) -> Result<Option<u64>, Error> {
        Ok(self.tree.get(&mut self.tx.inner, key)?)
    }

    /// The values under `keys`, in order. Gives what `get` gives for each key, faster: the
    /// descents of 16 keys at a time run side by side, so their cache misses overlap (about
    /// 3x the lookups per second of `get` after `get` on a tree larger than the caches).
    ///
    /// ```
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = tusk::Store::open(dir.path(), tusk::Options { heap_capacity: 64 << 20, ..tusk::Options::default() })?;
    /// store.transact(tusk::Commit::Async, |tx| {
    ///     let mut users = tx.art("users")?;
    ///     users.insert(b"ada", 1)?;
    ///     users.insert(b"alan", 2)?;
    ///     assert_eq!(users.get_many(&[b"alan".as_slice(), b"al", b"ada"])?, [Some(2), None, Some(1)]);
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn get_many(&mut self, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, Error> {
        Ok(self.tree.get_many(&mut self.tx.inner, keys)?)
    }

    /// Sets `key` to `value`; returns the value it replaced. A key longer than
    /// [`crate::ART_MAX_KEY_LEN`] fails with [`Error::KeyTooLong`].
    pub fn insert(&mut self, key: &[u8], value: u64) -> Result<Option<u64>, Error> {
        Ok(self.tree.insert(&mut self.tx.inner, key, value)?)
    }

    /// Removes `key`; returns the value it had.
    pub fn remove(&mut self, key: &[u8]) -> Result<Option<u64>, Error> {
        Ok(self.tree.remove(&mut self.tx.inner, key)?)
    }

    /// Applies a batch of upserts and removes of byte keys, in key order (sorted stably, so
    /// the last operation on a key wins): consecutive operations share the upper part of
    /// their paths while it is in cache. Equals applying them one by one; a key longer than
    /// [`crate::ART_MAX_KEY_LEN`] fails the batch with [`Error::KeyTooLong`] before anything
    /// changes.
    ///
    /// ```
    /// # use tusk::{ArtOp, Commit, Options, Store};
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path(), Options::default())?;
    /// store.transact(Commit::Sync, |tx| {
    ///     let mut names = tx.art("names")?;
    ///     names.insert(b"ada", 1)?;
    ///     let outcome = names.apply_batch(&[
    ///         ArtOp::Upsert { key: b"bob", value: 2 },
    ///         ArtOp::Upsert { key: b"ada", value: 3 },
    ///         ArtOp::Remove { key: b"eve" },
    ///     ])?;
    ///     assert_eq!((outcome.inserted, outcome.updated, outcome.absent), (1, 1, 1));
    ///     assert_eq!(names.get(b"ada")?, Some(3));
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn apply_batch(&mut self, ops: &[ArtOp<'_>]) -> Result<BatchOutcome, Error> {
        Ok(self.tree.apply_batch(&mut self.tx.inner, ops)?)
    }

    /// The entries with keys in `range`, in key order. Bounds are anything that views as bytes
    /// (`b"a".as_slice()..b"m"`, `Vec<u8>`); a full range needs its type named:
    /// `range::<&[u8]>(..)`.
    pub fn range<K: AsRef<[u8]>>(&mut self, range: impl RangeBounds<K>) -> Result<ArtRange<'_, 's>, Error> {
        Ok(ArtRange { inner: self.tree.range(&mut self.tx.inner, range)? })
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub fn prefix(&mut self, prefix: &[u8]) -> Result<ArtRange<'_, 's>, Error> {
        Ok(ArtRange { inner: self.tree.prefix(&mut self.tx.inner, prefix)? })
    }

    /// Number of keys in `range`.
    pub fn count<K: AsRef<[u8]>>(&mut self, range: impl RangeBounds<K>) -> Result<u64, Error> {
        Ok(self.tree.count(&mut self.tx.inner, range)?)
    }

    /// Sum of the values of the keys in `range`.
    pub fn sum<K: AsRef<[u8]>>(&mut self, range: impl RangeBounds<K>) -> Result<u128, Error> {
        Ok(self.tree.sum(&mut self.tx.inner, range)?)
    }

    /// Number of keys starting with `prefix`.
    pub fn count_prefix(&mut self, prefix: &[u8]) -> Result<u64, Error> {
        Ok(self.tree.count_prefix(&mut self.tx.inner, prefix)?)
    }

    /// Sum of the values of the keys starting with `prefix`.
    pub fn sum_prefix(&mut self, prefix: &[u8]) -> Result<u128, Error> {
        Ok(self.tree.sum_prefix(&mut self.tx.inner, prefix)?)
    }

    /// Walks the whole tree and verifies every invariant; returns its shape.
    pub fn check(&mut self) -> Result<ArtStats, Error> {
        Ok(self.tree.check(&mut self.tx.inner)?)
    }
}

/// Iterator over a range or prefix of an [`Art`]: `(key, value)` in key order.
pub struct ArtRange<'t, 's> {
    inner: ArtIter<'t, tusk_txn::Transaction<'s>>,
}

impl Iterator for ArtRange<'_, '_> {
    type Item = Result<(Vec<u8>, u64), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map_err(Error::from))
    }
}
