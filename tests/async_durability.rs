//! Async commits become durable without anyone waiting for them: the background flusher
//! writes every partition that holds records within a few group-commit intervals.

mod common;

use std::time::{Duration, Instant};

use tusk::{Commit, Options, Store};

/// Every partition, including one never flushed before. (Such a partition was due "at once" as
/// of a clock read taken after the flusher's own, so the flusher found it never due: it spun
/// at full speed and left the partition's records unwritten until someone waited for them.)
#[test]
fn async_commits_become_durable_on_their_own_in_every_partition() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { log_partitions: 4, checkpoint_interval: None, ..common::small_opts() };
    let store = Store::open(dir.path(), opts).unwrap();
    let (p, _) = store.transact(Commit::Sync, |tx| tx.alloc(64)).unwrap();
    // New threads take the next thread slots, so the four land in four partitions.
    let last = std::thread::scope(|s| {
        let commits: Vec<_> = (0..4u64).map(|i| s.spawn({
            let store = &store;
            move || store.transact(Commit::Async, |tx| tx.write_u64_at(p, 8 * i, i + 1)).unwrap().1.unwrap()
        })).collect();
        commits.into_iter().map(|c| c.join().unwrap()).max().unwrap()
    });
    let started = Instant::now();
    while store.durable_lsn() < last {
        assert!(started.elapsed() < Duration::from_secs(5), "Async commits still not durable after 5 s (durable {}, last {last})", store.durable_lsn());
        std::thread::sleep(Duration::from_millis(1));
    }
    store.close().unwrap();
}
