//! What a store offers replication: its log's records through `Options::commit_tap`, applied
//! to another store with `Store::apply_replicated`, and the node's own replica line.

use std::sync::{Arc, Mutex};

use tusk::{Commit, CommitTap, Error, Options, Store};

type Tapped = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

fn tapped_options(stream_from: u64) -> (Options, Tapped) {
    let seen: Tapped = Arc::default();
    let s = seen.clone();
    let options = Options {
        heap_capacity: 256 << 20,
        log_partitions: 2,
        stream_records_from: stream_from,
        commit_tap: Some(CommitTap(Arc::new(move |lsn, record| s.lock().unwrap().push((lsn, record.to_vec()))))),
        ..Options::default()
    };
    (options, seen)
}

fn plain() -> Options {
    Options { heap_capacity: 256 << 20, log_partitions: 2, ..Options::default() }
}

fn words(store: &Store, name: &str, n: u64) -> Vec<u64> {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root(name)?.unwrap();
            (0..n).map(|i| tx.read_u64_at(p, 8 * i)).collect::<Result<Vec<_>, _>>()
        })
        .unwrap()
        .0
}

/// Every LSN reaches the tap once; a fresh store that applies a leader's records after its
/// own format holds the leader's data, small and streamed records alike.
#[test]
fn a_store_applies_another_stores_records() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Records of 64 KiB and more are streamed: the tap sees them whole too.
    let (options, seen) = tapped_options(64 << 10);
    let a = Store::open(dir_a.path(), options).unwrap();
    let b = Store::open(dir_b.path(), plain()).unwrap();
    let formatted = a.last_lsn();
    assert_eq!(formatted, b.last_lsn(), "both stores formatted alike");
    let (p, _) = a
        .transact(Commit::Async, |tx| {
            let p = tx.alloc(8 * 4)?;
            tx.set_root("small", p)?;
            Ok(p)
        })
        .unwrap();
    for i in 0..50u64 {
        a.transact(Commit::Async, |tx| tx.write_u64_at(p, 8 * (i % 4), i)).unwrap();
    }
    // A large transaction: in place, its record streamed.
    let n = 200_000u64;
    a.transact(Commit::Sync, |tx| {
        let big = tx.alloc(8 * n)?;
        for i in 0..n {
            tx.write_u64_at(big, 8 * i, i * 3)?;
        }
        tx.set_root("big", big)
    })
    .unwrap();
    let last = a.last_lsn();
    let mut records = seen.lock().unwrap().clone();
    records.sort_by_key(|r| r.0);
    let lsns: Vec<u64> = records.iter().map(|r| r.0).collect();
    assert_eq!(lsns, (1..=last).collect::<Vec<_>>(), "every LSN tapped once");
    assert!(records.iter().any(|r| r.1.len() > 64 << 10), "a streamed record was tapped whole");
    let after_format: Vec<&[u8]> = records.iter().filter(|r| r.0 > formatted).map(|r| r.1.as_slice()).collect();
    let line = [7u64, 1, 2, 3, 4, 5, 6, 8];
    b.apply_replicated(&after_format, line, Commit::Sync).unwrap();
    assert_eq!(words(&b, "small", 4), words(&a, "small", 4));
    assert_eq!(words(&b, "big", n), words(&a, "big", n));
    assert_eq!(b.replica().unwrap(), line, "the replica line is written with the records");
    assert_eq!(a.replica().unwrap(), [0; 8], "a store never replicated has a zero line");
    // Across a reopen, both stay.
    b.close().unwrap();
    let b = Store::open(dir_b.path(), plain()).unwrap();
    assert_eq!(words(&b, "small", 4), words(&a, "small", 4));
    assert_eq!(b.replica().unwrap(), line);
}

/// A damaged record, a truncated one, or one that writes the replica line fails the call and
/// writes nothing, not even the records before it.
#[test]
fn bad_records_are_refused_whole() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (options, seen) = tapped_options(256 << 20);
    let a = Store::open(dir_a.path(), options).unwrap();
    let b = Store::open(dir_b.path(), plain()).unwrap();
    let formatted = a.last_lsn();
    a.transact(Commit::Async, |tx| {
        let p = tx.alloc(64)?;
        tx.write_u64_at(p, 0, 42)?;
        tx.set_root("x", p)
    })
    .unwrap();
    let good: Vec<Vec<u8>> = seen.lock().unwrap().iter().filter(|r| r.0 > formatted).map(|r| r.1.clone()).collect();
    let mut flipped = good.last().unwrap().clone();
    let at = flipped.len() - 12;
    flipped[at] ^= 1;
    let cut = &good.last().unwrap()[..good.last().unwrap().len() - 8];
    let before = b.last_lsn();
    for bad in [flipped.as_slice(), cut] {
        let mut call: Vec<&[u8]> = good.iter().map(Vec::as_slice).collect();
        call.push(bad);
        let e = b.apply_replicated(&call, [1; 8], Commit::Sync).unwrap_err();
        assert!(matches!(e, Error::BadReplicatedRecord { index, .. } if index == good.len()), "{e}");
    }
    assert_eq!(b.last_lsn(), before, "nothing committed");
    assert_eq!(b.replica().unwrap(), [0; 8]);
    // A record that writes the replica line (here, one of a store that wrote its own).
    let (options, seen) = tapped_options(256 << 20);
    let dir_c = tempfile::tempdir().unwrap();
    let c = Store::open(dir_c.path(), options).unwrap();
    c.write_replica([9; 8], Commit::Async).unwrap();
    let own = seen.lock().unwrap().last().unwrap().1.clone();
    let e = b.apply_replicated(&[own.as_slice()], [1; 8], Commit::Sync).unwrap_err();
    assert!(e.to_string().contains("replica line"), "{e}");
}

/// A store that refuses updates fails every transaction that writes, small or run in place,
/// writing nothing; reads and replication's own writes go on; allowed again, writes commit.
#[test]
fn a_store_that_refuses_updates_writes_nothing_but_replication() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), plain()).unwrap();
    let (p, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(8 * 100_000)?;
            tx.set_root("p", p)?;
            Ok(p)
        })
        .unwrap();
    store.refuse_updates(true);
    let small = store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 0, 1));
    assert!(matches!(small, Err(Error::UpdatesRefused)), "{small:?}");
    // 100 k words: a transaction that runs in place, its writes in the heap until undone.
    let large = store.transact(Commit::Sync, |tx| {
        for i in 0..100_000 {
            tx.write_u64_at(p, 8 * i, 7)?;
        }
        Ok(())
    });
    assert!(matches!(large, Err(Error::UpdatesRefused)), "{large:?}");
    // (An undone run in place still draws an LSN for an empty record: it changed its lines'
    // versions. No write of either transaction is in the heap.)
    let (sum, _) = store.transact(Commit::Async, |tx| (0..100_000).map(|i| tx.read_u64_at(p, 8 * i)).sum::<Result<u64, _>>()).unwrap();
    assert_eq!(sum, 0, "no write is left in the heap");
    store.write_replica([3; 8], Commit::Sync).unwrap();
    assert_eq!(store.replica().unwrap(), [3; 8], "replication's own writes are taken");
    store.refuse_updates(false);
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 0, 1)).unwrap();
}
