//! Many keys, ascending and shuffled: splits on every level, a deep tree, full scans.

mod common;

use tusk_index::BTree;

const KEYS: u64 = 120_000;
const PER_TX: u64 = 2_000;

/// A deterministic permutation of 0..n (multiplicative hashing with an odd constant, modulo a
/// power of two, then filtered to the range), so the test needs no random-number crate.
fn shuffled(n: u64) -> Vec<u64> {
    let m = n.next_power_of_two();
    (0..m).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % m).filter(|&k| k < n).collect()
}

fn load_and_verify(keys: &[u64]) {
    let engine = common::engine(256 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    for chunk in keys.chunks(PER_TX as usize) {
        common::transact(&engine, |tx| {
            for &k in chunk {
                assert_eq!(tree.insert(tx, k * 3, k).unwrap(), None);
            }
        });
    }
    common::transact(&engine, |tx| {
        let stats = tree.check(tx).unwrap();
        assert_eq!(stats.keys, KEYS);
        assert!(stats.levels >= 3, "{stats:?}");
        for k in (0..KEYS).step_by(7) {
            assert_eq!(tree.get(tx, k * 3).unwrap(), Some(k));
            assert_eq!(tree.get(tx, k * 3 + 1).unwrap(), None);
        }
        let mut expect = 0u64;
        for item in tree.range(tx, ..).unwrap() {
            let (k, v) = item.unwrap();
            assert_eq!((k, v), (expect * 3, expect));
            expect += 1;
        }
        assert_eq!(expect, KEYS);
        assert_eq!(tree.count(tx, 300..=3_000).unwrap(), 901);
        assert_eq!(tree.sum(tx, ..).unwrap(), (KEYS as u128) * (KEYS as u128 - 1) / 2);
        // Upserts return the old value and change no structure.
        assert_eq!(tree.insert(tx, 3 * 42, 7).unwrap(), Some(42));
        assert_eq!(tree.check(tx).unwrap().nodes, stats.nodes);
    });
}

#[test]
fn ascending_keys() {
    let keys: Vec<u64> = (0..KEYS).collect();
    load_and_verify(&keys);
}

#[test]
fn shuffled_keys() {
    let keys = shuffled(KEYS);
    assert_eq!(keys.len() as u64, KEYS);
    load_and_verify(&keys);
}

#[test]
fn descriptor_is_checked_on_open() {
    let engine = common::engine(1 << 20);
    common::transact(&engine, |tx| {
        let not_a_tree = tx.alloc(64).unwrap();
        assert!(matches!(BTree::open(tx, not_a_tree), Err(tusk_index::IndexError::NotABTree(_))));
    });
}

/// Sequential inserts fill their leaves (the append split): every leaf but the rightmost is
/// full, and removing keys again from such a tree (the underfull rightmost leaf included)
/// keeps every invariant.
#[test]
fn ascending_inserts_leave_full_leaves() {
    use tusk_index::btree::layout::CAPACITY;
    let engine = common::engine(256 << 20);
    let tree = common::transact(&engine, |tx| BTree::create(tx).unwrap());
    let n = 10_000u64;
    for chunk in (0..n).collect::<Vec<_>>().chunks(PER_TX as usize) {
        common::transact(&engine, |tx| {
            for &k in chunk {
                tree.insert(tx, k, k).unwrap();
            }
        });
    }
    let stats = common::transact(&engine, |tx| tree.check(tx).unwrap());
    assert_eq!(stats.leaves, n.div_ceil(CAPACITY as u64), "{stats:?}");
    // Remove from the right end (the underfull rightmost leaf first) and from the middle.
    common::transact(&engine, |tx| {
        for k in (n - 100..n).rev().chain((1000..3000).step_by(2)) {
            assert_eq!(tree.remove(tx, k).unwrap(), Some(k));
            if k % 97 == 0 {
                tree.check(tx).unwrap();
            }
        }
        assert_eq!(tree.check(tx).unwrap().keys, n - 100 - 1000);
    });
}
