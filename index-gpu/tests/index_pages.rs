//! The index-only layout of the GPU mirror (`mirror/index_pages.rs`) without a GPU: a heap of
//! mostly records with named trees in it, the layout refreshed from an image, and the device
//! memory it describes built on the host (each placed object's pages copied to the device
//! pages the table names). The CPU read paths then run through the page table, a load at a
//! time, as the kernels do: every node the trees' full checks reach, and every answer, must
//! come out right, while the device holds a small part of the heap. Then rounds of inserts
//! (new chunks), a tree dropped and another made (pages given back and reused), and a tree
//! from before the chunk lists (refused).

mod common;

use std::collections::BTreeMap;

use common::Rng;
use tusk_index::heap::HeapRead;
use tusk_index::mirror::index_pages::{IndexPages, Refresh, NO_PAGE};
use tusk_index::mirror::MirrorError;
use tusk_index::{Art, BTree};
use tusk_storage::layout::BRK_OFF;
use tusk_storage::PAGE_SIZE;
use tusk_txn::{Engine, TxnError};

/// The heap's bytes [0, extent).
fn image(engine: &Engine) -> Vec<u8> {
    let heap = engine.heap();
    let extent = heap.load_word(BRK_OFF).next_multiple_of(PAGE_SIZE);
    let mut bytes = vec![0u8; extent as usize];
    heap.read_bytes(0, &mut bytes);
    bytes
}

/// Device memory as the layout describes it, read through its page table as the kernels do.
struct Device {
    bytes: Vec<u8>,
    table: Vec<u32>,
}

impl Device {
    /// What a sync leaves on the device: every held page as `image` has it (the streamed
    /// pages and the refresh's new objects together).
    fn synced(pages: &IndexPages, d: usize, refresh: &Refresh, image: &[u8]) -> Device {
        let table = pages.table(d).to_vec();
        let mut bytes = vec![0u8; (refresh.devices[d].device_pages * PAGE_SIZE) as usize];
        for (heap_page, &dev) in table.iter().enumerate() {
            if dev != NO_PAGE {
                let (from, to) = (heap_page * PAGE_SIZE as usize, dev as usize * PAGE_SIZE as usize);
                bytes[to..to + PAGE_SIZE as usize].copy_from_slice(&image[from..from + PAGE_SIZE as usize]);
            }
        }
        Device { bytes, table }
    }

    fn at(&self, off: u64) -> Result<usize, TxnError> {
        match self.table.get((off / PAGE_SIZE) as usize) {
            Some(&page) if page != NO_PAGE && off.is_multiple_of(8) => Ok((page as u64 * PAGE_SIZE + off % PAGE_SIZE) as usize),
            _ => Err(TxnError::InvalidPointer(off)),
        }
    }
}

impl HeapRead for Device {
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        let at = self.at(off)?;
        Ok(u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes")))
    }

    fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.load(off + 8 * i as u64)?;
        }
        Ok(())
    }

    fn prefetch(&self, _off: u64, _len: u64) {}

    fn contains(&self, off: u64, len: u64) -> bool {
        (off..off + len).step_by(PAGE_SIZE as usize).all(|o| self.at(o & !7).is_ok()) && self.at((off + len).saturating_sub(8) & !7).is_ok()
    }
}

/// Each object's pages are consecutive on the device, and no device page holds two heap pages.
fn assert_objects_contiguous(pages: &IndexPages, d: usize) {
    let mut device_pages_seen = std::collections::HashSet::new();
    for (first, count, device) in pages.objects(d) {
        for i in 0..count {
            assert_eq!(pages.device_page(d, first + i), Some(device + i as u32), "page {i} of the object at heap page {first}");
            assert!(device_pages_seen.insert(device + i as u32), "device page {} holds two heap pages", device + i as u32);
        }
    }
    let held = pages.table(d).iter().filter(|&&p| p != NO_PAGE).count();
    assert_eq!(held, device_pages_seen.len(), "every held page belongs to an object");
}

struct Models {
    orders: BTreeMap<u64, u64>,
    users: BTreeMap<Vec<u8>, u64>,
}

fn check(device: &mut Device, orders: &BTree, users: &Art, models: &Models, what: &str) {
    let stats = orders.check(device).unwrap_or_else(|e| panic!("{what}: the B-link tree through the page table: {e}"));
    assert_eq!(stats.keys, models.orders.len() as u64, "{what}");
    for (k, v) in models.orders.iter().step_by(7) {
        assert_eq!(orders.get(device, *k).unwrap(), Some(*v), "{what}: key {k}");
    }
    let stats = users.check(device).unwrap_or_else(|e| panic!("{what}: the ART through the page table: {e}"));
    assert_eq!(stats.keys, models.users.len() as u64, "{what}");
    for (k, v) in models.users.iter().step_by(5) {
        assert_eq!(users.get(device, k).unwrap(), Some(*v), "{what}: key {k:?}");
    }
}

/// Inserts `n` keys into both trees, between records of 1–6 KiB (small and large allocations)
/// that take most of the heap.
fn grow(engine: &Engine, orders: &BTree, users: &Art, models: &mut Models, rng: &mut Rng, n: usize) {
    for _ in 0..n / 500 {
        common::transact(engine, |tx| {
            for _ in 0..500 {
                let k = rng.next();
                orders.insert(tx, k, k ^ 1).unwrap();
                models.orders.insert(k, k ^ 1);
                let key = format!("user/{:x}", rng.below(1 << 40)).into_bytes();
                users.insert(tx, &key, k).unwrap();
                models.users.insert(key, k);
            }
            for _ in 0..200 {
                let record = tx.alloc(1024 + rng.below(5 * 1024)).unwrap();
                tx.store(record.offset(), 0xfeed).unwrap();
            }
        });
    }
}

#[test]
fn the_trees_read_through_the_page_table_as_from_the_heap() {
    let engine = common::engine(256 << 20);
    let mut rng = Rng::new("the_trees_read_through_the_page_table_as_from_the_heap");
    let (orders, users, stray) = common::transact(&engine, |tx| (BTree::named(tx, "orders").unwrap(), Art::named(tx, "users").unwrap(), BTree::create(tx).unwrap()));
    // A tree under no root is not mirrored.
    common::transact(&engine, |tx| stray.insert(tx, 1, 1).unwrap());
    let mut models = Models { orders: BTreeMap::new(), users: BTreeMap::new() };
    grow(&engine, &orders, &users, &mut models, &mut rng, 20_000);

    let mut pages = IndexPages::new(1, None);
    let img = image(&engine);
    let refresh = pages.refresh(&img, img.len() as u64).unwrap();
    assert_eq!(refresh.devices[0].changed, Some(0..img.len() / PAGE_SIZE as usize), "the first refresh writes the whole table");
    assert_eq!(refresh.devices[0].new.iter().map(|r| r.end - r.start).sum::<u64>(), pages.mirrored_bytes(0));
    assert!(pages.holders(orders.ptr().offset()) == [0] && pages.holders(users.ptr().offset()) == [0] && pages.holders(stray.ptr().offset()).is_empty());
    let held = pages.mirrored_bytes(0);
    eprintln!("heap {} MiB, index pages {} MiB", img.len() >> 20, held >> 20);
    assert!(held * 4 < img.len() as u64, "the index pages ({held} bytes) are a small part of the heap ({} bytes)", img.len());
    assert_objects_contiguous(&pages, 0);
    let mut device = Device::synced(&pages, 0, &refresh, &img);
    check(&mut device, &orders, &users, &models, "first sync");
    assert!(stray.check(&mut device).is_err(), "a tree under no root is not on the device");

    // Rounds of growth: new chunks only, placed after the others.
    for round in 0..3 {
        let before = pages.device_pages(0);
        grow(&engine, &orders, &users, &mut models, &mut rng, 10_000);
        let img = image(&engine);
        let refresh = pages.refresh(&img, img.len() as u64).unwrap();
        let new = &refresh.devices[0].new;
        assert!(!new.is_empty() && refresh.devices[0].device_pages > before, "round {round}: new chunks");
        assert!(new.iter().all(|r| pages.device_page(0, r.start / PAGE_SIZE).is_some_and(|d| d as u64 >= before)), "round {round}: only new objects are new");
        assert_objects_contiguous(&pages, 0);
        let mut device = Device::synced(&pages, 0, &refresh, &img);
        check(&mut device, &orders, &users, &models, &format!("round {round}"));
        // A refresh with nothing new changes nothing.
        let again = pages.refresh(&img, img.len() as u64).unwrap();
        assert!(again.devices[0].new.is_empty() && again.devices[0].changed.is_none(), "round {round}: a second refresh of the same image");
    }

    // The ART's root goes away: its pages are given back; a new ART reuses them.
    let old_users = users.ptr().offset();
    let old_pages: Vec<u64> = (0..pages.table(0).len() as u64).filter(|&p| pages.device_page(0, p).is_some()).collect();
    common::transact(&engine, |tx| assert!(tx.remove_root("users").unwrap()));
    let img = image(&engine);
    let used_before = pages.device_pages(0);
    pages.refresh(&img, img.len() as u64).unwrap();
    assert!(pages.holders(old_users).is_empty());
    assert!(old_pages.iter().filter(|&&p| pages.device_page(0, p).is_none()).count() > 4, "the dropped tree's pages are no longer held");
    let users = common::transact(&engine, |tx| Art::named(tx, "users2").unwrap());
    models.users.clear();
    grow(&engine, &orders, &users, &mut models, &mut rng, 5_000);
    let img = image(&engine);
    let refresh = pages.refresh(&img, img.len() as u64).unwrap();
    assert!(refresh.devices[0].new.iter().any(|r| pages.device_page(0, r.start / PAGE_SIZE).is_some_and(|d| (d as u64) < used_before)), "freed device pages are reused");
    assert_objects_contiguous(&pages, 0);
    let mut device = Device::synced(&pages, 0, &refresh, &img);
    check(&mut device, &orders, &users, &models, "after a dropped tree");
}

#[test]
fn a_btree_from_before_chunk_lists_is_refused_and_a_limit_holds() {
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| {
        let tree = BTree::named(tx, "old").unwrap();
        for k in 0..5_000u64 {
            tree.insert(tx, k * 31, k).unwrap();
        }
        tree
    });
    let img = image(&engine);
    // Under a limit smaller than its pages and table, the layout says what it needs.
    match IndexPages::new(1, Some(64 << 10)).refresh(&img, img.len() as u64) {
        Err(MirrorError::OverLimit { bytes, limit }) => assert!(bytes > limit && limit == 64 << 10),
        other => panic!("a layout over its limit: {other:?}"),
    }
    IndexPages::new(1, None).refresh(&img, img.len() as u64).unwrap();
    // Zero the chunk words of the stripe that holds the nodes, as a tree made before them has.
    let meta = tree.ptr().offset();
    common::transact(&engine, |tx| {
        for s in 0..tusk_index::stripe::STRIPES {
            let stripe = tusk_index::btree::meta::stripe(meta, s);
            tx.store(stripe + tusk_index::btree::meta::CHUNKS, 0).unwrap();
            tx.store(stripe + tusk_index::btree::meta::LAST_CHUNK, 0).unwrap();
        }
    });
    let img = image(&engine);
    match IndexPages::new(1, None).refresh(&img, img.len() as u64) {
        Err(MirrorError::Unsupported(why)) => assert!(why.contains("before its slab listed its chunks"), "{why}"),
        other => panic!("a tree without chunk lists: {other:?}"),
    }
    // The tree itself still works.
    common::transact(&engine, |tx| assert_eq!(tree.get(tx, 31).unwrap(), Some(1)));
}

/// Several GPUs: trees that fit on each are replicated on all; trees that do not all fit on
/// one are sharded (a replica gives way to a tree with no copy), and each tree reads right
/// through the table of every GPU holding it; a tree larger than any GPU's limit is refused.
#[test]
fn trees_are_replicated_where_they_fit_and_sharded_where_they_do_not() {
    let engine = common::engine(256 << 20);
    let mut rng = Rng::new("trees_are_replicated_where_they_fit_and_sharded_where_they_do_not");
    let (orders, users) = common::transact(&engine, |tx| (BTree::named(tx, "orders").unwrap(), Art::named(tx, "users").unwrap()));
    let mut models = Models { orders: BTreeMap::new(), users: BTreeMap::new() };
    grow(&engine, &orders, &users, &mut models, &mut rng, 20_000);
    let img = image(&engine);
    let (o, u) = (orders.ptr().offset(), users.ptr().offset());

    let mut replicated = IndexPages::new(2, None);
    let refresh = replicated.refresh(&img, img.len() as u64).unwrap();
    assert_eq!((replicated.holders(o), replicated.holders(u)), (&[0, 1][..], &[0, 1][..]), "without a limit every tree is on every GPU");
    for d in 0..2 {
        assert_objects_contiguous(&replicated, d);
        check(&mut Device::synced(&replicated, d, &refresh, &img), &orders, &users, &models, &format!("replica on GPU {d}"));
    }

    // A limit that holds either tree but not both: one tree per GPU.
    let table = 4 * img.len() as u64 / PAGE_SIZE;
    let (ob, ub) = (replicated.tree_bytes(o), replicated.tree_bytes(u));
    let limit = ob.max(ub) + table + (64 << 10);
    assert!(limit < ob + ub + table, "the test's trees ({ob} and {ub} bytes) must not fit on one GPU together");
    // On two GPUs one tree each; on more, the first tree placed keeps its other replicas.
    for gpus in [4, 3, 2] {
        let mut sharded = IndexPages::new(gpus, Some(limit));
        let refresh = sharded.refresh(&img, img.len() as u64).unwrap();
        let (ho, hu) = (sharded.holders(o).to_vec(), sharded.holders(u).to_vec());
        assert!(!ho.is_empty() && !hu.is_empty() && ho.iter().all(|d| !hu.contains(d)), "{gpus} GPUs: B-link on {ho:?}, ART on {hu:?}");
        assert_eq!(ho.len() + hu.len(), gpus, "{gpus} GPUs: every GPU holds a tree");
        for d in 0..gpus {
            assert!(sharded.device_bytes(d) <= limit, "GPU {d} of {gpus}: {} bytes over the limit {limit}", sharded.device_bytes(d));
            assert_objects_contiguous(&sharded, d);
        }
        for &d in &ho {
            let mut on_orders = Device::synced(&sharded, d, &refresh, &img);
            assert_eq!(orders.check(&mut on_orders).unwrap().keys, models.orders.len() as u64);
            assert!(users.check(&mut on_orders).is_err(), "the ART is not on the B-link tree's GPU");
        }
        for &d in &hu {
            assert_eq!(users.check(&mut Device::synced(&sharded, d, &refresh, &img)).unwrap().keys, models.users.len() as u64);
        }
    }
    let mut sharded = IndexPages::new(2, Some(limit));
    sharded.refresh(&img, img.len() as u64).unwrap();

    // Growth past a GPU's room moves nothing silently: the next refresh either still fits or
    // says what it needs.
    grow(&engine, &orders, &users, &mut models, &mut rng, 20_000);
    let img = image(&engine);
    match sharded.refresh(&img, img.len() as u64) {
        Ok(refresh) => {
            for d in 0..2 {
                assert!(sharded.device_bytes(d) <= limit);
            }
            let (ho, hu) = (sharded.holders(o).to_vec(), sharded.holders(u).to_vec());
            assert_eq!(orders.check(&mut Device::synced(&sharded, ho[0], &refresh, &img)).unwrap().keys, models.orders.len() as u64);
            assert_eq!(users.check(&mut Device::synced(&sharded, hu[0], &refresh, &img)).unwrap().keys, models.users.len() as u64);
        }
        Err(MirrorError::OverLimit { bytes, limit: l }) => assert!(bytes > l && l == limit),
        Err(e) => panic!("growth past the limit: {e}"),
    }

    // A tree larger than any one GPU's limit.
    match IndexPages::new(2, Some(ob.min(ub) / 2)).refresh(&img, img.len() as u64) {
        Err(MirrorError::OverLimit { .. }) => {}
        other => panic!("trees larger than any GPU: {other:?}"),
    }
}

/// Two GPUs whose limit holds the large tree, or the small one, but not both: the small tree
/// starts on both, gives up one copy when the large one comes, and takes it back once the
/// large one is dropped (its batches then split across both GPUs again). The copy taken back
/// reads as the heap does through that GPU's table, and a second refresh changes nothing.
#[test]
fn a_replica_given_up_for_room_comes_back_when_the_room_does() {
    let engine = common::engine(128 << 20);
    let mut rng = Rng::new("a_replica_given_up_for_room_comes_back_when_the_room_does");
    let fill = |tree: &BTree, model: &mut BTreeMap<u64, u64>, rng: &mut Rng, n: usize| {
        for _ in 0..n / 1000 {
            common::transact(&engine, |tx| {
                for _ in 0..1000 {
                    let k = rng.next();
                    tree.insert(tx, k, k ^ 3).unwrap();
                    model.insert(k, k ^ 3);
                }
            });
        }
    };
    let (small, large) = common::transact(&engine, |tx| (BTree::named(tx, "small").unwrap(), BTree::create(tx).unwrap()));
    let mut small_model = BTreeMap::new();
    fill(&small, &mut small_model, &mut rng, 20_000);
    let with_small = image(&engine);
    common::transact(&engine, |tx| tx.set_root("large", large.ptr()).unwrap());
    fill(&large, &mut BTreeMap::new(), &mut rng, 120_000);
    let with_both = image(&engine);
    common::transact(&engine, |tx| assert!(tx.remove_root("large").unwrap()));
    let large_dropped = image(&engine);
    assert_eq!(large_dropped.len(), with_both.len(), "dropping a root leaves the heap's extent");

    let (small_meta, large_meta) = (small.ptr().offset(), large.ptr().offset());
    let mut probe = IndexPages::new(1, None);
    probe.refresh(&with_both, with_both.len() as u64).unwrap();
    let (s, l) = (probe.tree_bytes(small_meta), probe.tree_bytes(large_meta));
    assert!(l > s && s > 0, "the large tree ({l} bytes) is larger than the small one ({s})");
    let limit = 4 * (with_both.len() as u64 / PAGE_SIZE) + l + s / 2;

    let mut pages = IndexPages::new(2, Some(limit));
    pages.refresh(&with_small, with_small.len() as u64).unwrap();
    assert_eq!(pages.holders(small_meta), [0, 1], "alone, the small tree is on both GPUs");
    pages.refresh(&with_both, with_both.len() as u64).unwrap();
    let (on_large, on_small) = (pages.holders(large_meta).to_vec(), pages.holders(small_meta).to_vec());
    assert!(on_large.len() == 1 && on_small.len() == 1 && on_large != on_small, "sharded: large on {on_large:?}, small on {on_small:?}");
    let freed = on_large[0];

    let refresh = pages.refresh(&large_dropped, large_dropped.len() as u64).unwrap();
    assert!(pages.holders(large_meta).is_empty());
    assert_eq!(pages.holders(small_meta), [0, 1], "the small tree's copy is back on GPU {freed}");
    assert_eq!(refresh.devices[freed].new.iter().map(|r| r.end - r.start).sum::<u64>(), s, "its objects are uploaded to GPU {freed}");
    assert!(refresh.devices[on_small[0]].new.is_empty(), "the GPU that kept its copy uploads nothing");
    assert_objects_contiguous(&pages, freed);
    let mut device = Device::synced(&pages, freed, &refresh, &large_dropped);
    let stats = small.check(&mut device).unwrap_or_else(|e| panic!("the small tree through GPU {freed}'s table: {e}"));
    assert_eq!(stats.keys, small_model.len() as u64);
    for (k, v) in small_model.iter().step_by(11) {
        assert_eq!(small.get(&mut device, *k).unwrap(), Some(*v), "key {k}");
    }
    let again = pages.refresh(&large_dropped, large_dropped.len() as u64).unwrap();
    assert!(again.devices.iter().all(|d| d.new.is_empty() && d.changed.is_none()), "a second refresh of the same image changes nothing");
}
