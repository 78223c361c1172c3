//! Separators left to the commit.
//!
//! A split of an internal node sends a separator up into a node one level nearer the root,
//! and every writer of the tree passes those few nodes. Written by a transaction, they stay
//! held to its end (a large transaction in place locks them; a buffered one must find them
//! unchanged at commit), so two large transactions on disjoint key ranges still met there:
//! on 2 cores, 8 threads loading their own ranges in 25 k-key transactions lost about one
//! attempt in two, nearly all on nodes of the top three levels.
//!
//! So in a transaction a split of an internal node stops after its half-split (the node,
//! its new right sibling, the high key and right link between them: a Lehman–Yao tree needs
//! nothing more to be searched, see `search.rs`), and the separator waits in the
//! transaction's [`PendingPosts`] (`tusk_txn::deferred`). The commit posts them first, top
//! level first, each into the parent that peeks find and the transaction's read proves (else
//! one a descent from the root finds), just before it locks and validates: the upper nodes
//! are held for the commit only.
//!
//! Other transactions meet a level's pending nodes as a chain of right siblings and walk it
//! (a run in place's are visible to their peeks): at [`MAX_PENDING_PER_LEVEL`] on a level,
//! the transaction posts every separator it has pending, top level first, and goes on
//! (`insert.rs`), so that walk stays well inside a peeked descent's bound (`search.rs`) and
//! never falls back to reads of nodes a run holds. Leaf splits still post
//! at once: their parents lie in the transaction's own part of the tree, and a separator left
//! out of a level-1 node would send every later descent along the leaf chain.
//!
//! Until the commit, the transaction's own descents jump to the nearest pending node of a
//! level instead of walking to it along the right links ([`PendingPosts::nearest`]): a load
//! of ascending keys splits a level-1 node every few hundred keys and would otherwise walk
//! ever longer chains. Other transactions cannot see the pending nodes as anything but right
//! siblings. Operations that need every separator in place (`remove.rs`'s repairs look a
//! node up in its parent) post them first ([`crate::heap::HeapWrite::finish_posts`]), and
//! `check()` accepts exactly the nodes the transaction has pending.

use std::any::Any;
use std::collections::BTreeMap;

use super::insert::{self, Posting};
use super::path::Path;
use super::{layout, search};
use tusk_txn::{Deferred, Transaction, TxnError};

/// Most separators a transaction leaves to its commit on one level of a tree (see the
/// module docs): half a peeked descent's walk.
pub const MAX_PENDING_PER_LEVEL: usize = search::MAX_PEEKED_STEPS / 2;

/// The separators a transaction has not yet posted into one tree.
#[derive(Debug)]
pub struct PendingPosts {
    meta: u64,
    /// (level of the node split off, separator) → that node.
    posts: BTreeMap<(u32, u64), u64>,
    /// Per level, the pending node with the greatest separator: an ascending load's descents
    /// all land beyond it, so they find it without a search of `posts` (which cost 4.6% of
    /// such a load on 2 threads).
    tops: Vec<Option<(u64, u64)>>,
    /// Per level, the pending nodes.
    counts: Vec<usize>,
}

impl PendingPosts {
    pub fn new(meta: u64) -> PendingPosts {
        PendingPosts { meta, posts: BTreeMap::new(), tops: Vec::new(), counts: Vec::new() }
    }

    /// Leaves the separator of `node`, split off a node of `level`, to the commit; false (and
    /// nothing kept) where `level` has [`MAX_PENDING_PER_LEVEL`] already.
    pub fn add(&mut self, level: u32, separator: u64, node: u64) -> bool {
        let at = level as usize;
        if self.tops.len() <= at {
            self.tops.resize(at + 1, None);
            self.counts.resize(at + 1, 0);
        }
        if self.counts[at] >= MAX_PENDING_PER_LEVEL {
            return false;
        }
        self.counts[at] += 1;
        let before = self.posts.insert((level, separator), node);
        debug_assert!(before.is_none(), "separator {separator} pending twice on level {level}");
        if self.tops[at].is_none_or(|(top, _)| top < separator) {
            self.tops[at] = Some((separator, node));
        }
        true
    }

    /// The pending node of `level` with the greatest separator ≤ `key`, and that separator.
    pub fn nearest(&self, level: u32, key: u64) -> Option<(u64, u64)> {
        match self.tops.get(level as usize).copied().flatten() {
            Some(top) if top.0 <= key => Some(top),
            _ => self.posts.range((level, 0)..=(level, key)).next_back().map(|(&(_, sep), &node)| (sep, node)),
        }
    }

    /// The pending nodes of `level`, by separator.
    pub fn on_level(&self, level: u32) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.posts.range((level, 0)..=(level, u64::MAX)).map(|(&(_, sep), &node)| (sep, node))
    }

    pub fn len(&self) -> usize {
        self.posts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.posts.is_empty()
    }
}

impl Deferred for PendingPosts {
    fn finish(self: Box<Self>, txn: &mut Transaction<'_>) -> Result<(), TxnError> {
        // Top level first: the descents of the lower levels' posts then find every node above
        // them in its parent, with no walk along a level.
        for (&(level, separator), &node) in self.posts.iter().rev() {
            post(txn, self.meta, level, separator, node)?;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Posts the separator of `node`, split off a node of `level`, into the level above (a new
/// root where `level` is the top).
///
/// The parent is found as a split's is: by peeks, then proven through the transaction
/// (`insert.rs`), so the descriptor's root word is read only where no peeked parent proves
/// itself or the tree grows. Read by every commit that posts, it was held, in place, to each
/// one's end: a run that finished while another committed waited for it and wounded.
fn post(txn: &mut Transaction<'_>, meta: u64, level: u32, separator: u64, node: u64) -> Result<(), TxnError> {
    let mut path = Path::new();
    if let Some(peeked) = search::peeked_node_on_level(txn, meta, separator, level + 1, &mut path)? {
        let mut parent = peeked;
        let mut ph = layout::read_header(txn, parent)?;
        if insert::proves_parent(&ph, meta, level, separator) {
            while ph.must_move_right(separator) {
                parent = ph.right;
                ph = layout::read_header(txn, parent)?;
            }
            let i = layout::lower_bound(txn, parent, ph.count, separator)?;
            return insert::insert_entry(txn, meta, parent, ph, i, separator, node, &mut path, Posting::Now);
        }
    }
    let root = search::root(txn, meta)?;
    let rh = layout::read_header(txn, root)?;
    assert!(rh.level >= level, "the tree at {meta} has no level {level} under root {root}");
    if rh.level == level {
        // The root is the level's leftmost node: it and everything right of it go under a new
        // root (nodes still pending on this level are posted into it after).
        return insert::grow_root(txn, meta, root, level, separator, node);
    }
    let (parent, ph) = search::descend_to(txn, root, separator, level + 1, None)?;
    assert_eq!(ph.level, level + 1, "the tree at {meta} has no level above {level} under root {root}");
    let i = layout::lower_bound(txn, parent, ph.count, separator)?;
    insert::insert_entry(txn, meta, parent, ph, i, separator, node, &mut [], Posting::Now)
}

#[cfg(test)]
mod tests {
    use super::PendingPosts;

    /// The nearest pending node at or before a key, per level, whichever order they came in.
    #[test]
    fn nearest_is_the_greatest_separator_at_or_below_the_key_on_its_level() {
        let mut posts = PendingPosts::new(64);
        for (level, sep, node) in [(1, 500, 5), (1, 100, 1), (1, 300, 3), (2, 200, 22), (1, 900, 9)] {
            assert!(posts.add(level, sep, node));
        }
        assert_eq!(posts.nearest(1, 99), None);
        assert_eq!(posts.nearest(1, 100), Some((100, 1)));
        assert_eq!(posts.nearest(1, 450), Some((300, 3)));
        assert_eq!(posts.nearest(1, 899), Some((500, 5)));
        assert_eq!(posts.nearest(1, u64::MAX), Some((900, 9)));
        assert_eq!(posts.nearest(2, 1000), Some((200, 22)));
        assert_eq!(posts.nearest(2, 199), None);
        assert_eq!(posts.nearest(3, 1000), None);
        assert_eq!(posts.on_level(1).map(|(sep, _)| sep).collect::<Vec<_>>(), [100, 300, 500, 900]);
        assert_eq!(posts.len(), 5);
    }

    /// A level takes at most MAX_PENDING_PER_LEVEL; the others are not limited by it.
    #[test]
    fn a_level_keeps_at_most_its_share_of_pending_separators() {
        let mut posts = PendingPosts::new(64);
        for k in 0..super::MAX_PENDING_PER_LEVEL as u64 {
            assert!(posts.add(1, 100 + k, 1000 + k));
        }
        assert!(!posts.add(1, 5, 5), "level 1 is full: the split posts at once");
        assert_eq!(posts.nearest(1, 5), None, "a refused separator is not kept");
        assert!(posts.add(2, 5, 5));
        assert_eq!(posts.len(), super::MAX_PENDING_PER_LEVEL + 1);
    }
}
