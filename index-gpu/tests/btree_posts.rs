//! Separators of internal splits wait for the commit (`btree/posts.rs`): the transaction
//! that split sees its whole tree before then, `check()` accepts exactly its pending nodes,
//! and two transactions that split nodes in disjoint key ranges no longer meet in the nodes
//! above them.

mod common;

use std::sync::{Barrier, Mutex};

use tusk_index::heap::HeapRead;
use tusk_index::{BTree, IndexError};
use tusk_txn::{Commit, TxnError};

/// A tree of `keys` keys, 1000 apart.
fn prefilled(engine: &tusk_txn::Engine, keys: u64) -> BTree {
    common::transact(engine, |tx| {
        let tree = BTree::named(tx, "t").unwrap();
        for k in 0..keys {
            tree.insert(tx, k * 1000, k).unwrap();
        }
        tree
    })
}

/// Ascending keys `at + 1..=at + n` (into a gap of the prefilled keys): every leaf split is a
/// split in the middle of the tree, and every few of them split the level-1 node above.
fn fill_gap(tx: &mut tusk_txn::Transaction<'_>, tree: BTree, at: u64, n: u64) {
    for k in 1..=n {
        assert_eq!(tree.insert(tx, at + k, k).unwrap(), None);
    }
}

#[test]
fn a_transactions_pending_separators_are_posted_at_its_commit() {
    let engine = common::engine(64 << 20);
    let tree = prefilled(&engine, 20_000);
    let meta = tree.ptr().offset();
    let mut tx = engine.begin();
    fill_gap(&mut tx, tree, 5_000_000, 800);
    let pending = HeapRead::pending_posts(&tx, meta).map_or(0, |p| p.len());
    assert!(pending > 0, "800 ascending keys in one gap split level-1 nodes");
    // Before the commit: every key found, the tree valid with its pending nodes.
    for k in 1..=800 {
        assert_eq!(tree.get(&mut tx, 5_000_000 + k).unwrap(), Some(k));
    }
    assert_eq!(tree.get(&mut tx, 5_001_000).unwrap(), Some(5_001));
    assert_eq!(tree.check(&mut tx).unwrap().keys, 20_800);
    tx.commit(Commit::Async).unwrap();
    // After it: nothing pending, and the check without pending nodes passes, so each one
    // was posted into its parent.
    common::transact(&engine, |tx| {
        assert!(HeapRead::pending_posts(tx, meta).is_none());
        assert_eq!(tree.check(tx).unwrap().keys, 20_800);
        assert_eq!(tree.count(tx, 5_000_000..5_001_000).unwrap(), 801);
    });
}

#[test]
fn a_removal_posts_the_pending_separators_first() {
    let engine = common::engine(64 << 20);
    let tree = prefilled(&engine, 20_000);
    let meta = tree.ptr().offset();
    common::transact(&engine, |tx| {
        fill_gap(tx, tree, 7_000_000, 800);
        assert!(HeapRead::pending_posts(tx, meta).is_some_and(|p| !p.is_empty()));
        // Removals repair underfull nodes through their parents: everything is posted first.
        for k in 1..=800 {
            assert_eq!(tree.remove(tx, 7_000_000 + k).unwrap(), Some(k));
        }
        assert!(HeapRead::pending_posts(tx, meta).is_none());
        assert_eq!(tree.check(tx).unwrap().keys, 20_000);
    });
}

/// Two transactions open at once, each splitting level-1 nodes under one root in its own
/// key range: with the separators posted at once the second one's commit found the root
/// changed by the first and conflicted; now each posts at its commit.
#[test]
fn splits_in_disjoint_ranges_commit_side_by_side() {
    // A stripe per line of the heap: no two lines share a lock.
    let engine = common::engine_with_stripes(64 << 20, 20);
    let tree = prefilled(&engine, 5_000);
    let levels = common::transact(&engine, |tx| tree.check(tx).unwrap().levels);
    assert_eq!(levels, 3, "one root over the level-1 nodes of both ranges");
    // On two threads: each thread's inserts count keys and take nodes in a descriptor
    // stripe of its own (`meta.rs`). Both fill, then the first commits, then the second.
    let (filled, first_done, warm_up) = (Barrier::new(2), Barrier::new(2), Mutex::new(()));
    let outcomes = std::thread::scope(|s| {
        let (engine, filled, first_done, warm_up) = (&engine, &filled, &first_done, &warm_up);
        let run = move |gap: u64, commits_first: bool| {
            // A first transaction of this thread's: its stripe takes its slab chunk, and its
            // arena its first step, from brk (two first takes would meet there): one at a time.
            drop(warm_up.lock().map(|_| common::transact(engine, |tx| fill_gap(tx, tree, gap, 100))));
            let mut tx = engine.begin();
            fill_gap(&mut tx, tree, gap + 100, 800);
            filled.wait();
            if commits_first {
                let outcome = tx.commit(Commit::Async).map(|_| ());
                first_done.wait();
                outcome
            } else {
                first_done.wait();
                tx.commit(Commit::Async).map(|_| ())
            }
        };
        let first = s.spawn(move || run(1_000_000, true));
        let second = s.spawn(move || run(4_000_000, false));
        [first.join().unwrap(), second.join().unwrap()]
    });
    for outcome in outcomes {
        match outcome {
            Ok(()) => {}
            Err(TxnError::Conflict) => panic!("the two transactions met in the upper levels"),
            Err(e) => panic!("{e}"),
        }
    }
    common::transact(&engine, |tx| {
        let stats = tree.check(tx).unwrap();
        assert_eq!(stats.keys, 6_800);
        assert_eq!(tree.count(tx, 1_000_000..1_001_000).unwrap(), 901);
        assert_eq!(tree.count(tx, 4_000_000..4_001_000).unwrap(), 901);
    });
}

/// `check()` in a transaction accepts the pending nodes where they are and nowhere else: a
/// pending node the tree does not hold (a made-up entry) is reported.
#[test]
fn check_reports_a_pending_node_that_is_not_on_its_level() {
    let engine = common::engine(64 << 20);
    let tree = prefilled(&engine, 20_000);
    let meta = tree.ptr().offset();
    let mut tx = engine.begin();
    fill_gap(&mut tx, tree, 9_000_000, 800);
    assert_eq!(tree.check(&mut tx).unwrap().keys, 20_800);
    let node = HeapRead::pending_posts(&tx, meta).unwrap().on_level(1).next().expect("a level-1 node pending").1;
    // The same node claimed again under a separator far to its right (never committed).
    assert!(tusk_index::heap::HeapWrite::defer_post(&mut tx, meta, 1, 15_000_500, node));
    assert!(matches!(tree.check(&mut tx), Err(IndexError::Invariant { .. })));
    tx.abort();
}

/// One transaction of scattered inserts into an empty tree splits its level-1 root, whose
/// growth then waits for the commit, and then more level-1 nodes than a level keeps pending.
/// The splits past the cap posted their separators at once and found no level above them:
/// the insert panicked ("no level above 1"), as `tusk bench index --txn-keys 2000000` did.
/// At the cap the transaction now posts what it has pending, the root's growth first.
#[test]
fn a_transaction_past_the_pending_cap_while_the_roots_growth_waits_commits() {
    const KEYS: u64 = 400_000;
    let engine = common::engine(256 << 20);
    let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
    let meta = tree.ptr().offset();
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    common::transact(&engine, |tx| {
        for i in 0..KEYS {
            assert_eq!(tree.insert(tx, key(i), i).unwrap(), None);
        }
        let pending = HeapRead::pending_posts(tx, meta).expect("level-1 splits pending");
        assert!(pending.on_level(1).count() <= tusk_index::btree::posts::MAX_PENDING_PER_LEVEL);
        assert_eq!(tree.check(tx).unwrap().keys, KEYS);
    });
    common::transact(&engine, |tx| {
        assert_eq!(tree.check(tx).unwrap().keys, KEYS);
        for i in (0..KEYS).step_by(997) {
            assert_eq!(tree.get(tx, key(i)).unwrap(), Some(i));
        }
    });
}
