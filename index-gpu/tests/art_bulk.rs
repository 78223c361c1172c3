//! Deterministic ART tests: many random 8-byte keys in and out (slab accounting back to zero,
//! free slots reused), growth and shrinking through every node type, the key-length limit,
//! and an aborted transaction.

mod common;

use tusk_index::{Art, ArtStats, IndexError, MAX_KEY_LEN};

/// splitmix64: deterministic pseudo-random keys without a random-number crate.
fn keys(n: usize, seed: u64) -> Vec<[u8; 8]> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)).to_be_bytes()
        })
        .collect()
}

fn slots(s: &ArtStats) -> u64 {
    s.n4 + s.n16 + s.n48 + s.n256 + s.leaves + s.free_slots
}

#[test]
fn random_8_byte_keys_in_and_out() {
    const N: usize = 100_000;
    let ks = keys(N, 7);
    let engine = common::engine(256 << 20);
    let tree = common::transact(&engine, |tx| Art::create(tx).unwrap());
    let fill = |round: u64| {
        for chunk in ks.chunks(5_000) {
            common::transact(&engine, |tx| {
                for (i, k) in chunk.iter().enumerate() {
                    assert_eq!(tree.insert(tx, k, i as u64 + round).unwrap(), None);
                }
            });
        }
        common::transact(&engine, |tx| {
            let stats = tree.check(tx).unwrap();
            assert_eq!(stats.keys, N as u64);
            assert!(stats.n256 >= 1 && stats.n48 + stats.n16 + stats.n4 > 0, "{stats:?}");
            for (j, chunk) in ks.chunks(5_000).enumerate() {
                for (i, k) in chunk.iter().enumerate().step_by(3) {
                    assert_eq!(tree.get(tx, k).unwrap(), Some(i as u64 + round), "chunk {j}");
                    let mut miss = *k;
                    miss[7] ^= 0x55;
                    assert_eq!(tree.get(tx, &miss).unwrap(), None);
                    assert_eq!(tree.get(tx, &k[..7]).unwrap(), None);
                }
            }
            let mut sorted = ks.clone();
            sorted.sort();
            let got: Vec<_> = tree.range::<_, &[u8]>(tx, ..).unwrap().map(|r| r.unwrap().0).collect();
            assert_eq!(got.len(), N);
            assert!(got.iter().zip(&sorted).all(|(a, b)| a == b));
            assert_eq!(tree.count::<_, &[u8]>(tx, ..).unwrap(), N as u64);
            let lo = sorted[N / 4];
            let hi = sorted[N / 2];
            assert_eq!(tree.count(tx, lo..hi).unwrap(), (N / 2 - N / 4) as u64);
            assert_eq!(tree.count_prefix(tx, &[0x80]).unwrap(), sorted.iter().filter(|k| k[0] == 0x80).count() as u64);
            stats
        })
    };
    let first = fill(0);
    let remove_all = || {
        for chunk in ks.chunks(5_000) {
            common::transact(&engine, |tx| {
                for k in chunk {
                    assert!(tree.remove(tx, k).unwrap().is_some());
                    assert_eq!(tree.remove(tx, k).unwrap(), None);
                }
            });
        }
        common::transact(&engine, |tx| {
            let stats = tree.check(tx).unwrap();
            assert_eq!((stats.keys, stats.bytes, stats.n4 + stats.n16 + stats.n48 + stats.n256), (0, 0, 0), "{stats:?}");
            assert!(tree.is_empty(tx).unwrap());
            stats
        })
    };
    let emptied = remove_all();
    // Removal frees every slot (shrinking may have taken a few more than the fill did).
    assert!(slots(&emptied) >= slots(&first) && emptied.free_slots == slots(&emptied));
    // The same inserts again take every slot from the free lists: nothing new is handed out.
    let second = fill(1);
    assert_eq!(slots(&second), slots(&emptied), "{second:?} vs {emptied:?}");
    assert_eq!(second.bytes, first.bytes);
    remove_all();
}

/// The kind of the only inner node for `n` children while growing.
fn grown_kind(n: usize) -> &'static str {
    match n {
        0..=4 => "N4",
        5..=16 => "N16",
        17..=48 => "N48",
        _ => "N256",
    }
}

fn shrunk_kind(n: usize) -> &'static str {
    match n {
        0..=3 => "N4",
        4..=12 => "N16",
        13..=37 => "N48",
        _ => "N256",
    }
}

fn only_node(s: &ArtStats) -> &'static str {
    match (s.n4, s.n16, s.n48, s.n256) {
        (1, 0, 0, 0) => "N4",
        (0, 1, 0, 0) => "N16",
        (0, 0, 1, 0) => "N48",
        (0, 0, 0, 1) => "N256",
        (0, 0, 0, 0) => "none",
        _ => "several",
    }
}

#[test]
fn grows_and_shrinks_through_every_node_type() {
    let engine = common::engine(64 << 20);
    for prefix in [&b""[..], b"ab", b"a-prefix-longer-than-eight-bytes/"] {
        for terminal in [false, true] {
            common::transact(&engine, |tx| {
                let tree = Art::create(tx).unwrap();
                let key = |b: u8| [prefix, &[b]].concat();
                if terminal {
                    tree.insert(tx, prefix, 1_000).unwrap();
                }
                let extra = terminal as usize;
                for n in 1..=256usize {
                    tree.insert(tx, &key((n - 1) as u8), n as u64).unwrap();
                    let s = tree.check(tx).unwrap();
                    assert_eq!(s.keys as usize, n + extra);
                    let want = if n + extra == 1 { "none" } else { grown_kind(n) };
                    assert_eq!(only_node(&s), want, "growing to {n}, prefix {prefix:?}, terminal {terminal}: {s:?}");
                }
                assert_eq!(tree.count_prefix(tx, prefix).unwrap(), 256 + extra as u64);
                for n in (0..256usize).rev() {
                    // Remove from the middle out, so the N48 slot reuse and the N4/N16 shifts are exercised.
                    let b = ((n * 7 + 3) % 256) as u8;
                    let b = (0..=255u8).map(|d| b.wrapping_add(d)).find(|&c| tree.get(tx, &key(c)).unwrap().is_some()).unwrap();
                    assert!(tree.remove(tx, &key(b)).unwrap().is_some());
                    let s = tree.check(tx).unwrap();
                    let want = if n + extra <= 1 { "none" } else { shrunk_kind(n) };
                    assert_eq!(only_node(&s), want, "shrinking to {n}, prefix {prefix:?}, terminal {terminal}: {s:?}");
                    assert_eq!(s.keys as usize, n + extra);
                }
                if terminal {
                    assert_eq!(tree.get(tx, prefix).unwrap(), Some(1_000));
                    assert_eq!(tree.remove(tx, prefix).unwrap(), Some(1_000));
                }
                let s = tree.check(tx).unwrap();
                assert_eq!((s.keys, s.bytes), (0, 0));
            });
        }
    }
}

#[test]
fn nested_keys_and_the_empty_key() {
    let engine = common::engine(64 << 20);
    common::transact(&engine, |tx| {
        let tree = Art::create(tx).unwrap();
        let keys: Vec<Vec<u8>> = (0..=40).map(|n| vec![b'a'; n]).collect();
        for (i, k) in keys.iter().enumerate().rev() {
            tree.insert(tx, k, i as u64).unwrap();
            tree.check(tx).unwrap();
        }
        let all: Vec<_> = tree.range::<_, &[u8]>(tx, ..).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(all, keys.iter().enumerate().map(|(i, k)| (k.clone(), i as u64)).collect::<Vec<_>>());
        assert_eq!(tree.get(tx, b"").unwrap(), Some(0));
        assert_eq!(tree.count_prefix(tx, b"aaaaa").unwrap(), 36);
        assert_eq!(tree.sum(tx, &b"a"[..]..=&b"aaa"[..]).unwrap(), 1 + 2 + 3);
        // Removing from the shortest: each removal collapses a node.
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(tree.remove(tx, k).unwrap(), Some(i as u64));
            let s = tree.check(tx).unwrap();
            assert_eq!(s.keys as usize, keys.len() - i - 1);
        }
    });
}

#[test]
fn keys_longer_than_the_maximum_are_refused() {
    let engine = common::engine(64 << 20);
    common::transact(&engine, |tx| {
        let tree = Art::create(tx).unwrap();
        let max = vec![7u8; MAX_KEY_LEN];
        let over = vec![7u8; MAX_KEY_LEN + 1];
        assert_eq!(tree.insert(tx, &max, 1).unwrap(), None);
        match tree.insert(tx, &over, 2) {
            Err(IndexError::KeyTooLong { len, max }) => assert_eq!((len, max), (MAX_KEY_LEN + 1, MAX_KEY_LEN)),
            other => panic!("expected KeyTooLong, got {other:?}"),
        }
        assert_eq!(tree.get(tx, &over).unwrap(), None);
        assert_eq!(tree.remove(tx, &over).unwrap(), None);
        assert_eq!(tree.get(tx, &max).unwrap(), Some(1));
        let s = tree.check(tx).unwrap();
        assert_eq!((s.keys, s.overflow_leaves), (1, 1));
    });
}

#[test]
fn aborted_transaction_leaves_the_tree_unchanged() {
    let engine = common::engine(64 << 20);
    let ks = keys(2_000, 3);
    let tree = common::transact(&engine, |tx| {
        let tree = Art::named(tx, "a").unwrap();
        for (i, k) in ks[..1_000].iter().enumerate() {
            tree.insert(tx, k, i as u64).unwrap();
        }
        tree
    });
    let before = common::transact(&engine, |tx| tree.check(tx).unwrap());
    {
        let mut tx = engine.begin();
        for (i, k) in ks[1_000..].iter().enumerate() {
            tree.insert(&mut tx, k, i as u64).unwrap();
        }
        for k in &ks[..500] {
            tree.remove(&mut tx, k).unwrap().unwrap();
        }
        tree.insert(&mut tx, b"", 5).unwrap();
        assert_eq!(tree.len(&mut tx).unwrap(), 1_501);
        // Dropped without commit.
    }
    common::transact(&engine, |tx| {
        assert_eq!(Art::named(tx, "a").unwrap(), tree);
        assert_eq!(tree.check(tx).unwrap(), before);
        assert_eq!(tree.len(tx).unwrap(), 1_000);
        for (i, k) in ks[..1_000].iter().enumerate() {
            assert_eq!(tree.get(tx, k).unwrap(), Some(i as u64));
        }
        for k in &ks[1_000..] {
            assert_eq!(tree.get(tx, k).unwrap(), None);
        }
        assert_eq!(tree.get(tx, b"").unwrap(), None);
    });
}
