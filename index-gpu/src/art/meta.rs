//! The ART's descriptor: the one heap object a named root points at. It holds the root link,
//! the key count (so `len()` is O(1)), and per kind the slab bookkeeping, so a tree handle is
//! just this object's offset and every change is an ordinary transactional write.
//!
//! ```text
//! byte  0  word 0   magic "tuskART1"
//! byte  8  word 1   root link (0: empty tree)
//! byte 16  word 2   key count
//! byte 24  words 3..7 reserved
//! byte 64  per kind k (KINDS of them), KIND_STRIDE = 288 bytes each:
//!          word 0   handed out: slots ever taken from the chunks (the highest index in use)
//!          word 1   live: slots in use (handed out minus free)
//!          word 2   free-list head (index, 0: empty); a free slot's word 0 holds the next
//!          word 3   reserved
//!          words 4..35  heap offsets of the 32 chunks (0: not yet allocated)
//! ```
//!
//! 64 + 14 × 288 = 4096 bytes.

use super::link::KINDS;

pub const MAGIC: u64 = u64::from_le_bytes(*b"tuskART1");

pub const MAGIC_OFF: u64 = 0;
pub const ROOT_OFF: u64 = 8;
pub const KEY_COUNT_OFF: u64 = 16;

pub const KINDS_OFF: u64 = 64;
pub const CHUNKS: usize = 32;
pub const KIND_STRIDE: u64 = 32 + 8 * CHUNKS as u64;
pub const HANDED_OUT: u64 = 0;
pub const LIVE: u64 = 8;
pub const FREE_HEAD: u64 = 16;
pub const CHUNK_TABLE: u64 = 32;

pub const META_SIZE: u64 = KINDS_OFF + KINDS as u64 * KIND_STRIDE;

/// Heap offset of kind `kind`'s slab record in the descriptor at `meta`.
#[inline]
pub fn kind_rec(meta: u64, kind: u8) -> u64 {
    meta + KINDS_OFF + kind as u64 * KIND_STRIDE
}
