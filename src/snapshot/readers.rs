//! The index handles of a snapshot: the read verbs of the B-link tree and the ART, answered
//! at the snapshot's LSN. Point lookups on an image call the tree directly (the hot path of
//! query readers); everything else goes through [`Query`], on the image or in the fork child.
//! Ranges come in pages (one descent each, then the leaf chain), so a fork child never has
//! to hold an iterator between calls.

use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

use tusk_index::btree::TreeStats;
use tusk_index::ArtStats;
use tusk_storage::HeapPtr;

use super::query::{Answer, ByteKeys, Keys, Query};
use super::{unexpected, Snapshot};
use crate::Error;

/// Entries per page of a range over an image (answers from a fork child are bounded by its
/// shared memory instead).
const PAGE_ENTRIES: u64 = 4096;

impl Snapshot {
    /// The B-link tree under the root `name` ([`Error::NoSuchRoot`] if there is none).
    pub fn btree(&self, name: &str) -> Result<SnapshotBTree<'_>, Error> {
        self.btree_at(self.named(name)?)
    }

    /// The B-link tree whose descriptor is at `ptr`.
    pub fn btree_at(&self, ptr: HeapPtr) -> Result<SnapshotBTree<'_>, Error> {
        expect_unit(self.ask(&Query::OpenBTree(ptr.offset()))?)?;
        Ok(SnapshotBTree { snap: self, meta: ptr.offset() })
    }

    /// The ART under the root `name` ([`Error::NoSuchRoot`] if there is none).
    pub fn art(&self, name: &str) -> Result<SnapshotArt<'_>, Error> {
        self.art_at(self.named(name)?)
    }

    /// The ART whose descriptor is at `ptr`.
    pub fn art_at(&self, ptr: HeapPtr) -> Result<SnapshotArt<'_>, Error> {
        expect_unit(self.ask(&Query::OpenArt(ptr.offset()))?)?;
        Ok(SnapshotArt { snap: self, meta: ptr.offset() })
    }

    /// Keys per batch so that a batch's query and answer fit the fork child's memory.
    fn batch_keys(&self, bytes_per_key: usize) -> usize {
        (self.answer_capacity() / 2 / bytes_per_key.max(9)).clamp(1, 1 << 20)
    }
}

fn expect_unit(a: Answer) -> Result<(), Error> {
    match a {
        Answer::Unit => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn expect_u64(a: Answer) -> Result<u64, Error> {
    match a {
        Answer::U64(v) => Ok(v),
        other => Err(unexpected(other)),
    }
}

fn expect_u128(a: Answer) -> Result<u128, Error> {
    match a {
        Answer::U128(v) => Ok(v),
        other => Err(unexpected(other)),
    }
}

fn expect_values(a: Answer, n: usize) -> Result<Vec<Option<u64>>, Error> {
    match a {
        Answer::Values(v) if v.len() == n => Ok(v),
        other => Err(unexpected(other)),
    }
}

fn owned_bounds(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

/// A B-link tree of a snapshot: read verbs only.
#[derive(Clone, Copy)]
pub struct SnapshotBTree<'s> {
    snap: &'s Snapshot,
    meta: u64,
}

impl<'s> SnapshotBTree<'s> {
    /// Number of keys.
    pub fn len(&self) -> Result<u64, Error> {
        expect_u64(self.snap.ask(&Query::BTreeLen(self.meta))?)
    }

    /// Whether the tree holds no key.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// The value under `key`.
    pub fn get(&self, key: u64) -> Result<Option<u64>, Error> {
        if let Some(mut image) = self.snap.image() {
            return Ok(tusk_index::BTree::open(&mut image, HeapPtr(self.meta))?.get(&mut image, key)?);
        }
        Ok(self.get_many(&[key])?[0])
    }

    /// The values under `keys`, in order (one round trip per batch for a fork snapshot).
    pub fn get_many(&self, keys: &[u64]) -> Result<Vec<Option<u64>>, Error> {
        let mut out = Vec::with_capacity(keys.len());
        for batch in keys.chunks(self.snap.batch_keys(9)) {
            out.extend(expect_values(self.snap.ask(&Query::BTreeGet { meta: self.meta, keys: Keys::Numbers(batch) })?, batch.len())?);
        }
        Ok(out)
    }

    /// Number of keys in `range`.
    pub fn count(&self, range: impl RangeBounds<u64>) -> Result<u64, Error> {
        expect_u64(self.snap.ask(&Query::BTreeCount { meta: self.meta, range: owned_bounds(&range) })?)
    }

    /// Sum of the values of the keys in `range`.
    pub fn sum(&self, range: impl RangeBounds<u64>) -> Result<u128, Error> {
        expect_u128(self.snap.ask(&Query::BTreeSum { meta: self.meta, range: owned_bounds(&range) })?)
    }

    /// The entries with keys in `range`, in key order.
    pub fn range(&self, range: impl RangeBounds<u64>) -> SnapshotBTreeRange<'s> {
        SnapshotBTreeRange { tree: *self, next: Some(owned_bounds(&range)), page: VecDeque::new() }
    }

    /// Walks the whole tree and verifies every invariant; returns its shape.
    pub fn check(&self) -> Result<TreeStats, Error> {
        match self.snap.ask(&Query::BTreeCheck(self.meta))? {
            Answer::BTreeStats(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }
}

/// The entries of a range of a [`SnapshotBTree`], fetched a page at a time.
pub struct SnapshotBTreeRange<'s> {
    tree: SnapshotBTree<'s>,
    /// The part of the range not fetched yet; `None` once it is all fetched.
    next: Option<(Bound<u64>, Bound<u64>)>,
    page: VecDeque<(u64, u64)>,
}

impl Iterator for SnapshotBTreeRange<'_> {
    type Item = Result<(u64, u64), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.page.is_empty() {
            let range = self.next.take()?;
            let max = (self.tree.snap.answer_capacity() as u64 / 32).clamp(1, PAGE_ENTRIES);
            match self.tree.snap.ask(&Query::BTreePage { meta: self.tree.meta, range, max }) {
                Ok(Answer::BTreePage(page, more)) => {
                    if more {
                        let last = page.last().map(|&(k, _)| k);
                        self.next = last.map(|k| (Bound::Excluded(k), range.1));
                    }
                    self.page = page.into();
                }
                Ok(other) => return Some(Err(unexpected(other))),
                Err(e) => return Some(Err(e)),
            }
        }
        self.page.pop_front().map(Ok)
    }
}

fn borrowed_bounds<'k, K: AsRef<[u8]> + 'k>(range: &'k impl RangeBounds<K>) -> (Bound<&'k [u8]>, Bound<&'k [u8]>) {
    fn map<'k, K: AsRef<[u8]> + 'k>(b: Bound<&'k K>) -> Bound<&'k [u8]> {
        match b {
            Bound::Included(k) => Bound::Included(k.as_ref()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref()),
            Bound::Unbounded => Bound::Unbounded,
        }
    }
    (map(range.start_bound()), map(range.end_bound()))
}

/// An ART of a snapshot: read verbs only.
#[derive(Clone, Copy)]
pub struct SnapshotArt<'s> {
    snap: &'s Snapshot,
    meta: u64,
}

impl<'s> SnapshotArt<'s> {
    /// Number of keys.
    pub fn len(&self) -> Result<u64, Error> {
        expect_u64(self.snap.ask(&Query::ArtLen(self.meta))?)
    }

    /// Whether the tree holds no key.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// The value under `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<u64>, Error> {
        if let Some(mut image) = self.snap.image() {
            return Ok(tusk_index::Art::open(&mut image, HeapPtr(self.meta))?.get(&mut image, key)?);
        }
        Ok(self.get_many(&[key])?[0])
    }

    /// The values under `keys`, in order (one round trip per batch for a fork snapshot).
    pub fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, Error> {
        let longest = keys.iter().map(|k| k.len()).max().unwrap_or(0);
        let mut out = Vec::with_capacity(keys.len());
        for batch in keys.chunks(self.snap.batch_keys(longest + 4)) {
            let packed = ByteKeys::pack(batch);
            out.extend(expect_values(self.snap.ask(&Query::ArtGet { meta: self.meta, keys: ByteKeys(&packed) })?, batch.len())?);
        }
        Ok(out)
    }

    /// Number of keys in `range`.
    pub fn count<K: AsRef<[u8]>>(&self, range: impl RangeBounds<K>) -> Result<u64, Error> {
        expect_u64(self.snap.ask(&Query::ArtCount { meta: self.meta, range: borrowed_bounds(&range) })?)
    }

    /// Sum of the values of the keys in `range`.
    pub fn sum<K: AsRef<[u8]>>(&self, range: impl RangeBounds<K>) -> Result<u128, Error> {
        expect_u128(self.snap.ask(&Query::ArtSum { meta: self.meta, range: borrowed_bounds(&range) })?)
    }

    /// Number of keys starting with `prefix`.
    pub fn count_prefix(&self, prefix: &[u8]) -> Result<u64, Error> {
        expect_u64(self.snap.ask(&Query::ArtCountPrefix { meta: self.meta, prefix })?)
    }

    /// Sum of the values of the keys starting with `prefix`.
    pub fn sum_prefix(&self, prefix: &[u8]) -> Result<u128, Error> {
        expect_u128(self.snap.ask(&Query::ArtSumPrefix { meta: self.meta, prefix })?)
    }

    /// The entries with keys in `range`, in key order.
    pub fn range<K: AsRef<[u8]>>(&self, range: impl RangeBounds<K>) -> SnapshotArtRange<'s> {
        let (lo, hi) = borrowed_bounds(&range);
        SnapshotArtRange { tree: *self, next: Some((lo.map(<[u8]>::to_vec), hi.map(<[u8]>::to_vec))), page: VecDeque::new() }
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> SnapshotArtRange<'s> {
        let bounds = tusk_index::art::range::Bounds::prefix(prefix);
        let end = bounds.hi.map_or(Bound::Unbounded, Bound::Excluded);
        SnapshotArtRange { tree: *self, next: Some((Bound::Included(bounds.lo), end)), page: VecDeque::new() }
    }

    /// Walks the whole tree and verifies every invariant; returns its shape.
    pub fn check(&self) -> Result<ArtStats, Error> {
        match self.snap.ask(&Query::ArtCheck(self.meta))? {
            Answer::ArtStats(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }
}

/// Bounds of byte-string keys, owned.
type OwnedBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// The entries of a range of a [`SnapshotArt`], fetched a page at a time.
pub struct SnapshotArtRange<'s> {
    tree: SnapshotArt<'s>,
    next: Option<OwnedBounds>,
    page: VecDeque<(Vec<u8>, u64)>,
}

impl Iterator for SnapshotArtRange<'_> {
    type Item = Result<(Vec<u8>, u64), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.page.is_empty() {
            let (lo, hi) = self.next.take()?;
            let max_bytes = (self.tree.snap.answer_capacity() as u64 / 4).clamp(4096, PAGE_ENTRIES * 64);
            let range = (lo.as_ref().map(Vec::as_slice), hi.as_ref().map(Vec::as_slice));
            match self.tree.snap.ask(&Query::ArtPage { meta: self.tree.meta, range, max_bytes }) {
                Ok(Answer::ArtPage(page, more)) => {
                    if more {
                        if let Some((last, _)) = page.last() {
                            self.next = Some((Bound::Excluded(last.clone()), hi));
                        }
                    }
                    self.page = page.into();
                }
                Ok(other) => return Some(Err(unexpected(other))),
                Err(e) => return Some(Err(e)),
            }
        }
        self.page.pop_front().map(Ok)
    }
}
