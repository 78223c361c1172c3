//! The Adaptive Radix Tree (Leis et al., ICDE 2013) of byte-string keys to u64 values, stored
//! in the transactional heap in CuART's (ICPP'21) layout, ready for a GPU mirror.
//!
//! A tree is a descriptor object (`meta.rs`) plus one slab per node or leaf kind (`slab.rs`):
//! N4, N16, N48, N256 (`node.rs`) and leaves by key-size class (`leaf.rs`). Child links are
//! packed u64s — kind in the high byte, slab index below (`link.rs`) — so the GPU buffer of a
//! kind is the concatenation of its slab chunks and a kernel follows links with bit math.
//!
//! - Path compression, hybrid: exact prefix length, 8 prefix bytes stored, longer prefixes
//!   completed from a leaf below when an update needs them.
//! - Lazy expansion: a key alone below a point is a single leaf holding the whole key.
//! - Keys that are prefixes of others (and the empty key): each inner node has a terminal
//!   link, the leaf of the key ending right after its prefix; it sorts before the children.
//! - Nodes grow on insert and shrink on remove; an N4 left with one entry collapses.
//!
//! Every read and write goes through [`crate::heap`] (reads through [`HeapRead`] only, so a
//! snapshot image runs them unchanged); updates are transactional heap writes, so logging,
//! checkpoints and recovery cover the tree with no code of its own. [`Art`] is a plain handle
//! (the descriptor's offset); operations take the heap (transaction) as an argument.

pub mod batch;
pub mod check;
pub mod insert;
pub mod leaf;
pub mod link;
pub mod meta;
pub mod node;
pub mod range;
pub mod remove;
pub mod search;
pub mod slab;

use std::ops::RangeBounds;

use tusk_storage::HeapPtr;
use tusk_txn::Transaction;

use crate::heap::{HeapRead, HeapWrite};
use crate::IndexError;
pub use batch::Op as ArtOp;
pub use check::ArtStats;
pub use link::MAX_KEY_LEN;
pub use range::ArtIter;
use range::Bounds;

/// A handle on an Adaptive Radix Tree in the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Art {
    meta: u64,
}

impl Art {
    /// Creates an empty tree (a descriptor; slabs are allocated on first use).
    pub fn create<H: HeapWrite>(heap: &mut H) -> Result<Art, IndexError> {
        Ok(Art { meta: meta::create(heap)? })
    }

    /// The tree whose descriptor is at `ptr`; fails if there is none.
    pub fn open<H: HeapRead>(heap: &mut H, ptr: HeapPtr) -> Result<Art, IndexError> {
        if ptr.is_null() || heap.load(ptr.offset() + meta::MAGIC_OFF)? != meta::MAGIC {
            return Err(IndexError::NotAnArt(ptr.offset()));
        }
        Ok(Art { meta: ptr.offset() })
    }

    /// The tree under the named root `name`, created (and the root set) if missing.
    pub fn named(tx: &mut Transaction<'_>, name: &str) -> Result<Art, IndexError> {
        crate::named::open_or_create(tx, name, Art::open, Art::create, Art::ptr)
    }

    /// The descriptor's pointer, to store under a root or in another object.
    pub fn ptr(&self) -> HeapPtr {
        HeapPtr(self.meta)
    }

    /// Number of keys: exact, the sum of the descriptor's per-thread stripes (one line each,
    /// see `meta.rs`) read in this transaction.
    pub fn len<H: HeapRead>(&self, heap: &mut H) -> Result<u64, IndexError> {
        Ok(meta::keys(heap, self.meta)?)
    }

    pub fn is_empty<H: HeapRead>(&self, heap: &mut H) -> Result<bool, IndexError> {
        Ok(self.len(heap)? == 0)
    }

    pub fn get<H: HeapRead>(&self, heap: &mut H, key: &[u8]) -> Result<Option<u64>, IndexError> {
        search::get(heap, self.meta, key)
    }

    /// The values under `keys`, in order: what `get` gives for each, with the descents of
    /// [`search::LOOKUP_GROUP`] keys at a time run side by side so their memory misses
    /// overlap. The way to look up many keys in one transaction.
    pub fn get_many<H: HeapRead>(&self, heap: &mut H, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, IndexError> {
        let mut out = vec![None; keys.len()];
        search::get_many(heap, self.meta, keys, &mut out)?;
        Ok(out)
    }

    /// Sets `key` to `value`; returns the value it had. Keys longer than [`MAX_KEY_LEN`] are
    /// refused with [`IndexError::KeyTooLong`].
    pub fn insert<H: HeapWrite>(&self, heap: &mut H, key: &[u8], value: u64) -> Result<Option<u64>, IndexError> {
        insert::insert(heap, self.meta, key, value)
    }

    /// Removes `key`; returns the value it had.
    pub fn remove<H: HeapWrite>(&self, heap: &mut H, key: &[u8]) -> Result<Option<u64>, IndexError> {
        remove::remove(heap, self.meta, key)
    }

    /// Applies a batch of upserts and removes in key order (see `batch.rs`); equals applying
    /// them one by one. A key too long fails the batch before anything changes.
    pub fn apply_batch<H: HeapWrite>(&self, heap: &mut H, ops: &[ArtOp<'_>]) -> Result<crate::btree::BatchOutcome, IndexError> {
        batch::apply_batch(heap, self.meta, ops)
    }

    /// The entries with keys in `range`, in key order (a key before its extensions).
    pub fn range<'h, H: HeapRead, K: AsRef<[u8]>>(&self, heap: &'h mut H, range: impl RangeBounds<K>) -> Result<ArtIter<'h, H>, IndexError> {
        ArtIter::new(heap, self.meta, Bounds::of(&range))
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub fn prefix<'h, H: HeapRead>(&self, heap: &'h mut H, prefix: &[u8]) -> Result<ArtIter<'h, H>, IndexError> {
        ArtIter::new(heap, self.meta, Bounds::prefix(prefix))
    }

    /// Number of keys in `range`.
    pub fn count<H: HeapRead, K: AsRef<[u8]>>(&self, heap: &mut H, range: impl RangeBounds<K>) -> Result<u64, IndexError> {
        Ok(range::aggregate(heap, self.meta, Bounds::of(&range), false)?.0)
    }

    /// Sum of the values of the keys in `range` (u128: cannot overflow).
    pub fn sum<H: HeapRead, K: AsRef<[u8]>>(&self, heap: &mut H, range: impl RangeBounds<K>) -> Result<u128, IndexError> {
        Ok(range::aggregate(heap, self.meta, Bounds::of(&range), true)?.1)
    }

    /// Number of keys starting with `prefix`.
    pub fn count_prefix<H: HeapRead>(&self, heap: &mut H, prefix: &[u8]) -> Result<u64, IndexError> {
        Ok(range::aggregate(heap, self.meta, Bounds::prefix(prefix), false)?.0)
    }

    /// Sum of the values of the keys starting with `prefix`.
    pub fn sum_prefix<H: HeapRead>(&self, heap: &mut H, prefix: &[u8]) -> Result<u128, IndexError> {
        Ok(range::aggregate(heap, self.meta, Bounds::prefix(prefix), true)?.1)
    }

    /// Walks the whole tree and verifies every invariant (see `check.rs`).
    pub fn check<H: HeapRead>(&self, heap: &mut H) -> Result<ArtStats, IndexError> {
        check::check(heap, self.meta)
    }
}
