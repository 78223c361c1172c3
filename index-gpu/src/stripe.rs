//! Per-thread counter stripes of the index descriptors.
//!
//! A counter that every insert bumps (a tree's key count, a slab cursor) is a conflict between
//! any two concurrent inserts under the STM, whatever leaves they touch: both read and write
//! the same 64-byte line. So each descriptor keeps such counters in [`STRIPES`] copies, each on
//! its own line, and a thread writes only the copy of its own stripe ([`current`]). A counter's
//! value is the wrapping sum of its copies (each copy is a signed delta, two's complement:
//! a key inserted by one thread may be removed by another), read in the reader's transaction,
//! so it stays exact and serializable; only its readers pay, with one line per stripe.
//!
//! Threads take stripes round robin in the order they first touch an index, so up to
//! [`STRIPES`] inserting threads never share one; more threads share stripes, which costs
//! conflicts between the sharers, never correctness.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::heap::{HeapRead, HeapWrite};
use tusk_txn::TxnError;

/// Copies of each striped counter per descriptor.
pub const STRIPES: u64 = 16;

static NEXT_STRIPE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static STRIPE: u64 = take_stripe(&NEXT_STRIPE);
}

/// Every striped descriptor starts on a line of its own (so that each stripe's lines are its
/// own, the STM's unit of conflict) holding its magic, its root (byte 8) and its stripe count.
pub const DESCRIPTOR_ALIGN: u64 = 64;
pub const MAGIC_OFF: u64 = 0;
pub const STRIPE_COUNT_OFF: u64 = 16;

/// Allocates a descriptor of `size` bytes on a [`DESCRIPTOR_ALIGN`] boundary, all zero but
/// its magic and stripe count; returns its offset.
pub fn create_descriptor<H: HeapWrite>(heap: &mut H, size: u64, magic: u64) -> Result<u64, TxnError> {
    let raw = heap.alloc(size + DESCRIPTOR_ALIGN - 8)?;
    let meta = raw.next_multiple_of(DESCRIPTOR_ALIGN);
    heap.store(meta + MAGIC_OFF, magic)?;
    heap.store(meta + STRIPE_COUNT_OFF, STRIPES)?;
    Ok(meta)
}

/// The next stripe in round-robin order.
fn take_stripe(next: &AtomicU64) -> u64 {
    next.fetch_add(1, Ordering::Relaxed) % STRIPES
}

/// The calling thread's stripe, in `0..STRIPES`.
#[inline]
pub fn current() -> u64 {
    STRIPE.with(|s| *s)
}

/// Adds `delta` to the counter copy at `off` (wrapping: copies are two's-complement deltas).
#[inline]
pub fn add<H: HeapWrite>(heap: &mut H, off: u64, delta: i64) -> Result<(), TxnError> {
    let v = heap.load(off)?;
    heap.store(off, v.wrapping_add_signed(delta))
}

/// The counter whose copy of stripe s is at `first + s * stride`: the wrapping sum of all.
pub fn sum<H: HeapRead>(heap: &mut H, first: u64, stride: u64) -> Result<u64, TxnError> {
    let mut total = 0u64;
    for s in 0..STRIPES {
        total = total.wrapping_add(heap.load(first + s * stride)?);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_go_round_robin() {
        let next = AtomicU64::new(0);
        let taken: Vec<u64> = (0..2 * STRIPES).map(|_| take_stripe(&next)).collect();
        let expected: Vec<u64> = (0..STRIPES).chain(0..STRIPES).collect();
        assert_eq!(taken, expected);
    }

    #[test]
    fn a_thread_keeps_its_stripe() {
        let mine = current();
        assert!(mine < STRIPES);
        assert_eq!(mine, current());
    }
}
