//! Point lookup: from the root, per inner node compare the stored prefix bytes (skipping any
//! beyond 8: the leaf decides), then follow the terminal link when the key ends here or the
//! child for the next key byte; at a leaf compare the whole key. No allocation.

use super::link;
use super::meta::ROOT_OFF;
use super::node::{self, PREFIX, PREFIX_BYTES, TERMINAL};
use super::{leaf, slab};
use crate::heap::HeapRead;
use crate::IndexError;

/// Whether the stored prefix bytes of a node (word `prefix`, length `plen`) agree with `key`
/// from `depth`; the caller has checked that the key is long enough for the whole prefix.
#[inline]
pub fn stored_prefix_matches(prefix: u64, plen: usize, key: &[u8], depth: usize) -> bool {
    let n = plen.min(PREFIX_BYTES);
    let mask = if n == 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
    (prefix ^ leaf::key_word(key, depth)) & mask == 0
}

/// A descent's position: the node `link` names, at heap offset `off`, reached after `depth`
/// key bytes.
#[derive(Clone, Copy)]
struct Cursor {
    link: u64,
    off: u64,
    depth: usize,
}

/// Where one step of a descent ended.
enum Step {
    Done(Option<u64>),
    Next(Cursor),
}

/// Locates the node `link` names and starts fetching its lines; `None` for the empty link.
#[inline]
fn fetch<H: HeapRead>(heap: &mut H, meta: u64, link: u64, key: &[u8], depth: usize) -> Result<Option<Cursor>, IndexError> {
    if link == 0 {
        return Ok(None);
    }
    let off = slab::offset(heap, meta, link)?;
    prefetch_node(heap, link, off, key, depth);
    Ok(Some(Cursor { link, off, depth }))
}

/// Starts fetching the lines of the node `link` at `off` that a descent for `key` from
/// `depth` reads first: the first line, and the line that most likely holds the child link
/// for the next key byte (the node's prefix is usually empty where nodes are large), in
/// parallel rather than after the header arrives. In a transaction the lines' stripe words
/// come too, so that a large transaction's locks wait on neither.
#[inline]
pub(super) fn prefetch_node<H: HeapRead>(heap: &H, link: u64, off: u64, key: &[u8], depth: usize) {
    heap.prefetch(off, 64);
    match link::kind(link) {
        _ if link::is_leaf(link) => {}
        link::N16 => heap.prefetch(off + 64, 128),
        link::N48 => heap.prefetch(off + node::N48_INDEX + key.get(depth).map_or(0, |&b| b as u64), 8),
        link::N256 => heap.prefetch(off + node::N256_CHILDREN + 8 * key.get(depth).map_or(0, |&b| b as u64), 8),
        _ => {}
    }
}

/// One node of a descent: a leaf answers; an inner node names the next node, whose lines
/// [`fetch`] starts loading before the step returns.
#[inline]
fn step<H: HeapRead>(heap: &mut H, meta: u64, at: Cursor, key: &[u8]) -> Result<Step, IndexError> {
    let Cursor { link, off, mut depth } = at;
    if link::is_leaf(link) {
        return Ok(Step::Done(leaf_value(heap, off, key)?));
    }
    let kind = link::kind(link);
    // The node's first line (header, prefix, terminal link, and an N4's keys and children,
    // an N16's keys and first three children; an N48's or N256's first line holds only
    // the first three): one validated read.
    const _: () = assert!(node::HDR == 0 && PREFIX == 8 && TERMINAL == 16);
    let mut line = [0u64; 8];
    let words = if kind <= link::N16 { 8 } else { 3 };
    heap.load_words(off, &mut line[..words])?;
    let [hdr, prefix, terminal] = [line[0], line[1], line[2]];
    let (count, plen) = node::decode_header(hdr);
    if plen > 0 {
        if key.len() < depth + plen || !stored_prefix_matches(prefix, plen, key, depth) {
            return Ok(Step::Done(None));
        }
        depth += plen;
    }
    let next = match key.get(depth) {
        None => terminal,
        Some(&b) => {
            depth += 1;
            match node::child_in_line(heap, kind, off, &line, count, b)? {
                Some(child) => child,
                None => return Ok(Step::Done(None)),
            }
        }
    };
    Ok(match fetch(heap, meta, next, key, depth)? {
        Some(at) => Step::Next(at),
        None => Step::Done(None),
    })
}

pub fn get<H: HeapRead>(heap: &mut H, meta: u64, key: &[u8]) -> Result<Option<u64>, IndexError> {
    let root = heap.load(meta + ROOT_OFF)?;
    let Some(mut at) = fetch(heap, meta, root, key, 0)? else {
        return Ok(None);
    };
    loop {
        match step(heap, meta, at, key)? {
            Step::Done(value) => return Ok(value),
            Step::Next(next) => at = next,
        }
    }
}

/// Keys whose descents [`get_many`] runs side by side (see the B-link tree's `LOOKUP_GROUP`).
pub const LOOKUP_GROUP: usize = 16;

/// The values stored under `keys`, written to `out` in the same order: the descents of up to
/// [`LOOKUP_GROUP`] keys advance together, one node per pass, so each node's lines arrive
/// while the other descents take their step. The same reads as `get`, in another order.
pub fn get_many<H: HeapRead>(heap: &mut H, meta: u64, keys: &[&[u8]], out: &mut [Option<u64>]) -> Result<(), IndexError> {
    assert_eq!(keys.len(), out.len(), "one answer per key");
    let root = heap.load(meta + ROOT_OFF)?;
    for (keys, out) in keys.chunks(LOOKUP_GROUP).zip(out.chunks_mut(LOOKUP_GROUP)) {
        let mut at: [Option<Cursor>; LOOKUP_GROUP] = [None; LOOKUP_GROUP];
        let mut left = 0;
        for (i, key) in keys.iter().enumerate() {
            at[i] = fetch(heap, meta, root, key, 0)?;
            out[i] = None;
            left += at[i].is_some() as usize;
        }
        while left > 0 {
            for (i, key) in keys.iter().enumerate() {
                let Some(cursor) = at[i] else { continue };
                match step(heap, meta, cursor, key)? {
                    Step::Next(next) => at[i] = Some(next),
                    Step::Done(value) => {
                        out[i] = value;
                        at[i] = None;
                        left -= 1;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The value of the leaf at `off` if it holds exactly `key`. Keys of up to 32 bytes are read
/// with the length and value in one validated read of the leaf's words.
fn leaf_value<H: HeapRead>(heap: &mut H, off: u64, key: &[u8]) -> Result<Option<u64>, IndexError> {
    const _: () = assert!(leaf::LEN == 0 && leaf::VALUE == 8 && leaf::KEY == 16);
    if key.len() > 32 {
        return if leaf::matches(heap, off, key)? { Ok(Some(leaf::value(heap, off)?)) } else { Ok(None) };
    }
    let key_words = key.len().div_ceil(8);
    let mut words = [0u64; 6];
    heap.load_words(off, &mut words[..2 + key_words])?;
    if words[0] != key.len() as u64 {
        return Ok(None);
    }
    let same = (0..key_words).all(|i| words[2 + i] == leaf::key_word(key, 8 * i));
    Ok(same.then_some(words[1]))
}
