//! Leaves: one fixed-size slot per key, in the slab of the smallest class that fits the key
//! (lazy expansion: a key alone below some point is just its leaf, with no chain of nodes).
//!
//! ```text
//! word 0   key length in bytes
//! word 1   value
//! word 2.. key bytes, packed little-endian 8 per word, zero-padded
//! ```
//!
//! The leaf keeps the whole key, so a lookup that skipped prefix bytes (optimistic path
//! compression, see `node.rs`) is verified here, and the full prefix of any node can be read
//! from any leaf below it.

use super::link;
use super::slab;
use crate::heap::{HeapRead, HeapWrite};
use crate::IndexError;

pub const LEN: u64 = 0;
pub const VALUE: u64 = 8;
pub const KEY: u64 = 16;

/// A word of key bytes starting at `from` (zero-padded past the end).
#[inline]
pub fn key_word(key: &[u8], from: usize) -> u64 {
    let mut b = [0u8; 8];
    if from < key.len() {
        let n = (key.len() - from).min(8);
        b[..n].copy_from_slice(&key[from..from + n]);
    }
    u64::from_le_bytes(b)
}

/// Creates a leaf for (key, value); returns its link. `key.len()` ≤ MAX_KEY_LEN.
pub fn create<H: HeapWrite>(heap: &mut H, meta: u64, key: &[u8], value: u64) -> Result<u64, IndexError> {
    let link = slab::alloc(heap, meta, link::leaf_kind(key.len()))?;
    let off = slab::offset(heap, meta, link)?;
    heap.store(off + LEN, key.len() as u64)?;
    heap.store(off + VALUE, value)?;
    for (i, from) in (0..key.len()).step_by(8).enumerate() {
        heap.store(off + KEY + i as u64 * 8, key_word(key, from))?;
    }
    Ok(link)
}

/// Reads the key of the leaf at `off` (its stored length clamped to `cap`, the class capacity,
/// so a damaged length cannot read past the slot).
pub fn read_key<H: HeapRead>(heap: &mut H, off: u64, cap: usize) -> Result<Vec<u8>, IndexError> {
    let len = (heap.load(off + LEN)? as usize).min(cap);
    let mut key = Vec::with_capacity(len.next_multiple_of(8));
    for i in 0..len.div_ceil(8) {
        key.extend_from_slice(&heap.load(off + KEY + i as u64 * 8)?.to_le_bytes());
    }
    key.truncate(len);
    Ok(key)
}

/// Whether the leaf at `off` holds exactly `key` (no allocation).
#[inline]
pub fn matches<H: HeapRead>(heap: &mut H, off: u64, key: &[u8]) -> Result<bool, IndexError> {
    if heap.load(off + LEN)? != key.len() as u64 {
        return Ok(false);
    }
    let mut from = 0;
    while from < key.len() {
        if heap.load(off + KEY + from as u64)? != key_word(key, from) {
            return Ok(false);
        }
        from += 8;
    }
    Ok(true)
}

pub fn value<H: HeapRead>(heap: &mut H, off: u64) -> Result<u64, IndexError> {
    Ok(heap.load(off + VALUE)?)
}
