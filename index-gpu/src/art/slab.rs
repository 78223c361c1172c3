//! Per-kind slabs. Each kind's slots live in up to 32 chunks of geometrically growing size:
//! chunk c holds `2^(base + c)` slots (`base` from [`link::base_log2`], about 16 KiB for the
//! first chunk), so the 1-based index i maps to (chunk, slot) with bit math:
//!
//! ```text
//! x = i - 1 + 2^base;   c = floor(log2 x) - base;   slot = x - 2^(base + c)
//! ```
//!
//! Chunks never move and are never reallocated; indices stay dense, so the kind's GPU buffer
//! is the concatenation of its chunks (index i - 1 in that buffer). Chunk offsets are kept in
//! the descriptor (`meta.rs`), and each chunk is 64-byte aligned inside its allocation.
//!
//! A freed slot goes on the kind's free list (its word 0 holds the next index) and is reused
//! first; a reused slot is zeroed. Live counts are kept in the descriptor so that `check()`
//! can account for every slot: reachable + free == handed out.

use super::link::{self, base_log2, slot_size};
use super::meta::{kind_rec, CHUNKS, CHUNK_TABLE, FREE_HEAD, HANDED_OUT, LIVE};
use crate::heap::{HeapRead, HeapWrite};
use crate::IndexError;

/// Chunk number and slot within it of the 1-based `index` of `kind` (index ≥ 1). The chunk may
/// be ≥ CHUNKS for an index beyond the slab's capacity; callers that must not trust the index
/// check it against the handed-out count first.
#[inline]
pub fn locate(kind: u8, index: u64) -> (u64, u64) {
    let base = base_log2(kind);
    let x = index.wrapping_sub(1).wrapping_add(1 << base);
    let top = 63 - x.leading_zeros() as u64;
    let c = top.wrapping_sub(base as u64);
    (c, x - (1 << top))
}

/// Heap offset of the slot a (non-null) link names. Reads one word of the descriptor (the
/// chunk offset). Does not validate the index: the read paths trust the structure, and
/// `check()` validates indices before calling this.
#[inline]
pub fn offset<H: HeapRead>(heap: &mut H, meta: u64, link: u64) -> Result<u64, IndexError> {
    let kind = link::kind(link);
    let (c, s) = locate(kind, link::index(link));
    let chunk = heap.load(kind_rec(meta, kind % link::KINDS as u8) + CHUNK_TABLE + (c % CHUNKS as u64) * 8)?;
    Ok(chunk.wrapping_add(s.wrapping_mul(slot_size(kind))))
}

/// Takes a zeroed slot of `kind`; returns its link.
pub fn alloc<H: HeapWrite>(heap: &mut H, meta: u64, kind: u8) -> Result<u64, IndexError> {
    let rec = kind_rec(meta, kind);
    let live = heap.load(rec + LIVE)?;
    heap.store(rec + LIVE, live + 1)?;
    let free = heap.load(rec + FREE_HEAD)?;
    if free != 0 {
        let link = link::pack(kind, free);
        let off = offset(heap, meta, link)?;
        let next = heap.load(off)?;
        heap.store(rec + FREE_HEAD, next)?;
        for w in 0..slot_size(kind) / 8 {
            heap.store(off + w * 8, 0)?;
        }
        return Ok(link);
    }
    let index = heap.load(rec + HANDED_OUT)? + 1;
    let (c, s) = locate(kind, index);
    if c >= CHUNKS as u64 {
        return Err(IndexError::ArtInvariant { node: meta, what: format!("slab of {} is full", link::kind_name(kind)) });
    }
    if s == 0 {
        let slots = 1u64 << (base_log2(kind) + c as u32);
        let raw = heap.alloc(slots * slot_size(kind) + 64)?;
        heap.store(rec + CHUNK_TABLE + c * 8, raw.next_multiple_of(64))?;
    }
    heap.store(rec + HANDED_OUT, index)?;
    Ok(link::pack(kind, index))
}

/// Puts the slot `link` names on its kind's free list.
pub fn free<H: HeapWrite>(heap: &mut H, meta: u64, link: u64) -> Result<(), IndexError> {
    let kind = link::kind(link);
    let rec = kind_rec(meta, kind);
    let off = offset(heap, meta, link)?;
    let head = heap.load(rec + FREE_HEAD)?;
    heap.store(off, head)?;
    heap.store(rec + FREE_HEAD, link::index(link))?;
    let live = heap.load(rec + LIVE)?;
    heap.store(rec + LIVE, live.wrapping_sub(1))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_is_dense() {
        for kind in 0..link::KINDS as u8 {
            let base = base_log2(kind);
            let mut expect = (0u64, 0u64);
            for i in 1..5000u64 {
                assert_eq!(locate(kind, i), expect, "kind {kind} index {i}");
                expect.1 += 1;
                if expect.1 == 1 << (base + expect.0 as u32) {
                    expect = (expect.0 + 1, 0);
                }
            }
        }
    }
}
