//! The B-link tree against `std::collections::BTreeMap`: random batches of operations, each
//! batch one transaction, `check()` after every batch. Operations include removals, batched
//! updates (`apply_batch`, with duplicate keys), removing everything (then the next batches
//! reinsert), and a bulk-loaded start. The same test runs over a tiny key domain, where
//! merges, redistributions and root shrinks happen all the time.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use tusk_index::{BTree, BatchOutcome, Op as BatchOp};

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u64),
    /// A read-modify-write in one descent: the new value is the old one (0 when absent)
    /// times 3 plus the operand.
    Update(u64, u64),
    Remove(u64),
    Get(u64),
    /// Lookups of several keys (duplicates and absent ones included) with one `get_many`,
    /// more than one lookup group of them at times.
    GetMany(Vec<u64>),
    Range(u64, u64),
    Count(u64, u64),
    Sum(u64, u64),
    Batch(Vec<BatchOp>),
    /// Removes every key, one by one or (true) as one batch; later batches reinsert.
    RemoveAll(bool),
}

/// Keys from a small domain (many duplicates, dense ranges) or anywhere in u64 (edges included).
fn wide_key() -> BoxedStrategy<u64> {
    prop_oneof![4 => 0u64..2_000, 1 => any::<u64>(), 1 => Just(u64::MAX), 1 => Just(0)].boxed()
}

/// Keys from 0..64: a tree of a few leaves that keeps splitting and merging.
fn tiny_key() -> BoxedStrategy<u64> {
    (0u64..64).boxed()
}

fn batch_op(key: BoxedStrategy<u64>) -> impl Strategy<Value = BatchOp> {
    prop_oneof![
        3 => (key.clone(), any::<u64>()).prop_map(|(key, value)| BatchOp::Upsert { key, value }),
        2 => key.prop_map(|key| BatchOp::Remove { key }),
    ]
}

fn op(key: BoxedStrategy<u64>) -> impl Strategy<Value = Op> {
    let k = key.clone();
    prop_oneof![
        6 => (k.clone(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (k.clone(), any::<u64>()).prop_map(|(k, v)| Op::Update(k, v)),
        5 => k.clone().prop_map(Op::Remove),
        2 => k.clone().prop_map(Op::Get),
        1 => prop::collection::vec(k.clone(), 0..40).prop_map(Op::GetMany),
        1 => (k.clone(), k.clone()).prop_map(|(a, b)| Op::Range(a.min(b), a.max(b))),
        1 => (k.clone(), k.clone()).prop_map(|(a, b)| Op::Count(a.min(b), a.max(b))),
        1 => (k.clone(), k).prop_map(|(a, b)| Op::Sum(a.min(b), a.max(b))),
        1 => prop::collection::vec(batch_op(key), 0..200).prop_map(Op::Batch),
        1 => any::<bool>().prop_map(Op::RemoveAll),
    ]
}

/// An optional bulk-loaded start: ascending keys (a set) and a fill fraction.
fn start(key: BoxedStrategy<u64>) -> impl Strategy<Value = Option<(Vec<u64>, f64)>> {
    prop::option::of((prop::collection::btree_set(key, 0..600), 0.0f64..1.2)
        .prop_map(|(keys, fill)| (keys.into_iter().collect(), fill)))
}

/// The model's answer to a batch: ops one by one in batch order.
fn model_batch(model: &mut BTreeMap<u64, u64>, ops: &[BatchOp]) -> BatchOutcome {
    let mut out = BatchOutcome::default();
    for op in ops {
        match *op {
            BatchOp::Upsert { key, value } => match model.insert(key, value) {
                Some(_) => out.updated += 1,
                None => out.inserted += 1,
            },
            BatchOp::Remove { key } => match model.remove(&key) {
                Some(_) => out.removed += 1,
                None => out.absent += 1,
            },
        }
    }
    out
}

fn run(start: Option<(Vec<u64>, f64)>, batches: Vec<Vec<Op>>) -> Result<(), TestCaseError> {
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
    let mut model = BTreeMap::new();
    if let Some((keys, fill)) = start {
        common::transact(&engine, |tx| {
            let n = tree.bulk_load(tx, keys.iter().map(|&k| (k, !k)), fill).unwrap();
            assert_eq!(n, keys.len() as u64);
        });
        model.extend(keys.iter().map(|&k| (k, !k)));
    }
    for batch in batches {
        common::transact(&engine, |tx| {
            for op in &batch {
                match op {
                    &Op::Insert(k, v) => assert_eq!(tree.insert(tx, k, v).unwrap(), model.insert(k, v)),
                    &Op::Update(k, v) => {
                        let new = |old: Option<u64>| old.unwrap_or(0).wrapping_mul(3).wrapping_add(v);
                        let old = model.get(&k).copied();
                        model.insert(k, new(old));
                        assert_eq!(tree.update(tx, k, new).unwrap(), old);
                    }
                    &Op::Remove(k) => assert_eq!(tree.remove(tx, k).unwrap(), model.remove(&k)),
                    &Op::Get(k) => assert_eq!(tree.get(tx, k).unwrap(), model.get(&k).copied()),
                    Op::GetMany(keys) => {
                        let expected: Vec<Option<u64>> = keys.iter().map(|k| model.get(k).copied()).collect();
                        assert_eq!(tree.get_many(tx, keys).unwrap(), expected);
                    }
                    &Op::Range(lo, hi) => {
                        let got: Vec<_> = tree.range(tx, lo..hi).unwrap().map(Result::unwrap).collect();
                        let want: Vec<_> = model.range(lo..hi).map(|(&k, &v)| (k, v)).collect();
                        assert_eq!(got, want);
                        let got: Vec<_> = tree.range(tx, lo..=hi).unwrap().map(Result::unwrap).collect();
                        let want: Vec<_> = model.range(lo..=hi).map(|(&k, &v)| (k, v)).collect();
                        assert_eq!(got, want);
                    }
                    &Op::Count(lo, hi) => {
                        assert_eq!(tree.count(tx, lo..hi).unwrap(), model.range(lo..hi).count() as u64);
                        assert_eq!(tree.count(tx, lo..).unwrap(), model.range(lo..).count() as u64);
                    }
                    &Op::Sum(lo, hi) => {
                        let want: u128 = model.range(lo..=hi).map(|(_, &v)| v as u128).sum();
                        assert_eq!(tree.sum(tx, lo..=hi).unwrap(), want);
                    }
                    Op::Batch(ops) => {
                        let want = model_batch(&mut model, ops);
                        assert_eq!(tree.apply_batch(tx, ops).unwrap(), want);
                    }
                    &Op::RemoveAll(batched) => {
                        let keys: Vec<u64> = model.keys().copied().collect();
                        if batched {
                            let ops: Vec<BatchOp> = keys.iter().rev().map(|&key| BatchOp::Remove { key }).collect();
                            let out = tree.apply_batch(tx, &ops).unwrap();
                            assert_eq!(out.removed, keys.len() as u64);
                            model.clear();
                        } else {
                            for k in keys {
                                assert_eq!(tree.remove(tx, k).unwrap(), model.remove(&k));
                            }
                        }
                        let stats = tree.check(tx).unwrap();
                        assert_eq!((stats.levels, stats.nodes, stats.keys), (1, 1, 0));
                    }
                }
            }
        });
        // A fresh transaction sees the committed tree: reopen by name, then validate.
        common::transact(&engine, |tx| {
            let reopened = BTree::named(tx, "t").unwrap();
            prop_assert_eq!(reopened, tree);
            let stats = tree.check(tx).unwrap();
            prop_assert_eq!(stats.keys, model.len() as u64);
            prop_assert_eq!(tree.len(tx).unwrap(), model.len() as u64);
            let all: Vec<_> = tree.range(tx, ..).unwrap().map(Result::unwrap).collect();
            let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
            prop_assert_eq!(all, want);
            Ok(())
        })?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_btreemap(
        start in start(wide_key()),
        batches in prop::collection::vec(prop::collection::vec(op(wide_key()), 1..300), 1..8),
    ) {
        run(start, batches)?;
    }

    #[test]
    fn matches_btreemap_tiny_domain(
        start in start(tiny_key()),
        batches in prop::collection::vec(prop::collection::vec(op(tiny_key()), 1..300), 1..8),
    ) {
        run(start, batches)?;
    }
}
