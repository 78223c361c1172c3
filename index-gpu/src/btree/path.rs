//! The internal nodes a descent passed, root first: where a split of the level below sends
//! its separator (`insert.rs`) and where a removal's repair finds a node's parent
//! (`remove.rs`). A fixed array on the stack, not a `Vec`: every insert descends, and an
//! allocation and a free per insert were a tenth of an 8-thread load's time on the 16-core
//! device host, through the allocator's shared counters and locks.

use std::ops::{Deref, DerefMut};

use super::layout::MIN_FILL;

/// Internal levels a path holds. A tree's nodes other than the root hold at least
/// [`MIN_FILL`] entries and an internal root at least 2, so a tree with this many internal
/// levels has at least 2·14^23 leaves: far more 512-byte nodes than a 2^64-byte heap holds.
pub const MAX_LEVELS: usize = 24;

const _: () = assert!(MIN_FILL >= 14, "MAX_LEVELS' bound assumes nodes at least 14 full");

/// A descent's internal nodes, root first, at most [`MAX_LEVELS`].
#[derive(Clone, Debug)]
pub struct Path {
    nodes: [u64; MAX_LEVELS],
    len: usize,
}

impl Default for Path {
    fn default() -> Self {
        Self::new()
    }
}

impl Path {
    /// An empty path.
    pub const fn new() -> Path {
        Path { nodes: [0; MAX_LEVELS], len: 0 }
    }

    /// Appends the node of the next level down.
    ///
    /// # Panics
    /// Past [`MAX_LEVELS`] nodes: a descent through the transaction sees a consistent tree,
    /// which is never that deep, and peeked descents give up on a level beyond it first.
    pub fn push(&mut self, node: u64) {
        assert!(self.len < MAX_LEVELS, "a descent passed more than {MAX_LEVELS} internal levels");
        self.nodes[self.len] = node;
        self.len += 1;
    }

    /// Removes and returns the lowest level's node.
    pub fn pop(&mut self) -> Option<u64> {
        self.len = self.len.checked_sub(1)?;
        Some(self.nodes[self.len])
    }

    /// Keeps the first `len` levels.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Empties the path.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Deref for Path {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        &self.nodes[..self.len]
    }
}

impl DerefMut for Path {
    fn deref_mut(&mut self) -> &mut [u64] {
        &mut self.nodes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_keeps_its_levels_root_first() {
        let mut path = Path::new();
        assert!(path.is_empty());
        for node in [64, 128, 192] {
            path.push(node);
        }
        assert_eq!(&path[..], &[64, 128, 192]);
        path[1] = 256;
        assert_eq!(path.pop(), Some(192));
        assert_eq!(&path[..], &[64, 256]);
        path.truncate(5);
        assert_eq!(path.len(), 2);
        path.truncate(1);
        assert_eq!(&path[..], &[64]);
        path.clear();
        assert_eq!(path.pop(), None);
    }

    #[test]
    #[should_panic(expected = "more than 24 internal levels")]
    fn a_path_deeper_than_any_tree_panics() {
        let mut path = Path::new();
        for node in 0..=MAX_LEVELS as u64 {
            path.push(node * 512);
        }
    }
}
