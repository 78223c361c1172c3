//! Group commit across threads: commits that wait for their flush (`Sync`, `Partition`) append
//! to one log partition whatever their thread, so that waiters share flushes; `Async` commits
//! append to their thread's partition.

mod common;

use std::collections::BTreeSet;

use tusk::{Commit, Options, Store};

const PARTITIONS: u32 = 4;

fn opts() -> Options {
    Options { log_partitions: PARTITIONS as usize, checkpoint_interval: None, ..common::small_opts() }
}

/// Each of four new threads commits once in each mode: the waiting commits' records are all in
/// partition 0, the Async ones in their threads' partitions, and every record is replayed on
/// reopen.
#[test]
fn waiting_commits_of_every_thread_share_one_partition() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let (p, _) = store.transact(Commit::Sync, |tx| tx.alloc(8 * 12)).unwrap();
    let lsns: Vec<[u64; 3]> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    [Commit::Sync, Commit::Partition, Commit::Async].map(|mode| {
                        let at = 8 * (3 * t + mode as u64);
                        store.transact(mode, |tx| tx.write_u64_at(p, at, 100 + at)).unwrap().1.expect("an update has an LSN")
                    })
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    store.close().unwrap();
    let partition = |lsn| common::partition_of_lsn(dir.path(), PARTITIONS, lsn).expect("every record is on disk");
    let mut async_partitions = BTreeSet::new();
    for [sync, part, asynchronous] in lsns {
        assert_eq!(partition(sync), 0, "a Sync commit's record");
        assert_eq!(partition(part), 0, "a Partition commit's record");
        async_partitions.insert(partition(asynchronous));
    }
    // Other tests of this process take thread slots meanwhile, so which partitions is not
    // known; four consecutive slots among them are not all ≡ 0 mod 4 but by a rare chance.
    assert!(async_partitions.iter().any(|&p| p != 0), "Async commits stay in their threads' partitions, not all in 0: {async_partitions:?}");

    let store = Store::open(dir.path(), opts()).unwrap();
    store
        .transact(Commit::Async, |tx| {
            for at in (0..12).map(|k| 8 * k) {
                assert_eq!(tx.read_u64_at(p, at)?, 100 + at, "word {at} after reopen");
            }
            Ok(())
        })
        .unwrap();
}

/// Eight threads committing `Sync` share flushes: far fewer flushes than commits (with a
/// partition per thread, each commit led a flush of its own partition), and each commit is
/// durable when it returns.
#[test]
fn concurrent_sync_commits_share_flushes() {
    const THREADS: u64 = 8;
    const COMMITS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { log_partitions: THREADS as usize, ..opts() }).unwrap();
    let (p, _) = store.transact(Commit::Sync, |tx| tx.alloc(8 * THREADS)).unwrap();
    let flushes_before = store.log_flush_totals().flushes;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let store = &store;
            s.spawn(move || {
                for k in 1..=COMMITS {
                    let (_, lsn) = store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 8 * t, k)).unwrap();
                    let lsn = lsn.expect("an update has an LSN");
                    assert!(store.durable_lsn() >= lsn, "a Sync commit returned before LSN {lsn} was durable");
                }
            });
        }
    });
    let totals = store.log_flush_totals();
    let flushes = totals.flushes - flushes_before;
    assert!(totals.writing > std::time::Duration::ZERO, "flushes were written, but no time in writing was counted");
    let commits = THREADS * COMMITS;
    assert!(flushes * 2 <= commits, "{flushes} flushes for {commits} Sync commits of {THREADS} threads: they did not group");
    store.close().unwrap();
}
