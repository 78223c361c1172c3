//! The tree's descriptor: one small heap object that a named root (or any other object) points
//! at. Everything about the tree that is not a node lives here, so that a tree handle is just
//! this object's offset and every change to the tree is an ordinary transactional write.
//!
//! ```text
//! word 0  magic            identifies a B-link tree descriptor
//! word 1  root             heap offset of the root node
//! word 2  slab cursor      next unused node of the current slab chunk (0: none)
//! word 3  slab end         end of the current slab chunk
//! word 4  node count       nodes handed out by the slab and in use
//! word 5  key count        entries in the leaves (so `len()` is O(1))
//! word 6  free list head   heap offset of the first freed node (0: none); each freed node
//!                          keeps the next one's offset in its first word
//! word 7  handed out       nodes ever carved from slab chunks (in use + free), so `check()`
//!                          can prove no node leaked: reused free nodes do not count again
//! ```

pub const MAGIC: u64 = u64::from_le_bytes(*b"tuskBLT1");
pub const META_SIZE: u64 = 64;

pub const MAGIC_OFF: u64 = 0;
pub const ROOT_OFF: u64 = 8;
pub const SLAB_CURSOR_OFF: u64 = 16;
pub const SLAB_END_OFF: u64 = 24;
pub const NODE_COUNT_OFF: u64 = 32;
pub const KEY_COUNT_OFF: u64 = 40;
pub const FREE_HEAD_OFF: u64 = 48;
pub const HANDED_OUT_OFF: u64 = 56;

const _: () = assert!(HANDED_OUT_OFF + 8 == META_SIZE);
