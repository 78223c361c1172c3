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

pub fn get<H: HeapRead>(heap: &mut H, meta: u64, key: &[u8]) -> Result<Option<u64>, IndexError> {
    let mut link = heap.load(meta + ROOT_OFF)?;
    let mut depth = 0usize;
    loop {
        if link == 0 {
            return Ok(None);
        }
        let off = slab::offset(heap, meta, link)?;
        let kind = link::kind(link);
        // The node's first line is on its way; so is the line that most likely holds the
        // child link for the next key byte (the node's prefix is usually empty where nodes
        // are large), fetched in parallel rather than after the header arrives.
        heap.prefetch(off, 64);
        match kind {
            link::N16 => heap.prefetch(off + 64, 128),
            link::N48 => heap.prefetch(off + node::N48_INDEX + key.get(depth).map_or(0, |&b| b as u64), 8),
            link::N256 => heap.prefetch(off + node::N256_CHILDREN + 8 * key.get(depth).map_or(0, |&b| b as u64), 8),
            _ => {}
        }
        if link::is_leaf(link) {
            return leaf_value(heap, off, key);
        }
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
                return Ok(None);
            }
            depth += plen;
        }
        let Some(&b) = key.get(depth) else {
            link = terminal;
            continue;
        };
        match node::child_in_line(heap, kind, off, &line, count, b)? {
            Some(child) => link = child,
            None => return Ok(None),
        }
        depth += 1;
    }
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
