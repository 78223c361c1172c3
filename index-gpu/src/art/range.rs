//! Ordered reads: the range iterator, and count/sum over a range or a prefix.
//!
//! Bounds are normalized to `[lo, hi)` over byte strings: the successor of a string s is
//! s ++ \[0\], so an included end s becomes the excluded end s ++ \[0\], an excluded start s the
//! included start s ++ \[0\]; a prefix p is `[p, p')` where p' is p with its trailing 0xFF bytes
//! cut and the last byte incremented (unbounded when there is none).
//!
//! The walk is in order (terminal first, then children by byte) with an explicit stack. A
//! frame is either *inside* the range (everything below it qualifies: nothing is compared) or
//! on a *boundary*, in which case it knows its full path (every key below starts with it):
//! a child whose path is entirely below `lo` is skipped unvisited, the first one entirely at
//! or above `hi` ends the walk, one entirely inside becomes an inside frame (or, for count and
//! sum, is added up whole), and the rest stay boundary frames. A boundary frame that lies on
//! `lo`'s path starts at `lo`'s next byte: this is the one descent to the start. Boundary
//! frames exist only along the paths of `lo` and `hi`.

use std::ops::{Bound, RangeBounds};

use super::link;
use super::meta::ROOT_OFF;
use super::node::{self, TERMINAL};
use super::{leaf, slab};
use crate::heap::HeapRead;
use crate::IndexError;

/// `[lo, hi)` over byte strings (`hi` None: unbounded).
#[derive(Clone, Debug)]
pub struct Bounds {
    pub lo: Vec<u8>,
    pub hi: Option<Vec<u8>>,
}

impl Bounds {
    pub fn of<K: AsRef<[u8]>>(range: &impl RangeBounds<K>) -> Bounds {
        let lo = match range.start_bound() {
            Bound::Included(k) => k.as_ref().to_vec(),
            Bound::Excluded(k) => successor(k.as_ref()),
            Bound::Unbounded => Vec::new(),
        };
        let hi = match range.end_bound() {
            Bound::Included(k) => Some(successor(k.as_ref())),
            Bound::Excluded(k) => Some(k.as_ref().to_vec()),
            Bound::Unbounded => None,
        };
        Bounds { lo, hi }
    }

    pub fn prefix(p: &[u8]) -> Bounds {
        let mut hi = p.to_vec();
        while hi.last() == Some(&0xFF) {
            hi.pop();
        }
        let hi = match hi.last_mut() {
            Some(last) => {
                *last += 1;
                Some(hi)
            }
            None => None,
        };
        Bounds { lo: p.to_vec(), hi }
    }

    fn is_empty(&self) -> bool {
        self.hi.as_ref().is_some_and(|h| *h <= self.lo)
    }

    /// Every key with prefix `path` is below `lo`.
    fn all_below(&self, path: &[u8]) -> bool {
        path < self.lo.as_slice() && !self.lo.starts_with(path)
    }

    /// Every key with prefix `path` is at or above `hi`.
    fn all_above(&self, path: &[u8]) -> bool {
        self.hi.as_ref().is_some_and(|h| h.as_slice() <= path)
    }

    /// Every key with prefix `path` is in the range.
    fn all_inside(&self, path: &[u8]) -> bool {
        self.lo.as_slice() <= path && self.hi.as_ref().is_none_or(|h| path < h.as_slice() && !h.starts_with(path))
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.lo.as_slice() <= key && self.hi.as_ref().is_none_or(|h| key < h.as_slice())
    }
}

fn successor(k: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(k.len() + 1);
    s.extend_from_slice(k);
    s.push(0);
    s
}

struct Frame {
    off: u64,
    kind: u8,
    count: usize,
    /// 0: the terminal is next; 1 + b: the next child has byte ≥ b; 257: done.
    next: usize,
    /// The full path of a boundary frame (prefix included); None for an inside frame.
    path: Option<Vec<u8>>,
}

/// What the walk hands out next.
pub enum Visit {
    /// A leaf in range, with its key when the walk already read it.
    Leaf(u64, Option<Vec<u8>>),
    /// A whole subtree in range (only when asked for subtrees).
    Subtree(u64),
}

/// The in-order walk shared by the iterator and count/sum.
pub struct Walk {
    meta: u64,
    bounds: Bounds,
    stack: Vec<Frame>,
    /// The root, not yet looked at.
    root: u64,
    done: bool,
    subtrees: bool,
}

impl Walk {
    pub fn new<H: HeapRead>(heap: &mut H, meta: u64, bounds: Bounds, subtrees: bool) -> Result<Walk, IndexError> {
        let root = heap.load(meta + ROOT_OFF)?;
        let done = bounds.is_empty() || root == 0;
        Ok(Walk { meta, bounds, stack: Vec::new(), root, done, subtrees })
    }

    /// The next leaf or whole subtree in range, in key order.
    pub fn next<H: HeapRead>(&mut self, heap: &mut H) -> Result<Option<Visit>, IndexError> {
        if self.done {
            return Ok(None);
        }
        if self.root != 0 {
            let root = std::mem::take(&mut self.root);
            if let Some(v) = self.consider(heap, root, Some(Vec::new()))? {
                return Ok(Some(v));
            }
        }
        while !self.done {
            let Some(top) = self.stack.last_mut() else {
                self.done = true;
                break;
            };
            let (child, byte) = if top.next == 0 {
                top.next = 1;
                (heap.load(top.off + TERMINAL)?, None)
            } else if top.next > 256 {
                self.stack.pop();
                continue;
            } else {
                match node::next_child(heap, top.kind, top.off, top.count, top.next - 1)? {
                    Some((b, l)) => {
                        top.next = b as usize + 2;
                        (l, Some(b))
                    }
                    None => {
                        self.stack.pop();
                        continue;
                    }
                }
            };
            if child == 0 {
                continue;
            }
            let path = top.path.as_ref().map(|p| {
                let mut q = p.clone();
                q.extend(byte);
                q
            });
            if let Some(v) = self.consider(heap, child, path)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// Looks at `link`, whose path up to its own prefix is `path` (None: inside the range).
    fn consider<H: HeapRead>(&mut self, heap: &mut H, link: u64, path: Option<Vec<u8>>) -> Result<Option<Visit>, IndexError> {
        let Some(mut path) = path else {
            if link::is_leaf(link) {
                return Ok(Some(Visit::Leaf(link, None)));
            }
            if self.subtrees {
                return Ok(Some(Visit::Subtree(link)));
            }
            self.push(heap, link, None)?;
            return Ok(None);
        };
        let off = slab::offset(heap, self.meta, link)?;
        if link::is_leaf(link) {
            let key = leaf::read_key(heap, off, link::leaf_cap(link::kind(link)))?;
            if self.bounds.all_above(&key) {
                self.done = true;
                return Ok(None);
            }
            return Ok(self.bounds.contains(&key).then_some(Visit::Leaf(link, Some(key))));
        }
        let (_, plen) = node::header(heap, off)?;
        let depth = path.len();
        path.extend(node::full_prefix(heap, self.meta, link, off, depth, plen)?);
        if self.bounds.all_below(&path) {
            return Ok(None);
        }
        if self.bounds.all_above(&path) {
            self.done = true;
            return Ok(None);
        }
        if self.bounds.all_inside(&path) {
            if self.subtrees {
                return Ok(Some(Visit::Subtree(link)));
            }
            self.push(heap, link, None)?;
        } else {
            self.push(heap, link, Some(path))?;
        }
        Ok(None)
    }

    fn push<H: HeapRead>(&mut self, heap: &mut H, link: u64, path: Option<Vec<u8>>) -> Result<(), IndexError> {
        let off = slab::offset(heap, self.meta, link)?;
        let (count, _) = node::header(heap, off)?;
        // On lo's path: skip the terminal and the children below lo's next byte.
        let next = match &path {
            Some(p) if self.bounds.lo.len() > p.len() && self.bounds.lo.starts_with(p) => 1 + self.bounds.lo[p.len()] as usize,
            _ => 0,
        };
        self.stack.push(Frame { off, kind: link::kind(link), count, next, path });
        Ok(())
    }
}

/// Adds up a whole subtree: `f` gets each leaf's link.
pub fn for_each_leaf<H: HeapRead>(heap: &mut H, meta: u64, link: u64, mut f: impl FnMut(&mut H, u64) -> Result<(), IndexError>) -> Result<(), IndexError> {
    let mut stack = vec![link];
    while let Some(l) = stack.pop() {
        if l == 0 {
            continue;
        }
        if link::is_leaf(l) {
            f(heap, l)?;
            continue;
        }
        let off = slab::offset(heap, meta, l)?;
        let (count, _) = node::header(heap, off)?;
        stack.push(heap.load(off + TERMINAL)?);
        let mut from = 0;
        while let Some((b, c)) = node::next_child(heap, link::kind(l), off, count, from)? {
            stack.push(c);
            from = b as usize + 1;
        }
    }
    Ok(())
}

/// Count and sum of the values of the keys in `bounds`.
pub fn aggregate<H: HeapRead>(heap: &mut H, meta: u64, bounds: Bounds, values: bool) -> Result<(u64, u128), IndexError> {
    let mut walk = Walk::new(heap, meta, bounds, true)?;
    let (mut n, mut total) = (0u64, 0u128);
    let mut add = |heap: &mut H, l: u64| -> Result<(), IndexError> {
        n += 1;
        if values {
            let off = slab::offset(heap, meta, l)?;
            total += leaf::value(heap, off)? as u128;
        }
        Ok(())
    };
    while let Some(v) = walk.next(heap)? {
        match v {
            Visit::Leaf(l, _) => add(heap, l)?,
            Visit::Subtree(l) => for_each_leaf(heap, meta, l, &mut add)?,
        }
    }
    Ok((n, total))
}

/// Iterator over the entries of a range or prefix, in key order.
pub struct ArtIter<'h, H: HeapRead> {
    heap: &'h mut H,
    walk: Walk,
    failed: bool,
}

impl<'h, H: HeapRead> ArtIter<'h, H> {
    pub fn new(heap: &'h mut H, meta: u64, bounds: Bounds) -> Result<ArtIter<'h, H>, IndexError> {
        let walk = Walk::new(heap, meta, bounds, false)?;
        Ok(ArtIter { heap, walk, failed: false })
    }

    fn step(&mut self) -> Result<Option<(Vec<u8>, u64)>, IndexError> {
        let Some(Visit::Leaf(l, key)) = self.walk.next(self.heap)? else {
            return Ok(None);
        };
        let off = slab::offset(self.heap, self.walk.meta, l)?;
        let key = match key {
            Some(k) => k,
            None => leaf::read_key(self.heap, off, link::leaf_cap(link::kind(l)))?,
        };
        Ok(Some((key, leaf::value(self.heap, off)?)))
    }
}

impl<H: HeapRead> Iterator for ArtIter<'_, H> {
    type Item = Result<(Vec<u8>, u64), IndexError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.step().transpose();
        if matches!(item, Some(Err(_))) {
            self.failed = true;
        }
        item
    }
}
