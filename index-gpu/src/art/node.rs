//! Inner nodes N4, N16, N48, N256 (Leis et al.), one slab per type. Common header:
//!
//! ```text
//! word 0   children count (bits 0..16) | prefix length (bits 32..64)
//! word 1   the first min(prefix length, 8) prefix bytes, little-endian
//! word 2   terminal link: the leaf of the key that ends right after this node's prefix, or 0
//! ```
//!
//! Type-specific part (byte offsets in the slot):
//!
//! ```text
//! N4    64 B  byte 24: 4 key bytes (one word)   byte 32: 4 child links
//! N16  192 B  byte 24: 16 key bytes (2 words)   byte 40: 16 child links
//! N48  704 B  byte 64: 256 index bytes (32 words, 0 = none, else slot + 1)
//!             byte 320: 48 child links
//! N256 2112 B byte 64: 256 child links, one per byte
//! ```
//!
//! Why: a lookup step reads the header word, then at most two key words (N4/N16, compared
//! with SWAR on the loaded words) or one index word (N48) before the child link: few loads
//! per level, no loop over memory. N4/N16 keys are sorted, so in-order walks need no sort.
//!
//! Path compression is the hybrid scheme of the paper: the prefix length is exact, but only 8
//! prefix bytes are stored. Lookups compare the stored bytes and skip the rest (the leaf's
//! full key settles it); updates that need the full prefix read it from a leaf below.
//!
//! Node-size bounds (growth when full; shrinking with hysteresis, as in libart):
//! N4 1..=4 children, N16 4..=16, N48 13..=48, N256 38..=256. An inner node always has at
//! least two entries (children plus terminal): a node left with one collapses into it.

use super::link::{self, N16, N256, N4, N48};
use super::slab;
use crate::heap::{HeapRead, HeapWrite};
use crate::IndexError;

pub const HDR: u64 = 0;
pub const PREFIX: u64 = 8;
pub const TERMINAL: u64 = 16;
pub const N4_KEYS: u64 = 24;
pub const N4_CHILDREN: u64 = 32;
pub const N16_KEYS: u64 = 24;
pub const N16_CHILDREN: u64 = 40;
pub const N48_INDEX: u64 = 64;
pub const N48_CHILDREN: u64 = 320;
pub const N256_CHILDREN: u64 = 64;

/// Stored prefix bytes.
pub const PREFIX_BYTES: usize = 8;

/// Most children of each inner kind.
pub const fn capacity(kind: u8) -> usize {
    match kind {
        N4 => 4,
        N16 => 16,
        N48 => 48,
        _ => 256,
    }
}

/// Fewest children of each inner kind (fewer: shrink to the next smaller kind).
pub const fn min_children(kind: u8) -> usize {
    match kind {
        N4 => 1,
        N16 => 4,
        N48 => 13,
        _ => 38,
    }
}


#[inline]
pub fn decode_header(word: u64) -> (usize, usize) {
    ((word & 0xFFFF) as usize, (word >> 32) as usize)
}

#[inline]
pub fn encode_header(count: usize, plen: usize) -> u64 {
    count as u64 | (plen as u64) << 32
}

/// (children count, prefix length) of the node at `off`.
#[inline]
pub fn header<H: HeapRead>(heap: &mut H, off: u64) -> Result<(usize, usize), IndexError> {
    Ok(decode_header(heap.load(off + HDR)?))
}

/// Packs the first ≤ 8 bytes of `bytes` into a prefix word.
pub fn pack_prefix(bytes: &[u8]) -> u64 {
    super::leaf::key_word(&bytes[..bytes.len().min(PREFIX_BYTES)], 0)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Position of byte `b` among the first `n` (≤ 8) bytes of `word`, by SWAR.
#[inline]
fn find_byte(word: u64, b: u8, n: usize) -> Option<usize> {
    let x = word ^ (ONES * b as u64);
    let mut z = x.wrapping_sub(ONES) & !x & HIGHS;
    if n < 8 {
        z &= (1u64 << (8 * n)) - 1;
    }
    (z != 0).then(|| z.trailing_zeros() as usize / 8)
}

/// Heap offset of the child-link word for byte `b` in the node at `off`, if the node may have
/// such a child. For N256 it is always the slot: its link may be 0.
#[inline]
pub fn child_slot<H: HeapRead>(heap: &mut H, kind: u8, off: u64, count: usize, b: u8) -> Result<Option<u64>, IndexError> {
    Ok(match kind {
        N4 => {
            let w = heap.load(off + N4_KEYS)?;
            find_byte(w, b, count.min(4)).map(|i| off + N4_CHILDREN + i as u64 * 8)
        }
        N16 => {
            let w = heap.load(off + N16_KEYS)?;
            match find_byte(w, b, count.min(8)) {
                Some(i) => Some(off + N16_CHILDREN + i as u64 * 8),
                None if count > 8 => {
                    let w = heap.load(off + N16_KEYS + 8)?;
                    find_byte(w, b, (count - 8).min(8)).map(|i| off + N16_CHILDREN + (8 + i) as u64 * 8)
                }
                None => None,
            }
        }
        N48 => {
            let w = heap.load(off + N48_INDEX + (b as u64 / 8) * 8)?;
            let i = (w >> (8 * (b % 8))) & 0xFF;
            (i != 0).then(|| off + N48_CHILDREN + ((i - 1) % 48) * 8)
        }
        _ => Some(off + N256_CHILDREN + b as u64 * 8),
    })
}

/// The child link for byte `b` of the node at `off`, whose first line (8 words) is `line`:
/// an N4's keys and children and an N16's keys and first three children are taken from it,
/// the rest read (of an N48's or N256's line only the first three words, the common header,
/// need be filled: its children are read). `None` when the node has no such child (an N256
/// gives its link, maybe 0).
#[inline]
pub fn child_in_line<H: HeapRead>(heap: &mut H, kind: u8, off: u64, line: &[u64; 8], count: usize, b: u8) -> Result<Option<u64>, IndexError> {
    const _: () = assert!(N4_KEYS == 24 && N4_CHILDREN == 32 && N16_KEYS == 24 && N16_CHILDREN == 40);
    Ok(match kind {
        N4 => find_byte(line[3], b, count.min(4)).map(|i| line[4 + i]),
        N16 => {
            let i = match find_byte(line[3], b, count.min(8)) {
                Some(i) => i,
                None if count > 8 => match find_byte(line[4], b, (count - 8).min(8)) {
                    Some(i) => 8 + i,
                    None => return Ok(None),
                },
                None => return Ok(None),
            };
            Some(if i < 3 { line[5 + i] } else { heap.load(off + N16_CHILDREN + i as u64 * 8)? })
        }
        N48 => {
            let w = heap.load(off + N48_INDEX + (b as u64 / 8) * 8)?;
            let i = (w >> (8 * (b % 8))) & 0xFF;
            if i == 0 {
                None
            } else {
                Some(heap.load(off + N48_CHILDREN + ((i - 1) % 48) * 8)?)
            }
        }
        _ => Some(heap.load(off + N256_CHILDREN + b as u64 * 8)?),
    })
}

/// Key byte i of an N4/N16 (i < capacity).
fn sorted_key<H: HeapRead>(heap: &mut H, off: u64, i: usize) -> Result<u8, IndexError> {
    let w = heap.load(off + N4_KEYS + (i as u64 / 8) * 8)?;
    Ok((w >> (8 * (i % 8))) as u8)
}

fn set_sorted_key<H: HeapWrite>(heap: &mut H, off: u64, i: usize, b: u8) -> Result<(), IndexError> {
    let at = off + N4_KEYS + (i as u64 / 8) * 8;
    let shift = 8 * (i % 8);
    let w = heap.load(at)?;
    heap.store(at, (w & !(0xFF << shift)) | (b as u64) << shift)?;
    Ok(())
}

fn children_off(kind: u8) -> u64 {
    match kind {
        N4 => N4_CHILDREN,
        N16 => N16_CHILDREN,
        N48 => N48_CHILDREN,
        _ => N256_CHILDREN,
    }
}

/// The first child with byte ≥ `from` (from ≤ 256): its byte and link.
pub fn next_child<H: HeapRead>(heap: &mut H, kind: u8, off: u64, count: usize, from: usize) -> Result<Option<(u8, u64)>, IndexError> {
    match kind {
        N4 | N16 => {
            for i in 0..count.min(capacity(kind)) {
                let b = sorted_key(heap, off, i)?;
                if b as usize >= from {
                    return Ok(Some((b, heap.load(off + children_off(kind) + i as u64 * 8)?)));
                }
            }
            Ok(None)
        }
        N48 => {
            let mut b = from;
            while b < 256 {
                let w = heap.load(off + N48_INDEX + (b as u64 / 8) * 8)? >> (8 * (b % 8));
                if w == 0 {
                    b = (b / 8 + 1) * 8;
                    continue;
                }
                let i = w & 0xFF;
                if i != 0 {
                    let child = heap.load(off + N48_CHILDREN + ((i - 1) % 48) * 8)?;
                    return Ok(Some((b as u8, child)));
                }
                b += 1;
            }
            Ok(None)
        }
        _ => {
            for b in from..256 {
                let child = heap.load(off + N256_CHILDREN + b as u64 * 8)?;
                if child != 0 {
                    return Ok(Some((b as u8, child)));
                }
            }
            Ok(None)
        }
    }
}

/// All children (byte, link), in byte order.
pub fn children<H: HeapRead>(heap: &mut H, kind: u8, off: u64, count: usize) -> Result<Vec<(u8, u64)>, IndexError> {
    let mut out = Vec::with_capacity(count);
    let mut from = 0;
    while let Some((b, l)) = next_child(heap, kind, off, count, from)? {
        out.push((b, l));
        from = b as usize + 1;
    }
    Ok(out)
}

/// A new node of `kind` with the given prefix (length and stored word), terminal and sorted
/// children; returns its link.
pub fn build<H: HeapWrite>(heap: &mut H, meta: u64, kind: u8, plen: usize, prefix: u64, terminal: u64, entries: &[(u8, u64)]) -> Result<u64, IndexError> {
    let link = slab::alloc(heap, meta, kind)?;
    let off = slab::offset(heap, meta, link)?;
    heap.store(off + HDR, encode_header(entries.len(), plen))?;
    heap.store(off + PREFIX, prefix)?;
    heap.store(off + TERMINAL, terminal)?;
    match kind {
        N4 | N16 => {
            let mut keys = [0u64; 2];
            for (i, &(b, child)) in entries.iter().enumerate() {
                keys[i / 8] |= (b as u64) << (8 * (i % 8));
                heap.store(off + children_off(kind) + i as u64 * 8, child)?;
            }
            heap.store(off + N4_KEYS, keys[0])?;
            if kind == N16 {
                heap.store(off + N16_KEYS + 8, keys[1])?;
            }
        }
        N48 => {
            let mut index = [0u64; 32];
            for (i, &(b, child)) in entries.iter().enumerate() {
                index[b as usize / 8] |= (i as u64 + 1) << (8 * (b % 8));
                heap.store(off + N48_CHILDREN + i as u64 * 8, child)?;
            }
            for (w, &word) in index.iter().enumerate() {
                if word != 0 {
                    heap.store(off + N48_INDEX + w as u64 * 8, word)?;
                }
            }
        }
        _ => {
            for &(b, child) in entries {
                heap.store(off + N256_CHILDREN + b as u64 * 8, child)?;
            }
        }
    }
    Ok(link)
}

/// The kind that holds `n` children after growth.
fn grown(kind: u8) -> u8 {
    match kind {
        N4 => N16,
        N16 => N48,
        _ => N256,
    }
}

/// Adds child `b` → `child` (absent so far) to the node `link` at `off`, whose link is stored
/// at heap offset `slot`. A full node is replaced by one of the next size, rewriting `slot`.
#[allow(clippy::too_many_arguments)]
pub fn add_child<H: HeapWrite>(heap: &mut H, meta: u64, slot: u64, link: u64, off: u64, count: usize, plen: usize, b: u8, child: u64) -> Result<(), IndexError> {
    let kind = link::kind(link);
    if count >= capacity(kind) {
        let mut entries = children(heap, kind, off, count)?;
        let at = entries.partition_point(|&(k, _)| k < b);
        entries.insert(at, (b, child));
        let prefix = heap.load(off + PREFIX)?;
        let terminal = heap.load(off + TERMINAL)?;
        let new = build(heap, meta, grown(kind), plen, prefix, terminal, &entries)?;
        heap.store(slot, new)?;
        return slab::free(heap, meta, link);
    }
    match kind {
        N4 | N16 => {
            let base = children_off(kind);
            let mut i = count;
            while i > 0 {
                let k = sorted_key(heap, off, i - 1)?;
                if k < b {
                    break;
                }
                set_sorted_key(heap, off, i, k)?;
                let c = heap.load(off + base + (i - 1) as u64 * 8)?;
                heap.store(off + base + i as u64 * 8, c)?;
                i -= 1;
            }
            set_sorted_key(heap, off, i, b)?;
            heap.store(off + base + i as u64 * 8, child)?;
        }
        N48 => {
            let mut i = 0;
            while heap.load(off + N48_CHILDREN + i * 8)? != 0 {
                i += 1;
            }
            heap.store(off + N48_CHILDREN + i * 8, child)?;
            let at = off + N48_INDEX + (b as u64 / 8) * 8;
            let w = heap.load(at)?;
            heap.store(at, w | (i + 1) << (8 * (b % 8)))?;
        }
        _ => heap.store(off + N256_CHILDREN + b as u64 * 8, child)?,
    }
    heap.store(off + HDR, encode_header(count + 1, plen))?;
    Ok(())
}

/// Removes child `b` (present) from the node at `off` in place; returns the new count.
pub fn remove_child<H: HeapWrite>(heap: &mut H, kind: u8, off: u64, count: usize, plen: usize, b: u8) -> Result<usize, IndexError> {
    match kind {
        N4 | N16 => {
            let base = children_off(kind);
            let n = count.min(capacity(kind));
            let mut i = 0;
            while i < n && sorted_key(heap, off, i)? != b {
                i += 1;
            }
            for j in i + 1..n {
                let k = sorted_key(heap, off, j)?;
                set_sorted_key(heap, off, j - 1, k)?;
                let c = heap.load(off + base + j as u64 * 8)?;
                heap.store(off + base + (j - 1) as u64 * 8, c)?;
            }
            if n > 0 {
                set_sorted_key(heap, off, n - 1, 0)?;
                heap.store(off + base + (n - 1) as u64 * 8, 0)?;
            }
        }
        N48 => {
            let at = off + N48_INDEX + (b as u64 / 8) * 8;
            let w = heap.load(at)?;
            let shift = 8 * (b % 8);
            let i = (w >> shift) & 0xFF;
            heap.store(at, w & !(0xFF << shift))?;
            if i != 0 {
                heap.store(off + N48_CHILDREN + ((i - 1) % 48) * 8, 0)?;
            }
        }
        _ => heap.store(off + N256_CHILDREN + b as u64 * 8, 0)?,
    }
    let count = count.saturating_sub(1);
    heap.store(off + HDR, encode_header(count, plen))?;
    Ok(count)
}

/// The leaf reached by always taking the smallest entry (terminal first) from `link`: its
/// link. Any leaf below a node carries the node's full prefix.
pub fn first_leaf<H: HeapRead>(heap: &mut H, meta: u64, mut link: u64) -> Result<u64, IndexError> {
    for _ in 0..=super::MAX_KEY_LEN + 1 {
        if link == 0 {
            break;
        }
        if link::is_leaf(link) {
            return Ok(link);
        }
        let off = slab::offset(heap, meta, link)?;
        let terminal = heap.load(off + TERMINAL)?;
        if terminal != 0 {
            link = terminal;
            continue;
        }
        let (count, _) = header(heap, off)?;
        link = next_child(heap, link::kind(link), off, count, 0)?.map_or(0, |(_, c)| c);
    }
    Err(IndexError::ArtInvariant { node: link, what: "no leaf below an inner node".into() })
}

/// The full prefix of the node `link` at `off`, which sits at key depth `depth`: the stored
/// bytes when they are all of it, else the bytes of a leaf below.
pub fn full_prefix<H: HeapRead>(heap: &mut H, meta: u64, link: u64, off: u64, depth: usize, plen: usize) -> Result<Vec<u8>, IndexError> {
    if plen <= PREFIX_BYTES {
        let w = heap.load(off + PREFIX)?.to_le_bytes();
        return Ok(w[..plen].to_vec());
    }
    let leaf = first_leaf(heap, meta, link)?;
    let loff = slab::offset(heap, meta, leaf)?;
    let key = super::leaf::read_key(heap, loff, link::leaf_cap(link::kind(leaf)))?;
    match key.get(depth..depth + plen) {
        Some(p) => Ok(p.to_vec()),
        None => Err(IndexError::ArtInvariant { node: link, what: format!("leaf below is shorter than the prefix of {plen} bytes at depth {depth}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_their_slots() {
        assert!(link::slot_size(N4) >= N4_CHILDREN + 4 * 8);
        assert!(link::slot_size(N16) >= N16_CHILDREN + 16 * 8);
        assert_eq!(link::slot_size(N48), N48_CHILDREN + 48 * 8);
        assert_eq!(link::slot_size(N256), N256_CHILDREN + 256 * 8);
        for kind in 0..link::KINDS as u8 {
            assert!(link::slot_size(kind).is_multiple_of(if kind < link::LEAF0 { 64 } else { 32 }));
        }
    }
}
