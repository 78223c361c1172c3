//! The ART validator is not vacuous: each kind of damage to a valid tree makes `check()` fail
//! with an ART invariant error naming what broke, and never panic. Damage is written with raw
//! heap stores in the layouts documented in `art/{meta,node,leaf,slab}.rs`.

mod common;

use tusk_index::art::link::{self, LEAF0, N4};
use tusk_index::art::meta::{self, CURSOR, END, KEY_DELTA, LIVE_DELTA, ROOT_OFF, STRIPE_COUNT_OFF};
use tusk_index::stripe::{self, STRIPES};
use tusk_index::art::{leaf, node, slab};
use tusk_index::{Art, IndexError};
use tusk_txn::Transaction;

const LONG: &[u8] = b"\x04a-prefix-longer-than-8/";

/// A tree whose root (an N16) has below byte 0 an N256, 1 an N48, 2 an N16, 3 an N4, and 4 an
/// N4 with a long prefix.
fn tree(tx: &mut Transaction<'_>) -> Art {
    let tree = Art::create(tx).unwrap();
    for (first, n) in [(0u8, 256u32), (1, 20), (2, 8), (3, 3)] {
        for b in 0..n {
            tree.insert(tx, &[first, b as u8], b as u64).unwrap();
        }
    }
    for b in 0..2u8 {
        tree.insert(tx, &[LONG, &[b]].concat(), 7).unwrap();
    }
    let s = tree.check(tx).unwrap();
    assert_eq!((s.n4, s.n16, s.n48, s.n256), (2, 2, 1, 1), "{s:?}");
    tree
}

fn meta(tree: Art) -> u64 {
    tree.ptr().offset()
}

/// The link below the root's byte `first`, and its heap offset.
fn child(tx: &mut Transaction<'_>, tree: Art, path: &[u8]) -> (u64, u64) {
    let mut l = tx.load(meta(tree) + ROOT_OFF).unwrap();
    for &b in path {
        let off = slab::offset(tx, meta(tree), l).unwrap();
        let (count, _) = node::header(tx, off).unwrap();
        let at = node::child_slot(tx, link::kind(l), off, count, b).unwrap().unwrap();
        l = tx.load(at).unwrap();
    }
    (l, slab::offset(tx, meta(tree), l).unwrap())
}

/// Heap offset of the child-link word for byte `b` of the node at `path`.
fn child_word(tx: &mut Transaction<'_>, tree: Art, path: &[u8], b: u8) -> u64 {
    let (l, off) = child(tx, tree, path);
    let (count, _) = node::header(tx, off).unwrap();
    node::child_slot(tx, link::kind(l), off, count, b).unwrap().unwrap()
}

fn assert_broken(damage: impl Fn(&mut Transaction<'_>, Art), expect: &str) {
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let tree = tree(tx);
        damage(tx, tree);
        match tree.check(tx) {
            Err(IndexError::ArtInvariant { what, .. }) => assert!(what.contains(expect), "{what}"),
            other => panic!("expected an invariant error with {expect:?}, got {other:?}"),
        }
    });
}

#[test]
fn detects_unordered_n4_keys() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[3]);
        tx.store(off + node::N4_KEYS, u64::from_le_bytes([1, 0, 2, 0, 0, 0, 0, 0])).unwrap();
    }, "ascending");
}

#[test]
fn detects_n48_index_to_an_empty_slot() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[1]);
        // byte 201 has no child; point it at slot 30 (20 children: slots 0..20 used).
        let b = 201u64;
        let at = off + node::N48_INDEX + b / 8 * 8;
        let w = tx.load(at).unwrap();
        tx.store(at, w | 31 << (8 * (b % 8))).unwrap();
    }, "empty slot");
}

#[test]
fn detects_wrong_children_count() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[0]);
        tx.store(off + node::HDR, node::encode_header(255, 0)).unwrap();
    }, "holds 256");
}

#[test]
fn detects_underfull_node() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[1]);
        tx.store(off + node::HDR, node::encode_header(5, 0)).unwrap();
    }, "outside 13..=48");
}

#[test]
fn detects_wrong_stored_prefix() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[4]);
        let w = tx.load(off + node::PREFIX).unwrap();
        tx.store(off + node::PREFIX, w ^ 0x100).unwrap();
    }, "stored prefix");
}

#[test]
fn detects_wrong_prefix_length() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[4]);
        tx.store(off + node::HDR, node::encode_header(2, 40)).unwrap();
    }, "leaf below has");
}

#[test]
fn detects_leaf_off_its_path() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[2, 5]);
        tx.store(off + leaf::KEY, u64::from_le_bytes([2, 9, 0, 0, 0, 0, 0, 0])).unwrap();
    }, "disagrees with its path");
}

#[test]
fn detects_leaf_in_wrong_size_class() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[2, 5]);
        tx.store(off + leaf::LEN, 5_000).unwrap();
    }, "leaf class");
}

#[test]
fn detects_wrong_key_count() {
    // Another thread's stripe: the count is the sum over all of them.
    let other = (stripe::current() + 1) % STRIPES;
    assert_broken(|tx, t| tx.store(meta::stripe(meta(t), other) + KEY_DELTA, 5).unwrap(), "descriptor");
}

#[test]
fn detects_wrong_stripe_count() {
    assert_broken(|tx, t| tx.store(meta(t) + STRIPE_COUNT_OFF, 4).unwrap(), "stripes");
}

/// This thread's stripe record of `kind`.
fn my_rec(t: Art, kind: u8) -> u64 {
    meta::stripe_kind(meta(t), stripe::current(), kind)
}

#[test]
fn detects_reachable_slot_in_an_unused_batch() {
    assert_broken(|tx, t| {
        // The last leaf this stripe handed out is in the tree: move the cursor back over it.
        let rec = my_rec(t, LEAF0);
        let cursor = tx.load(rec + CURSOR).unwrap();
        tx.store(rec + CURSOR, cursor - 1).unwrap();
    }, "unused batch");
}

#[test]
fn detects_a_batch_given_to_two_stripes() {
    assert_broken(|tx, t| {
        let rec = my_rec(t, LEAF0);
        let other = meta::stripe_kind(meta(t), (stripe::current() + 1) % STRIPES, LEAF0);
        for w in [CURSOR, END] {
            let v = tx.load(rec + w).unwrap();
            tx.store(other + w, v).unwrap();
        }
    }, "two stripes");
}

#[test]
fn detects_batch_beyond_the_handed_out_indices() {
    assert_broken(|tx, t| {
        let rec = my_rec(t, LEAF0);
        let end = tx.load(rec + END).unwrap();
        tx.store(rec + END, end + 1).unwrap();
    }, "batch rest");
}

#[test]
fn detects_link_to_a_slot_never_handed_out() {
    assert_broken(|tx, t| {
        let at = child_word(tx, t, &[3], 1);
        tx.store(at, link::pack(N4, 99_999)).unwrap();
    }, "not handed out");
}

#[test]
fn detects_link_of_unknown_kind() {
    assert_broken(|tx, t| {
        let at = child_word(tx, t, &[3], 1);
        tx.store(at, link::pack(200, 1)).unwrap();
    }, "unknown kind");
}

#[test]
fn detects_shared_slot() {
    assert_broken(|tx, t| {
        let (l, _) = child(tx, t, &[2, 4]);
        let at = child_word(tx, t, &[2], 5);
        tx.store(at, l).unwrap();
    }, "reached twice");
}

#[test]
fn detects_live_slot_on_the_free_list() {
    assert_broken(|tx, t| {
        let (l, _) = child(tx, t, &[2, 4]);
        tx.store(meta::free_head(meta(t), stripe::current(), LEAF0), link::index(l)).unwrap();
    }, "free list");
}

#[test]
fn detects_free_list_cycle() {
    assert_broken(|tx, t| {
        let (l, off) = child(tx, t, &[2, 4]);
        t.remove(tx, &[2, 4]).unwrap().unwrap();
        // The freed leaf's next-free word points at itself.
        tx.store(off, link::index(l)).unwrap();
    }, "twice");
}

#[test]
fn detects_wrong_live_count() {
    assert_broken(|tx, t| {
        let rec = my_rec(t, N4);
        let live = tx.load(rec + LIVE_DELTA).unwrap();
        tx.store(rec + LIVE_DELTA, live + 1).unwrap();
    }, "live");
}

#[test]
fn detects_inner_node_with_one_entry() {
    assert_broken(|tx, t| {
        let (_, off) = child(tx, t, &[3]);
        // Drop two of the N4's three children by hand.
        tx.store(off + node::HDR, node::encode_header(1, 0)).unwrap();
        tx.store(off + node::N4_KEYS, 0).unwrap();
        tx.store(off + node::N4_CHILDREN + 8, 0).unwrap();
        tx.store(off + node::N4_CHILDREN + 16, 0).unwrap();
    }, "single entry");
}

#[test]
fn open_refuses_a_foreign_object() {
    let engine = common::engine(16 << 20);
    common::transact(&engine, |tx| {
        let t = tree(tx);
        let (_, off) = child(tx, t, &[0]);
        assert!(matches!(Art::open(tx, tusk_storage::HeapPtr(off)), Err(IndexError::NotAnArt(o)) if o == off));
        assert_eq!(Art::open(tx, t.ptr()).unwrap(), t);
    });
}
