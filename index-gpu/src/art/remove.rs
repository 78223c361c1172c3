//! Removal. Descends like a lookup, remembering the parent node and where its link is stored;
//! the leaf is freed and its entry (child or terminal) removed from the parent, which then
//! shrinks (N256 → N48 → N16 → N4 below the bounds in `node.rs`) or, when an N4 is left with
//! one entry, collapses: the remaining leaf takes its place, or the remaining inner child
//! does, its prefix becoming the N4's prefix + the branch byte + its own. Only the parent
//! changes shape, so one level of bookkeeping suffices.

use super::link::{self, N16, N256, N4, N48};
use super::meta::{self, ROOT_OFF};
use super::node::{self, PREFIX, PREFIX_BYTES, TERMINAL};
use super::search::stored_prefix_matches;
use super::{leaf, slab};
use crate::heap::HeapWrite;
use crate::IndexError;

/// The parent of the link being looked at: where its own link is stored, the link, and the
/// byte under which the child hangs (None: the terminal).
struct Parent {
    slot: u64,
    link: u64,
    byte: Option<u8>,
}

pub fn remove<H: HeapWrite>(heap: &mut H, meta: u64, key: &[u8]) -> Result<Option<u64>, IndexError> {
    let mut slot = meta + ROOT_OFF;
    let mut parent: Option<Parent> = None;
    let mut depth = 0usize;
    loop {
        let link = heap.load(slot)?;
        if link == 0 {
            return Ok(None);
        }
        let off = slab::offset(heap, meta, link)?;
        if link::is_leaf(link) {
            if !leaf::matches(heap, off, key)? {
                return Ok(None);
            }
            let value = leaf::value(heap, off)?;
            slab::free(heap, meta, link)?;
            meta::add_keys(heap, meta, -1)?;
            match parent {
                None => heap.store(slot, 0)?,
                Some(p) => remove_entry(heap, meta, p)?,
            }
            return Ok(Some(value));
        }
        let (count, plen) = node::header(heap, off)?;
        if plen > 0 {
            if key.len() < depth + plen || !stored_prefix_matches(heap.load(off + PREFIX)?, plen, key, depth) {
                return Ok(None);
            }
            depth += plen;
        }
        let Some(&b) = key.get(depth) else {
            parent = Some(Parent { slot, link, byte: None });
            slot = off + TERMINAL;
            continue;
        };
        match node::child_slot(heap, link::kind(link), off, count, b)? {
            Some(at) => {
                parent = Some(Parent { slot, link, byte: Some(b) });
                slot = at;
                depth += 1;
            }
            None => return Ok(None),
        }
    }
}

/// Removes the parent's entry, then shrinks or collapses the parent.
fn remove_entry<H: HeapWrite>(heap: &mut H, meta: u64, p: Parent) -> Result<(), IndexError> {
    let kind = link::kind(p.link);
    let off = slab::offset(heap, meta, p.link)?;
    let (count, plen) = node::header(heap, off)?;
    let count = match p.byte {
        None => {
            heap.store(off + TERMINAL, 0)?;
            count
        }
        Some(b) => node::remove_child(heap, kind, off, count, plen, b)?,
    };
    let terminal = heap.load(off + TERMINAL)?;
    if kind == N4 {
        if count + usize::from(terminal != 0) > 1 {
            return Ok(());
        }
        if count == 0 {
            // Only the terminal leaf is left: it takes the node's place (it holds its whole key).
            heap.store(p.slot, terminal)?;
            return slab::free(heap, meta, p.link);
        }
        let (b, child) = node::next_child(heap, kind, off, count, 0)?
            .ok_or_else(|| IndexError::ArtInvariant { node: p.link, what: "N4 lost its last child".into() })?;
        if !link::is_leaf(child) {
            let coff = slab::offset(heap, meta, child)?;
            let (ccount, cplen) = node::header(heap, coff)?;
            let mut merged = heap.load(off + PREFIX)?.to_le_bytes()[..plen.min(PREFIX_BYTES)].to_vec();
            merged.push(b);
            merged.extend_from_slice(&heap.load(coff + PREFIX)?.to_le_bytes()[..cplen.min(PREFIX_BYTES)]);
            heap.store(coff + node::HDR, node::encode_header(ccount, plen + 1 + cplen))?;
            heap.store(coff + PREFIX, node::pack_prefix(&merged))?;
        }
        heap.store(p.slot, child)?;
        return slab::free(heap, meta, p.link);
    }
    let smaller = match kind {
        N16 => N4,
        N48 => N16,
        _ => N48,
    };
    debug_assert!(kind != N256 || smaller == N48);
    if count < node::min_children(kind) {
        let entries = node::children(heap, kind, off, count)?;
        let prefix = heap.load(off + PREFIX)?;
        let new = node::build(heap, meta, smaller, plen, prefix, terminal, &entries)?;
        heap.store(p.slot, new)?;
        slab::free(heap, meta, p.link)?;
    }
    Ok(())
}
