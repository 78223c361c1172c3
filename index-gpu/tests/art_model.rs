//! The ART against `std::collections::BTreeMap<Vec<u8>, u64>`: random batches of operations,
//! each batch one transaction, `check()` after every batch.

mod common;

use std::collections::BTreeMap;
use std::ops::Bound;

use proptest::prelude::*;
use tusk_index::{Art, ArtOp, BatchOutcome, MAX_KEY_LEN};

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u8>, u64),
    Get(Vec<u8>),
    /// Lookups of several keys with one `get_many`, at times more than one lookup group.
    GetMany(Vec<Vec<u8>>),
    Remove(Vec<u8>),
    Range(Vec<u8>, Vec<u8>, u8),
    Prefix(Vec<u8>),
    Count(Vec<u8>, Vec<u8>),
    Sum(Vec<u8>, Vec<u8>),
    CountPrefix(Vec<u8>),
    SumPrefix(Vec<u8>),
    /// Remove every key (the tree empties), to be refilled by later inserts.
    Clear,
}

const LONG: [u8; 40] = *b"a-common-prefix-of-forty-bytes-for-keys.";

/// Keys from generators that collide, share long prefixes, nest, and sit on length boundaries.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // a tiny alphabet: duplicates and keys that are prefixes of others ("", "a", "ab", ...)
        4 => prop::collection::vec(prop::sample::select(vec![b'a', b'b', 0u8, 0xFF]), 0..5),
        // a 40-byte common prefix plus a small suffix (prefixes longer than the stored 8 bytes)
        3 => prop::collection::vec(prop::sample::select(vec![b'x', b'y', 0u8]), 0..4).prop_map(|s| [&LONG[..], &s].concat()),
        // a cut of the long prefix: nodes split inside long prefixes
        1 => (0..=LONG.len()).prop_map(|n| LONG[..n].to_vec()),
        // lengths on every leaf-class boundary
        2 => (prop::sample::select(vec![0usize, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1024, MAX_KEY_LEN]), 0u8..3)
            .prop_map(|(n, b)| vec![b'k' + b; n]),
        // random bytes
        2 => prop::collection::vec(any::<u8>(), 0..12),
        // high fan-out below a shared prefix (N48 and N256 nodes that grow and shrink)
        3 => (prop::sample::select(vec![&b""[..], b"f", b"fan-out-prefix-"]), any::<u8>(), 0u8..4)
            .prop_map(|(p, b, c)| [p, &[b], &[c][..(c as usize % 2)]].concat()),
    ]
}

fn ordered(a: Vec<u8>, b: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    if a <= b { (a, b) } else { (b, a) }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (key(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => key().prop_map(Op::Get),
        1 => prop::collection::vec(key(), 0..40).prop_map(Op::GetMany),
        5 => key().prop_map(Op::Remove),
        1 => (key(), key(), 0u8..4).prop_map(|(a, b, m)| { let (a, b) = ordered(a, b); Op::Range(a, b, m) }),
        1 => key().prop_map(|k| Op::Prefix(k[..k.len().min(3)].to_vec())),
        1 => key().prop_map(Op::Prefix),
        1 => (key(), key()).prop_map(|(a, b)| { let (a, b) = ordered(a, b); Op::Count(a, b) }),
        1 => (key(), key()).prop_map(|(a, b)| { let (a, b) = ordered(a, b); Op::Sum(a, b) }),
        1 => key().prop_map(|k| Op::CountPrefix(k[..k.len().min(2)].to_vec())),
        1 => key().prop_map(|k| Op::SumPrefix(k[..k.len().min(41)].to_vec())),
    ]
}

fn bounds(lo: &[u8], hi: &[u8], mode: u8) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    match mode {
        0 => (Bound::Included(lo.to_vec()), Bound::Excluded(hi.to_vec())),
        1 => (Bound::Excluded(lo.to_vec()), Bound::Included(hi.to_vec())),
        2 => (Bound::Included(lo.to_vec()), Bound::Unbounded),
        _ => (Bound::Unbounded, Bound::Included(hi.to_vec())),
    }
}

fn with_prefix<'m>(model: &'m BTreeMap<Vec<u8>, u64>, p: &'m [u8]) -> impl Iterator<Item = (&'m Vec<u8>, &'m u64)> {
    model.range(p.to_vec()..).take_while(move |(k, _)| k.starts_with(p))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_btreemap(batches in prop::collection::vec((prop::bool::weighted(0.2), prop::collection::vec(op(), 1..400)), 1..8)) {
        let engine = common::engine(64 << 20);
        let tree = common::transact(&engine, |tx| Art::named(tx, "a").unwrap());
        let mut model: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for (clear, mut batch) in batches {
            if clear {
                // Empty the tree first, then refill it with the batch's inserts.
                batch.insert(0, Op::Clear);
            }
            common::transact(&engine, |tx| {
                for op in &batch {
                    match op {
                        Op::Insert(k, v) => assert_eq!(tree.insert(tx, k, *v).unwrap(), model.insert(k.clone(), *v), "insert {k:?}"),
                        Op::Get(k) => assert_eq!(tree.get(tx, k).unwrap(), model.get(k).copied(), "get {k:?}"),
                        Op::GetMany(keys) => {
                            let expected: Vec<Option<u64>> = keys.iter().map(|k| model.get(k).copied()).collect();
                            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                            assert_eq!(tree.get_many(tx, &keys).unwrap(), expected, "get_many {keys:?}");
                        }
                        Op::Remove(k) => assert_eq!(tree.remove(tx, k).unwrap(), model.remove(k), "remove {k:?}"),
                        Op::Range(lo, hi, mode) => {
                            let b = bounds(lo, hi, *mode);
                            let got: Vec<_> = tree.range(tx, b.clone()).unwrap().map(Result::unwrap).collect();
                            let want: Vec<_> = model.range(b.clone()).map(|(k, &v)| (k.clone(), v)).collect();
                            assert_eq!(got, want, "range {b:?}");
                        }
                        Op::Prefix(p) => {
                            let got: Vec<_> = tree.prefix(tx, p).unwrap().map(Result::unwrap).collect();
                            let want: Vec<_> = with_prefix(&model, p).map(|(k, &v)| (k.clone(), v)).collect();
                            assert_eq!(got, want, "prefix {p:?}");
                        }
                        Op::Count(lo, hi) => {
                            assert_eq!(tree.count(tx, lo.clone()..hi.clone()).unwrap(), model.range(lo.clone()..hi.clone()).count() as u64);
                            assert_eq!(tree.count(tx, lo.clone()..=hi.clone()).unwrap(), model.range(lo.clone()..=hi.clone()).count() as u64);
                            assert_eq!(tree.count(tx, lo.clone()..).unwrap(), model.range(lo.clone()..).count() as u64);
                        }
                        Op::Sum(lo, hi) => {
                            let want: u128 = model.range(lo.clone()..=hi.clone()).map(|(_, &v)| v as u128).sum();
                            assert_eq!(tree.sum(tx, lo.clone()..=hi.clone()).unwrap(), want);
                            let want: u128 = model.range(..hi.clone()).map(|(_, &v)| v as u128).sum();
                            assert_eq!(tree.sum(tx, ..hi.clone()).unwrap(), want);
                        }
                        Op::CountPrefix(p) => assert_eq!(tree.count_prefix(tx, p).unwrap(), with_prefix(&model, p).count() as u64, "count_prefix {p:?}"),
                        Op::SumPrefix(p) => {
                            let want: u128 = with_prefix(&model, p).map(|(_, &v)| v as u128).sum();
                            assert_eq!(tree.sum_prefix(tx, p).unwrap(), want, "sum_prefix {p:?}");
                        }
                        Op::Clear => {
                            for k in std::mem::take(&mut model).into_keys() {
                                assert!(tree.remove(tx, &k).unwrap().is_some());
                            }
                            assert!(tree.is_empty(tx).unwrap());
                        }
                    }
                }
            });
            // A fresh transaction sees the committed tree: reopen by name, then validate.
            common::transact(&engine, |tx| {
                let reopened = Art::named(tx, "a").unwrap();
                prop_assert_eq!(reopened, tree);
                let stats = tree.check(tx).unwrap();
                prop_assert_eq!(stats.keys, model.len() as u64);
                prop_assert_eq!(tree.len(tx).unwrap(), model.len() as u64);
                let all: Vec<_> = tree.range::<_, &[u8]>(tx, ..).unwrap().map(Result::unwrap).collect();
                let want: Vec<_> = model.iter().map(|(k, &v)| (k.clone(), v)).collect();
                prop_assert_eq!(all, want);
                for (k, &v) in &model {
                    prop_assert_eq!(tree.get(tx, k).unwrap(), Some(v));
                }
                if model.is_empty() {
                    prop_assert_eq!(stats.bytes, 0);
                }
                Ok(())
            })?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `apply_batch` (upserts that start at the deepest slot the previous upsert's path shares
    /// with them, removes from the root) against the model applied one by one in batch order:
    /// keys that nest, share long prefixes and split nodes inside them, several batches on
    /// one tree.
    #[test]
    fn batches_match_btreemap(batches in prop::collection::vec(prop::collection::vec((key(), prop::option::weighted(0.8, any::<u64>())), 1..300), 1..6)) {
        let engine = common::engine(64 << 20);
        let tree = common::transact(&engine, |tx| Art::named(tx, "a").unwrap());
        let mut model: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for batch in batches {
            let ops: Vec<ArtOp<'_>> = batch.iter().map(|(key, v)| ArtOp::new(key, *v)).collect();
            let mut want = BatchOutcome::default();
            for (key, v) in &batch {
                match *v {
                    Some(value) => match model.insert(key.clone(), value) {
                        Some(_) => want.updated += 1,
                        None => want.inserted += 1,
                    },
                    None => match model.remove(key) {
                        Some(_) => want.removed += 1,
                        None => want.absent += 1,
                    },
                }
            }
            common::transact(&engine, |tx| {
                assert_eq!(tree.apply_batch(tx, &ops).unwrap(), want, "the outcome of one by one");
                let got: Vec<(Vec<u8>, u64)> = tree.range::<_, &[u8]>(tx, ..).unwrap().map(Result::unwrap).collect();
                let expected: Vec<(Vec<u8>, u64)> = model.iter().map(|(k, &v)| (k.clone(), v)).collect();
                assert_eq!(got, expected);
                assert_eq!(tree.check(tx).unwrap().keys, model.len() as u64);
            });
        }
    }
}
