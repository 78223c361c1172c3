//! The index handles of the facade (`tx.btree`, `tx.art`) against `BTreeMap` models, through
//! commits, aborts, checkpoints and reopens; `check()` after every step; and two threads
//! inserting and looking up at once.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use tusk::{ArtOp, BTreeOp, BatchOutcome, Commit, Error, Options, Store};

#[derive(Clone, Debug)]
enum Step {
    /// One transaction of operations on both trees.
    Batch(Vec<Op>),
    /// A transaction that does the operations and then aborts.
    Aborted(Vec<Op>),
    Checkpoint,
    Reopen,
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(u64, u64),
    Remove(u64),
    Batch(Vec<(u64, Option<u64>)>),
    ArtUpsert(Vec<u8>, u64),
    ArtRemove(Vec<u8>),
    ArtBatch(Vec<(Vec<u8>, Option<u64>)>),
    RemoveAll,
}

fn key() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..3_000, 1 => any::<u64>(), 1 => Just(u64::MAX), 1 => Just(0)]
}

/// ART keys: the empty key, shared long prefixes, every length class boundary.
fn art_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => Just(Vec::new()),
        4 => prop::collection::vec(0u8..4, 0..12),
        2 => (prop::collection::vec(0u8..3, 0..4), prop::sample::select(vec![7usize, 8, 9, 15, 16, 17, 31, 32, 33, 100])).prop_map(|(tail, n)| {
            let mut k = vec![b'p'; n];
            k.extend(tail);
            k
        }),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (key(), any::<u64>()).prop_map(|(k, v)| Op::Upsert(k, v)),
        3 => key().prop_map(Op::Remove),
        1 => prop::collection::vec((key(), prop::option::of(any::<u64>())), 0..64).prop_map(Op::Batch),
        6 => (art_key(), any::<u64>()).prop_map(|(k, v)| Op::ArtUpsert(k, v)),
        3 => art_key().prop_map(Op::ArtRemove),
        1 => prop::collection::vec((art_key(), prop::option::of(any::<u64>())), 0..64).prop_map(Op::ArtBatch),
        1 => Just(Op::RemoveAll),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => prop::collection::vec(op(), 1..120).prop_map(Step::Batch),
        1 => prop::collection::vec(op(), 1..40).prop_map(Step::Aborted),
        1 => Just(Step::Checkpoint),
        2 => Just(Step::Reopen),
    ]
}

#[derive(Clone, Default)]
struct Model {
    tree: BTreeMap<u64, u64>,
    art: BTreeMap<Vec<u8>, u64>,
}

fn opts() -> Options {
    common::checkpoint_opts(64 << 20, 64 << 10)
}

/// Runs `ops` in `tx`, checking each result against (and updating) `model`.
fn apply(tx: &mut tusk::Transaction<'_>, ops: &[Op], model: &mut Model) -> Result<(), Error> {
    for op in ops {
        match op {
            Op::Upsert(k, v) => assert_eq!(tx.btree("t")?.insert(*k, *v)?, model.tree.insert(*k, *v)),
            Op::Remove(k) => assert_eq!(tx.btree("t")?.remove(*k)?, model.tree.remove(k)),
            Op::Batch(ops) => {
                let ops: Vec<BTreeOp> = ops
                    .iter()
                    .map(|&(key, v)| match v {
                        Some(value) => BTreeOp::Upsert { key, value },
                        None => BTreeOp::Remove { key },
                    })
                    .collect();
                tx.btree("t")?.apply_batch(&ops)?;
                for op in ops {
                    match op {
                        BTreeOp::Upsert { key, value } => drop(model.tree.insert(key, value)),
                        BTreeOp::Remove { key } => drop(model.tree.remove(&key)),
                    }
                }
            }
            Op::ArtUpsert(k, v) => assert_eq!(tx.art("a")?.insert(k, *v)?, model.art.insert(k.clone(), *v)),
            Op::ArtRemove(k) => assert_eq!(tx.art("a")?.remove(k)?, model.art.remove(k)),
            Op::ArtBatch(ops) => {
                let ops: Vec<ArtOp<'_>> = ops.iter().map(|(key, v)| ArtOp::new(key, *v)).collect();
                let mut want = BatchOutcome::default();
                for op in &ops {
                    match *op {
                        ArtOp::Upsert { key, value } => match model.art.insert(key.to_vec(), value) {
                            Some(_) => want.updated += 1,
                            None => want.inserted += 1,
                        },
                        ArtOp::Remove { key } => match model.art.remove(key) {
                            Some(_) => want.removed += 1,
                            None => want.absent += 1,
                        },
                    }
                }
                assert_eq!(tx.art("a")?.apply_batch(&ops)?, want, "the outcome of one by one, in batch order");
            }
            Op::RemoveAll => {
                for k in std::mem::take(&mut model.tree).into_keys() {
                    assert!(tx.btree("t")?.remove(k)?.is_some());
                }
                for k in std::mem::take(&mut model.art).into_keys() {
                    assert!(tx.art("a")?.remove(&k)?.is_some());
                }
            }
        }
    }
    Ok(())
}

/// Both trees validate and hold exactly the model; sampled counts, sums and prefixes agree.
fn verify(store: &Store, model: &Model) {
    store
        .transact(Commit::Async, |tx| {
            let mut t = tx.btree("t")?;
            assert_eq!(t.check()?.keys, model.tree.len() as u64);
            let got: Vec<(u64, u64)> = t.range(..)?.collect::<Result<_, _>>()?;
            let want: Vec<(u64, u64)> = model.tree.iter().map(|(&k, &v)| (k, v)).collect();
            assert_eq!(got, want);
            for (lo, hi) in [(0, 1_000), (500, 2_999), (3_000, u64::MAX)] {
                assert_eq!(t.count(lo..hi)?, model.tree.range(lo..hi).count() as u64);
                assert_eq!(t.sum(lo..=hi)?, model.tree.range(lo..=hi).map(|(_, &v)| v as u128).sum::<u128>());
            }
            let mut a = tx.art("a")?;
            assert_eq!(a.check()?.keys, model.art.len() as u64);
            let got: Vec<(Vec<u8>, u64)> = a.range::<&[u8]>(..)?.collect::<Result<_, _>>()?;
            let want: Vec<(Vec<u8>, u64)> = model.art.iter().map(|(k, &v)| (k.clone(), v)).collect();
            assert_eq!(got, want);
            for p in [&b""[..], b"\x00", b"\x01\x02", b"pppppppp", b"ppppppppppppppp"] {
                let want: Vec<_> = model.art.range(p.to_vec()..).take_while(|(k, _)| k.starts_with(p)).map(|(k, &v)| (k.clone(), v)).collect();
                let got: Vec<(Vec<u8>, u64)> = a.prefix(p)?.collect::<Result<_, _>>()?;
                assert_eq!(got, want, "prefix {p:?}");
                assert_eq!(a.count_prefix(p)?, want.len() as u64);
                assert_eq!(a.sum_prefix(p)?, want.iter().map(|(_, v)| *v as u128).sum::<u128>());
            }
            let (lo, hi) = (&b"\x01"[..], &b"p"[..]);
            assert_eq!(a.count(lo..hi)?, model.art.range(lo.to_vec()..hi.to_vec()).count() as u64);
            Ok(())
        })
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn indexes_match_their_models_through_reopens(steps in prop::collection::vec(step(), 1..14)) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), opts()).unwrap();
        let mut model = Model::default();
        for step in steps {
            match step {
                Step::Batch(ops) => {
                    let mut next = model.clone();
                    let mut tx = store.begin();
                    apply(&mut tx, &ops, &mut next).unwrap();
                    tx.commit(Commit::Async).unwrap();
                    model = next;
                }
                Step::Aborted(ops) => {
                    let mut scratch = model.clone();
                    let mut tx = store.begin();
                    apply(&mut tx, &ops, &mut scratch).unwrap();
                    tx.abort();
                }
                Step::Checkpoint => drop(store.checkpoint().unwrap()),
                Step::Reopen => {
                    store.close().unwrap();
                    store = Store::open(dir.path(), opts()).unwrap();
                }
            }
            verify(&store, &model);
        }
        store.close().unwrap();
        let store = Store::open(dir.path(), opts()).unwrap();
        verify(&store, &model);
    }
}

/// Two threads insert disjoint keys into both trees while looking up each other's; every
/// lookup sees either nothing or the final value, and both trees end complete and valid.
#[test]
fn two_threads_insert_and_look_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { log_partitions: 2, ..opts() }).unwrap();
    store.transact(Commit::Sync, |tx| tx.btree("t").map(drop).and_then(|_| tx.art("a").map(drop))).unwrap();
    const N: u64 = 6_000;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0..N {
                    let k = i * 2 + t;
                    store
                        .transact(Commit::Async, |tx| {
                            tx.btree("t")?.insert(k, k * 10)?;
                            tx.art("a")?.insert(&k.to_be_bytes(), k * 10)?;
                            Ok(())
                        })
                        .unwrap();
                    let other = (i / 2) * 2 + (1 - t);
                    let (seen, _) = store
                        .transact(Commit::Async, |tx| Ok((tx.btree("t")?.get(other)?, tx.art("a")?.get(&other.to_be_bytes())?)))
                        .unwrap();
                    assert!(seen.0.is_none_or(|v| v == other * 10), "{seen:?}");
                    assert!(seen.1.is_none_or(|v| v == other * 10), "{seen:?}");
                }
            });
        }
    });
    store
        .transact(Commit::Async, |tx| {
            assert_eq!(tx.btree("t")?.check()?.keys, 2 * N);
            assert_eq!(tx.art("a")?.check()?.keys, 2 * N);
            assert_eq!(tx.btree("t")?.sum(..)?, (0..2 * N).map(|k| (k * 10) as u128).sum::<u128>());
            Ok(())
        })
        .unwrap();
    store.close().unwrap();
}

#[test]
fn typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let long = vec![7u8; tusk::ART_MAX_KEY_LEN + 1];
    let err = store.transact(Commit::Async, |tx| tx.art("a")?.insert(&long, 1)).unwrap_err();
    assert!(matches!(err, Error::KeyTooLong { len, max } if len == long.len() && max == tusk::ART_MAX_KEY_LEN), "{err}");
    store.transact(Commit::Async, |tx| tx.art("a")?.insert(&long[1..], 1)).unwrap();
    // A batch with a key too long fails before it changes anything, in the same transaction.
    store
        .transact(Commit::Async, |tx| {
            let ops = [ArtOp::Upsert { key: b"first", value: 1 }, ArtOp::Upsert { key: &long, value: 2 }];
            let err = tx.art("a")?.apply_batch(&ops).unwrap_err();
            assert!(matches!(err, Error::KeyTooLong { len, .. } if len == long.len()), "{err}");
            assert_eq!(tx.art("a")?.get(b"first")?, None, "nothing of the batch applied");
            Ok(())
        })
        .unwrap();
    // A root of one kind is not the other.
    let err = store.transact(Commit::Async, |tx| tx.btree("a").map(drop)).unwrap_err();
    assert!(matches!(err, Error::NotAnIndex { .. }), "{err}");
    let err = store
        .transact(Commit::Async, |tx| {
            let tree = tx.btree("t")?.ptr();
            tx.art_at(tree).map(drop)
        })
        .unwrap_err();
    assert!(matches!(err, Error::NotAnIndex { .. }), "{err}");
    let err = store.transact(Commit::Async, |tx| tx.btree("t")?.bulk_load([(2, 0), (1, 0)], 1.0)).unwrap_err();
    assert!(matches!(err, Error::BulkLoadNotSorted { at_index: 1 }), "{err}");
    store.transact(Commit::Async, |tx| tx.btree("t")?.insert(5, 5)).unwrap();
    let err = store.transact(Commit::Async, |tx| tx.btree("t")?.bulk_load([(1, 0)], 1.0)).unwrap_err();
    assert!(matches!(err, Error::BulkLoadNotEmpty), "{err}");
    store.close().unwrap();
}

/// Two threads upsert and remove over the same small key domain (every transaction touches
/// both trees, so they conflict often); the trees stay valid and equal to a replay of the
/// committed transactions in commit (LSN) order.
#[test]
fn two_threads_update_the_same_keys() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { log_partitions: 2, ..opts() }).unwrap();
    store.transact(Commit::Sync, |tx| tx.btree("t").map(drop).and_then(|_| tx.art("a").map(drop))).unwrap();
    // Per thread: (LSN, (key, value written or None for a removal)*) of each commit.
    type CommitLog = Vec<(u64, Vec<(u64, Option<u64>)>)>;
    let logs: Vec<CommitLog> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                    let mut log = Vec::new();
                    for _ in 0..3_000 {
                        let ops: Vec<(u64, Option<u64>)> =
                            (0..4).map(|_| (rng.random_range(0..600u64), rng.random_bool(0.6).then(|| rng.random()))).collect();
                        let (_, lsn) = store
                            .transact(Commit::Async, |tx| {
                                for &(k, v) in &ops {
                                    match v {
                                        Some(v) => drop(tx.btree("t")?.insert(k, v)?),
                                        None => drop(tx.btree("t")?.remove(k)?),
                                    }
                                    match v {
                                        Some(v) => drop(tx.art("a")?.insert(&k.to_be_bytes(), v)?),
                                        None => drop(tx.art("a")?.remove(&k.to_be_bytes())?),
                                    }
                                }
                                Ok(())
                            })
                            .unwrap();
                        // No LSN: every op removed an absent key, so the transaction wrote nothing.
                        if let Some(lsn) = lsn {
                            log.push((lsn, ops));
                        }
                    }
                    log
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<_> = logs.into_iter().flatten().collect();
    all.sort_by_key(|(lsn, _)| *lsn);
    let mut model = BTreeMap::new();
    for (_, ops) in all {
        for (k, v) in ops {
            match v {
                Some(v) => drop(model.insert(k, v)),
                None => drop(model.remove(&k)),
            }
        }
    }
    store
        .transact(Commit::Async, |tx| {
            let mut t = tx.btree("t")?;
            assert_eq!(t.check()?.keys, model.len() as u64);
            let got: Vec<(u64, u64)> = t.range(..)?.collect::<Result<_, _>>()?;
            assert_eq!(got, model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
            let mut a = tx.art("a")?;
            assert_eq!(a.check()?.keys, model.len() as u64);
            Ok(())
        })
        .unwrap();
    store.close().unwrap();
}
