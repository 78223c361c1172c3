//! Packed child links and the node/leaf kinds they name.
//!
//! A link is one u64: the kind in the high byte, the 1-based index in that kind's slab in the
//! low 56 bits, and 0 (index 0) the null link. CuART's layout: a GPU kernel decodes a link
//! with a shift and a mask and indexes the kind's buffer directly, with no pointer in sight.
//!
//! ```text
//! kind  0..=3   inner nodes N4, N16, N48, N256
//! kind  4..=13  leaves whose key fits 8 << (kind - 4) bytes: 8, 16, 32, ... 4096
//! ```
//!
//! Leaves of classes 8, 16 and 32 are the fixed-size leaves a GPU mirror answers from; the
//! classes 64..4096 are the *overflow* leaves (long keys, answered on the CPU). They too are
//! fixed-size slab slots, one slab per class, so that no leaf ever needs the general allocator
//! (which the heap traits do not expose a `free` for) and every slot is accounted for by
//! `check()` in the same way.
//!
//! Slot sizes are multiples of 32 bytes (inner nodes: of 64, a cache line), so every slot in a
//! 64-aligned chunk is aligned.

/// Number of kinds (and slabs).
pub const KINDS: usize = 14;
pub const N4: u8 = 0;
pub const N16: u8 = 1;
pub const N48: u8 = 2;
pub const N256: u8 = 3;
/// First leaf kind (keys of at most 8 bytes).
pub const LEAF0: u8 = 4;
/// The leaf kinds up to this one (keys ≤ 32 bytes) are the fixed GPU leaves; beyond it, overflow.
pub const LAST_SMALL_LEAF: u8 = LEAF0 + 2;

pub const INDEX_BITS: u32 = 56;
pub const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// The largest key an ART accepts, in bytes (the largest leaf class).
pub const MAX_KEY_LEN: usize = 8 << (KINDS as u8 - 1 - LEAF0);

const _: () = assert!(MAX_KEY_LEN == 4096);

#[inline]
pub fn pack(kind: u8, index: u64) -> u64 {
    (kind as u64) << INDEX_BITS | index
}

#[inline]
pub fn kind(link: u64) -> u8 {
    (link >> INDEX_BITS) as u8
}

#[inline]
pub fn index(link: u64) -> u64 {
    link & INDEX_MASK
}

#[inline]
pub fn is_leaf(link: u64) -> bool {
    kind(link) >= LEAF0
}

/// Key capacity of a leaf kind.
pub fn leaf_cap(kind: u8) -> usize {
    8 << (kind - LEAF0)
}

/// The smallest leaf kind holding a key of `len` bytes (len ≤ MAX_KEY_LEN).
pub fn leaf_kind(len: usize) -> u8 {
    let classes = len.max(8).next_power_of_two().trailing_zeros() - 3;
    LEAF0 + classes as u8
}

pub fn kind_name(kind: u8) -> &'static str {
    ["N4", "N16", "N48", "N256", "L8", "L16", "L32", "L64", "L128", "L256", "L512", "L1024", "L2048", "L4096"]
        .get(kind as usize)
        .copied()
        .unwrap_or("?")
}

/// Bytes per slot of `kind` (a table lookup: it is on every lookup's path).
#[inline]
pub fn slot_size(kind: u8) -> u64 {
    SLOT_SIZE[kind as usize % KINDS]
}

/// log2 of the slots in a kind's first slab chunk (a table lookup).
#[inline]
pub fn base_log2(kind: u8) -> u32 {
    BASE_LOG2[kind as usize % KINDS]
}

const SLOT_SIZE: [u64; KINDS] = {
    let mut t = [0; KINDS];
    let mut k = 0;
    while k < KINDS {
        t[k] = compute_slot_size(k as u8);
        k += 1;
    }
    t
};

const BASE_LOG2: [u32; KINDS] = {
    let mut t = [0; KINDS];
    let mut k = 0;
    while k < KINDS {
        t[k] = compute_base_log2(k as u8);
        k += 1;
    }
    t
};

const fn compute_slot_size(kind: u8) -> u64 {
    match kind {
        N4 => 64,
        N16 => 192,
        N48 => 704,
        N256 => 2112,
        // value + length + key bytes, rounded up to 32.
        _ => (16 + (8u64 << (kind - LEAF0))).next_multiple_of(32),
    }
}

/// About 16 KiB of slots in the first chunk, at least 1.
const fn compute_base_log2(kind: u8) -> u32 {
    let n = 16384 / compute_slot_size(kind);
    if n <= 1 {
        0
    } else {
        63 - n.leading_zeros()
    }
}
