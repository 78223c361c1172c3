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
//! Allocation is striped per thread (`meta.rs`): a stripe takes a batch of [`batch`]
//! consecutive indices from the kind's handed-out word at once (allocating the chunks they
//! fall in) and hands them out one by one from its own cursor, so concurrent inserts write no
//! common word, and the batch covers whole cache lines, so two threads' fresh slots never
//! share one either. Indices stay dense; the unused rest of a stripe's batch is zero, like
//! any slot never handed out.
//!
//! A freed slot goes on the freeing stripe's free list of its kind (its word 0 holds the next
//! index) and is reused first. When a stripe takes a new batch it also adopts another
//! stripe's whole free list of the kind, if any, to use before the batch (one write to that
//! stripe's free-list line, and one scan of the other stripes per batch, so owners are rarely
//! disturbed). A reused slot is zeroed. Live counts are kept per stripe so that
//! `check()` can account for every slot: reachable + free + unused batch rests == handed out.

use super::link::{self, base_log2, slot_size};
use super::meta::{self, CHUNKS, CURSOR, END, LIVE_DELTA};
use crate::heap::{HeapRead, HeapWrite};
use crate::stripe::{self, STRIPES};
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

/// Indices a stripe takes at once: about 4 KiB of slots, a power of two ≥ 2 (so a batch is
/// whole cache lines: slot sizes are multiples of 32 bytes) and at most the first chunk's
/// slots (so, the chunks being powers of two from there on, a batch never spans two chunks).
pub fn batch(kind: u8) -> u64 {
    (4096 / slot_size(kind)).next_power_of_two().max(2).min(1 << base_log2(kind))
}

/// Heap offset of the slot a (non-null) link names. Reads one word of the descriptor (the
/// chunk offset). Does not validate the index: the read paths trust the structure, and
/// `check()` validates indices before calling this.
#[inline]
pub fn offset<H: HeapRead>(heap: &mut H, meta: u64, link: u64) -> Result<u64, IndexError> {
    let kind = link::kind(link);
    let (c, s) = locate(kind, link::index(link));
    let chunk = heap.load(meta::chunk_entry(meta, kind % link::KINDS as u8, c % CHUNKS as u64))?;
    Ok(chunk.wrapping_add(s.wrapping_mul(slot_size(kind))))
}

/// Takes a zeroed slot of `kind`; returns its link.
pub fn alloc<H: HeapWrite>(heap: &mut H, meta: u64, kind: u8) -> Result<u64, IndexError> {
    let mine = stripe::current();
    let rec = meta::stripe_kind(meta, mine, kind);
    let free = meta::free_head(meta, mine, kind);
    stripe::add(heap, rec + LIVE_DELTA, 1)?;
    if let Some(link) = pop_free(heap, meta, free, kind)? {
        return Ok(link);
    }
    let mut index = heap.load(rec + CURSOR)?;
    if index == 0 || index == heap.load(rec + END)? {
        index = take_batch(heap, meta, kind)?;
        heap.store(rec + END, index + batch(kind))?;
        if adopt(heap, meta, mine, kind)? {
            heap.store(rec + CURSOR, index)?;
            return Ok(pop_free(heap, meta, free, kind)?.expect("the adopted list is not empty"));
        }
    }
    heap.store(rec + CURSOR, index + 1)?;
    Ok(link::pack(kind, index))
}

/// Moves the first non-empty free list of `kind` of another stripe to stripe `mine` (whose
/// list is empty); returns whether there was one.
fn adopt<H: HeapWrite>(heap: &mut H, meta: u64, mine: u64, kind: u8) -> Result<bool, IndexError> {
    for s in (0..STRIPES).filter(|&s| s != mine) {
        let other = meta::free_head(meta, s, kind);
        let head = heap.load(other)?;
        if head != 0 {
            heap.store(other, 0)?;
            heap.store(meta::free_head(meta, mine, kind), head)?;
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first slot of the free list whose head is at `head`, zeroed.
fn pop_free<H: HeapWrite>(heap: &mut H, meta: u64, head: u64, kind: u8) -> Result<Option<u64>, IndexError> {
    let free = heap.load(head)?;
    if free == 0 {
        return Ok(None);
    }
    let link = link::pack(kind, free);
    let off = offset(heap, meta, link)?;
    let next = heap.load(off)?;
    heap.store(head, next)?;
    for w in 0..slot_size(kind) / 8 {
        heap.store(off + w * 8, 0)?;
    }
    Ok(Some(link))
}

/// Bytes of slots in chunk `c` of `kind` (the allocation adds alignment slack before them).
pub fn chunk_bytes(kind: u8, c: u64) -> u64 {
    (1u64 << (base_log2(kind) as u64 + c)) * slot_size(kind)
}

/// Takes the kind's next batch of indices; returns the first. Allocates the chunk it starts
/// (a batch lies within one chunk, see [`batch`]).
fn take_batch<H: HeapWrite>(heap: &mut H, meta: u64, kind: u8) -> Result<u64, IndexError> {
    let handed = heap.load(meta::handed_out(meta, kind))?;
    let first = handed + 1;
    let (c, s) = locate(kind, first);
    if c >= CHUNKS as u64 {
        return Err(IndexError::ArtInvariant { node: meta, what: format!("slab of {} is full", link::kind_name(kind)) });
    }
    debug_assert!(s.is_multiple_of(batch(kind)), "batches are aligned within their chunk");
    if s == 0 {
        let raw = heap.alloc(chunk_bytes(kind, c) + 64)?;
        heap.store(meta::chunk_entry(meta, kind, c), raw.next_multiple_of(64))?;
    }
    heap.store(meta::handed_out(meta, kind), handed + batch(kind))?;
    Ok(first)
}

/// Puts the slot `link` names on its kind's free list of the calling thread's stripe.
pub fn free<H: HeapWrite>(heap: &mut H, meta: u64, link: u64) -> Result<(), IndexError> {
    let kind = link::kind(link);
    let mine = stripe::current();
    let rec = meta::stripe_kind(meta, mine, kind);
    let free = meta::free_head(meta, mine, kind);
    let off = offset(heap, meta, link)?;
    let head = heap.load(free)?;
    heap.store(off, head)?;
    heap.store(free, link::index(link))?;
    stripe::add(heap, rec + LIVE_DELTA, -1)?;
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

    /// Two stripes' batches never share a cache line (else their inserts would conflict on
    /// it) nor span two chunks (whose slots are not contiguous).
    #[test]
    fn batches_are_whole_lines_in_one_chunk() {
        for kind in 0..link::KINDS as u8 {
            let b = batch(kind);
            assert!(b >= 2 && b.is_power_of_two(), "kind {kind}: batch {b}");
            assert!((b * slot_size(kind)).is_multiple_of(64), "kind {kind}");
            for first in (1..20_000u64).step_by(b as usize) {
                let (c, s) = locate(kind, first);
                assert_eq!(locate(kind, first + b - 1), (c, s + b - 1), "kind {kind}: batch at {first} spans chunks");
                assert!((s * slot_size(kind)).is_multiple_of(64), "kind {kind}: batch at {first} starts mid-line");
            }
        }
    }
}
