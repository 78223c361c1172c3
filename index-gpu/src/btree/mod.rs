//! The B-link tree (Lehman–Yao) of u64 keys to u64 values, stored in the transactional heap.
//!
//! A tree is a descriptor object (`meta.rs`) plus fixed-size nodes carved from its slab
//! (`slab.rs`, `layout.rs`). Every read and write goes through the heap traits of
//! [`crate::heap`], i.e. through the transaction: logging, checkpoints and recovery cover the
//! tree with no code of its own, and a conflict surfaces as [`IndexError::Txn`] for the caller
//! to retry the transaction.
//!
//! Updates: single-key `insert` (splits, `insert.rs`) and `remove` (redistribution, merges,
//! free list, `remove.rs`); `bulk_load` builds an empty tree bottom-up (`bulk.rs`);
//! `apply_batch` applies a sorted batch leaf by leaf, the update path of the GPU mirror
//! (`batch.rs`).
//!
//! [`BTree`] is a plain handle (the descriptor's heap offset); operations take the heap
//! (transaction) as an argument, so one handle serves any number of transactions.

pub mod batch;
pub mod bulk;
pub mod check;
pub mod insert;
pub mod layout;
pub mod meta;
pub mod path;
pub mod posts;
pub mod range;
pub mod remove;
pub mod search;
pub mod slab;

use std::ops::RangeBounds;

use tusk_storage::HeapPtr;
use tusk_txn::Transaction;

use crate::heap::{HeapRead, HeapWrite};
use crate::IndexError;
pub use batch::{BatchOutcome, Op};
pub use check::TreeStats;
pub use range::Range;
use range::KeySpan;

/// A handle on a B-link tree in the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BTree {
    meta: u64,
}

impl BTree {
    /// Creates an empty tree: a descriptor and one empty leaf as the root.
    pub fn create<H: HeapWrite>(heap: &mut H) -> Result<BTree, IndexError> {
        let meta = meta::create(heap)?;
        let root = slab::alloc_node(heap, meta)?;
        layout::write_header(heap, root, 0, 0, None, 0, layout::Fences { low_key: 0, owner: meta })?;
        heap.store(meta + meta::ROOT_OFF, root)?;
        heap.store(meta + meta::FENCED_OFF, meta::FENCED)?;
        Ok(BTree { meta })
    }

    /// The tree whose descriptor is at `ptr`; fails if there is none.
    ///
    /// In a transaction the magic is peeked (`HeapRead::peek_words`), not read: a descriptor's
    /// magic never changes while it lives, and what the transaction then does with the tree
    /// proves itself (a leaf names its owner, see `search.rs`). A read would put the
    /// descriptor's first line in the read set, and a transaction that runs in place locks
    /// every line of its read set to its end, so two large ones into one tree would wait for
    /// each other. Only a magic the peek does not find is read, so that the error is one the
    /// transaction's snapshot shows.
    pub fn open<H: HeapRead>(heap: &mut H, ptr: HeapPtr) -> Result<BTree, IndexError> {
        let at = ptr.offset() + meta::MAGIC_OFF;
        let mut magic = [0u64];
        let peeked = heap.tracks_reads() && heap.peek_words(at, &mut magic)? && magic[0] == meta::MAGIC;
        if ptr.is_null() || !peeked && heap.load(at)? != meta::MAGIC {
            return Err(IndexError::NotABTree(ptr.offset()));
        }
        Ok(BTree { meta: ptr.offset() })
    }

    /// The tree under the named root `name`, created (and the root set) if missing.
    pub fn named(tx: &mut Transaction<'_>, name: &str) -> Result<BTree, IndexError> {
        crate::named::open_or_create(tx, name, BTree::open, BTree::create, BTree::ptr)
    }

    /// The descriptor's pointer, to store under a root or in another object.
    pub fn ptr(&self) -> HeapPtr {
        HeapPtr(self.meta)
    }

    /// Number of entries: exact, the sum of the descriptor's per-thread stripes (one line
    /// each, see `meta.rs`) read in this transaction.
    pub fn len<H: HeapRead>(&self, heap: &mut H) -> Result<u64, IndexError> {
        Ok(meta::total(heap, self.meta, meta::KEY_DELTA)?)
    }

    pub fn is_empty<H: HeapRead>(&self, heap: &mut H) -> Result<bool, IndexError> {
        Ok(self.len(heap)? == 0)
    }

    pub fn get<H: HeapRead>(&self, heap: &mut H, key: u64) -> Result<Option<u64>, IndexError> {
        Ok(search::get(heap, self.meta, key)?)
    }

    /// The values under `keys`, in order: what `get` gives for each, with the descents of
    /// [`search::LOOKUP_GROUP`] keys at a time run side by side so their memory misses
    /// overlap. The way to look up many keys in one transaction.
    pub fn get_many<H: HeapRead>(&self, heap: &mut H, keys: &[u64]) -> Result<Vec<Option<u64>>, IndexError> {
        let mut out = vec![None; keys.len()];
        search::get_many(heap, self.meta, keys, &mut out)?;
        Ok(out)
    }

    /// Sets `key` to `value`; returns the value it had.
    pub fn insert<H: HeapWrite>(&self, heap: &mut H, key: u64, value: u64) -> Result<Option<u64>, IndexError> {
        Ok(insert::insert(heap, self.meta, key, value)?)
    }

    /// Sets `key` to `value(old)` (`old`: its value, `None` when absent) in one descent;
    /// returns `old`. A read-modify-write without the second descent of `get` + `insert`.
    pub fn update<H: HeapWrite>(&self, heap: &mut H, key: u64, value: impl FnOnce(Option<u64>) -> u64) -> Result<Option<u64>, IndexError> {
        Ok(insert::update(heap, self.meta, key, value)?)
    }

    /// Removes `key`; returns the value it had. Underfull nodes are repaired by redistribution
    /// or merging (see `remove.rs`); freed nodes are reused by later inserts.
    pub fn remove<H: HeapWrite>(&self, heap: &mut H, key: u64) -> Result<Option<u64>, IndexError> {
        Ok(remove::remove(heap, self.meta, key)?)
    }

    /// Loads an empty tree from `pairs`, whose keys must strictly ascend, bottom-up with the
    /// nodes filled to `fill` (a fraction of CAPACITY, clamped so every node holds at least
    /// MIN_FILL); returns the number of keys loaded. Fails with [`IndexError::NotEmpty`] on a
    /// tree with keys, and with [`IndexError::NotSorted`] at the first key not above its
    /// predecessor, leaving the tree empty and valid (see `bulk.rs`).
    pub fn bulk_load<H: HeapWrite>(&self, heap: &mut H, pairs: impl IntoIterator<Item = (u64, u64)>, fill: f64) -> Result<u64, IndexError> {
        bulk::bulk_load(heap, self.meta, pairs, fill)
    }

    /// Applies a batch of upserts and removals with one descent per touched leaf; the result
    /// equals applying `ops` one by one in order (see `batch.rs`).
    pub fn apply_batch<H: HeapWrite>(&self, heap: &mut H, ops: &[Op]) -> Result<BatchOutcome, IndexError> {
        Ok(batch::apply_batch(heap, self.meta, ops, batch::OPS_PER_BUCKET)?)
    }

    /// [`BTree::apply_batch`] with the batch cut into key-range buckets of about
    /// `ops_per_bucket` operations (tests: a large batch's buckets, at a small size).
    #[doc(hidden)]
    pub fn apply_batch_in_buckets<H: HeapWrite>(&self, heap: &mut H, ops: &[Op], ops_per_bucket: usize) -> Result<BatchOutcome, IndexError> {
        Ok(batch::apply_batch(heap, self.meta, ops, ops_per_bucket)?)
    }

    /// The entries with keys in `range`, in key order.
    pub fn range<'h, H: HeapRead>(&self, heap: &'h mut H, range: impl RangeBounds<u64>) -> Result<Range<'h, H>, IndexError> {
        Ok(Range::new(heap, self.meta, KeySpan::of(&range))?)
    }

    /// Number of keys in `range`.
    pub fn count<H: HeapRead>(&self, heap: &mut H, range: impl RangeBounds<u64>) -> Result<u64, IndexError> {
        let mut n = 0u64;
        range::for_each_run(heap, self.meta, KeySpan::of(&range), |_, _, from, to| {
            n += (to - from) as u64;
            Ok(())
        })?;
        Ok(n)
    }

    /// Sum of the values of the keys in `range` (u128: it cannot overflow for any tree that
    /// fits a heap).
    pub fn sum<H: HeapRead>(&self, heap: &mut H, range: impl RangeBounds<u64>) -> Result<u128, IndexError> {
        let mut total = 0u128;
        range::for_each_run(heap, self.meta, KeySpan::of(&range), |heap, leaf, from, to| {
            for i in from..to {
                total += layout::value(heap, leaf, i)? as u128;
            }
            Ok(())
        })?;
        Ok(total)
    }

    /// Walks the whole tree and verifies every invariant (see `check.rs`).
    pub fn check<H: HeapRead>(&self, heap: &mut H) -> Result<TreeStats, IndexError> {
        check::check(heap, self.meta)
    }
}
