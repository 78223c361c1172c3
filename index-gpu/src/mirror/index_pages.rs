//! The index-only layout of the GPU mirror ([`MirrorContents::Indexes`](super::MirrorContents)):
//! device memory holds the pages of the trees' nodes and descriptors, not the records around
//! them, and a page table through which the kernels translate heap offsets (common.cuh:
//! `tusk_map`).
//!
//! **What is an index page.** Every index under a named root (B-link trees and ARTs, found by
//! their descriptors' magic words) is a few objects: its descriptor, and its slab chunks (the
//! B-link's on its stripes' chunk lists, `btree/slab.rs`; the ART's in its descriptor's chunk
//! tables, `art/slab.rs`). Each object is a large allocation, which takes whole heap pages of
//! its own (`txn/src/alloc.rs`), so a page holds at most one object. An object is placed on
//! consecutive device pages, so a node that starts on a mirrored page continues on the device
//! pages after it, and one lookup per node (or, for the ART, per chunk) finds it.
//!
//! **How it stays current.** After each sync's copy (the host image then holds the one LSN),
//! [`IndexPages::refresh`] reads the roots and the trees' chunk lists from the image: objects
//! of trees no longer named give their device pages back, new objects get device pages (first
//! fit among freed runs, else after the last), and the caller uploads the new objects whole
//! from the image and the changed stretch of the table. Pages of objects already placed reach
//! the device with the sync's streamed portions, translated on the host
//! ([`IndexPages::device_page`]); every other dirty page stays on the host. The walk is
//! incremental: a B-link stripe's list is followed only for the chunks added since the last
//! refresh (its chunk count says how many).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use tusk_storage::layout::{MAX_ROOTS, ROOTS_OFF, ROOT_ENTRY_SIZE, ROOT_NAME_MAX};
use tusk_storage::PAGE_SIZE;

use super::MirrorError;
use crate::heap::HeapRead;
use crate::image::HeapImage;
use crate::stripe::STRIPES;
use crate::{art, btree};

/// A table entry for a heap page the device does not hold (common.cuh: TUSK_NO_PAGE).
pub const NO_PAGE: u32 = u32::MAX;

/// The kind of index behind a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    BTree,
    Art,
}

/// What a refresh knows of one tree.
#[derive(Debug)]
struct Tree {
    kind: Kind,
    /// First heap pages of its objects.
    objects: Vec<u64>,
    /// B-link: per stripe, the chunks already walked and the newest of them (0: none).
    chunks_seen: Vec<(u64, u64)>,
}

/// One object on the device: `pages` heap pages from its first, on device pages from `device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Placed {
    pages: u64,
    device: u32,
    /// The descriptor of the tree it belongs to.
    owner: u64,
}

/// What the device must do after a refresh.
#[derive(Debug, Default)]
pub struct Refresh {
    /// Heap byte ranges (whole pages) of the objects placed by this refresh: upload them from
    /// the image, through the table.
    pub new: Vec<Range<u64>>,
    /// Entries of the table that changed (upload them); `None` if none did.
    pub changed: Option<Range<usize>>,
    /// Device pages the layout uses: the device buffer must hold at least this many.
    pub device_pages: u64,
}

/// The host side of the index-only layout: which heap pages the device holds, and where.
#[derive(Debug)]
pub struct IndexPages {
    /// Heap page → device page ([`NO_PAGE`]: not held), for every page of the extent.
    table: Vec<u32>,
    /// Placed objects by first heap page.
    objects: BTreeMap<u64, Placed>,
    trees: HashMap<u64, Tree>,
    /// Device runs (first page, pages) given back, reused first fit.
    free: Vec<(u32, u64)>,
    /// Device pages up to here have been handed out.
    next: u64,
    /// Most device bytes the objects' pages and the table may take together.
    limit: Option<u64>,
}

impl IndexPages {
    /// An empty layout whose pages and table may take at most `limit` bytes of device memory
    /// (`None`: what the GPU has).
    pub fn new(limit: Option<u64>) -> IndexPages {
        IndexPages { table: Vec::new(), objects: BTreeMap::new(), trees: HashMap::new(), free: Vec::new(), next: 0, limit }
    }

    /// The table, one entry per heap page of the extent.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// The device page holding heap page `page`, if any.
    #[inline]
    pub fn device_page(&self, page: u64) -> Option<u32> {
        self.table.get(page as usize).copied().filter(|&p| p != NO_PAGE)
    }

    /// Whether the descriptor at `meta` is a mirrored tree's.
    pub fn holds(&self, meta: u64) -> bool {
        self.trees.contains_key(&meta)
    }

    /// Device pages handed out (the device buffer holds at least this many).
    pub fn device_pages(&self) -> u64 {
        self.next
    }

    /// The placed objects: (first heap page, pages, first device page), by heap page.
    pub fn objects(&self) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.objects.iter().map(|(&first, p)| (first, p.pages, p.device))
    }

    /// Bytes of heap the mirrored objects cover.
    pub fn mirrored_bytes(&self) -> u64 {
        self.objects.values().map(|p| p.pages * PAGE_SIZE).sum()
    }

    /// Brings the layout to the trees of `image` (a heap image at one LSN, `extent` bytes
    /// used). On an error the layout may be half changed: the caller forgets it
    /// ([`IndexPages::new`]) before the next sync.
    pub fn refresh(&mut self, image: &[u8], extent: u64) -> Result<Refresh, MirrorError> {
        let mut out = Refresh::default();
        let pages = extent.div_ceil(PAGE_SIZE) as usize;
        if pages > self.table.len() {
            let from = self.table.len();
            self.table.resize(pages, NO_PAGE);
            widen(&mut out.changed, from..pages);
        }
        let mut heap = HeapImage::new(image);
        let named = named_indexes(&mut heap)?;
        let gone: Vec<u64> = self.trees.iter().filter(|(meta, t)| named.get(meta) != Some(&t.kind)).map(|(&meta, _)| meta).collect();
        for meta in gone {
            self.forget(meta, &mut out);
        }
        for (&meta, &kind) in &named {
            let mut tree = self.trees.remove(&meta).unwrap_or_else(|| Tree::new(kind));
            if kind == Kind::BTree && !self.btree_lists_go_on(&mut heap, meta, &tree)? {
                // Another tree now has this descriptor's place: start over.
                self.trees.insert(meta, tree);
                self.forget(meta, &mut out);
                tree = Tree::new(kind);
            }
            let placed = self.add_tree(&mut heap, meta, &mut tree, extent, &mut out);
            self.trees.insert(meta, tree);
            placed?;
        }
        out.device_pages = self.next;
        Ok(out)
    }

    /// Whether each stripe's chunk list of the B-link tree at `meta` still ends in the chunks
    /// `tree` walked: its new chunks are then exactly the ones before them.
    fn btree_lists_go_on(&self, heap: &mut HeapImage<'_>, meta: u64, tree: &Tree) -> Result<bool, MirrorError> {
        for s in 0..STRIPES {
            let (seen, newest_seen) = tree.chunks_seen[s as usize];
            if seen == 0 {
                continue;
            }
            let Some((chunks, mut chunk)) = btree::slab::listed_chunks(heap, meta, s)? else { return Ok(false) };
            if chunks < seen {
                return Ok(false);
            }
            for _ in seen..chunks {
                if chunk == 0 {
                    return Ok(false);
                }
                chunk = btree::slab::previous_chunk(heap, chunk)?;
            }
            if chunk != newest_seen {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Places the objects of the tree at `meta` that `tree` does not hold yet (an ART's
    /// objects no longer in its chunk tables give their pages back).
    fn add_tree(&mut self, heap: &mut HeapImage<'_>, meta: u64, tree: &mut Tree, extent: u64, out: &mut Refresh) -> Result<(), MirrorError> {
        if tree.objects.is_empty() {
            let size = match tree.kind {
                Kind::BTree => btree::meta::META_SIZE,
                Kind::Art => art::meta::META_SIZE,
            };
            self.place(meta..meta + size, meta, tree, extent, out)?;
        }
        match tree.kind {
            Kind::BTree => {
                for s in 0..STRIPES {
                    let Some((chunks, mut chunk)) = btree::slab::listed_chunks(heap, meta, s)? else {
                        return Err(MirrorError::Unsupported(format!(
                            "the B-link tree at heap offset {meta} was made before its slab listed its chunks, so the index-only mirror cannot find its nodes: mirror the whole heap, or copy it into a new tree"
                        )));
                    };
                    let (seen, _) = tree.chunks_seen[s as usize];
                    let newest = chunk;
                    for _ in seen..chunks {
                        if chunk == 0 {
                            return Err(MirrorError::Unsupported(format!("the chunk list of the B-link tree at heap offset {meta} ends early: damaged")));
                        }
                        self.place(btree::slab::chunk_span(chunk), meta, tree, extent, out)?;
                        chunk = btree::slab::previous_chunk(heap, chunk)?;
                    }
                    tree.chunks_seen[s as usize] = (chunks, newest);
                }
            }
            Kind::Art => {
                let mut now = vec![meta / PAGE_SIZE];
                for kind in 0..art::link::KINDS as u8 {
                    for c in 0..art::meta::CHUNKS as u64 {
                        let chunk = heap.load(art::meta::chunk_entry(meta, kind, c))?;
                        if chunk != 0 {
                            now.push(chunk / PAGE_SIZE);
                            self.place(chunk..chunk + art::slab::chunk_bytes(kind, c), meta, tree, extent, out)?;
                        }
                    }
                }
                let (keep, stale): (Vec<u64>, Vec<u64>) = tree.objects.iter().partition(|first| now.contains(first));
                tree.objects = keep;
                for first in stale {
                    self.give_back(first, out);
                }
            }
        }
        Ok(())
    }

    /// Places the object covering heap bytes `span`, unless it is placed already.
    fn place(&mut self, span: Range<u64>, owner: u64, tree: &mut Tree, extent: u64, out: &mut Refresh) -> Result<(), MirrorError> {
        if span.start >= span.end || span.end > extent {
            return Err(MirrorError::Unsupported(format!("an index object at heap bytes {span:?} lies outside the heap's used {extent} bytes: damaged")));
        }
        let first = span.start / PAGE_SIZE;
        let pages = span.end.div_ceil(PAGE_SIZE) - first;
        if let Some(p) = self.objects.get(&first) {
            if p.pages == pages && p.owner == owner {
                return Ok(());
            }
        }
        // A page holds at most one object (each is a large allocation): anything else is a
        // damaged tree, or two trees sharing memory.
        if let Some((&before, p)) = self.objects.range(..first + pages).next_back() {
            if before + p.pages > first {
                return Err(MirrorError::Unsupported(format!("index objects share heap page {}: damaged, or a tree made before its objects had pages of their own", first.max(before))));
            }
        }
        let device = self.take(pages)?;
        self.objects.insert(first, Placed { pages, device, owner });
        for (i, page) in (first..first + pages).enumerate() {
            self.table[page as usize] = device + i as u32;
        }
        widen(&mut out.changed, first as usize..(first + pages) as usize);
        tree.objects.push(first);
        out.new.push(first * PAGE_SIZE..(first + pages) * PAGE_SIZE);
        Ok(())
    }

    /// Device pages for an object of `pages` pages: first fit among the runs given back, else
    /// after the last.
    fn take(&mut self, pages: u64) -> Result<u32, MirrorError> {
        if let Some(i) = self.free.iter().position(|&(_, n)| n >= pages) {
            let (at, n) = self.free[i];
            if n == pages {
                self.free.swap_remove(i);
            } else {
                self.free[i] = (at + pages as u32, n - pages);
            }
            return Ok(at);
        }
        let need = (self.next + pages) * PAGE_SIZE + 4 * self.table.len() as u64;
        if let Some(limit) = self.limit.filter(|&l| need > l) {
            return Err(MirrorError::OverLimit { bytes: need, limit });
        }
        if self.next + pages >= NO_PAGE as u64 {
            return Err(MirrorError::OutOfMemory { bytes: (self.next + pages) * PAGE_SIZE });
        }
        let at = self.next as u32;
        self.next += pages;
        Ok(at)
    }

    /// Gives back the device pages of the tree at `meta`.
    fn forget(&mut self, meta: u64, out: &mut Refresh) {
        let Some(tree) = self.trees.remove(&meta) else { return };
        for first in tree.objects {
            self.give_back(first, out);
        }
    }

    /// Gives back the device pages of the object whose first heap page is `first`.
    fn give_back(&mut self, first: u64, out: &mut Refresh) {
        let Some(p) = self.objects.remove(&first) else { return };
        for page in first..first + p.pages {
            self.table[page as usize] = NO_PAGE;
        }
        widen(&mut out.changed, first as usize..(first + p.pages) as usize);
        self.free.push((p.device, p.pages));
    }
}

impl Tree {
    fn new(kind: Kind) -> Tree {
        Tree { kind, objects: Vec::new(), chunks_seen: vec![(0, 0); STRIPES as usize] }
    }
}

fn widen(changed: &mut Option<Range<usize>>, by: Range<usize>) {
    *changed = Some(match changed.take() {
        Some(c) => c.start.min(by.start)..c.end.max(by.end),
        None => by,
    });
}

/// The descriptors behind the named roots that hold a B-link tree or an ART.
fn named_indexes(heap: &mut HeapImage<'_>) -> Result<HashMap<u64, Kind>, MirrorError> {
    let mut out = HashMap::new();
    if !heap.contains(ROOTS_OFF, MAX_ROOTS * ROOT_ENTRY_SIZE) {
        return Ok(out);
    }
    for i in 0..MAX_ROOTS {
        let entry = ROOTS_OFF + i * ROOT_ENTRY_SIZE;
        let len = heap.load(entry)?;
        if len == 0 || len > ROOT_NAME_MAX as u64 {
            continue;
        }
        let meta = heap.load(entry + 8 + ROOT_NAME_MAX as u64)?;
        if meta == 0 || !meta.is_multiple_of(8) || !heap.contains(meta, 8) {
            continue;
        }
        let kind = match heap.load(meta)? {
            m if m == btree::meta::MAGIC => Kind::BTree,
            m if m == art::meta::MAGIC => Kind::Art,
            _ => continue,
        };
        out.insert(meta, kind);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_runs_are_reused_first_fit_and_the_limit_holds() {
        let mut pages = IndexPages::new(Some(10 * PAGE_SIZE));
        assert_eq!(pages.take(4).unwrap(), 0);
        assert_eq!(pages.take(4).unwrap(), 4);
        assert!(matches!(pages.take(3), Err(MirrorError::OverLimit { bytes, limit }) if bytes == 11 * PAGE_SIZE && limit == 10 * PAGE_SIZE));
        pages.free.push((0, 4));
        assert_eq!(pages.take(3).unwrap(), 0);
        assert_eq!(pages.take(1).unwrap(), 3);
        assert_eq!(pages.take(2).unwrap(), 8);
        assert!(pages.free.is_empty());
    }
}
