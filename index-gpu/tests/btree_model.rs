//! The B-link tree against `std::collections::BTreeMap`: random batches of operations, each
//! batch one transaction, `check()` after every batch.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use tusk_index::BTree;

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u64),
    Get(u64),
    Range(u64, u64),
    Count(u64, u64),
    Sum(u64, u64),
}

/// Keys from a small domain (many duplicates, dense ranges) or anywhere in u64 (edges included).
fn key() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..2_000, 1 => any::<u64>(), 1 => Just(u64::MAX), 1 => Just(0)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (key(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => key().prop_map(Op::Get),
        1 => (key(), key()).prop_map(|(a, b)| Op::Range(a.min(b), a.max(b))),
        1 => (key(), key()).prop_map(|(a, b)| Op::Count(a.min(b), a.max(b))),
        1 => (key(), key()).prop_map(|(a, b)| Op::Sum(a.min(b), a.max(b))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_btreemap(batches in prop::collection::vec(prop::collection::vec(op(), 1..300), 1..8)) {
        let engine = common::engine(64 << 20);
        let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
        let mut model = BTreeMap::new();
        for batch in batches {
            common::transact(&engine, |tx| {
                for op in &batch {
                    match *op {
                        Op::Insert(k, v) => assert_eq!(tree.insert(tx, k, v).unwrap(), model.insert(k, v)),
                        Op::Get(k) => assert_eq!(tree.get(tx, k).unwrap(), model.get(&k).copied()),
                        Op::Range(lo, hi) => {
                            let got: Vec<_> = tree.range(tx, lo..hi).unwrap().map(Result::unwrap).collect();
                            let want: Vec<_> = model.range(lo..hi).map(|(&k, &v)| (k, v)).collect();
                            assert_eq!(got, want);
                            let got: Vec<_> = tree.range(tx, lo..=hi).unwrap().map(Result::unwrap).collect();
                            let want: Vec<_> = model.range(lo..=hi).map(|(&k, &v)| (k, v)).collect();
                            assert_eq!(got, want);
                        }
                        Op::Count(lo, hi) => {
                            assert_eq!(tree.count(tx, lo..hi).unwrap(), model.range(lo..hi).count() as u64);
                            assert_eq!(tree.count(tx, lo..).unwrap(), model.range(lo..).count() as u64);
                        }
                        Op::Sum(lo, hi) => {
                            let want: u128 = model.range(lo..=hi).map(|(_, &v)| v as u128).sum();
                            assert_eq!(tree.sum(tx, lo..=hi).unwrap(), want);
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
    }
}
