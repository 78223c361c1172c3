//! The tree's descriptor: one heap object that a named root (or any other object) points at.
//! Everything about the tree that is not a node lives here, so that a tree handle is just
//! this object's offset and every change to the tree is an ordinary transactional write.
//!
//! Layout version 2 (magic "tuskBLT2"), 64-byte aligned, 2112 bytes:
//!
//! ```text
//! byte   0  line 0, read by every operation, written only when the root changes
//!           word 0  magic            identifies a B-link tree descriptor (and its layout)
//!           word 1  root             heap offset of the root node (the GPU kernels read it)
//!           word 2  stripes          STRIPES, the number of stripe lines below
//!           word 3  fenced           1: every node carries its low key and owner
//!                                    (`layout.rs`), so descents in a transaction may peek
//!                                    (`search.rs`); 0 in trees made before, whose descents
//!                                    read every node through the transaction
//!           words 4..7 reserved (zero)
//! byte  64  stripe s (s in 0..STRIPES) at 64 + 128 s, two lines, the first written only by
//!           the threads of stripe s (`crate::stripe`):
//!           word 0  key delta        keys this stripe added minus removed (two's complement);
//!                                    the key count, `len()`, is the sum over the stripes
//!           word 1  node delta       nodes this stripe took minus freed; the nodes in use are
//!                                    the sum
//!           word 2  slab cursor      next unused node of this stripe's slab chunk (0: none)
//!           word 3  slab end         end of that chunk
//!           word 4  handed out       nodes ever carved from this stripe's chunks; the sum over
//!                                    the stripes is what `check()` accounts for (in use + free)
//!           word 5  chunks           slab chunks this stripe allocated
//!           word 6  last chunk       heap offset of the newest of them (0: none); each chunk's
//!                                    first word holds the one before it (`slab.rs`), so the
//!                                    index-only GPU mirror finds every node's pages
//!           word 7  reserved (zero)
//!           second line, written by the stripe's threads when they free nodes or reuse them,
//!           and by another stripe's thread that adopts the list (`slab.rs`):
//!           word 8  free list head   heap offset of the first node on this stripe's free list
//!                                    (0: none); each freed node keeps the next one's offset in
//!                                    its first word
//!           words 9..15 reserved (zero)
//! ```
//!
//! The free list head has a line of its own because other stripes read it, when their chunk
//! is spent: on the first line it would conflict with every insert of the owner.
//!
//! Why stripes: with one key count and one slab cursor, every two concurrent inserts wrote a
//! common line and one of them aborted, whatever leaves they touched. Now an insert writes its
//! leaf (and, on a split, its parents) and its own stripe's line only.
//!
//! Trees made before the chunk words existed have zeros there while their stripes hold nodes:
//! they work everywhere except in the index-only GPU mirror, which cannot find their chunks
//! (`slab::listed_chunks` says so).
//!
//! Version 1 ("tuskBLT1", one 64-byte line holding all counters) is not opened: its trees
//! report [`crate::IndexError::NotABTree`].

use crate::heap::{HeapRead, HeapWrite};
use crate::stripe::{self, STRIPES};
use tusk_txn::TxnError;

pub const MAGIC: u64 = u64::from_le_bytes(*b"tuskBLT2");
/// The descriptor's alignment: every stripe must own its cache line (the STM's unit).
pub const META_ALIGN: u64 = stripe::DESCRIPTOR_ALIGN;

pub const MAGIC_OFF: u64 = stripe::MAGIC_OFF;
pub const ROOT_OFF: u64 = 8;
pub const STRIPE_COUNT_OFF: u64 = stripe::STRIPE_COUNT_OFF;
pub const FENCED_OFF: u64 = 24;
/// The fenced word's value in a fenced tree.
pub const FENCED: u64 = 1;

/// First stripe line, and bytes per stripe.
pub const STRIPES_OFF: u64 = 64;
pub const STRIPE_SIZE: u64 = 128;
/// Words of a stripe, relative to its start.
pub const KEY_DELTA: u64 = 0;
pub const NODE_DELTA: u64 = 8;
pub const SLAB_CURSOR: u64 = 16;
pub const SLAB_END: u64 = 24;
pub const HANDED_OUT: u64 = 32;
pub const CHUNKS: u64 = 40;
pub const LAST_CHUNK: u64 = 48;
pub const FREE_HEAD: u64 = 64;

pub const META_SIZE: u64 = STRIPES_OFF + STRIPES * STRIPE_SIZE;

const _: () = assert!(LAST_CHUNK + 8 <= FREE_HEAD && CHUNKS > HANDED_OUT && FREE_HEAD.is_multiple_of(64) && STRIPE_SIZE.is_multiple_of(META_ALIGN));
const _: () = assert!(META_SIZE == 2112);

/// Heap offset of stripe `s` in the descriptor at `meta`.
#[inline]
pub fn stripe(meta: u64, s: u64) -> u64 {
    meta + STRIPES_OFF + s * STRIPE_SIZE
}

/// The calling thread's stripe.
#[inline]
pub fn my_stripe(meta: u64) -> u64 {
    stripe(meta, stripe::current())
}

/// A counter summed over the stripes (`field` is one of the stripe word offsets).
pub fn total<H: HeapRead>(heap: &mut H, meta: u64, field: u64) -> Result<u64, TxnError> {
    stripe::sum(heap, stripe(meta, 0) + field, STRIPE_SIZE)
}

/// Adds `delta` to the key count (the calling thread's stripe).
pub fn add_keys<H: HeapWrite>(heap: &mut H, meta: u64, delta: i64) -> Result<(), TxnError> {
    stripe::add(heap, my_stripe(meta) + KEY_DELTA, delta)
}

/// Allocates and formats an empty descriptor (no root yet); returns its offset.
pub fn create<H: HeapWrite>(heap: &mut H) -> Result<u64, TxnError> {
    stripe::create_descriptor(heap, META_SIZE, MAGIC)
}

#[cfg(test)]
mod tests {
    /// The kernels read the root at byte 8 of the descriptor (btree.cu: the scanning and the
    /// sector-searching lookups, the ranges): it must stay there.
    #[test]
    fn kernels_read_the_root_here() {
        let src = tusk_kernels::source();
        assert_eq!(super::ROOT_OFF, 8);
        assert_eq!(src.matches("const u64 root = tusk_ld(v.base, dmeta + 8);").count(), 3);
    }
}
