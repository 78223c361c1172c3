//! The validator: walks every level of the tree along its sibling chain and checks each
//! invariant the tree's code relies on. Tests run it after every batch of operations.
//!
//! Checked, per level from the root down:
//! - the chain starts at the first child of the level above's first node and is exactly the
//!   concatenation, in order, of the children of the level above (so no node is lost, shared
//!   or out of order), and the root level is the root alone;
//! - every node has the level's number, at most CAPACITY entries and at least MIN_FILL (the
//!   rightmost leaf at least one, see insert.rs's append split; the root: a leaf root anything,
//!   an internal root two children);
//! - keys strictly ascend and lie in the node's range `[low, high)`, where `low` is the left
//!   sibling's high key (0 for the leftmost) and the high key is the one its parent implies;
//!   an internal node's keys\[0\] equals its `low`;
//! - the rightmost node has no right link (and so no high key), every other one does;
//! - in a fenced tree (`meta.rs`), every node's low key is that `low` and its owner the
//!   descriptor, and every free node's owner is 0 (`layout.rs`: what a descent that peeked
//!   relies on);
//! - a node the transaction split off and whose separator waits for its commit
//!   (`posts.rs`) is on its level's chain right after the node whose range its separator
//!   splits, and nowhere else (the chain is the children of the level above with the
//!   transaction's pending nodes of the level in between);
//! - the nodes reached equal the descriptor's node count, the leaf entries its key count
//!   (both the sums of the per-thread stripes, see `meta.rs`).
//!
//! And the slab's accounting: the descriptor's stripe count matches; every stripe's free list
//! is walked first, bounded (a cycle, a node on two lists, a misaligned offset or one outside
//! the heap is reported, never followed into a panic or a loop); no free node may be reachable
//! in the tree; nodes in use plus free nodes must equal the nodes the stripes ever handed out,
//! so a node lost by a merge (neither in the tree nor free) shows. Where the stripes list
//! their chunks (`slab.rs`; trees made before the lists have none), every node in use or free
//! must lie in a listed chunk: the index-only GPU mirror holds those chunks' pages only.

use std::collections::HashSet;

use super::layout::{self, CAPACITY, MIN_FILL, NODE_SIZE};
use super::slab;
use super::meta::{self, FENCED, FENCED_OFF, FREE_HEAD, HANDED_OUT, KEY_DELTA, NODE_DELTA, ROOT_OFF, STRIPE_COUNT_OFF};
use crate::stripe::STRIPES;
use crate::heap::HeapRead;
use crate::IndexError;

/// What `check` saw, for tests and `tusk inspect`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Levels including the leaves.
    pub levels: u32,
    pub nodes: u64,
    pub leaves: u64,
    pub keys: u64,
    /// Nodes on the slab's free list.
    pub free_nodes: u64,
}

/// A node expected on the level being walked, with the low and high keys its parent
/// implies.
struct Expected {
    node: u64,
    low_key: u64,
    high_key: Option<u64>,
}

/// Puts the transaction's pending nodes of `level` (`posts.rs`) into the level's chain, each
/// right after the node whose range holds its separator, which ends there.
fn with_pending<H: HeapRead>(heap: &H, meta: u64, level: u32, mut expected: Vec<Expected>) -> Vec<Expected> {
    let Some(posts) = heap.pending_posts(meta) else { return expected };
    for (separator, node) in posts.on_level(level) {
        let at = expected.partition_point(|e| e.low_key <= separator);
        if at == 0 {
            continue; // Left of the leftmost node: reported as missing from the chain.
        }
        let high_key = expected[at - 1].high_key;
        expected[at - 1].high_key = Some(separator);
        expected.insert(at, Expected { node, low_key: separator, high_key });
    }
    expected
}

fn broken(node: u64, what: impl Into<String>) -> IndexError {
    IndexError::Invariant { node, what: what.into() }
}

pub fn check<H: HeapRead>(heap: &mut H, meta: u64) -> Result<TreeStats, IndexError> {
    let root = heap.load(meta + ROOT_OFF)?;
    let stripes = heap.load(meta + STRIPE_COUNT_OFF)?;
    if stripes != STRIPES {
        return Err(broken(root, format!("descriptor has {stripes} stripes, this layout {STRIPES}")));
    }
    let node_count = meta::total(heap, meta, NODE_DELTA)?;
    let key_count = meta::total(heap, meta, KEY_DELTA)?;
    let handed_out = meta::total(heap, meta, HANDED_OUT)?;
    let free = free_lists(heap, meta, handed_out)?;
    let chunks = listed_chunks(heap, meta)?;
    let in_chunks = |node: u64| -> Result<(), IndexError> {
        let Some(chunks) = &chunks else { return Ok(()) };
        let i = chunks.partition_point(|&c| slab::first_node(c) <= node);
        match i.checked_sub(1).map(|i| chunks[i]) {
            Some(c) if node + NODE_SIZE <= slab::chunk_span(c).end => Ok(()),
            _ => Err(broken(node, "node in no chunk of its stripes' lists")),
        }
    };
    let fenced = heap.load(meta + FENCED_OFF)? == FENCED;
    for &node in &free {
        in_chunks(node)?;
        if fenced && layout::read_header(heap, node)?.owner != 0 {
            return Err(broken(node, "free node still names its tree as owner"));
        }
    }
    check_node_offset(heap, root)?;
    let root_level = layout::read_header(heap, root)?.level;
    let mut stats = TreeStats { levels: root_level + 1, ..TreeStats::default() };
    let mut next_expected = vec![Expected { node: root, low_key: 0, high_key: None }];
    for level in (0..=root_level).rev() {
        let expected = with_pending(heap, meta, level, std::mem::take(&mut next_expected));
        let mut children = Vec::new();
        let mut low = 0u64;
        for (n, exp) in expected.iter().enumerate() {
            let node = exp.node;
            check_node_offset(heap, node)?;
            if free.contains(&node) {
                return Err(broken(node, "node on the free list is reachable in the tree"));
            }
            in_chunks(node)?;
            stats.nodes += 1;
            if stats.nodes > node_count {
                return Err(broken(node, format!("more nodes reachable than the {node_count} allocated")));
            }
            let h = layout::read_header(heap, node)?;
            if h.level != level {
                return Err(broken(node, format!("level {} on level {level}", h.level)));
            }
            if h.high_key != exp.high_key {
                return Err(broken(node, format!("high key {:?}, parent implies {:?}", h.high_key, exp.high_key)));
            }
            if fenced && (h.low_key != low || h.owner != meta) {
                return Err(broken(node, format!("fences (low key {}, owner {}), expected ({low}, {meta})", h.low_key, h.owner)));
            }
            let next = expected.get(n + 1).map_or(0, |e| e.node);
            if h.right != next {
                return Err(broken(node, format!("right link {} instead of {next}", h.right)));
            }
            let is_root = node == root;
            let min = match (is_root, h.is_leaf()) {
                (true, true) => 0,
                (true, false) => 2,
                // The rightmost leaf grows from one entry after an append split (insert.rs).
                (false, true) if h.right == 0 => 1,
                (false, _) => MIN_FILL,
            };
            if h.count > CAPACITY || h.count < min {
                return Err(broken(node, format!("{} entries, outside {min}..={CAPACITY}", h.count)));
            }
            let mut prev: Option<u64> = None;
            for i in 0..h.count {
                let k = layout::key(heap, node, i)?;
                if prev.is_some_and(|p| p >= k) {
                    return Err(broken(node, format!("keys not ascending at slot {i}")));
                }
                if k < low || h.high_key.is_some_and(|hk| k >= hk) {
                    return Err(broken(node, format!("key {k} outside [{low}, {:?})", h.high_key)));
                }
                if !h.is_leaf() {
                    if i == 0 && k != low {
                        return Err(broken(node, format!("first key {k} is not the low bound {low}")));
                    }
                    let child = layout::value(heap, node, i)?;
                    children.push(Expected { node: child, low_key: k, high_key: None });
                    if i > 0 {
                        let at = children.len() - 2;
                        children[at].high_key = Some(k);
                    }
                }
                prev = Some(k);
            }
            if !h.is_leaf() {
                // The last child ends where its parent does.
                let last = children.len() - 1;
                children[last].high_key = h.high_key;
            } else {
                stats.leaves += 1;
                stats.keys += h.count as u64;
            }
            low = h.high_key.unwrap_or(u64::MAX);
        }
        next_expected = children;
    }
    if stats.nodes != node_count {
        return Err(broken(root, format!("{} nodes reachable, {node_count} allocated", stats.nodes)));
    }
    if stats.keys != key_count {
        return Err(broken(root, format!("{} keys in the leaves, descriptor says {key_count}", stats.keys)));
    }
    stats.free_nodes = free.len() as u64;
    if stats.nodes + stats.free_nodes != handed_out {
        return Err(broken(root, format!("{} nodes in use + {} free, but the slab handed out {handed_out}", stats.nodes, stats.free_nodes)));
    }
    Ok(stats)
}

/// A node offset read from the tree must be 64-byte aligned and lie inside the heap before
/// anything is read from it.
fn check_node_offset<H: HeapRead>(heap: &mut H, node: u64) -> Result<(), IndexError> {
    if node == 0 || !node.is_multiple_of(layout::NODE_ALIGN) {
        return Err(broken(node, "node offset null or not 64-byte aligned"));
    }
    if !heap.contains(node, NODE_SIZE) {
        return Err(broken(node, "node offset outside the heap"));
    }
    Ok(())
}

/// The chunks on the stripes' lists, ascending (`None` for a tree made before the lists). A
/// list is followed for as many links as its count says, so a damaged one ends the check.
fn listed_chunks<H: HeapRead>(heap: &mut H, meta: u64) -> Result<Option<Vec<u64>>, IndexError> {
    let mut chunks = Vec::new();
    for s in 0..STRIPES {
        let Some((count, last)) = slab::listed_chunks(heap, meta, s)? else { return Ok(None) };
        let Some((walked, _)) = slab::walk_chunks(heap, last, count)? else {
            return Err(broken(last, format!("the chunk list of stripe {s} ends early")));
        };
        if let Some(&outside) = walked.iter().find(|&&c| !heap.contains(c, slab::CHUNK_BYTES)) {
            return Err(broken(outside, format!("a chunk of stripe {s}'s list leaves the heap")));
        }
        chunks.extend(walked);
    }
    chunks.sort_unstable();
    if chunks.windows(2).any(|w| slab::chunk_span(w[0]).end > w[1]) {
        return Err(broken(meta, "listed chunks overlap"));
    }
    Ok(Some(chunks))
}

/// The nodes on the stripes' free lists. Walks at most `handed_out` links in all, and stops at
/// the first repeated node, so a damaged list ends the check with an error instead of a loop.
fn free_lists<H: HeapRead>(heap: &mut H, meta: u64, handed_out: u64) -> Result<HashSet<u64>, IndexError> {
    let mut free = HashSet::new();
    for s in 0..STRIPES {
        let mut node = heap.load(meta::stripe(meta, s) + FREE_HEAD)?;
        while node != 0 {
            check_node_offset(heap, node)?;
            if !free.insert(node) {
                return Err(broken(node, format!("free list of stripe {s} has a cycle or shares a node")));
            }
            if free.len() as u64 > handed_out {
                return Err(broken(node, format!("free lists longer than the {handed_out} nodes handed out")));
            }
            node = heap.load(node)?;
        }
    }
    Ok(free)
}
