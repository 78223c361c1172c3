//! Batched updates equal the same operations applied one by one: large random batches over a
//! populated tree, with duplicate keys, splits and merges along the way.

mod common;

use common::Rng;

use std::collections::BTreeMap;

use tusk_index::{BTree, BatchOutcome, Op};

fn random_ops(rng: &mut Rng, n: usize, domain: u64, remove_share: u64) -> Vec<Op> {
    (0..n)
        .map(|_| {
            let key = rng.next() % domain;
            if rng.next() % 100 < remove_share {
                Op::Remove { key }
            } else {
                Op::Upsert { key, value: rng.next() }
            }
        })
        .collect()
}

fn one_by_one(tree: BTree, tx: &mut tusk_txn::Transaction<'_>, ops: &[Op]) -> BatchOutcome {
    let mut out = BatchOutcome::default();
    for op in ops {
        match *op {
            Op::Upsert { key, value } => match tree.insert(tx, key, value).unwrap() {
                Some(_) => out.updated += 1,
                None => out.inserted += 1,
            },
            Op::Remove { key } => match tree.remove(tx, key).unwrap() {
                Some(_) => out.removed += 1,
                None => out.absent += 1,
            },
        }
    }
    out
}

fn contents(tree: BTree, tx: &mut tusk_txn::Transaction<'_>) -> Vec<(u64, u64)> {
    tree.range(tx, ..).unwrap().map(Result::unwrap).collect()
}

/// Two trees bulk-loaded alike: one for batches, one for the same operations one by one.
fn twin_trees(engine: &tusk_txn::Engine, start: &[(u64, u64)], fill: f64) -> (BTree, BTree) {
    common::transact(engine, |tx| {
        let a = BTree::create(tx).unwrap();
        let b = BTree::create(tx).unwrap();
        a.bulk_load(tx, start.iter().copied(), fill).unwrap();
        b.bulk_load(tx, start.iter().copied(), fill).unwrap();
        (a, b)
    })
}

#[test]
fn fifty_thousand_random_ops_equal_one_by_one() {
    let engine = common::engine(256 << 20);
    let mut rng = Rng(42);
    let start: Vec<(u64, u64)> = (0..30_000u64).map(|k| (k * 2, k)).collect();
    let (batched, single) = twin_trees(&engine, &start, 0.7);
    // Phases: mostly inserts (splits), mixed, mostly removals (merges down to a small tree).
    for (phase, remove_share) in [(0, 20u64), (1, 50), (2, 90), (3, 95)] {
        let ops = random_ops(&mut rng, 50_000, 80_000, remove_share);
        common::transact(&engine, |tx| {
            let got = batched.apply_batch(tx, &ops).unwrap();
            let want = one_by_one(single, tx, &ops);
            assert_eq!(got, want, "phase {phase}");
            assert_eq!(got.inserted + got.updated + got.removed + got.absent, ops.len() as u64);
            let sa = batched.check(tx).unwrap();
            let sb = single.check(tx).unwrap();
            assert_eq!(sa.keys, sb.keys);
            assert_eq!(contents(batched, tx), contents(single, tx), "phase {phase}");
        });
    }
}

/// A batch cut into key-range buckets (as a large one is, at 256 Ki operations a bucket)
/// applies bucket after bucket with one pass's state: the same result as one by one,
/// including splits at bucket edges and duplicate keys.
#[test]
fn a_batch_in_buckets_equals_one_by_one() {
    let engine = common::engine(256 << 20);
    let mut rng = Rng(7);
    let start: Vec<(u64, u64)> = (0..20_000u64).map(|k| (k * 3, k)).collect();
    let (batched, single) = twin_trees(&engine, &start, 0.9);
    for (round, (per_bucket, remove_share)) in [(500usize, 10u64), (64, 40), (3000, 0)].into_iter().enumerate() {
        let ops = random_ops(&mut rng, 40_000, 70_000, remove_share);
        common::transact(&engine, |tx| {
            let got = batched.apply_batch_in_buckets(tx, &ops, per_bucket).unwrap();
            let want = one_by_one(single, tx, &ops);
            assert_eq!(got, want, "round {round}");
            assert_eq!(batched.check(tx).unwrap().keys, single.check(tx).unwrap().keys);
            assert_eq!(contents(batched, tx), contents(single, tx), "round {round}");
        });
    }
}

#[test]
fn small_batches_against_the_model() {
    // Many small batches, keys from a narrow domain so one batch hits a leaf many times and a
    // key several times: the last operation on a key wins.
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    let mut model = BTreeMap::new();
    let mut rng = Rng(7);
    for round in 0..400 {
        let len = (rng.next() % 300) as usize;
        let ops = random_ops(&mut rng, len, 1_500, if round % 4 == 3 { 85 } else { 40 });
        common::transact(&engine, |tx| {
            let mut want = BatchOutcome::default();
            for op in &ops {
                match *op {
                    Op::Upsert { key, value } => match model.insert(key, value) {
                        Some(_) => want.updated += 1,
                        None => want.inserted += 1,
                    },
                    Op::Remove { key } => match model.remove(&key) {
                        Some(_) => want.removed += 1,
                        None => want.absent += 1,
                    },
                }
            }
            assert_eq!(tree.apply_batch(tx, &ops).unwrap(), want, "round {round}");
            assert_eq!(tree.check(tx).unwrap().keys, model.len() as u64);
            assert_eq!(contents(tree, tx), model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
        });
    }
}

#[test]
fn empty_batch_and_duplicates_of_one_key() {
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        assert_eq!(tree.apply_batch(tx, &[]).unwrap(), BatchOutcome::default());
        let ops = [
            Op::Upsert { key: 5, value: 1 },
            Op::Remove { key: 5 },
            Op::Remove { key: 5 },
            Op::Upsert { key: 5, value: 2 },
            Op::Upsert { key: 5, value: 3 },
            Op::Upsert { key: 4, value: 9 },
        ];
        let out = tree.apply_batch(tx, &ops).unwrap();
        assert_eq!(out, BatchOutcome { inserted: 3, updated: 1, removed: 1, absent: 1 });
        assert_eq!(contents(tree, tx), vec![(4, 9), (5, 3)]);
        assert_eq!(tree.len(tx).unwrap(), 2);
        tree.check(tx).unwrap();
    });
}

/// Heap access that counts loads, to see what a batch saves.
struct Counting<'a, 'e> {
    tx: &'a mut tusk_txn::Transaction<'e>,
    loads: u64,
}

impl tusk_index::heap::HeapRead for Counting<'_, '_> {
    fn load(&mut self, off: u64) -> Result<u64, tusk_txn::TxnError> {
        self.loads += 1;
        self.tx.load(off)
    }
}

impl tusk_index::heap::HeapWrite for Counting<'_, '_> {
    fn store(&mut self, off: u64, value: u64) -> Result<(), tusk_txn::TxnError> {
        self.tx.store(off, value)
    }

    fn alloc(&mut self, len: u64) -> Result<u64, tusk_txn::TxnError> {
        tusk_index::heap::HeapWrite::alloc(self.tx, len)
    }
}

#[test]
fn batch_descends_once_per_leaf() {
    // 5,000 updates over 10,000 consecutive keys of a 100k-key tree touch ~500 leaves: the
    // batch reads a fraction of what 5,000 separate descents read.
    let engine = common::engine(128 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        tree.bulk_load(tx, (0..100_000u64).map(|k| (k, k)), 0.7).unwrap();
        let ops: Vec<Op> = (0..5_000u64).rev().map(|i| Op::Upsert { key: 40_000 + i * 2, value: i }).collect();
        let mut counting = Counting { tx, loads: 0 };
        let out = tree.apply_batch(&mut counting, &ops).unwrap();
        assert_eq!(out.updated, 5_000);
        let batch_loads = counting.loads;
        counting.loads = 0;
        for op in &ops {
            if let Op::Upsert { key, value } = *op {
                tree.insert(&mut counting, key, value + 1).unwrap();
            }
        }
        let single_loads = counting.loads;
        assert!(batch_loads * 3 < single_loads, "batch {batch_loads} loads, one by one {single_loads}");
        tree.check(tx).unwrap();
    });
}

#[test]
fn a_dense_batch_walks_the_leaf_level() {
    // Every key of 20,000 consecutive ones: each touched leaf's next is its right sibling, so
    // the batch reads the leaves (header, keys, values; the sibling's header) and descends
    // once, where a descent per leaf would read ~27 more words per leaf (three internal levels).
    let engine = common::engine(128 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        tree.bulk_load(tx, (0..100_000u64).map(|k| (k, k)), 0.7).unwrap();
        let ops: Vec<Op> = (40_000..60_000u64).map(|key| Op::Upsert { key, value: key + 1 }).collect();
        let mut counting = Counting { tx, loads: 0 };
        let out = tree.apply_batch(&mut counting, &ops).unwrap();
        assert_eq!(out.updated, 20_000);
        let per_op = counting.loads as f64 / ops.len() as f64;
        assert!(per_op < 2.5, "{per_op:.2} words read per operation: a key and a value each, and little else");
        assert_eq!(tree.get(tx, 50_000).unwrap(), Some(50_001));
        tree.check(tx).unwrap();
    });
}

#[test]
fn splits_inside_a_dense_batch_grow_the_tree_as_one_by_one() {
    // A full tree (fill 1.0) and a batch that inserts between every two keys: every leaf
    // splits, most more than once, in the batch's own pass (separators going up the last
    // descent's path, moving right), parents split in turn, and at the commit, where the
    // internal splits' separators go up (`btree/posts.rs`), the root grows.
    let engine = common::engine(64 << 20);
    let start: Vec<(u64, u64)> = (0..3_000u64).map(|k| (k * 4, k)).collect();
    let (batched, single) = twin_trees(&engine, &start, 1.0);
    let ops: Vec<Op> = (0..12_000u64).filter(|k| k % 4 != 0).rev().map(|key| Op::Upsert { key, value: key + 7 }).collect();
    let before = common::transact(&engine, |tx| {
        let before = batched.check(tx).unwrap();
        let got = batched.apply_batch(tx, &ops).unwrap();
        let want = one_by_one(single, tx, &ops);
        assert_eq!(got, want);
        assert_eq!(got.inserted, 9_000);
        assert_eq!(batched.check(tx).unwrap().keys, 12_000);
        assert_eq!(contents(batched, tx), contents(single, tx));
        before
    });
    common::transact(&engine, |tx| {
        let after = batched.check(tx).unwrap();
        assert_eq!(after.keys, 12_000);
        assert!(after.levels > before.levels, "the root grew: {} -> {} levels", before.levels, after.levels);
        assert_eq!(contents(batched, tx), contents(single, tx));
    });
}

#[test]
fn a_batch_into_an_empty_tree_reads_a_bounded_amount_per_key() {
    // 400,000 new keys into an empty tree: the batch splits leaf after leaf without a new
    // descent, each separator moving right along the parent level from where the last one
    // went. When it moved right from the last descent's node instead (the path never
    // updated), each split walked the parent level again: the words read per key grew with
    // the tree (a 64 M-key batch never ended).
    let engine = common::engine(256 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        let mut rng = Rng(3);
        let ops: Vec<Op> = (0..400_000).map(|_| Op::Upsert { key: rng.next(), value: 1 }).collect();
        let mut counting = Counting { tx, loads: 0 };
        let out = tree.apply_batch(&mut counting, &ops).unwrap();
        assert_eq!(out.inserted, 400_000);
        let per_op = counting.loads as f64 / ops.len() as f64;
        assert!(per_op < 6.0, "{per_op:.2} words read per key");
        assert_eq!(tree.check(tx).unwrap().keys, 400_000);
    });
}
