//! The transactional allocator. Its metadata (free-list heads, carve cursors, brk, block
//! headers) is heap memory written through the transaction, so allocation is logged,
//! checkpointed and recovered like any other write, and an aborted transaction allocates
//! nothing.
//!
//! Small blocks (16 B .. 2 KiB, powers of two) are carved from pages of one class; a block is
//! `[header][user bytes]`. Large allocations take whole pages: `[exact length][header][user
//! bytes]`. Freed blocks go to a free list per class; freed large runs to one first-fit list
//! (the tail of a larger run is split off). Memory handed out is zeroed: reused blocks are
//! cleared, never-used memory is zero already.

use tusk_storage::layout::*;
use tusk_storage::{HeapPtr, PAGE_SIZE};

use crate::transaction::Transaction;
use crate::TxnError;

/// Size class for a small allocation of `len` user bytes, if it fits one.
fn small_class(len: u64) -> Option<usize> {
    // checked: a length within 8 of u64::MAX must not wrap around into the smallest class.
    let need = len.checked_add(HEADER_SIZE)?.max(SMALL_MIN_BLOCK);
    (need <= SMALL_MAX_BLOCK).then(|| (need.next_power_of_two() / SMALL_MIN_BLOCK).trailing_zeros() as usize)
}

fn block_size(class: usize) -> u64 {
    SMALL_MIN_BLOCK << class
}

impl Transaction<'_> {
    /// Allocates `len` zeroed bytes.
    pub fn alloc(&mut self, len: u64) -> Result<HeapPtr, TxnError> {
        match small_class(len) {
            Some(c) => self.alloc_small(c, len),
            None => self.alloc_large(len),
        }
    }

    fn exhausted<T>(&self, requested: u64) -> Result<T, TxnError> {
        Err(TxnError::HeapExhausted { requested, capacity: self.engine().heap().capacity() })
    }

    /// Moves brk up by `bytes`; returns the old brk.
    fn take_from_brk(&mut self, bytes: u64, requested: u64) -> Result<u64, TxnError> {
        let brk = self.load(BRK_OFF)?;
        let capacity = self.engine().heap().capacity();
        match brk.checked_add(bytes) {
            Some(end) if end <= capacity => {
                self.store(BRK_OFF, end)?;
                debug_assert!(brk.is_multiple_of(PAGE_SIZE) && bytes.is_multiple_of(PAGE_SIZE), "brk moves by whole pages");
                // Contiguous with earlier takes: brk was read through this transaction.
                self.fresh = if self.fresh.0 == self.fresh.1 { (brk, end) } else { (self.fresh.0, end) };
                self.engine().growth().taken(end);
                Ok(brk)
            }
            _ => self.exhausted(requested),
        }
    }

    fn zero(&mut self, from: u64, to: u64) -> Result<(), TxnError> {
        let mut off = from;
        while off < to {
            self.store(off, 0)?;
            off += 8;
        }
        Ok(())
    }

    fn alloc_small(&mut self, c: usize, len: u64) -> Result<HeapPtr, TxnError> {
        let size = block_size(c);
        let head = self.load(small_free_head_off(c))?;
        let block = if head != 0 {
            let next = self.load(head + HEADER_SIZE)?;
            self.store(small_free_head_off(c), next)?;
            self.zero(head + HEADER_SIZE, head + size)?;
            head
        } else {
            let cursor = self.load(small_cursor_off(c))?;
            let block = if cursor != 0 { cursor } else { self.take_from_brk(PAGE_SIZE, len)? };
            let next = block + size;
            self.store(small_cursor_off(c), if next.is_multiple_of(PAGE_SIZE) { 0 } else { next })?;
            block
        };
        let header = BlockHeader { class: c as u8, state: STATE_ALLOCATED, len: len as u32 };
        self.store(block, header.encode())?;
        Ok(HeapPtr(block + HEADER_SIZE))
    }

    fn alloc_large(&mut self, len: u64) -> Result<HeapPtr, TxnError> {
        let Some(pages) = len.checked_add(2 * HEADER_SIZE).map(|n| n.div_ceil(PAGE_SIZE)) else {
            return self.exhausted(len);
        };
        if pages > u32::MAX as u64 {
            return self.exhausted(len);
        }
        let run = match self.take_free_run(pages)? {
            Some(run) => {
                self.zero(run + 2 * HEADER_SIZE, run + pages * PAGE_SIZE)?;
                run
            }
            None => self.take_from_brk(pages * PAGE_SIZE, len)?,
        };
        self.store(run, len)?;
        let header = BlockHeader { class: CLASS_LARGE, state: STATE_ALLOCATED, len: pages as u32 };
        self.store(run + HEADER_SIZE, header.encode())?;
        Ok(HeapPtr(run + 2 * HEADER_SIZE))
    }

    /// First fit over the free runs: an exact run is unlinked, a larger one gives its tail.
    fn take_free_run(&mut self, pages: u64) -> Result<Option<u64>, TxnError> {
        let mut link = LARGE_FREE_HEAD_OFF;
        let mut run = self.load(link)?;
        while run != 0 {
            let header = BlockHeader::decode(self.load(run + HEADER_SIZE)?).ok_or(TxnError::InvalidPointer(run))?;
            let have = header.len as u64;
            let next = self.load(run + 2 * HEADER_SIZE)?;
            if have == pages {
                self.store(link, next)?;
                return Ok(Some(run));
            }
            if have > pages {
                let keep = have - pages;
                let shrunk = BlockHeader { class: CLASS_LARGE, state: STATE_FREE, len: keep as u32 };
                self.store(run + HEADER_SIZE, shrunk.encode())?;
                return Ok(Some(run + keep * PAGE_SIZE));
            }
            link = run + 2 * HEADER_SIZE;
            run = next;
        }
        Ok(None)
    }

    /// Frees the allocation at `p`.
    pub fn free(&mut self, p: HeapPtr) -> Result<(), TxnError> {
        let ptr = p.offset();
        if !ptr.is_multiple_of(8) || ptr < DATA_START + HEADER_SIZE || !self.engine().heap().contains(ptr, 0) {
            return Err(TxnError::InvalidPointer(ptr));
        }
        let header = BlockHeader::decode(self.load(ptr - HEADER_SIZE)?).ok_or(TxnError::InvalidPointer(ptr))?;
        if header.state == STATE_FREE {
            return Err(TxnError::DoubleFree(ptr));
        }
        self.forget_bounds(p);
        if header.class == CLASS_LARGE {
            let run = ptr - 2 * HEADER_SIZE;
            let freed = BlockHeader { class: CLASS_LARGE, state: STATE_FREE, len: header.len };
            self.store(run + HEADER_SIZE, freed.encode())?;
            let head = self.load(LARGE_FREE_HEAD_OFF)?;
            self.store(run + 2 * HEADER_SIZE, head)?;
            self.store(LARGE_FREE_HEAD_OFF, run)?;
        } else {
            let c = header.class as usize;
            let block = ptr - HEADER_SIZE;
            let freed = BlockHeader { class: header.class, state: STATE_FREE, len: 0 };
            self.store(block, freed.encode())?;
            let head = self.load(small_free_head_off(c))?;
            self.store(block + HEADER_SIZE, head)?;
            self.store(small_free_head_off(c), block)?;
        }
        Ok(())
    }

    /// Writes a fresh heap's superblock (the first transaction of every store).
    pub fn format_heap(&mut self) -> Result<(), TxnError> {
        self.store(MAGIC_OFF, MAGIC)?;
        self.store(VERSION_OFF, FORMAT_VERSION)?;
        self.store(CAPACITY_OFF, self.engine().heap().capacity())?;
        self.store(BRK_OFF, DATA_START)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_fit_their_lengths() {
        assert_eq!(small_class(0), Some(0));
        assert_eq!(small_class(8), Some(0));
        assert_eq!(small_class(9), Some(1));
        assert_eq!(small_class(2040), Some(7));
        assert_eq!(small_class(2041), None);
        assert_eq!(small_class(u64::MAX), None);
        assert_eq!(small_class(u64::MAX - 7), None);
        for len in 0..2041 {
            let c = small_class(len).unwrap();
            assert!(block_size(c) >= len + HEADER_SIZE);
            assert!(c == 0 || block_size(c - 1) < len + HEADER_SIZE);
        }
    }
}
