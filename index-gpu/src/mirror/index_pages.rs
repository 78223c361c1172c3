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
//! **Several GPUs.** Each GPU has a layout of its own (a table, its device pages). A tree is
//! replicated on every GPU where it fits, so that its batches are split across them; a tree
//! that fits on no GPU beside the others takes the place of other trees' replicas on one GPU
//! (a tree with copies on two GPUs gives one up), so the trees are sharded across the GPUs
//! when they do not all fit on each. Where room comes free again (a tree dropped), trees take
//! copies again on the GPUs where they fit whole. A tree that fits on no GPU alone is
//! [`MirrorError::OverLimit`]. Queries about a tree go to the GPUs holding it
//! ([`IndexPages::holders`]).
//!
//! **How it stays current.** After each sync's copy (the host image then holds the one LSN),
//! [`IndexPages::refresh`] reads the roots and the trees' chunk lists from the image: objects
//! of trees no longer named give their device pages back, new objects get device pages (first
//! fit among freed runs, else after the last), and the caller uploads each GPU's new objects
//! whole from the image and the changed stretch of its table. Pages of objects already placed
//! reach the devices with the sync's streamed portions (each GPU's scatter translates them
//! through its own table, `upload.cu`); every other dirty page stays on the host. The walk is
//! incremental: a B-link stripe's list is followed only for the chunks added since the last
//! refresh (its chunk count says how many, and the walk must end in the chunk seen last).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use tusk_storage::layout::{MAX_ROOTS, ROOTS_OFF, ROOT_ENTRY_SIZE, ROOT_NAME_MAX, SMALL_MAX_BLOCK};
use tusk_storage::PAGE_SIZE;

use super::MirrorError;
use crate::heap::HeapRead;
use crate::image::HeapImage;
use crate::stripe::STRIPES;
use crate::{art, btree};

/// A table entry for a heap page the device does not hold (common.cuh: TUSK_NO_PAGE).
pub const NO_PAGE: u32 = u32::MAX;

// Descriptors are large allocations (whole pages of their own), as chunks are.
const _: () = assert!(btree::meta::META_SIZE > SMALL_MAX_BLOCK && art::meta::META_SIZE > SMALL_MAX_BLOCK);
const _: () = assert!(btree::slab::CHUNK_BYTES > SMALL_MAX_BLOCK);

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
    /// Its objects: (first heap page, pages).
    objects: Vec<(u64, u64)>,
    /// B-link: per stripe, the chunks already walked and the newest of them (0: none).
    chunks_seen: Vec<(u64, u64)>,
    /// The GPUs holding it (indices into the mirror's device list), ascending.
    devices: Vec<usize>,
}

impl Tree {
    fn new(kind: Kind) -> Tree {
        Tree { kind, objects: Vec::new(), chunks_seen: vec![(0, 0); STRIPES as usize], devices: Vec::new() }
    }

    fn pages(&self) -> u64 {
        self.objects.iter().map(|&(_, n)| n).sum()
    }
}

/// What one GPU must do after a refresh.
#[derive(Clone, Debug, Default)]
pub struct DeviceRefresh {
    /// Heap byte ranges (whole pages) of the objects placed on it by this refresh: upload them
    /// from the image, through its table.
    pub new: Vec<Range<u64>>,
    /// Entries of its table that changed (upload them); `None` if none did.
    pub changed: Option<Range<usize>>,
    /// Device pages its layout uses: its page buffer must hold at least this many.
    pub device_pages: u64,
}

/// What every GPU must do after a refresh, in the mirror's device order.
#[derive(Debug, Default)]
pub struct Refresh {
    pub devices: Vec<DeviceRefresh>,
}

/// One GPU's layout: which heap pages it holds, and where.
#[derive(Debug)]
struct Layout {
    /// Heap page → device page ([`NO_PAGE`]: not held), for every page of the extent.
    table: Vec<u32>,
    /// Placed objects by first heap page: (pages, first device page).
    placed: BTreeMap<u64, (u64, u32)>,
    /// Device runs (first page, pages) given back, reused first fit.
    free: Vec<(u32, u64)>,
    /// Device pages up to here have been handed out.
    next: u64,
    /// Most device bytes its pages and table may take together.
    limit: Option<u64>,
}

impl Layout {
    fn new(limit: Option<u64>) -> Layout {
        Layout { table: Vec::new(), placed: BTreeMap::new(), free: Vec::new(), next: 0, limit }
    }

    fn grow_table(&mut self, pages: usize, out: &mut DeviceRefresh) {
        if pages > self.table.len() {
            let from = self.table.len();
            self.table.resize(pages, NO_PAGE);
            widen(&mut out.changed, from..pages);
        }
    }

    /// Device bytes in use: handed-out pages not given back, and the table.
    fn used(&self) -> u64 {
        let free: u64 = self.free.iter().map(|&(_, n)| n).sum();
        (self.next - free) * PAGE_SIZE + 4 * self.table.len() as u64
    }

    /// Device pages for an object of `pages` pages: first fit among the runs given back, else
    /// after the last.
    fn take(&mut self, pages: u64) -> Result<u32, MirrorError> {
        take_pages(&mut self.free, &mut self.next, self.limit, self.table.len(), pages)
    }

    /// Whether [`Layout::place_all`] of `objects` would succeed (it changes nothing).
    fn fits(&self, objects: &[(u64, u64)]) -> bool {
        let (mut free, mut next) = (self.free.clone(), self.next);
        objects.iter().filter(|(first, _)| !self.placed.contains_key(first)).all(|&(_, pages)| take_pages(&mut free, &mut next, self.limit, self.table.len(), pages).is_ok())
    }

    /// Places each of `objects` not placed yet; on an error, gives back what this call placed.
    fn place_all(&mut self, objects: &[(u64, u64)], out: &mut DeviceRefresh) -> Result<(), MirrorError> {
        let mut done = Vec::new();
        for &(first, pages) in objects {
            if self.placed.contains_key(&first) {
                continue;
            }
            match self.take(pages) {
                Ok(device) => {
                    self.placed.insert(first, (pages, device));
                    for i in 0..pages {
                        self.table[(first + i) as usize] = device + i as u32;
                    }
                    widen(&mut out.changed, first as usize..(first + pages) as usize);
                    out.new.push(first * PAGE_SIZE..(first + pages) * PAGE_SIZE);
                    done.push(first);
                }
                Err(e) => {
                    // The ranges already in `out.new` stay there: their pages are no longer in
                    // the table, and an upload skips pages its table does not hold.
                    for first in done {
                        self.give_back(first, out);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Gives back the device pages of the object whose first heap page is `first`. A run
    /// that ends where the handed-out pages end lowers that end instead (with the free runs
    /// below it), so a placement that failed and was given back leaves no hole.
    fn give_back(&mut self, first: u64, out: &mut DeviceRefresh) {
        let Some((pages, device)) = self.placed.remove(&first) else { return };
        for page in first..first + pages {
            self.table[page as usize] = NO_PAGE;
        }
        widen(&mut out.changed, first as usize..(first + pages) as usize);
        self.free.push((device, pages));
        while let Some(i) = self.free.iter().position(|&(at, n)| at as u64 + n == self.next) {
            self.next = self.free.swap_remove(i).0 as u64;
        }
    }

    /// Room left under the limit (pages given back count, though they may be scattered).
    fn room(&self) -> u64 {
        self.limit.map_or(u64::MAX, |l| l.saturating_sub(self.used()))
    }

    /// Lays `objects` out afresh, consecutively from device page 0, as if nothing had been
    /// placed: every one is new (to upload again) and the whole table changes.
    fn compact(&mut self, objects: &[(u64, u64)], out: &mut DeviceRefresh) -> Result<(), MirrorError> {
        self.table.fill(NO_PAGE);
        self.placed.clear();
        self.free.clear();
        self.next = 0;
        widen(&mut out.changed, 0..self.table.len());
        self.place_all(objects, out)
    }
}

/// [`Layout::take`] over a layout's free runs and end (so that [`Layout::fits`] can try it on
/// copies): first fit among `free`, else after `next`, within `limit` beside a table of
/// `table_len` entries.
fn take_pages(free: &mut Vec<(u32, u64)>, next: &mut u64, limit: Option<u64>, table_len: usize, pages: u64) -> Result<u32, MirrorError> {
    if let Some(i) = free.iter().position(|&(_, n)| n >= pages) {
        let (at, n) = free[i];
        if n == pages {
            free.swap_remove(i);
        } else {
            free[i] = (at + pages as u32, n - pages);
        }
        return Ok(at);
    }
    let need = (*next + pages) * PAGE_SIZE + 4 * table_len as u64;
    if let Some(limit) = limit.filter(|&l| need > l) {
        return Err(MirrorError::OverLimit { bytes: need, limit });
    }
    if *next + pages >= NO_PAGE as u64 {
        return Err(MirrorError::OutOfMemory { bytes: (*next + pages) * PAGE_SIZE });
    }
    let at = *next as u32;
    *next += pages;
    Ok(at)
}

/// The host side of the index-only layout, for every GPU of a mirror.
#[derive(Debug)]
pub struct IndexPages {
    trees: HashMap<u64, Tree>,
    /// Every object of the named trees by first heap page: (pages, the descriptor of its tree).
    objects: BTreeMap<u64, (u64, u64)>,
    layouts: Vec<Layout>,
}

impl IndexPages {
    /// An empty layout for `devices` GPUs, each of whose pages and table may take at most
    /// `limit` bytes of device memory (`None`: what the GPU has).
    pub fn new(devices: usize, limit: Option<u64>) -> IndexPages {
        assert!(devices > 0, "a mirror has a GPU");
        IndexPages { trees: HashMap::new(), objects: BTreeMap::new(), layouts: (0..devices).map(|_| Layout::new(limit)).collect() }
    }

    /// GPU `d`'s table, one entry per heap page of the extent.
    pub fn table(&self, d: usize) -> &[u32] {
        &self.layouts[d].table
    }

    /// The page of GPU `d` holding heap page `page`, if any.
    #[inline]
    pub fn device_page(&self, d: usize, page: u64) -> Option<u32> {
        self.layouts[d].table.get(page as usize).copied().filter(|&p| p != NO_PAGE)
    }

    /// Whether some GPU holds heap page `page`.
    #[inline]
    pub fn held_anywhere(&self, page: u64) -> bool {
        self.layouts.iter().any(|l| l.table.get(page as usize).is_some_and(|&p| p != NO_PAGE))
    }

    /// The GPUs holding the tree whose descriptor is at `meta` (none: not mirrored).
    pub fn holders(&self, meta: u64) -> &[usize] {
        self.trees.get(&meta).map_or(&[], |t| &t.devices)
    }

    /// Heap bytes of the tree at `meta`'s objects (0: not mirrored).
    pub fn tree_bytes(&self, meta: u64) -> u64 {
        self.trees.get(&meta).map_or(0, |t| t.pages() * PAGE_SIZE)
    }

    /// Device pages GPU `d`'s layout has handed out (its page buffer holds at least these).
    pub fn device_pages(&self, d: usize) -> u64 {
        self.layouts[d].next
    }

    /// Device bytes GPU `d`'s layout takes: its pages and its table.
    pub fn device_bytes(&self, d: usize) -> u64 {
        self.layouts[d].next * PAGE_SIZE + 4 * self.layouts[d].table.len() as u64
    }

    /// GPU `d`'s placed objects: (first heap page, pages, first device page), by heap page.
    pub fn objects(&self, d: usize) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.layouts[d].placed.iter().map(|(&first, &(pages, device))| (first, pages, device))
    }

    /// Heap bytes of the objects GPU `d` holds.
    pub fn mirrored_bytes(&self, d: usize) -> u64 {
        self.layouts[d].placed.values().map(|&(pages, _)| pages * PAGE_SIZE).sum()
    }

    /// Brings the layouts to the trees of `image` (a heap image at one LSN, `extent` bytes
    /// used). On an error the layouts may be half changed: the caller forgets them
    /// ([`IndexPages::new`]) before the next sync.
    pub fn refresh(&mut self, image: &[u8], extent: u64) -> Result<Refresh, MirrorError> {
        let mut out = Refresh { devices: vec![DeviceRefresh::default(); self.layouts.len()] };
        let pages = extent.div_ceil(PAGE_SIZE) as usize;
        for (layout, o) in self.layouts.iter_mut().zip(&mut out.devices) {
            layout.grow_table(pages, o);
        }
        let mut heap = HeapImage::new(image);
        let named = named_indexes(&mut heap)?;
        let gone: Vec<u64> = self.trees.iter().filter(|(meta, t)| named.get(meta) != Some(&t.kind)).map(|(&meta, _)| meta).collect();
        for meta in gone {
            self.forget(meta, &mut out);
        }
        for (&meta, &kind) in &named {
            let mut tree = self.trees.remove(&meta).unwrap_or_else(|| Tree::new(kind));
            let fresh = match kind {
                Kind::Art => Vec::new(),
                Kind::BTree => match btree_new_chunks(&mut heap, meta, &tree)? {
                    Some(fresh) => fresh,
                    None => {
                        // Another tree now has this descriptor's place: start over.
                        self.trees.insert(meta, tree);
                        self.forget(meta, &mut out);
                        tree = Tree::new(kind);
                        btree_new_chunks(&mut heap, meta, &tree)?.expect("a tree walked from scratch has no earlier walk to continue")
                    }
                },
            };
            let placed = self.discover(&mut heap, meta, &mut tree, fresh, extent).and_then(|(added, removed)| {
                for &d in &tree.devices {
                    for &first in &removed {
                        self.layouts[d].give_back(first, &mut out.devices[d]);
                    }
                }
                self.place_tree(&mut tree, &added, &mut out)
            });
            self.trees.insert(meta, tree);
            placed?;
        }
        self.regrow_replicas(&mut out);
        for (layout, o) in self.layouts.iter().zip(&mut out.devices) {
            o.device_pages = layout.next;
        }
        Ok(out)
    }

    /// Finds the objects of the tree at `meta` that `tree` does not list yet (a B-link tree's:
    /// its stripes' new chunks, `fresh`; an ART's: read from its chunk tables, which also name
    /// those no longer in use); lists them. Returns (added, removed first pages).
    #[allow(clippy::type_complexity)]
    fn discover(&mut self, heap: &mut HeapImage<'_>, meta: u64, tree: &mut Tree, fresh: Vec<NewChunks>, extent: u64) -> Result<(Vec<(u64, u64)>, Vec<u64>), MirrorError> {
        let mut added = Vec::new();
        if tree.objects.is_empty() {
            let size = match tree.kind {
                Kind::BTree => btree::meta::META_SIZE,
                Kind::Art => art::meta::META_SIZE,
            };
            added.push(self.claim(meta..meta + size, meta, extent)?);
        }
        let mut removed = Vec::new();
        match tree.kind {
            Kind::BTree => {
                for NewChunks { stripe, listed, newest, chunks } in fresh {
                    for chunk in chunks {
                        added.push(self.claim(btree::slab::chunk_span(chunk), meta, extent)?);
                    }
                    tree.chunks_seen[stripe as usize] = (listed, newest);
                }
            }
            Kind::Art => {
                let mut now = vec![meta / PAGE_SIZE];
                for kind in 0..art::link::KINDS as u8 {
                    for c in 0..art::meta::CHUNKS as u64 {
                        let chunk = heap.load(art::meta::chunk_entry(meta, kind, c))?;
                        if chunk == 0 {
                            continue;
                        }
                        now.push(chunk / PAGE_SIZE);
                        if !tree.objects.iter().any(|&(first, _)| first == chunk / PAGE_SIZE) {
                            added.push(self.claim(chunk..chunk + art::slab::chunk_bytes(kind, c), meta, extent)?);
                        }
                    }
                }
                let (keep, stale): (Vec<(u64, u64)>, Vec<(u64, u64)>) = tree.objects.iter().partition(|(first, _)| now.contains(first));
                tree.objects = keep;
                for (first, _) in stale {
                    self.objects.remove(&first);
                    removed.push(first);
                }
            }
        }
        tree.objects.extend(&added);
        Ok((added, removed))
    }

    /// Claims the pages of the object covering heap bytes `span` for the tree at `owner`;
    /// returns (first page, pages).
    fn claim(&mut self, span: Range<u64>, owner: u64, extent: u64) -> Result<(u64, u64), MirrorError> {
        if span.start >= span.end || span.end > extent {
            return Err(MirrorError::Unsupported(format!("an index object at heap bytes {span:?} lies outside the heap's used {extent} bytes: damaged")));
        }
        let first = span.start / PAGE_SIZE;
        let pages = span.end.div_ceil(PAGE_SIZE) - first;
        // A page holds at most one object (each is a large allocation): anything else is a
        // damaged tree, or two trees sharing memory.
        if let Some((&before, &(n, _))) = self.objects.range(..first + pages).next_back() {
            if before + n > first {
                return Err(MirrorError::Unsupported(format!("index objects share heap page {}: damaged, or a tree made before its objects had pages of their own", first.max(before))));
            }
        }
        self.objects.insert(first, (pages, owner));
        Ok((first, pages))
    }

    /// Places `added` objects of `tree` on the GPUs holding it; a GPU without room for them
    /// gives the tree up, and a tree no GPU holds any more (or a new one) is placed whole.
    fn place_tree(&mut self, tree: &mut Tree, added: &[(u64, u64)], out: &mut Refresh) -> Result<(), MirrorError> {
        if tree.devices.is_empty() {
            return self.place_whole(tree, out);
        }
        let mut kept = Vec::new();
        for &d in &tree.devices {
            if self.layouts[d].place_all(added, &mut out.devices[d]).is_ok() || self.compact_with(d, &tree.objects, out) {
                kept.push(d);
            } else {
                for &(first, _) in &tree.objects {
                    self.layouts[d].give_back(first, &mut out.devices[d]);
                }
            }
        }
        tree.devices = kept;
        if tree.devices.is_empty() {
            return self.place_whole(tree, out);
        }
        Ok(())
    }

    /// Places every object of `tree` on each GPU with room for it; if none has, on the GPU
    /// with the most room after other trees give up their replicas there (never their last
    /// copy).
    fn place_whole(&mut self, tree: &mut Tree, out: &mut Refresh) -> Result<(), MirrorError> {
        tree.devices = (0..self.layouts.len()).filter(|&d| self.layouts[d].place_all(&tree.objects, &mut out.devices[d]).is_ok()).collect();
        if !tree.devices.is_empty() {
            return Ok(());
        }
        let mut by_room: Vec<usize> = (0..self.layouts.len()).collect();
        by_room.sort_by_key(|&d| self.layouts[d].used());
        for d in by_room {
            loop {
                if self.layouts[d].place_all(&tree.objects, &mut out.devices[d]).is_ok() || self.compact_with(d, &tree.objects, out) {
                    tree.devices = vec![d];
                    return Ok(());
                }
                // The largest tree with a copy elsewhere too gives up this one.
                let Some((&other, _)) = self.trees.iter().filter(|(_, t)| t.devices.len() > 1 && t.devices.contains(&d)).max_by_key(|(_, t)| t.pages()) else { break };
                let t = self.trees.get_mut(&other).expect("listed above");
                t.devices.retain(|&x| x != d);
                for &(first, _) in &t.objects {
                    self.layouts[d].give_back(first, &mut out.devices[d]);
                }
            }
        }
        let need = tree.pages() * PAGE_SIZE + 4 * self.layouts[0].table.len() as u64;
        Err(MirrorError::OverLimit { bytes: need, limit: self.layouts[0].limit.unwrap_or(u64::MAX) })
    }

    /// When GPU `d` has room for `objects` (of a tree not in `self.trees`) beside what it
    /// holds, but not in one piece (pages given back lie scattered), lays it out afresh with
    /// them; returns whether they are placed. Everything on `d` is then uploaded again.
    fn compact_with(&mut self, d: usize, objects: &[(u64, u64)], out: &mut Refresh) -> bool {
        let layout = &self.layouts[d];
        let missing: u64 = objects.iter().filter(|(first, _)| !layout.placed.contains_key(first)).map(|&(_, n)| n * PAGE_SIZE).sum();
        if missing > layout.room() {
            return false;
        }
        let mut all: Vec<(u64, u64)> = self.trees.values().filter(|t| t.devices.contains(&d)).flat_map(|t| t.objects.iter().copied()).collect();
        all.extend_from_slice(objects);
        all.sort_unstable();
        all.dedup();
        if self.layouts[d].compact(&all, &mut out.devices[d]).is_ok() {
            return true;
        }
        // Not even laid out afresh: put back what it held (the caller gives `objects` up).
        let held: Vec<(u64, u64)> = self.trees.values().filter(|t| t.devices.contains(&d)).flat_map(|t| t.objects.iter().copied()).collect();
        self.layouts[d].compact(&held, &mut out.devices[d]).expect("what a GPU held fits it again");
        false
    }

    /// Copies again, where room has come free (a tree dropped or shrunk), of trees that gave
    /// up replicas to make room or found none: their batches split across every GPU holding
    /// them again. Only where a tree fits whole beside what the GPU holds (nothing gives way),
    /// trees in descriptor order; a GPU without room changes nothing.
    fn regrow_replicas(&mut self, out: &mut Refresh) {
        let mut metas: Vec<u64> = self.trees.iter().filter(|(_, t)| t.devices.len() < self.layouts.len()).map(|(&meta, _)| meta).collect();
        metas.sort_unstable();
        for meta in metas {
            let tree = self.trees.get_mut(&meta).expect("listed above");
            for (d, layout) in self.layouts.iter_mut().enumerate() {
                if !tree.devices.contains(&d) && layout.fits(&tree.objects) {
                    layout.place_all(&tree.objects, &mut out.devices[d]).expect("checked to fit");
                    tree.devices.push(d);
                }
            }
            tree.devices.sort_unstable();
        }
    }

    /// Gives back the device pages of the tree at `meta` on every GPU.
    fn forget(&mut self, meta: u64, out: &mut Refresh) {
        let Some(tree) = self.trees.remove(&meta) else { return };
        for &(first, _) in &tree.objects {
            self.objects.remove(&first);
            for &d in &tree.devices {
                self.layouts[d].give_back(first, &mut out.devices[d]);
            }
        }
    }
}

/// The chunks one stripe of a B-link tree listed since the last refresh, newest first, and
/// what to remember of its list: how many it lists and its newest.
struct NewChunks {
    stripe: u64,
    listed: u64,
    newest: u64,
    chunks: Vec<u64>,
}

/// Each stripe's chunks listed since `tree` last walked the B-link tree at `meta` (one walk of
/// the new links only). `None` if a list no longer ends in the chunks `tree` walked: another
/// tree has the descriptor's place (the caller starts over). A tree made before the lists
/// is [`MirrorError::Unsupported`].
fn btree_new_chunks(heap: &mut HeapImage<'_>, meta: u64, tree: &Tree) -> Result<Option<Vec<NewChunks>>, MirrorError> {
    let mut out = Vec::new();
    for s in 0..STRIPES {
        let (seen, newest_seen) = tree.chunks_seen[s as usize];
        let Some((listed, newest)) = btree::slab::listed_chunks(heap, meta, s)? else {
            if seen > 0 {
                return Ok(None);
            }
            return Err(MirrorError::Unsupported(format!(
                "the B-link tree at heap offset {meta} was made before its slab listed its chunks, so the index-only mirror cannot find its nodes: mirror the whole heap, or copy it into a new tree"
            )));
        };
        if listed < seen {
            return Ok(None);
        }
        let Some((chunks, next)) = btree::slab::walk_chunks(heap, newest, listed - seen)? else {
            if seen > 0 {
                return Ok(None);
            }
            return Err(MirrorError::Unsupported(format!("the chunk list of the B-link tree at heap offset {meta} ends early: damaged")));
        };
        if seen > 0 && next != newest_seen {
            return Ok(None);
        }
        out.push(NewChunks { stripe: s, listed, newest, chunks });
    }
    Ok(Some(out))
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
        let mut layout = Layout::new(Some(10 * PAGE_SIZE));
        assert_eq!(layout.take(4).unwrap(), 0);
        assert_eq!(layout.take(4).unwrap(), 4);
        assert!(matches!(layout.take(3), Err(MirrorError::OverLimit { bytes, limit }) if bytes == 11 * PAGE_SIZE && limit == 10 * PAGE_SIZE));
        layout.free.push((0, 4));
        assert_eq!(layout.take(3).unwrap(), 0);
        assert_eq!(layout.take(1).unwrap(), 3);
        assert_eq!(layout.take(2).unwrap(), 8);
        assert!(layout.free.is_empty());
    }

    /// `fits` answers what `place_all` then does, and changes nothing itself: objects already
    /// placed cost nothing, freed runs count first fit, scattered room does not add up.
    #[test]
    fn fits_foretells_place_all() {
        let mut layout = Layout::new(Some(12 * PAGE_SIZE + 4 * 40));
        let mut out = DeviceRefresh::default();
        layout.grow_table(40, &mut out);
        layout.place_all(&[(0, 3), (10, 3), (20, 3), (30, 3)], &mut out).unwrap();
        layout.give_back(0, &mut out);
        layout.give_back(20, &mut out);
        // Room: two freed runs of 3 pages, none at the end.
        let cases: [&[(u64, u64)]; 5] = [&[(5, 3)], &[(5, 3), (25, 3)], &[(5, 4)], &[(5, 3), (25, 3), (35, 1)], &[(10, 3), (5, 3)]];
        for objects in cases {
            let foretold = layout.fits(objects);
            let (free, next, placed) = (layout.free.clone(), layout.next, layout.placed.clone());
            let mut trial = Layout { table: layout.table.clone(), placed, free, next, limit: layout.limit };
            assert_eq!(trial.place_all(objects, &mut DeviceRefresh::default()).is_ok(), foretold, "{objects:?}");
            assert_eq!((layout.free.len(), layout.next), (2, 12), "fits changes nothing");
        }
        assert!(layout.fits(&[(10, 3), (5, 3)]) && !layout.fits(&[(5, 4)]), "placed objects are free; a run larger than any freed one is not");
    }

    #[test]
    fn scattered_room_is_compacted_and_a_failed_placement_leaves_no_hole() {
        let mut layout = Layout::new(Some(10 * PAGE_SIZE));
        let mut out = DeviceRefresh::default();
        layout.grow_table(40, &mut out);
        // 40 table entries take 160 bytes, so 9 pages fit.
        layout.place_all(&[(0, 2), (10, 2), (20, 2), (30, 2)], &mut out).unwrap();
        layout.give_back(0, &mut out);
        layout.give_back(20, &mut out);
        assert_eq!(layout.next, 8, "holes below the top stay holes");
        // 4 pages of room (two holes of 2 and one free page at the top), not in one piece.
        assert!(layout.place_all(&[(5, 4)], &mut out).is_err());
        assert_eq!(layout.next, 8, "the failed placement took nothing");
        layout.compact(&[(10, 2), (30, 2), (5, 4)], &mut out).unwrap();
        assert_eq!((layout.table[10], layout.table[30], layout.table[5], layout.next), (0, 2, 4, 8));
        assert!(layout.table[20] == NO_PAGE && layout.table[0] == NO_PAGE);
        layout.give_back(5, &mut out);
        assert_eq!(layout.next, 4, "a run at the top lowers the top");
    }

    #[test]
    fn a_failed_placement_gives_back_what_it_placed() {
        let mut layout = Layout::new(Some(6 * PAGE_SIZE));
        let mut out = DeviceRefresh::default();
        layout.grow_table(20, &mut out);
        // 20 table entries take 80 bytes: 5 pages fit, 6 do not.
        assert!(layout.place_all(&[(0, 3), (10, 3)], &mut out).is_err());
        assert!(layout.placed.is_empty() && layout.table.iter().all(|&p| p == NO_PAGE));
        layout.place_all(&[(0, 3), (10, 2)], &mut out).unwrap();
        assert_eq!((layout.table[0], layout.table[2], layout.table[10], layout.table[11]), (0, 2, 3, 4));
    }
}
