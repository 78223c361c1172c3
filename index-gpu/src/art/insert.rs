//! Upsert. Descends like a lookup, keeping the heap offset of the word that holds the current
//! link (the descriptor's root word, a parent's child slot or terminal word), so that any
//! replacement (a leaf split into an N4, a prefix split, a grown node) is one store there.
//!
//! - empty slot: the new leaf goes there (lazy expansion);
//! - a leaf with another key: an N4 takes its place, its prefix the keys' common part from
//!   the current depth, the two leaves below (one of them as the terminal if its key ends);
//! - an inner node whose prefix disagrees with the key at byte m: an N4 with the first m
//!   prefix bytes takes its place, the old node below it at byte m with its prefix shortened
//!   by m + 1, the new leaf beside it (full prefix bytes from a leaf below if longer than 8);
//! - a node without the child: added, growing the node if full.

use super::link;
use super::meta::{self, ROOT_OFF};
use super::node::{self, PREFIX, PREFIX_BYTES, TERMINAL};
use super::{leaf, search, slab, MAX_KEY_LEN};
use crate::heap::HeapWrite;
use crate::IndexError;

fn bump<H: HeapWrite>(heap: &mut H, meta: u64) -> Result<(), IndexError> {
    Ok(meta::add_keys(heap, meta, 1)?)
}

/// An N4 at depth `depth` with prefix `prefix` (full bytes) over two entries, each a link
/// whose key continues at `depth + prefix.len()` with the given byte, or ends there (None).
fn split_node<H: HeapWrite>(heap: &mut H, meta: u64, prefix: &[u8], a: (Option<u8>, u64), b: (Option<u8>, u64)) -> Result<u64, IndexError> {
    let mut terminal = 0;
    let mut entries = Vec::with_capacity(2);
    for (byte, l) in [a, b] {
        match byte {
            Some(x) => entries.push((x, l)),
            None => terminal = l,
        }
    }
    entries.sort_unstable_by_key(|&(x, _)| x);
    node::build(heap, meta, link::N4, prefix.len(), node::pack_prefix(prefix), terminal, &entries)
}

pub fn insert<H: HeapWrite>(heap: &mut H, meta: u64, key: &[u8], value: u64) -> Result<Option<u64>, IndexError> {
    // No path kept: an allocation per insert cost what the allocator's shared counters and
    // locks cost when many threads insert (see the B-link tree's `path.rs`).
    insert_at(heap, meta, key, value, (meta + ROOT_OFF, 0), |_, _| {})
}

/// [`insert`], starting at the last slot of `path` (the root when empty) and adding the child
/// slots it passes, each with the key depth at it. A slot at depth `d` leads to the keys that
/// share the first `d` bytes of the key that reached it, and an insert leaves every slot on its
/// path where it was (it replaces at most what the last one links to), so a caller may keep a
/// path from one insert to the next, cut to the slots within the keys' common prefix.
/// Terminal slots are not added (a key ending there has no longer neighbours below it).
pub fn insert_from<H: HeapWrite>(heap: &mut H, meta: u64, key: &[u8], value: u64, path: &mut Vec<(u64, usize)>) -> Result<Option<u64>, IndexError> {
    if path.is_empty() {
        path.push((meta + ROOT_OFF, 0));
    }
    let start = *path.last().expect("a start");
    debug_assert!(path.iter().all(|&(_, d)| d <= key.len()), "a path within the key");
    insert_at(heap, meta, key, value, start, |slot, depth| path.push((slot, depth)))
}

/// [`insert`] from `(slot, depth)`, telling `passed` each child slot it moves to with the
/// key depth at it.
fn insert_at<H: HeapWrite>(heap: &mut H, meta: u64, key: &[u8], value: u64, start: (u64, usize), mut passed: impl FnMut(u64, usize)) -> Result<Option<u64>, IndexError> {
    if key.len() > MAX_KEY_LEN {
        return Err(IndexError::KeyTooLong { len: key.len(), max: MAX_KEY_LEN });
    }
    let (mut slot, mut depth) = start;
    loop {
        let link = heap.load(slot)?;
        if link == 0 {
            let new = leaf::create(heap, meta, key, value)?;
            heap.store(slot, new)?;
            bump(heap, meta)?;
            return Ok(None);
        }
        let off = slab::offset(heap, meta, link)?;
        search::prefetch_node(heap, link, off, key, depth);
        if link::is_leaf(link) {
            // An update compares in place; only a split needs the leaf's key as bytes.
            if leaf::matches(heap, off, key)? {
                let old = leaf::value(heap, off)?;
                heap.store(off + leaf::VALUE, value)?;
                return Ok(Some(old));
            }
            let lk = leaf::read_key(heap, off, link::leaf_cap(link::kind(link)))?;
            let from = depth.min(lk.len()).min(key.len());
            let common = lk[from..].iter().zip(&key[from..]).take_while(|(x, y)| x == y).count();
            let at = from + common;
            let new = leaf::create(heap, meta, key, value)?;
            let n4 = split_node(heap, meta, &key[from..at], (lk.get(at).copied(), link), (key.get(at).copied(), new))?;
            heap.store(slot, n4)?;
            bump(heap, meta)?;
            return Ok(None);
        }
        let (count, plen) = node::header(heap, off)?;
        if plen > 0 {
            let rest = &key[depth.min(key.len())..];
            let stored = heap.load(off + PREFIX)?.to_le_bytes();
            let mut m = stored[..plen.min(PREFIX_BYTES)].iter().zip(rest).take_while(|(x, y)| x == y).count();
            let mut full = None;
            if m == PREFIX_BYTES && plen > PREFIX_BYTES {
                let p = node::full_prefix(heap, meta, link, off, depth, plen)?;
                m = p.iter().zip(rest).take_while(|(x, y)| x == y).count();
                full = Some(p);
            }
            if m < plen {
                let p = match full {
                    Some(p) => p,
                    None => node::full_prefix(heap, meta, link, off, depth, plen)?,
                };
                // The old node moves one level down, below byte p[m].
                heap.store(off + node::HDR, node::encode_header(count, plen - m - 1))?;
                heap.store(off + PREFIX, node::pack_prefix(&p[m + 1..]))?;
                let new = leaf::create(heap, meta, key, value)?;
                let n4 = split_node(heap, meta, &p[..m], (Some(p[m]), link), (rest.get(m).copied(), new))?;
                heap.store(slot, n4)?;
                bump(heap, meta)?;
                return Ok(None);
            }
            depth += plen;
        }
        let Some(&b) = key.get(depth) else {
            slot = off + TERMINAL;
            continue;
        };
        match node::child_slot(heap, link::kind(link), off, count, b)? {
            Some(at) if heap.load(at)? != 0 => {
                slot = at;
                depth += 1;
                passed(slot, depth);
            }
            _ => {
                let new = leaf::create(heap, meta, key, value)?;
                node::add_child(heap, meta, slot, link, off, count, plen, b, new)?;
                bump(heap, meta)?;
                return Ok(None);
            }
        }
    }
}
