//! Where the heap keeps its own metadata. Everything here is ordinary heap memory, written
//! only by transactions, so the redo log, checkpoints and recovery cover it unchanged.
//!
//! ```text
//! offset 0      superblock (one page)
//!   0             MAGIC
//!   8             FORMAT_VERSION
//!   16            capacity the layout was created with
//!   64            brk: first never-allocated byte (page aligned)      (own 64-byte line)
//!   128           head of the free list of large runs                 (own line)
//!   192           replication: what this node applied (REPLICA_WORDS words; own line)
//!   512 + 64*c    free-list head and carve cursor of small class c    (one line per class)
//!   1024 + 64*a   large-run arena a: next free byte, end, reserve, its end (one line each)
//! offset 4096   root table: MAX_ROOTS entries of ROOT_ENTRY_SIZE bytes
//!                 [name length u64][name, ROOT_NAME_MAX bytes][HeapPtr u64]
//! offset 16384  DATA_START: allocations
//! ```
//! Lines are 64 bytes because the STM's stripes are: keeping unrelated metadata on separate
//! lines keeps allocations of different classes from conflicting.

/// Identifies a tusk heap ("TUSKHEAP").
pub const MAGIC: u64 = u64::from_le_bytes(*b"TUSKHEAP");
/// Version of this layout.
pub const FORMAT_VERSION: u64 = 1;

pub const MAGIC_OFF: u64 = 0;
pub const VERSION_OFF: u64 = 8;
pub const CAPACITY_OFF: u64 = 16;
pub const BRK_OFF: u64 = 64;
pub const LARGE_FREE_HEAD_OFF: u64 = 128;
/// A replicated node's own line (`tusk-replica`): the group's log position its heap holds.
/// Only the node itself writes it, in the transaction that applies the group's records, and
/// never through the group: the records it applies carry no write to it, since no
/// transaction but the replication layer's touches it. Zeros: not replicated.
pub const REPLICA_OFF: u64 = 192;
/// Words of the replica line.
pub const REPLICA_WORDS: usize = 8;

/// Small size classes: blocks of 16 << c bytes, c in 0..SMALL_CLASSES (16 B .. 2 KiB).
pub const SMALL_CLASSES: usize = 8;
pub const SMALL_MIN_BLOCK: u64 = 16;
pub const SMALL_MAX_BLOCK: u64 = SMALL_MIN_BLOCK << (SMALL_CLASSES - 1);

/// The free-list head of small class `c`.
pub const fn small_free_head_off(c: usize) -> u64 {
    512 + 64 * c as u64
}

/// The carve cursor of small class `c`: next never-used block in its current page, or 0.
pub const fn small_cursor_off(c: usize) -> u64 {
    512 + 64 * c as u64 + 8
}

/// Arenas of large runs, one line each: threads take pages for large allocations from their
/// arena (`thread slot mod ARENAS`), which takes them from brk in steps, so that threads
/// allocating at once do not all write brk. Zero words: an empty arena (a heap made before
/// the arenas reads so).
pub const ARENAS: u64 = 48;
pub const ARENAS_OFF: u64 = 1024;

/// Words of an arena's line: the next free byte of its range (0: empty), the range's end, and
/// its reserve, the next step taken ahead (start, 0: empty; end). Zero reserve words: no
/// reserve (a heap made before the reserves reads so).
pub const ARENA_WORDS: usize = 4;

/// Arena `a`'s line.
pub const fn arena_off(a: u64) -> u64 {
    ARENAS_OFF + 64 * a
}

pub const ROOTS_OFF: u64 = 4096;
pub const MAX_ROOTS: u64 = 128;
/// Longest root name in bytes.
pub const ROOT_NAME_MAX: usize = 64;
pub const ROOT_ENTRY_SIZE: u64 = 8 + ROOT_NAME_MAX as u64 + 8;

const _: () = assert!(arena_off(ARENAS) <= ROOTS_OFF && small_free_head_off(SMALL_CLASSES) <= ARENAS_OFF);

/// First byte the allocator hands out.
pub const DATA_START: u64 = 16384;

/// Block header: 8 bytes in front of every allocation.
/// `[tag u16][class u8][state u8][len u32]` little-endian.
pub const HEADER_SIZE: u64 = 8;
pub const HEADER_TAG: u16 = 0x7A5C;
pub const STATE_ALLOCATED: u8 = 0xA1;
pub const STATE_FREE: u8 = 0xF7;
/// Class byte of a large run (whole pages).
pub const CLASS_LARGE: u8 = 0xFF;

/// A decoded block header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub class: u8,
    pub state: u8,
    /// Requested length for small blocks; page count for large runs.
    pub len: u32,
}

impl BlockHeader {
    pub fn encode(self) -> u64 {
        HEADER_TAG as u64 | (self.class as u64) << 16 | (self.state as u64) << 24 | (self.len as u64) << 32
    }

    /// Decodes a header word; `None` if it does not carry the tag or a known state.
    pub fn decode(word: u64) -> Option<BlockHeader> {
        let tag = word as u16;
        let class = (word >> 16) as u8;
        let state = (word >> 24) as u8;
        let len = (word >> 32) as u32;
        let class_ok = class == CLASS_LARGE || (class as usize) < SMALL_CLASSES;
        let state_ok = state == STATE_ALLOCATED || state == STATE_FREE;
        (tag == HEADER_TAG && class_ok && state_ok).then_some(BlockHeader { class, state, len })
    }
}

const _: () = assert!(ROOTS_OFF + MAX_ROOTS * ROOT_ENTRY_SIZE <= DATA_START);
const _: () = assert!(small_cursor_off(SMALL_CLASSES - 1) < ROOTS_OFF);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = BlockHeader { class: 3, state: STATE_ALLOCATED, len: 100 };
        assert_eq!(BlockHeader::decode(h.encode()), Some(h));
        assert_eq!(BlockHeader::decode(0), None);
        assert_eq!(BlockHeader::decode(h.encode() ^ 1), None);
        let bad_class = (h.encode() & !(0xFF << 16)) | (9 << 16);
        assert_eq!(BlockHeader::decode(bad_class), None);
    }
}
