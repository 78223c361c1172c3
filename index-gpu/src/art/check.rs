//! The validator: walks the whole tree in key order and checks every invariant the code
//! relies on, reading only through [`HeapRead`] and validating each link before following it
//! (a damaged structure yields an error, never a panic or an out-of-range read).
//!
//! Checked:
//! - descriptor: magic and stripe count; per kind, the handed-out count fits the slab and
//!   every chunk it needs is allocated and 64-byte aligned;
//! - stripes (`meta.rs`): each stripe's unused batch rest `[cursor, end)` lies within the
//!   handed-out indices and overlaps no other stripe's;
//! - free lists (one per stripe and kind): every index in `1..=handed out`, no index twice
//!   (no cycle, no index on two lists), none in a stripe's unused batch rest;
//! - links: kind known, index handed out, not on the free list, reached once only;
//! - inner nodes: children count within the kind's bounds (`node.rs`), at least two entries
//!   with the terminal, prefix length ≤ MAX_KEY_LEN, stored prefix bytes equal to the full
//!   prefix (read from the first leaf below); N4/N16 keys strictly ascending and unused key
//!   bytes and child slots zero; N48 index bytes pointing at distinct non-null slots, the
//!   count equal to the index entries, unreferenced slots zero; N256 count equal to the
//!   non-null children;
//! - leaves: key length ≤ MAX_KEY_LEN and in its size class (the smallest that fits); key
//!   equal to the path for a terminal leaf, else starting with the path (every prefix byte
//!   and branch byte above it); keys strictly ascending in walk order (so no duplicates);
//! - totals (the stripes' counters summed): leaves reached == the key count; per kind
//!   reached == live, and reached + free + unused batch rests == handed out.

use super::link::{self, KINDS, LAST_SMALL_LEAF, LEAF0, N16, N256, N4, N48};
use super::meta::{self, CHUNKS, CURSOR, END, STRIPE_COUNT_OFF};
use crate::stripe::STRIPES;
use super::node::{self, PREFIX, PREFIX_BYTES, TERMINAL};
use super::{leaf, slab, MAX_KEY_LEN};
use crate::heap::HeapRead;
use crate::IndexError;

/// What `check` saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArtStats {
    pub keys: u64,
    pub n4: u64,
    pub n16: u64,
    pub n48: u64,
    pub n256: u64,
    /// All leaves (equals `keys` in a valid tree).
    pub leaves: u64,
    /// Leaves of keys longer than 32 bytes (the classes 64..4096).
    pub overflow_leaves: u64,
    /// Slots on the free lists.
    pub free_slots: u64,
    /// Bytes of the slots in use, over all slabs.
    pub bytes: u64,
    /// Most inner nodes on one root-to-leaf path.
    pub depth_max: u64,
}

fn broken(node: u64, what: impl Into<String>) -> IndexError {
    IndexError::ArtInvariant { node, what: what.into() }
}

struct Slabs {
    meta: u64,
    handed: [u64; KINDS],
    free: Vec<Vec<u64>>,
    /// Indices handed out to a stripe's batch but not yet by the stripe.
    spare: Vec<Vec<u64>>,
    reached: Vec<Vec<u64>>,
    reached_n: [u64; KINDS],
}

fn test_bit(bits: &[u64], i: u64) -> bool {
    bits[(i / 64) as usize] >> (i % 64) & 1 == 1
}

fn set_bit(bits: &mut [u64], i: u64) {
    bits[(i / 64) as usize] |= 1 << (i % 64);
}

impl Slabs {
    /// Heap offset of a link's slot, after validating kind and index.
    fn slot<H: HeapRead>(&self, heap: &mut H, link: u64) -> Result<u64, IndexError> {
        let kind = link::kind(link);
        if kind as usize >= KINDS {
            return Err(broken(link, format!("link of unknown kind {kind}")));
        }
        let index = link::index(link);
        if index == 0 || index > self.handed[kind as usize] {
            return Err(broken(link, format!("{} index {index} not handed out", link::kind_name(kind))));
        }
        slab::offset(heap, self.meta, link)
    }
}

pub fn check<H: HeapRead>(heap: &mut H, meta_off: u64) -> Result<ArtStats, IndexError> {
    if heap.load(meta_off + meta::MAGIC_OFF)? != meta::MAGIC {
        return Err(IndexError::NotAnArt(meta_off));
    }
    let stripes = heap.load(meta_off + STRIPE_COUNT_OFF)?;
    if stripes != STRIPES {
        return Err(broken(meta_off, format!("descriptor has {stripes} stripes, this layout {STRIPES}")));
    }
    let mut slabs = Slabs { meta: meta_off, handed: [0; KINDS], free: Vec::new(), spare: Vec::new(), reached: Vec::new(), reached_n: [0; KINDS] };
    let mut stats = ArtStats::default();
    for kind in 0..KINDS as u8 {
        let handed = heap.load(meta::handed_out(meta_off, kind))?;
        if handed > 0 {
            let (last, _) = slab::locate(kind, handed);
            if last >= CHUNKS as u64 {
                return Err(broken(meta_off, format!("{} handed-out count {handed} beyond the slab", link::kind_name(kind))));
            }
            for c in 0..=last {
                let chunk = heap.load(meta::chunk_entry(meta_off, kind, c))?;
                if chunk == 0 || !chunk.is_multiple_of(64) {
                    return Err(broken(meta_off, format!("{} chunk {c} at {chunk}: missing or misaligned", link::kind_name(kind))));
                }
            }
        }
        slabs.handed[kind as usize] = handed;
        let words = (handed as usize).div_ceil(64) + 1;
        slabs.free.push(vec![0; words]);
        slabs.spare.push(vec![0; words]);
        slabs.reached.push(vec![0; words]);
    }
    // The stripes' unused batch rests.
    let mut spare_n = [0u64; KINDS];
    for s in 0..STRIPES {
        for kind in 0..KINDS as u8 {
            let k = kind as usize;
            let rec = meta::stripe_kind(meta_off, s, kind);
            let (cursor, end) = (heap.load(rec + CURSOR)?, heap.load(rec + END)?);
            if cursor == 0 && end == 0 {
                continue;
            }
            let name = link::kind_name(kind);
            if cursor == 0 || cursor > end || end > slabs.handed[k] + 1 {
                return Err(broken(meta_off, format!("stripe {s}'s {name} batch rest {cursor}..{end} outside 1..={}", slabs.handed[k])));
            }
            for i in cursor..end {
                if test_bit(&slabs.spare[k], i) {
                    return Err(broken(meta_off, format!("{name} index {i} in two stripes' batches")));
                }
                set_bit(&mut slabs.spare[k], i);
            }
            spare_n[k] += end - cursor;
        }
    }
    // Free lists.
    let mut free_n = [0u64; KINDS];
    for s in 0..STRIPES {
        for kind in 0..KINDS as u8 {
            let k = kind as usize;
            let name = link::kind_name(kind);
            let mut i = heap.load(meta::free_head(meta_off, s, kind))?;
            while i != 0 {
                let l = link::pack(kind, i);
                let off = slabs.slot(heap, l).map_err(|_| broken(l, format!("free list of {name} holds index {i}, not handed out")))?;
                if test_bit(&slabs.free[k], i) {
                    return Err(broken(l, format!("free lists of {name} visit index {i} twice")));
                }
                if test_bit(&slabs.spare[k], i) {
                    return Err(broken(l, format!("free list of {name} holds index {i} of a stripe's unused batch")));
                }
                set_bit(&mut slabs.free[k], i);
                free_n[k] += 1;
                i = heap.load(off)?;
            }
        }
    }
    stats.free_slots = free_n.iter().sum();
    // The tree, in key order: (link, path so far, whether it is its parent's terminal, depth).
    let mut prev: Option<Vec<u8>> = None;
    let root = heap.load(meta_off + meta::ROOT_OFF)?;
    let mut stack: Vec<(u64, Vec<u8>, bool, u64)> = Vec::new();
    if root != 0 {
        stack.push((root, Vec::new(), false, 0));
    }
    while let Some((l, mut path, terminal, depth)) = stack.pop() {
        let off = slabs.slot(heap, l)?;
        let kind = link::kind(l);
        let k = kind as usize;
        let index = link::index(l);
        if test_bit(&slabs.free[k], index) {
            return Err(broken(l, "reachable slot is on the free list"));
        }
        if test_bit(&slabs.spare[k], index) {
            return Err(broken(l, "reachable slot is in a stripe's unused batch"));
        }
        if test_bit(&slabs.reached[k], index) {
            return Err(broken(l, "slot reached twice"));
        }
        set_bit(&mut slabs.reached[k], index);
        slabs.reached_n[k] += 1;
        if kind >= LEAF0 {
            let len = heap.load(off + leaf::LEN)? as usize;
            if len > MAX_KEY_LEN || link::leaf_kind(len) != kind {
                return Err(broken(l, format!("key of {len} bytes in leaf class {}", link::kind_name(kind))));
            }
            let key = leaf::read_key(heap, off, len)?;
            if terminal && key != path {
                return Err(broken(l, format!("terminal leaf's key {key:?} is not its path {path:?}")));
            }
            if !key.starts_with(&path) {
                return Err(broken(l, format!("leaf key {key:?} disagrees with its path {path:?}")));
            }
            if prev.as_ref().is_some_and(|p| *p >= key) {
                return Err(broken(l, format!("keys not ascending: {key:?} after {:?}", prev.unwrap_or_default())));
            }
            prev = Some(key);
            stats.keys += 1;
            stats.leaves += 1;
            if kind > LAST_SMALL_LEAF {
                stats.overflow_leaves += 1;
            }
            stats.depth_max = stats.depth_max.max(depth);
            continue;
        }
        // An inner node.
        let (count, plen) = node::header(heap, off)?;
        let t = heap.load(off + TERMINAL)?;
        let (lo, hi) = (node::min_children(kind), node::capacity(kind));
        if count < lo || count > hi {
            return Err(broken(l, format!("{} with {count} children, outside {lo}..={hi}", link::kind_name(kind))));
        }
        if count + usize::from(t != 0) < 2 {
            return Err(broken(l, "inner node with a single entry"));
        }
        if plen > MAX_KEY_LEN {
            return Err(broken(l, format!("prefix length {plen}")));
        }
        let prefix = full_prefix(heap, &slabs, l, path.len(), plen)?;
        let stored = heap.load(off + PREFIX)?.to_le_bytes();
        let n = plen.min(PREFIX_BYTES);
        if stored[..n] != prefix[..n] || stored[n..].iter().any(|&b| b != 0) {
            return Err(broken(l, format!("stored prefix {:?} disagrees with the leaves' {prefix:?}", &stored[..n])));
        }
        path.extend_from_slice(&prefix);
        let children = children(heap, l, kind, off, count)?;
        match kind {
            N4 => stats.n4 += 1,
            N16 => stats.n16 += 1,
            N48 => stats.n48 += 1,
            _ => stats.n256 += 1,
        }
        for &(b, c) in children.iter().rev() {
            let mut p = path.clone();
            p.push(b);
            stack.push((c, p, false, depth + 1));
        }
        if t != 0 {
            stack.push((t, path, true, depth + 1));
        }
    }
    let keys = meta::keys(heap, meta_off)?;
    if stats.keys != keys {
        return Err(broken(meta_off, format!("{} keys in the leaves, descriptor says {keys}", stats.keys)));
    }
    for kind in 0..KINDS as u8 {
        let k = kind as usize;
        let live = meta::live(heap, meta_off, kind)?;
        let name = link::kind_name(kind);
        if slabs.reached_n[k] != live {
            return Err(broken(meta_off, format!("{name}: {} slots reachable, descriptor says {live} live", slabs.reached_n[k])));
        }
        if live + free_n[k] + spare_n[k] != slabs.handed[k] {
            return Err(broken(meta_off, format!("{name}: {live} live + {} free + {} unused in batches != {} handed out", free_n[k], spare_n[k], slabs.handed[k])));
        }
        stats.bytes += live * link::slot_size(kind);
    }
    Ok(stats)
}

/// The full prefix of node `l` at key depth `depth`, from the first leaf below it (validated
/// links only); the leaf's key must be long enough to hold it.
fn full_prefix<H: HeapRead>(heap: &mut H, slabs: &Slabs, l: u64, depth: usize, plen: usize) -> Result<Vec<u8>, IndexError> {
    if plen == 0 {
        return Ok(Vec::new());
    }
    let mut cur = l;
    for _ in 0..=MAX_KEY_LEN + 1 {
        let off = slabs.slot(heap, cur)?;
        if link::is_leaf(cur) {
            let key = leaf::read_key(heap, off, link::leaf_cap(link::kind(cur)))?;
            return match key.get(depth..depth + plen) {
                Some(p) => Ok(p.to_vec()),
                None => Err(broken(l, format!("prefix of {plen} bytes at depth {depth} but a leaf below has {} bytes", key.len()))),
            };
        }
        let t = heap.load(off + TERMINAL)?;
        cur = if t != 0 {
            t
        } else {
            let (count, _) = node::header(heap, off)?;
            match node::next_child(heap, link::kind(cur), off, count, 0)? {
                Some((_, c)) if c != 0 => c,
                _ => return Err(broken(cur, "inner node without entries")),
            }
        };
    }
    Err(broken(l, "no leaf below within MAX_KEY_LEN levels"))
}

/// The children of an inner node, after checking its kind's layout rules.
fn children<H: HeapRead>(heap: &mut H, l: u64, kind: u8, off: u64, count: usize) -> Result<Vec<(u8, u64)>, IndexError> {
    let mut out = Vec::with_capacity(count);
    match kind {
        N4 | N16 => {
            let cap = node::capacity(kind);
            let base = if kind == N4 { node::N4_CHILDREN } else { node::N16_CHILDREN };
            let words = if kind == N4 { 1 } else { 2 };
            let mut keys = Vec::with_capacity(16);
            for w in 0..words {
                keys.extend_from_slice(&heap.load(off + node::N4_KEYS + w * 8)?.to_le_bytes());
            }
            let keys = &keys[..cap];
            for i in 0..cap {
                let c = heap.load(off + base + i as u64 * 8)?;
                if i < count {
                    if i > 0 && keys[i] <= keys[i - 1] {
                        return Err(broken(l, format!("keys not ascending at slot {i}")));
                    }
                    if c == 0 {
                        return Err(broken(l, format!("null child at slot {i}")));
                    }
                    out.push((keys[i], c));
                } else if c != 0 || keys[i] != 0 {
                    return Err(broken(l, format!("unused slot {i} not zero")));
                }
            }
        }
        N48 => {
            let mut used = [false; 48];
            for b in 0..256u64 {
                let w = heap.load(off + node::N48_INDEX + (b / 8) * 8)?;
                let i = (w >> (8 * (b % 8))) & 0xFF;
                if i == 0 {
                    continue;
                }
                if i > 48 || used[i as usize - 1] {
                    return Err(broken(l, format!("N48 index of byte {b} is {i}: out of range or shared")));
                }
                used[i as usize - 1] = true;
                let c = heap.load(off + node::N48_CHILDREN + (i - 1) * 8)?;
                if c == 0 {
                    return Err(broken(l, format!("N48 index of byte {b} points at an empty slot")));
                }
                out.push((b as u8, c));
            }
            for (i, &u) in used.iter().enumerate() {
                if !u && heap.load(off + node::N48_CHILDREN + i as u64 * 8)? != 0 {
                    return Err(broken(l, format!("N48 slot {i} in use but not indexed")));
                }
            }
        }
        N256 => {
            for b in 0..256u64 {
                let c = heap.load(off + node::N256_CHILDREN + b * 8)?;
                if c != 0 {
                    out.push((b as u8, c));
                }
            }
        }
        _ => unreachable!("inner kinds only"),
    }
    if out.len() != count {
        return Err(broken(l, format!("header says {count} children, the node holds {}", out.len())));
    }
    Ok(out)
}
