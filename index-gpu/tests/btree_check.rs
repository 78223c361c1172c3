//! The validator is not vacuous: each kind of damage to a valid tree makes `check()` fail with
//! an invariant error naming what broke. Damage is written with raw heap stores in the layout
//! documented in `layout.rs`.

mod common;

use tusk_index::btree::layout::{self, HIGH_KEY_OFF, RIGHT_LINK_OFF};
use tusk_index::btree::meta::{KEY_COUNT_OFF, ROOT_OFF};
use tusk_index::{BTree, IndexError};
use tusk_txn::Transaction;

/// A tree of three levels (1000 keys), and its first leaf.
fn tree(tx: &mut Transaction<'_>) -> (BTree, u64) {
    let tree = BTree::create(tx).unwrap();
    for k in 0..1_000u64 {
        tree.insert(tx, k * 2, k).unwrap();
    }
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
    assert_broken(|tx, tree, _| tx.store(tree.ptr().offset() + KEY_COUNT_OFF, 5).unwrap(), "descriptor");
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
