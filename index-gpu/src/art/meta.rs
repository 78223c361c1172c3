//! The ART's descriptor: the one heap object a named root points at. It holds the root link,
//! the chunk tables of the per-kind slabs, and the counters (key count, slab cursors, free
//! lists, live counts) striped per thread, so a tree handle is just this object's offset and
//! every change is an ordinary transactional write.
//!
//! Layout version 2 (magic "tuskART2"), 64-byte aligned, 14,784 bytes:
//!
//! ```text
//! byte     0  line 0, read by every operation, written only when the root link changes
//!             word 0  magic "tuskART2"
//!             word 1  root link (0: empty tree)
//!             word 2  stripes: STRIPES, the number of stripe records below
//!             words 3..7 reserved
//! byte    64  per kind k (KINDS of them) one line at 64 + 64 k:
//!             word 0  handed out: the slab's indices 1..=it are taken from the chunks (by the
//!                     stripes, a batch at a time: `slab.rs`)
//!             words 1..7 reserved
//! byte   960  chunk tables: per kind k at 960 + 256 k, 32 words: heap offsets of the kind's
//!             chunks (0: not yet allocated). Read on every link followed (and by the GPU
//!             kernels, art.cu), written only when a chunk is allocated, so they share no line
//!             with anything written often.
//! byte  4544  stripe s (s in 0..STRIPES) at 4544 + 640 s, ten lines:
//!             lines 0..7, written only by the threads of stripe s (`crate::stripe`):
//!             byte 0   word 0 key delta: keys added minus removed by this stripe (two's
//!                      complement); the key count, `len()`, is the sum over the stripes
//!             byte 64 + 32 k, per kind k:
//!                      word 0  cursor: the next index this stripe hands out (0: none yet)
//!                      word 1  end: one past the last index of its current batch
//!                      word 2  live delta: slots taken minus freed by this stripe; the slots
//!                              in use of a kind are the sum over the stripes
//!                      word 3  reserved
//!             lines 8..9, written when the stripe frees or reuses slots, or another stripe
//!             adopts a list (`slab.rs`):
//!             byte 512 + 8 k: kind k's free-list head (index, 0: empty); a free slot's word 0
//!                      holds the next
//! ```
//!
//! The free-list heads have lines of their own because other stripes read them (when their
//! batch is spent): next to the cursors they would conflict with every insert of the owner.
//!
//! Why stripes: every insert takes a leaf slot and bumps the key count. With one cursor and
//! one count per tree, any two concurrent inserts wrote a common line and one aborted; now
//! each writes its own stripe's lines (and the nodes it changes). A kind's indices stay dense
//! (the GPU buffer is the concatenation of its chunks): a stripe takes a batch of consecutive
//! indices from the kind's handed-out word and hands them out one by one.
//!
//! Version 1 ("tuskART1", counters and chunk tables interleaved per kind) is not opened: its
//! trees report [`crate::IndexError::NotAnArt`].

use super::link::KINDS;
use crate::heap::{HeapRead, HeapWrite};
use crate::stripe::{self, STRIPES};
use tusk_txn::TxnError;

pub const MAGIC: u64 = u64::from_le_bytes(*b"tuskART2");
/// The descriptor's alignment: the lines above are the STM's units of conflict.
pub const META_ALIGN: u64 = stripe::DESCRIPTOR_ALIGN;

pub const MAGIC_OFF: u64 = stripe::MAGIC_OFF;
pub const ROOT_OFF: u64 = 8;
pub const STRIPE_COUNT_OFF: u64 = stripe::STRIPE_COUNT_OFF;

/// Per-kind lines holding the handed-out count.
pub const KINDS_OFF: u64 = 64;
pub const KIND_LINE: u64 = 64;

/// Per-kind chunk tables.
pub const CHUNKS: usize = 32;
pub const CHUNK_TABLES_OFF: u64 = KINDS_OFF + KINDS as u64 * KIND_LINE;
pub const CHUNK_TABLE_SIZE: u64 = 8 * CHUNKS as u64;

/// Stripe records.
pub const STRIPES_OFF: u64 = CHUNK_TABLES_OFF + KINDS as u64 * CHUNK_TABLE_SIZE;
pub const STRIPE_SIZE: u64 = 640;
pub const KEY_DELTA: u64 = 0;
/// A stripe's per-kind records start on its second line.
pub const STRIPE_KINDS_OFF: u64 = 64;
pub const STRIPE_KIND_SIZE: u64 = 32;
/// Words of a stripe's kind record.
pub const CURSOR: u64 = 0;
pub const END: u64 = 8;
pub const LIVE_DELTA: u64 = 16;
/// A stripe's free-list heads, one word per kind.
pub const STRIPE_FREE_OFF: u64 = 512;

pub const META_SIZE: u64 = STRIPES_OFF + STRIPES * STRIPE_SIZE;

const _: () = assert!(CHUNK_TABLES_OFF == 960 && STRIPES_OFF == 4544 && META_SIZE == 14_784);
const _: () = assert!(STRIPE_KINDS_OFF + KINDS as u64 * STRIPE_KIND_SIZE <= STRIPE_FREE_OFF);
const _: () = assert!(STRIPE_FREE_OFF + 8 * KINDS as u64 <= STRIPE_SIZE && STRIPE_FREE_OFF.is_multiple_of(64));
const _: () = assert!(STRIPES_OFF.is_multiple_of(META_ALIGN) && STRIPE_SIZE.is_multiple_of(META_ALIGN));

/// Heap offset of kind `kind`'s handed-out word.
#[inline]
pub fn handed_out(meta: u64, kind: u8) -> u64 {
    meta + KINDS_OFF + kind as u64 * KIND_LINE
}

/// Heap offset of chunk `c`'s entry in kind `kind`'s chunk table.
#[inline]
pub fn chunk_entry(meta: u64, kind: u8, c: u64) -> u64 {
    meta + CHUNK_TABLES_OFF + kind as u64 * CHUNK_TABLE_SIZE + c * 8
}

/// Heap offset of stripe `s`'s record.
#[inline]
pub fn stripe(meta: u64, s: u64) -> u64 {
    meta + STRIPES_OFF + s * STRIPE_SIZE
}

/// Heap offset of kind `kind`'s record in stripe `s`.
#[inline]
pub fn stripe_kind(meta: u64, s: u64, kind: u8) -> u64 {
    stripe(meta, s) + STRIPE_KINDS_OFF + kind as u64 * STRIPE_KIND_SIZE
}

/// Heap offset of kind `kind`'s free-list head in stripe `s`.
#[inline]
pub fn free_head(meta: u64, s: u64, kind: u8) -> u64 {
    stripe(meta, s) + STRIPE_FREE_OFF + kind as u64 * 8
}

/// The key count: the sum of the stripes' key deltas.
pub fn keys<H: HeapRead>(heap: &mut H, meta: u64) -> Result<u64, TxnError> {
    stripe::sum(heap, stripe(meta, 0) + KEY_DELTA, STRIPE_SIZE)
}

/// Slots of `kind` in use: the sum of the stripes' live deltas.
pub fn live<H: HeapRead>(heap: &mut H, meta: u64, kind: u8) -> Result<u64, TxnError> {
    stripe::sum(heap, stripe_kind(meta, 0, kind) + LIVE_DELTA, STRIPE_SIZE)
}

/// Adds `delta` to the key count (the calling thread's stripe).
pub fn add_keys<H: HeapWrite>(heap: &mut H, meta: u64, delta: i64) -> Result<(), TxnError> {
    stripe::add(heap, stripe(meta, stripe::current()) + KEY_DELTA, delta)
}

/// Allocates and formats an empty descriptor; returns its offset.
pub fn create<H: HeapWrite>(heap: &mut H) -> Result<u64, TxnError> {
    stripe::create_descriptor(heap, META_SIZE, MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels read the root link and the chunk tables in place (art.cu): their offsets
    /// there must be these.
    #[test]
    fn kernels_read_this_layout() {
        let src = tusk_kernels::source();
        for (name, value) in [("ART_ROOT", ROOT_OFF), ("ART_CHUNK_TABLES_OFF", CHUNK_TABLES_OFF), ("ART_CHUNK_TABLE_SIZE", CHUNK_TABLE_SIZE), ("ART_META_SIZE", META_SIZE)] {
            assert!(src.contains(&format!("#define {name} {value}ull")), "art.cu's {name} is not {value}");
        }
        assert!(src.contains(&format!("#define ART_CHUNKS {CHUNKS}\n")));
        assert!(src.contains(&format!("#define ART_KINDS {KINDS}\n")));
    }
}
