//! Bulk load: a million ascending keys at several fills, every level checked; the errors
//! (unsorted input, a non-empty tree) leave a valid tree behind.

mod common;

use tusk_index::btree::bulk::entries_per_node;
use tusk_index::btree::layout::{CAPACITY, MIN_FILL};
use tusk_index::{BTree, IndexError, Op};

const KEYS: u64 = 1_000_000;

fn load_million(fill: f64) {
    let engine = common::engine(512 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    // A streamed input: an iterator, never collected.
    let n = common::transact(&engine, |tx| tree.bulk_load(tx, (0..KEYS).map(|k| (k * 2 + 1, k)), fill).unwrap());
    assert_eq!(n, KEYS);
    common::transact(&engine, |tx| {
        let stats = tree.check(tx).unwrap();
        assert_eq!(stats.keys, KEYS);
        assert_eq!(stats.free_nodes, 0);
        let per = entries_per_node(fill) as u64;
        // Every leaf but the last two holds exactly `per` entries.
        assert!(stats.leaves <= KEYS.div_ceil(per) + 1 && stats.leaves >= KEYS / per, "{stats:?}");
        for k in (0..KEYS).step_by(997).chain([0, KEYS - 1]) {
            assert_eq!(tree.get(tx, k * 2 + 1).unwrap(), Some(k));
            assert_eq!(tree.get(tx, k * 2).unwrap(), None);
        }
        assert_eq!(tree.count(tx, 1..=2_001).unwrap(), 1_001);
        assert_eq!(tree.sum(tx, ..).unwrap(), (KEYS as u128) * (KEYS as u128 - 1) / 2);
        // The loaded tree takes ordinary updates.
        assert_eq!(tree.insert(tx, 0, 9).unwrap(), None);
        assert_eq!(tree.remove(tx, 1).unwrap(), Some(0));
        tree.check(tx).unwrap();
    });
}

#[test]
fn million_keys_half_full() {
    load_million(0.5);
}

#[test]
fn million_keys_70_percent() {
    load_million(0.7);
}

#[test]
fn million_keys_full() {
    load_million(1.0);
}

#[test]
fn fill_is_clamped() {
    assert_eq!(entries_per_node(0.0), MIN_FILL);
    assert_eq!(entries_per_node(-3.0), MIN_FILL);
    assert_eq!(entries_per_node(f64::NAN), MIN_FILL);
    assert_eq!(entries_per_node(1.0), CAPACITY);
    assert_eq!(entries_per_node(7.5), CAPACITY);
}

#[test]
fn every_small_size_and_fill() {
    // The last-node rebalance, the lone root, and two-node upper levels, for all small sizes.
    // One tree throughout: emptied by a batch of removals after each load, so the loads also
    // run on a tree with free nodes, and the slab stays small.
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    for n in 0..900u64 {
        for fill in [0.5, 0.6, 1.0] {
            common::transact(&engine, |tx| {
                assert_eq!(tree.bulk_load(tx, (0..n).map(|k| (k + 10, k)), fill).unwrap(), n);
                let stats = tree.check(tx).unwrap();
                assert_eq!(stats.keys, n);
                let all: Vec<_> = tree.range(tx, ..).unwrap().map(Result::unwrap).collect();
                assert_eq!(all, (0..n).map(|k| (k + 10, k)).collect::<Vec<_>>());
                let removals: Vec<Op> = (0..n).map(|k| Op::Remove { key: k + 10 }).collect();
                assert_eq!(tree.apply_batch(tx, &removals).unwrap().removed, n);
                assert_eq!(tree.check(tx).unwrap().nodes, 1);
            });
        }
    }
}

#[test]
fn unsorted_input_leaves_an_empty_valid_tree() {
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    for bad_at in [1u64, 5, 40, 10_000] {
        // Keys ascend up to `bad_at`, which repeats its predecessor (or goes back, below).
        let input = (0..20_000u64).map(move |i| if i == bad_at { (i - 1, 0) } else { (i, 0) });
        let err = common::transact(&engine, |tx| tree.bulk_load(tx, input, 0.8).unwrap_err());
        assert!(matches!(err, IndexError::NotSorted { at_index } if at_index == bad_at), "{err:?}");
        let descending = [(9u64, 0u64), (3, 0)];
        let err = common::transact(&engine, |tx| tree.bulk_load(tx, descending, 0.8).unwrap_err());
        assert!(matches!(err, IndexError::NotSorted { at_index: 1 }), "{err:?}");
        // Committed anyway: the tree is empty and valid, its nodes on the free list.
        common::transact(&engine, |tx| {
            let stats = tree.check(tx).unwrap();
            assert_eq!((stats.nodes, stats.keys), (1, 0));
            assert!(tree.is_empty(tx).unwrap());
        });
    }
    // And a correct load afterwards reuses the freed nodes.
    common::transact(&engine, |tx| {
        assert_eq!(tree.bulk_load(tx, (0..5_000u64).map(|k| (k, k)), 1.0).unwrap(), 5_000);
        let stats = tree.check(tx).unwrap();
        assert_eq!(stats.keys, 5_000);
    });
}

#[test]
fn non_empty_tree_is_refused() {
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        for k in 0..100u64 {
            tree.insert(tx, k, k).unwrap();
        }
        let before = tree.check(tx).unwrap();
        assert!(matches!(tree.bulk_load(tx, [(500u64, 1u64)], 1.0), Err(IndexError::NotEmpty)));
        assert_eq!(tree.check(tx).unwrap(), before);
        assert_eq!(tree.get(tx, 500).unwrap(), None);
        // Emptied by removals, it can be bulk loaded again.
        for k in 0..100u64 {
            tree.remove(tx, k).unwrap();
        }
        assert_eq!(tree.bulk_load(tx, (0..1_000u64).map(|k| (k, k)), 0.7).unwrap(), 1_000);
        assert_eq!(tree.check(tx).unwrap().keys, 1_000);
    });
}
