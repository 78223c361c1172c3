//! Many removals: a 120k-key tree emptied in ascending, descending and shuffled order, with
//! merges and redistributions on every level and the root shrinking level by level down to one
//! empty leaf; then the freed nodes serve the next inserts.

mod common;

use tusk_index::btree::meta::{self, HANDED_OUT};
use tusk_index::BTree;
use tusk_txn::Engine;

const KEYS: u64 = 120_000;
const PER_TX: usize = 2_000;
const CHECK_EVERY: u64 = 10_000;

/// A deterministic permutation of 0..n (see btree_bulk.rs).
fn shuffled(n: u64) -> Vec<u64> {
    let m = n.next_power_of_two();
    (0..m).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % m).filter(|&k| k < n).collect()
}

fn handed_out(engine: &Engine, tree: BTree) -> u64 {
    common::transact(engine, |tx| meta::total(tx, tree.ptr().offset(), HANDED_OUT).unwrap())
}

fn insert_all(engine: &Engine, tree: BTree, keys: &[u64]) {
    for chunk in keys.chunks(PER_TX) {
        common::transact(engine, |tx| {
            for &k in chunk {
                assert_eq!(tree.insert(tx, k * 5, k).unwrap(), None);
            }
        });
    }
}

fn remove_in_order(order: &[u64]) {
    let engine = common::engine(256 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    insert_all(&engine, tree, &shuffled(KEYS));
    let full = common::transact(&engine, |tx| tree.check(tx).unwrap());
    assert!(full.levels >= 4, "{full:?}");
    let mut removed = 0u64;
    for chunk in order.chunks(PER_TX) {
        common::transact(&engine, |tx| {
            for &k in chunk {
                assert_eq!(tree.remove(tx, k * 5).unwrap(), Some(k));
                assert_eq!(tree.remove(tx, k * 5).unwrap(), None);
                removed += 1;
                if removed.is_multiple_of(CHECK_EVERY) {
                    let stats = tree.check(tx).unwrap();
                    assert_eq!(stats.keys, KEYS - removed);
                    assert_eq!(stats.nodes + stats.free_nodes, full.nodes);
                    // A key not yet removed is still there, one removed is gone.
                    assert_eq!(tree.get(tx, k * 5).unwrap(), None);
                }
            }
        });
    }
    let empty = common::transact(&engine, |tx| {
        assert!(tree.is_empty(tx).unwrap());
        assert_eq!(tree.range(tx, ..).unwrap().count(), 0);
        tree.check(tx).unwrap()
    });
    assert_eq!((empty.levels, empty.nodes, empty.leaves, empty.keys), (1, 1, 1, 0));
    assert_eq!(empty.free_nodes, full.nodes - 1);

    // Reinsertion takes nodes from the free list: the slab hands out nothing new.
    let before = handed_out(&engine, tree);
    let again: Vec<u64> = (0..KEYS / 4).collect();
    insert_all(&engine, tree, &again);
    assert_eq!(handed_out(&engine, tree), before);
    common::transact(&engine, |tx| {
        let stats = tree.check(tx).unwrap();
        assert_eq!(stats.keys, KEYS / 4);
        assert_eq!(stats.nodes + stats.free_nodes, full.nodes);
        for k in (0..KEYS / 4).step_by(97) {
            assert_eq!(tree.get(tx, k * 5).unwrap(), Some(k));
        }
    });
}

#[test]
fn remove_all_ascending() {
    remove_in_order(&(0..KEYS).collect::<Vec<_>>());
}

#[test]
fn remove_all_descending() {
    remove_in_order(&(0..KEYS).rev().collect::<Vec<_>>());
}

#[test]
fn remove_all_shuffled() {
    // A different permutation from the insertion order: reverse of the shuffle.
    let mut order = shuffled(KEYS);
    order.reverse();
    remove_in_order(&order);
}

#[test]
fn remove_from_empty_and_absent_keys() {
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        assert_eq!(tree.remove(tx, 7).unwrap(), None);
        tree.insert(tx, 7, 70).unwrap();
        assert_eq!(tree.remove(tx, 8).unwrap(), None);
        assert_eq!(tree.remove(tx, u64::MAX).unwrap(), None);
        assert_eq!(tree.remove(tx, 7).unwrap(), Some(70));
        let stats = tree.check(tx).unwrap();
        assert_eq!((stats.nodes, stats.keys, stats.free_nodes), (1, 0, 0));
    });
}

/// Nodes one thread freed serve another thread's inserts: once the second thread's first slab
/// chunk is spent, it adopts the first thread's free list (read after a peek at each other
/// stripe's list, `slab.rs`) instead of carving a second chunk.
#[test]
fn another_threads_freed_nodes_are_adopted() {
    use tusk_index::btree::slab::NODES_PER_CHUNK;
    let engine = common::engine(256 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    let keys: Vec<u64> = (0..20_000).collect();
    insert_all(&engine, tree, &keys);
    common::transact(&engine, |tx| {
        for &k in &keys {
            assert_eq!(tree.remove(tx, k * 5).unwrap(), Some(k));
        }
    });
    let freed = common::transact(&engine, |tx| tree.check(tx).unwrap()).free_nodes;
    assert!(freed > 2 * NODES_PER_CHUNK, "{freed} nodes freed");
    let before = handed_out(&engine, tree);
    let here = tusk_index::stripe::current();
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_ne!(tusk_index::stripe::current(), here, "the inserting thread needs a stripe of its own");
            insert_all(&engine, tree, &keys);
        });
    });
    let stats = common::transact(&engine, |tx| tree.check(tx).unwrap());
    assert_eq!(stats.keys, keys.len() as u64);
    // One chunk for the new stripe, then the adopted list; without adoption the inserts
    // would have carved as many nodes as the tree holds.
    assert!(handed_out(&engine, tree) <= before + NODES_PER_CHUNK, "carved {} nodes", handed_out(&engine, tree) - before);
    assert!(stats.free_nodes < freed, "{} of {freed} freed nodes left", stats.free_nodes);
}
