//! The validator is not vacuous: each kind of damage to a valid tree makes `check()` fail with
//! an invariant error naming what broke. Damage is written with raw heap stores in the layout
//! documented in `layout.rs`.

mod common;

use tusk_index::btree::layout::{self, HIGH_KEY_OFF, RIGHT_LINK_OFF};
use tusk_index::btree::meta::{self, FREE_HEAD, KEY_DELTA, ROOT_OFF, STRIPE_COUNT_OFF};
use tusk_index::stripe::{self, STRIPES};
use tusk_index::{BTree, IndexError};
use tusk_txn::Transaction;

/// A tree of three levels (3000 keys inserted in ascending order), and its first leaf.
fn tree(tx: &mut Transaction<'_>) -> (BTree, u64) {
    let tree = BTree::create(tx).unwrap();
    for k in 0..3_000u64 {
        tree.insert(tx, k * 2, k).unwrap();
    }
    // The separators of internal splits wait for the commit (`btree/posts.rs`): the damage
    // below is done to the whole tree.
    tusk_index::heap::HeapWrite::finish_posts(tx, tree.ptr().offset()).unwrap();
    assert_eq!(tree.check(tx).unwrap().levels, 3);
    let mut node = tx.load(tree.ptr().offset() + ROOT_OFF).unwrap();
    while !layout::read_header(tx, node).unwrap().is_leaf() {
        node = layout::value(tx, node, 0).unwrap();
    }
    (tree, node)
}

fn assert_broken(damage: impl Fn(&mut Transaction<'_>, BTree, u64), expect: &str) {
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let (tree, leaf) = tree(tx);
        damage(tx, tree, leaf);
        match tree.check(tx) {
            Err(IndexError::Invariant { what, .. }) => assert!(what.contains(expect), "{what}"),
            other => panic!("expected an invariant error with {expect:?}, got {other:?}"),
        }
    });
}

#[test]
fn detects_unordered_keys() {
    assert_broken(|tx, _, leaf| tx.store(layout::key_off(leaf, 1), 0).unwrap(), "ascending");
}

#[test]
fn detects_key_beyond_high_key() {
    assert_broken(|tx, _, leaf| {
        let h = layout::read_header(tx, leaf).unwrap();
        tx.store(layout::key_off(leaf, h.count - 1), h.high_key.unwrap() + 1).unwrap();
    }, "outside");
}

#[test]
fn detects_wrong_high_key() {
    assert_broken(|tx, _, leaf| tx.store(leaf + HIGH_KEY_OFF, 1).unwrap(), "high key");
}

#[test]
fn detects_broken_sibling_chain() {
    assert_broken(|tx, _, leaf| {
        let right = tx.load(leaf + RIGHT_LINK_OFF).unwrap();
        let skip = tx.load(right + RIGHT_LINK_OFF).unwrap();
        tx.store(leaf + RIGHT_LINK_OFF, skip).unwrap();
    }, "right link");
}

#[test]
fn detects_underfull_node() {
    assert_broken(|tx, _, leaf| {
        let h = layout::read_header(tx, leaf).unwrap();
        layout::write_level_count(tx, leaf, 0, 1).unwrap();
        assert!(h.count > 1);
    }, "entries");
}

#[test]
fn detects_wrong_key_count() {
    // Another thread's stripe: the count is the sum over all of them.
    let other = (stripe::current() + 1) % STRIPES;
    assert_broken(|tx, tree, _| tx.store(meta::stripe(tree.ptr().offset(), other) + KEY_DELTA, 5).unwrap(), "descriptor");
}

#[test]
fn detects_wrong_stripe_count() {
    assert_broken(|tx, tree, _| tx.store(tree.ptr().offset() + STRIPE_COUNT_OFF, 8).unwrap(), "stripes");
}

/// Removes three of every four of the first 400 keys, so leaves (full after the ascending
/// inserts) fall below MIN_FILL, merge, and nodes go to the free list; returns its head.
fn free_some(tx: &mut Transaction<'_>, tree: BTree) -> u64 {
    for k in (0..400u64).filter(|k| k % 4 != 0) {
        tree.remove(tx, k * 2).unwrap();
    }
    let stats = tree.check(tx).unwrap();
    assert!(stats.free_nodes >= 2, "{stats:?}");
    tx.load(meta::my_stripe(tree.ptr().offset()) + FREE_HEAD).unwrap()
}

#[test]
fn detects_node_on_two_free_lists() {
    assert_broken(|tx, tree, _| {
        let free = free_some(tx, tree);
        let other = (stripe::current() + 1) % STRIPES;
        tx.store(meta::stripe(tree.ptr().offset(), other) + FREE_HEAD, free).unwrap();
    }, "shares a node");
}

#[test]
fn detects_free_node_reachable_in_tree() {
    assert_broken(|tx, tree, _| {
        let free = free_some(tx, tree);
        // The first node of level 1 gets the free node as its first child.
        let root = tx.load(tree.ptr().offset() + ROOT_OFF).unwrap();
        let level1 = layout::value(tx, root, 0).unwrap();
        tx.store(layout::value_off(level1, 0), free).unwrap();
    }, "free list is reachable");
}

#[test]
fn detects_free_list_cycle() {
    assert_broken(|tx, tree, _| {
        let free = free_some(tx, tree);
        let second = tx.load(free).unwrap();
        assert_ne!(second, 0);
        tx.store(second, free).unwrap();
    }, "cycle");
}

#[test]
fn detects_free_list_self_loop() {
    assert_broken(|tx, tree, _| {
        let free = free_some(tx, tree);
        tx.store(free, free).unwrap();
    }, "cycle");
}

#[test]
fn detects_free_list_offset_outside_heap() {
    assert_broken(|tx, tree, _| {
        let free = free_some(tx, tree);
        tx.store(free, u64::MAX - 63).unwrap();
    }, "outside the heap");
}

#[test]
fn detects_misaligned_free_list_link() {
    assert_broken(|tx, tree, _| {
        let free = free_some(tx, tree);
        tx.store(free, free + 8).unwrap();
    }, "aligned");
}

#[test]
fn detects_lost_free_nodes() {
    // Free nodes neither in the tree nor on the list: the slab's accounting does not add up.
    assert_broken(|tx, tree, _| {
        free_some(tx, tree);
        tx.store(meta::my_stripe(tree.ptr().offset()) + FREE_HEAD, 0).unwrap();
    }, "handed out");
}

#[test]
fn detects_child_pointer_outside_heap() {
    assert_broken(|tx, tree, _| {
        let root = tx.load(tree.ptr().offset() + ROOT_OFF).unwrap();
        tx.store(layout::value_off(root, 0), 1 << 60).unwrap();
    }, "outside the heap");
}

#[test]
fn search_moves_right_past_a_high_key() {
    // A reader whose parent pointer is stale (it points at the left half of a split) must
    // still find keys that moved to the right sibling: point the root's second child slot at
    // the first leaf, as if the parent had not yet learned of the split.
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let tree = BTree::create(tx).unwrap();
        for k in 0..40u64 {
            tree.insert(tx, k, k + 100).unwrap();
        }
        let root = tx.load(tree.ptr().offset() + ROOT_OFF).unwrap();
        assert_eq!(layout::read_header(tx, root).unwrap().count, 2);
        let first = layout::value(tx, root, 0).unwrap();
        tx.store(layout::value_off(root, 1), first).unwrap();
        for k in 0..40u64 {
            assert_eq!(tree.get(tx, k).unwrap(), Some(k + 100));
        }
    });
}

/// Every node must lie in a chunk of its stripes' lists (the index-only GPU mirror holds only
/// those): a list cut short, and a node that points outside every chunk, are both reported.
#[test]
fn detects_a_chunk_list_cut_short_and_a_node_outside_the_chunks() {
    let stripe_of = |tx: &mut Transaction<'_>, tree: BTree| {
        // Enough more keys for a second chunk (128 nodes each).
        for k in 0..6_000u64 {
            tree.insert(tx, 1_000_000 + k, k).unwrap();
        }
        (0..STRIPES).map(|s| meta::stripe(tree.ptr().offset(), s)).find(|&st| tx.load(st + meta::CHUNKS).unwrap() >= 2).expect("9000 keys take several chunks")
    };
    assert_broken(
        |tx, tree, _| {
            let st = stripe_of(tx, tree);
            let newest = tx.load(st + meta::LAST_CHUNK).unwrap();
            tx.store(newest, 0).unwrap();
        },
        "ends early",
    );
    // A node in memory of no chunk: the first leaf copied into a fresh allocation and its
    // parent pointed at the copy (so that only the chunk rule breaks).
    assert_broken(
        |tx, tree, leaf| {
            let raw = tx.alloc(2 * layout::NODE_SIZE).unwrap().offset().next_multiple_of(64);
            for w in (0..layout::NODE_SIZE).step_by(8) {
                let v = tx.load(leaf + w).unwrap();
                tx.store(raw + w, v).unwrap();
            }
            // The root's path to the first leaf now ends at the copy.
            let mut parent = tx.load(tree.ptr().offset() + ROOT_OFF).unwrap();
            loop {
                let child = layout::value(tx, parent, 0).unwrap();
                if child == leaf {
                    tx.store(parent + layout::VALUES_OFF, raw).unwrap();
                    break;
                }
                parent = child;
            }
        },
        "in no chunk",
    );
}
