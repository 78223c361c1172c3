//! The public API end to end: create, write, close, reopen, and every documented error.

use tusk::{Commit, Options, Store};

fn small() -> Options {
    Options { heap_capacity: 64 << 20, ..Options::default() }
}

#[test]
fn data_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small()).unwrap();
    let (p, lsn) = store
        .transact(Commit::Async, |tx| {
            let p = tx.alloc(100)?;
            tx.write_at(p, 3, b"persistent")?;
            tx.set_root("data", p)?;
            Ok(p)
        })
        .unwrap();
    assert!(lsn.is_some());
    for i in 0..50u64 {
        store.transact(Commit::Async, |tx| tx.write_u64_at(p, 16 + (i % 10) * 8, i)).unwrap();
    }
    store.close().unwrap();

    let store = Store::open(dir.path(), small()).unwrap();
    assert!(store.recovery_report().records_replayed >= 52);
    let (got, _) = store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("root recovered");
            let mut buf = [0u8; 10];
            tx.read_at(p, 3, &mut buf)?;
            let words: Vec<u64> = (0..10).map(|i| tx.read_u64_at(p, 16 + i * 8)).collect::<Result<_, _>>()?;
            Ok((buf, words, tx.len(p)?))
        })
        .unwrap();
    assert_eq!(&got.0, b"persistent");
    assert_eq!(got.1, (40..50).collect::<Vec<u64>>());
    assert_eq!(got.2, 100);
}

/// `Async` commits become durable with nobody waiting: the background flusher flushes a
/// partition once nothing flushed it for a group-commit interval, also when a `Sync`
/// committer has just led a flush of it (which pushes the next background flush back).
#[test]
fn async_commits_become_durable_within_the_group_commit_interval() {
    let dir = tempfile::tempdir().unwrap();
    let interval = std::time::Duration::from_millis(40);
    let store = Store::open(dir.path(), Options { group_commit_interval: interval, ..small() }).unwrap();
    let (p, _) = store.transact(Commit::Sync, |tx| tx.alloc(64)).unwrap();
    for round in 0..6u64 {
        if round % 2 == 1 {
            store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 8, round)).unwrap();
        }
        let (_, lsn) = store.transact(Commit::Async, |tx| tx.write_u64_at(p, 0, round)).unwrap();
        let lsn = lsn.unwrap();
        let started = std::time::Instant::now();
        while store.durable_lsn() < lsn {
            // Generous for a loaded machine: the bound is one interval plus a flush.
            assert!(started.elapsed() < interval * 50, "round {round}: LSN {lsn} not durable after {:?}", started.elapsed());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    store.close().unwrap();
}
