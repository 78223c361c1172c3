//! Concurrent updates of one tree from several threads, through real STM transactions:
//!
//! - a model test: threads insert and remove random keys of a shared domain (so they collide),
//!   each transaction retried on conflict; every committed transaction's operations, replayed
//!   in LSN order on a `BTreeMap`, must give the tree's contents; `len()` must equal the model's
//!   length and, in read-only transactions taken while the writers run, the keys a full count
//!   walks (so the striped key count is exact in every snapshot); the validators must pass;
//! - a conflict test: two transactions inserting into disjoint key ranges, both open at once
//!   and committed one after the other, must mostly both commit (the descriptor's counters and
//!   slab cursors are per-thread stripes, so they no longer make every such pair conflict).

mod common;

use common::Rng;

use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};

use tusk_index::{Art, BTree, IndexError};
use tusk_txn::{Commit, Engine, Transaction, TxnError};

/// The two trees behind one interface, so every test runs on both.
#[derive(Clone, Copy)]
enum Tree {
    BTree(BTree),
    Art(Art),
}

fn art_key(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

impl Tree {
    fn create(engine: &Engine, art: bool) -> Tree {
        common::transact(engine, |tx| if art { Tree::Art(Art::create(tx).unwrap()) } else { Tree::BTree(BTree::create(tx).unwrap()) })
    }

    fn insert(self, tx: &mut Transaction<'_>, k: u64, v: u64) -> Result<Option<u64>, IndexError> {
        match self {
            Tree::BTree(t) => t.insert(tx, k, v),
            Tree::Art(t) => t.insert(tx, &art_key(k), v),
        }
    }

    fn remove(self, tx: &mut Transaction<'_>, k: u64) -> Result<Option<u64>, IndexError> {
        match self {
            Tree::BTree(t) => t.remove(tx, k),
            Tree::Art(t) => t.remove(tx, &art_key(k)),
        }
    }

    fn len(self, tx: &mut Transaction<'_>) -> Result<u64, IndexError> {
        match self {
            Tree::BTree(t) => t.len(tx),
            Tree::Art(t) => t.len(tx),
        }
    }

    /// Keys counted by walking the leaves, not from the descriptor.
    fn walked(self, tx: &mut Transaction<'_>) -> Result<u64, IndexError> {
        match self {
            Tree::BTree(t) => t.count(tx, ..),
            Tree::Art(t) => t.count::<_, &[u8]>(tx, ..),
        }
    }

    fn entries(self, tx: &mut Transaction<'_>) -> Vec<(u64, u64)> {
        match self {
            Tree::BTree(t) => t.range(tx, ..).unwrap().map(|e| e.unwrap()).collect(),
            Tree::Art(t) => t
                .range::<_, &[u8]>(tx, ..)
                .unwrap()
                .map(|e| e.unwrap())
                .map(|(k, v)| (u64::from_be_bytes(k.as_slice().try_into().unwrap()), v))
                .collect(),
        }
    }

    fn check(self, tx: &mut Transaction<'_>) -> u64 {
        match self {
            Tree::BTree(t) => t.check(tx).unwrap().keys,
            Tree::Art(t) => t.check(tx).unwrap().keys,
        }
    }
}

/// The stripe-lock table of a store with default options (`Options::stripes_log2`): with the
/// test engine's small table, lines 256 KiB apart share a lock word and would conflict falsely.
const STORE_STRIPES_LOG2: u32 = 20;

fn is_conflict(e: &IndexError) -> bool {
    matches!(e, IndexError::Txn(TxnError::Conflict))
}

/// Runs `f` in a transaction until it commits; returns its value, the LSN (None: it wrote
/// nothing) and how many attempts conflicted.
fn retry<T>(engine: &Engine, mut f: impl FnMut(&mut Transaction<'_>) -> Result<T, IndexError>) -> (T, Option<u64>, u64) {
    let mut tx = engine.begin();
    let mut conflicts = 0;
    loop {
        match f(&mut tx) {
            Ok(v) => match tx.commit(Commit::Async) {
                Ok(lsn) => return (v, lsn, conflicts),
                Err(TxnError::Conflict) => {}
                Err(e) => panic!("{e}"),
            },
            Err(e) if is_conflict(&e) => {}
            Err(e) => panic!("{e}"),
        }
        conflicts += 1;
        tx.restart();
        std::thread::yield_now();
    }
}

/// (key, Some(value) to insert / None to remove) per committed transaction, with its LSN.
type Log = Vec<(u64, Vec<(u64, Option<u64>)>)>;

fn model_run(art: bool, threads: u64, txns: u64, domain: u64) {
    let engine = common::engine(64 << 20);
    let tree = Tree::create(&engine, art);
    let log = Mutex::new(Log::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (engine, log) = (&engine, &log);
            s.spawn(move || {
                let mut rng = Rng(t * 7919 + u64::from(art));
                let mut mine = Log::new();
                for i in 0..txns {
                    let ops: Vec<(u64, Option<u64>)> =
                        (0..1 + rng.below(3)).map(|_| (rng.below(domain), (rng.below(3) != 0).then(|| rng.next() >> 1))).collect();
                    let ((), lsn, _) = retry(engine, |tx| {
                        for &(k, v) in &ops {
                            match v {
                                Some(v) => drop(tree.insert(tx, k, v)?),
                                None => drop(tree.remove(tx, k)?),
                            }
                        }
                        Ok(())
                    });
                    if let Some(lsn) = lsn {
                        mine.push((lsn, ops));
                    }
                    if i % 64 == 0 {
                        // The striped count, summed in this transaction, equals the keys it
                        // walks in the same transaction, whatever the others commit meanwhile.
                        let ((len, walked), _, _) = retry(engine, |tx| Ok((tree.len(tx)?, tree.walked(tx)?)));
                        assert_eq!(len, walked, "len() disagrees with the leaves in one snapshot");
                    }
                }
                log.lock().unwrap().extend(mine);
            });
        }
    });
    let mut log = log.into_inner().unwrap();
    log.sort_unstable_by_key(|&(lsn, _)| lsn);
    let mut model = BTreeMap::new();
    for (_, ops) in log {
        for (k, v) in ops {
            match v {
                Some(v) => model.insert(k, v),
                None => model.remove(&k),
            };
        }
    }
    common::transact(&engine, |tx| {
        assert_eq!(tree.check(tx), model.len() as u64);
        assert_eq!(tree.len(tx).unwrap(), model.len() as u64);
        assert_eq!(tree.entries(tx), model.into_iter().collect::<Vec<_>>());
    });
}

#[test]
fn btree_threads_insert_and_remove_like_the_model() {
    // A small domain: leaves split and merge under the threads all the time, and nodes move
    // between the stripes' free lists.
    model_run(false, 4, 3_000, 2_000);
}

#[test]
fn art_threads_insert_and_remove_like_the_model() {
    model_run(true, 4, 3_000, 2_000);
}

#[test]
fn btree_two_threads_wide_domain() {
    model_run(false, 2, 6_000, 1 << 40);
}

#[test]
fn art_two_threads_wide_domain() {
    model_run(true, 2, 6_000, 1 << 40);
}

/// Two threads, round after round: each opens a transaction and inserts one new key from its
/// own half of the key space into a tree of `PRELOAD` keys; once both have, thread 0 commits,
/// then thread 1, whose commit validates everything it read against thread 0's writes.
/// Returns thread 1's conflicts.
fn disjoint_conflicts(art: bool, rounds: u64) -> u64 {
    const PRELOAD: u64 = 40_000;
    let engine = common::engine_with_stripes(64 << 20, STORE_STRIPES_LOG2);
    let tree = Tree::create(&engine, art);
    // Shuffled, so the leaves are partly full (ascending inserts would leave them full, and
    // every insert below would split up to the root).
    let mut order: Vec<u64> = (0..PRELOAD).collect();
    let mut rng = Rng(5);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    common::transact(&engine, |tx| {
        for &k in &order {
            tree.insert(tx, k * 1_000, k).unwrap();
        }
    });
    let barrier = Barrier::new(2);
    let conflicts = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|t| {
                let (engine, barrier) = (&engine, &barrier);
                s.spawn(move || {
                    let mut rng = Rng(t + 11);
                    // Warm-up, one thread after the other: each stripe takes its first slab
                    // chunks or batches (and one of them adopts the free list the preloading
                    // thread's stripe left), so the rounds below see the steady state.
                    for turn in 0..2 {
                        if turn == t {
                            for i in 0..500 {
                                let k = (t * PRELOAD / 2 + i) * 1_000 + 500;
                                retry(engine, |tx| tree.insert(tx, k, k));
                            }
                        }
                        barrier.wait();
                    }
                    let mut conflicts = 0;
                    for _ in 0..rounds {
                        // New keys between the preloaded ones, in this thread's half.
                        let k = (t * PRELOAD / 2 + rng.below(PRELOAD / 2)) * 1_000 + 1 + rng.below(999);
                        barrier.wait();
                        let mut tx = engine.begin();
                        let inserted = tree.insert(&mut tx, k, k);
                        barrier.wait();
                        if t == 0 {
                            assert!(inserted.is_ok() && tx.commit(Commit::Async).is_ok(), "the first committer cannot conflict");
                        }
                        barrier.wait();
                        if t == 1 {
                            match inserted.map_err(|e| is_conflict(&e).then_some(TxnError::Conflict).ok_or(e)) {
                                Ok(_) => match tx.commit(Commit::Async) {
                                    Ok(_) => {}
                                    Err(TxnError::Conflict) => conflicts += 1,
                                    Err(e) => panic!("{e}"),
                                },
                                Err(Ok(_)) => conflicts += 1,
                                Err(Err(e)) => panic!("{e}"),
                            }
                        }
                    }
                    conflicts
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    });
    common::transact(&engine, |tx| {
        let keys = tree.check(tx);
        assert_eq!(tree.len(tx).unwrap(), keys);
        assert!(keys > PRELOAD + rounds, "{keys} keys");
    });
    conflicts
}

#[test]
fn btree_disjoint_inserts_mostly_do_not_conflict() {
    let rounds = 2_000;
    let conflicts = disjoint_conflicts(false, rounds);
    // Only splits that reach a node both paths share (the root) may conflict.
    assert!(conflicts * 50 <= rounds, "{conflicts} of {rounds} disjoint insert pairs conflicted");
}

#[test]
fn art_disjoint_inserts_mostly_do_not_conflict() {
    let rounds = 2_000;
    let conflicts = disjoint_conflicts(true, rounds);
    assert!(conflicts * 50 <= rounds, "{conflicts} of {rounds} disjoint insert pairs conflicted");
}
