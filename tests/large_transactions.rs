//! Transactions of any size through the store: one that outgrows the write set's threshold
//! runs in place (tusk-txn's `in_place`), and must keep every guarantee a small one has.
//! A large B-link and ART load commits whole, is recovered whole after a reopen and after a
//! kill-style abandon of the store, and one that fails (a user error, a conflict) leaves
//! nothing behind; small transactions beside a large one commit too.

mod common;

use std::fs::OpenOptions;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::small_opts;
use tusk::{Commit, Error, Options, Store};

/// More keys than the in-place threshold's lines: a random insert writes several lines.
const KEYS: u64 = 60_000;

fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn art_key(i: u64) -> [u8; 8] {
    key(i).to_be_bytes()
}

fn opts() -> Options {
    Options { heap_capacity: 256 << 20, ..small_opts() }
}

fn load(store: &Store, mode: Commit) {
    store
        .transact(mode, |tx| {
            for i in 0..KEYS {
                tx.btree("t")?.insert(key(i), i)?;
                tx.art("a")?.insert(&art_key(i), i)?;
            }
            Ok(())
        })
        .unwrap();
}

fn verify(store: &Store, keys: u64) {
    store
        .transact(Commit::Async, |tx| {
            let mut tree = tx.btree("t")?;
            assert_eq!(tree.check()?.keys, keys);
            for i in 0..keys {
                assert_eq!(tree.get(key(i))?, Some(i), "key {i}");
            }
            let mut art = tx.art("a")?;
            assert_eq!(art.check()?.keys, keys);
            for i in (0..keys).step_by(7) {
                assert_eq!(art.get(&art_key(i))?, Some(i), "ART key {i}");
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_large_load_commits_whole_and_is_recovered_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    load(&store, Commit::Sync);
    verify(&store, KEYS);
    store.close().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    verify(&store, KEYS);
    // Once more on top, Async, then the store is dropped without a close after its log is
    // durable: recovery replays the large record.
    store
        .transact(Commit::Async, |tx| {
            for i in KEYS..2 * KEYS {
                tx.btree("t")?.insert(key(i), i)?;
                tx.art("a")?.insert(&art_key(i), i)?;
            }
            Ok(())
        })
        .unwrap();
    let last = store.transact(Commit::Sync, |tx| tx.btree("t")?.insert(u64::MAX, 0).map(|_| ())).unwrap().1.unwrap();
    assert!(store.is_stable(last, true));
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    store
        .transact(Commit::Async, |tx| {
            assert_eq!(tx.btree("t")?.remove(u64::MAX)?, Some(0));
            Ok(())
        })
        .unwrap();
    verify(&store, 2 * KEYS);
    store.close().unwrap();
}

#[test]
fn a_large_transaction_that_fails_leaves_nothing_and_the_store_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.transact(Commit::Sync, |tx| (0..100).try_for_each(|i| tx.btree("t")?.insert(key(i), i).map(|_| ()))).unwrap();
    let failed = store.transact(Commit::Async, |tx| {
        for i in 100..KEYS {
            tx.btree("t")?.insert(key(i), i)?;
        }
        tx.btree("t")?.insert(1, 1)?;
        Err::<(), _>(Error::InvalidPointer(1))
    });
    assert!(matches!(failed, Err(Error::InvalidPointer(1))), "{failed:?}");
    store
        .transact(Commit::Async, |tx| {
            let mut tree = tx.btree("t")?;
            assert_eq!(tree.check()?.keys, 100);
            assert_eq!(tree.get(key(KEYS - 1))?, None);
            assert_eq!(tree.get(1)?, None);
            Ok(())
        })
        .unwrap();
    store.close().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let (keys, _) = store.transact(Commit::Async, |tx| Ok(tx.btree("t")?.check()?.keys)).unwrap();
    assert_eq!(keys, 100);
    store.close().unwrap();
}

/// An in-place run keeps no before-image of lines in heap it took from brk (zero by the
/// allocator's rule); when it fails, those lines must be zero again, or the next allocation
/// of that memory hands out garbage as "zeroed" bytes.
#[test]
fn memory_a_failed_large_transaction_took_is_zero_again() {
    const BLOCK: u64 = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let used = store.heap_used();
    let mut taken = None;
    let failed = store.transact(Commit::Async, |tx| {
        let p = tx.alloc(BLOCK)?;
        taken = Some(p);
        // 64 Ki lines written: past the in-place threshold.
        for off in (0..BLOCK).step_by(64) {
            tx.write_u64_at(p, off, off | 1)?;
        }
        assert!(tx.is_in_place(), "the block's lines make the transaction run in place");
        Err::<(), _>(Error::InvalidPointer(1))
    });
    assert!(matches!(failed, Err(Error::InvalidPointer(1))), "{failed:?}");
    assert_eq!(store.heap_used(), used, "the failed allocation is undone");
    let (again, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(BLOCK)?;
            let mut bytes = vec![0xAAu8; BLOCK as usize];
            tx.read(p, &mut bytes)?;
            assert!(bytes.iter().all(|&b| b == 0), "memory handed out again is zero");
            tx.write_u64_at(p, 8, 7)?;
            Ok(p)
        })
        .unwrap();
    assert_eq!(Some(again), taken, "the same memory, taken from brk again");
    store.close().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let (word, _) = store.transact(Commit::Async, |tx| tx.read_u64_at(again, 8)).unwrap();
    assert_eq!(word, 7);
    store.close().unwrap();
}

/// A record larger than one flush stages (8 MiB) goes to disk in pieces; replayed from the
/// log (the store dropped without a close, no checkpoint after it), it is whole.
#[test]
fn a_record_written_in_pieces_is_replayed_whole() {
    const BIG: usize = 20 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let data: Vec<u8> = (0..BIG).map(|i| (i % 253) as u8).collect();
    let (big, lsn) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(BIG as u64)?;
            tx.write(p, &data)?;
            assert!(tx.is_in_place());
            Ok(p)
        })
        .unwrap();
    assert!(store.is_stable(lsn.unwrap(), true));
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    let (back, _) = store
        .transact(Commit::Async, |tx| {
            let mut back = vec![0u8; BIG];
            tx.read(big, &mut back)?;
            Ok(back)
        })
        .unwrap();
    assert!(back == data, "the record written in pieces came back whole");
    store.close().unwrap();
}

/// A large transaction and small ones on the same tree at once: every transaction commits
/// (the large one retried if it must), and the tree holds exactly what they wrote.
#[test]
fn small_transactions_beside_a_large_one_commit_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.transact(Commit::Sync, |tx| tx.btree("t").map(|_| ())).unwrap();
    let stop = AtomicBool::new(false);
    let small = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..3u64 {
                store
                    .transact(Commit::Async, |tx| {
                        for i in 0..KEYS / 2 {
                            tx.btree("t")?.insert(key(round * KEYS + i), round)?;
                        }
                        Ok(())
                    })
                    .unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                store.transact(Commit::Async, |tx| tx.btree("t")?.insert(key((1 << 40) + i), i).map(|_| ())).unwrap();
                i += 1;
                small.fetch_add(1, Ordering::Relaxed);
            }
        });
    });
    let small = small.load(Ordering::Relaxed);
    assert!(small > 0);
    store
        .transact(Commit::Async, |tx| {
            let mut tree = tx.btree("t")?;
            let stats = tree.check()?;
            for round in 0..3u64 {
                for i in 0..KEYS / 2 {
                    assert_eq!(tree.get(key(round * KEYS + i))?, Some(round));
                }
            }
            for i in 0..small {
                assert_eq!(tree.get(key((1 << 40) + i))?, Some(i), "small insert {i}");
            }
            assert_eq!(stats.keys, 3 * (KEYS / 2) + small);
            Ok(())
        })
        .unwrap();
    store.close().unwrap();
}

/// A snapshot asked for inside a transaction that runs in place fails at once with
/// `Error::SnapshotInsideLargeTransaction`: it would wait for the transaction's end, which
/// waits for the closure (before, the thread hung for ever). The transaction still commits,
/// and a snapshot taken after it sees it; a small transaction may take one inside.
#[test]
fn a_snapshot_inside_a_large_transaction_fails_instead_of_waiting_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store
        .transact(Commit::Async, |tx| {
            tx.btree("t")?.insert(1, 1)?;
            assert!(!tx.is_in_place());
            assert!(store.snapshot(tusk::SnapshotMode::Memcpy).is_ok(), "a small transaction may take one");
            Ok(())
        })
        .unwrap();
    store
        .transact(Commit::Async, |tx| {
            for i in 0..KEYS {
                tx.btree("t")?.insert(key(i), i)?;
            }
            assert!(tx.is_in_place());
            for mode in [tusk::SnapshotMode::Memcpy, tusk::SnapshotMode::Fork] {
                let inside = store.snapshot(mode).map(|_| ());
                assert!(matches!(inside, Err(Error::SnapshotInsideLargeTransaction)), "{mode:?}: {inside:?}");
            }
            Ok(())
        })
        .unwrap();
    let snapshot = store.snapshot(tusk::SnapshotMode::Memcpy).unwrap();
    let tree = snapshot.btree("t").unwrap();
    for i in (0..KEYS).step_by(11) {
        assert_eq!(tree.get(key(i)).unwrap(), Some(i), "key {i} in the snapshot after");
    }
}

/// Streams every in-place record of a megabyte or more (the default is 64 MiB).
fn streaming_opts() -> Options {
    Options { stream_records_from: 1 << 20, ..opts() }
}

/// A block of `bytes` written whole in one transaction (in place, and streamed with
/// [`streaming_opts`]); returns the block and the commit's LSN.
fn write_block(store: &Store, bytes: &[u8], mode: Commit) -> (tusk::HeapPtr, u64) {
    let (p, lsn) = store
        .transact(mode, |tx| {
            let p = tx.alloc(bytes.len() as u64)?;
            tx.write(p, bytes)?;
            assert!(tx.is_in_place());
            Ok(p)
        })
        .unwrap();
    (p, lsn.unwrap())
}

fn pattern(bytes: usize, seed: u64) -> Vec<u8> {
    (0..bytes as u64).map(|i| (key(i ^ seed) >> 56) as u8).collect()
}

/// A record streamed to the log as it is encoded shares its partition with small commits
/// made while it goes out: an Async large commit returns with its record already durable,
/// and after a reopen from the log alone (no checkpoint) it, every small commit and a
/// second streamed record after them are all there.
#[test]
fn a_streamed_record_is_replayed_whole_beside_small_commits() {
    const BIG: usize = 12 << 20;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { checkpoint_interval: None, ..streaming_opts() };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let (counter, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(8)?;
            tx.set_root("counter", p)?;
            Ok(p)
        })
        .unwrap();
    let first = pattern(BIG, 1);
    let stop = AtomicBool::new(false);
    let (big, small) = std::thread::scope(|s| {
        let small = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                store.transact(Commit::Async, |tx| tx.write_u64_at(counter, 0, n)).unwrap();
            }
            n
        });
        let (big, lsn) = write_block(&store, &first, Commit::Async);
        assert!(store.is_stable(lsn, false), "a streamed commit returns with its record durable");
        stop.store(true, Ordering::Relaxed);
        (big, small.join().unwrap())
    });
    let second = pattern(BIG / 2, 2);
    let (big2, lsn2) = write_block(&store, &second, Commit::Async);
    assert!(store.is_stable(lsn2, false));
    drop(store);
    let store = Store::open(dir.path(), opts).unwrap();
    let report = store.recovery_report().clone();
    assert!(report.torn_tails.is_empty() && report.gap_at.is_none(), "{report:?}");
    let (back, _) = store
        .transact(Commit::Async, |tx| {
            let mut back = vec![0u8; BIG];
            tx.read(big, &mut back)?;
            let mut back2 = vec![0u8; BIG / 2];
            tx.read(big2, &mut back2)?;
            Ok((back, back2, tx.read_u64_at(counter, 0)?))
        })
        .unwrap();
    assert!(back.0 == first, "the first streamed record came back whole");
    assert!(back.1 == second, "the second streamed record came back whole");
    assert_eq!(back.2, small, "every small commit made beside the streamed one is there");
    store.close().unwrap();
}

/// A streamed record cut short on disk (a crash while it went out) is a torn tail: cut off
/// and reported, the transaction gone as if it never committed, everything before it kept.
#[test]
fn a_streamed_record_cut_short_is_a_torn_tail() {
    const BIG: usize = 6 << 20;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { checkpoint_interval: None, ..streaming_opts() };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let before = store.transact(Commit::Sync, |tx| tx.btree("t")?.insert(7, 70).map(|_| ())).unwrap().1.unwrap();
    let used = store.heap_used();
    let (_, lsn) = write_block(&store, &pattern(BIG, 3), Commit::Sync);
    drop(store);
    let seg = common::segments(dir.path(), 0).last().cloned().unwrap();
    let rec = *common::records(&seg).last().unwrap();
    assert!(rec.len > BIG as u64, "the streamed record is the partition's last: {rec:?}");
    OpenOptions::new().write(true).open(&seg).unwrap().set_len(rec.offset + rec.len / 2).unwrap();
    let store = Store::open(dir.path(), opts).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(report.torn_tails.len(), 1, "{report:?}");
    assert_eq!(report.torn_tails[0].offset, rec.offset, "{report:?}");
    assert!(report.recovered_lsn >= before && report.recovered_lsn == lsn - 1, "{report:?}");
    assert_eq!(store.heap_used(), used, "the lost transaction's allocation is gone");
    let (value, _) = store.transact(Commit::Async, |tx| tx.btree("t")?.get(7)).unwrap();
    assert_eq!(value, Some(70));
    store.close().unwrap();
}
