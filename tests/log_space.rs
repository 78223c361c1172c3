//! The log space bound: with background checkpoints on, the log on disk stays under
//! `max_log_bytes` under any update pattern (committers stall until a checkpoint trims it),
//! and a stall ends in an error, never a hang, when the checkpoint cannot run.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tusk::{Commit, Error, HeapPtr, Options, Store};
use tusk_storage::io::FaultPlan;

const WORDS: u64 = 512 * 1024; // 4 MiB of u64 words
const MAX_LOG: u64 = 4 << 20;

fn options() -> Options {
    Options {
        heap_capacity: 32 << 20,
        chunk_size: 64 << 10,
        log_partitions: 2,
        log_buffer_bytes: 64 << 10,
        checkpoint_interval: Some(Duration::from_secs(3600)),
        max_log_bytes: MAX_LOG,
        ..Options::default()
    }
}

fn setup(store: &Store) -> HeapPtr {
    
    common::alloc_data_root(store, WORDS * 8)
}

/// Two threads update the first 1% of the words (skewed: most chunks stay clean, so their
/// old images pin the log unless the checkpointer rewrites them). Each word holds a count of
/// the updates made to it; returns the per-word counts the threads committed.
fn skewed_updates(store: &Arc<Store>, p: HeapPtr, run_for: Duration, max_seen: &AtomicU64) -> Vec<u64> {
    let hot = WORDS / 100;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut counts = vec![0u64; hot as usize];
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Each thread owns every other hot word: counts stay exact without conflicts.
                    let w = (x % (hot / 2)) * 2 + t;
                    store
                        .transact(Commit::Async, |tx| {
                            let v = tx.read_u64_at(p, w * 8)?;
                            tx.write_u64_at(p, w * 8, v + 1)
                        })
                        .unwrap();
                    counts[w as usize] += 1;
                }
                counts
            })
        })
        .collect();
    let started = Instant::now();
    while started.elapsed() < run_for {
        max_seen.fetch_max(store.log_bytes(), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = vec![0u64; hot as usize];
    for w in workers {
        for (t, c) in total.iter_mut().zip(w.join().unwrap()) {
            *t += c;
        }
    }
    total
}

#[test]
fn log_stays_under_its_bound_with_skewed_updates_and_recovers_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), options()).unwrap());
    let p = setup(&store);
    let max_seen = AtomicU64::new(0);
    let counts = skewed_updates(&store, p, Duration::from_secs(3), &max_seen);
    let (_, error, taken) = store.checkpoint_status();
    assert_eq!(error, None);
    let max_seen = max_seen.into_inner();
    let updates: u64 = counts.iter().sum();
    // The run must write many times the bound, or it proves nothing.
    assert!(updates * 40 > 4 * MAX_LOG, "only {updates} updates");
    assert!(taken >= 2, "log pressure must start checkpoints ({taken} taken)");
    assert!(max_seen <= MAX_LOG, "log reached {max_seen} bytes, bound {MAX_LOG}");
    Arc::try_unwrap(store).ok().unwrap().close().unwrap();

    let store = Store::open(dir.path(), options()).unwrap();
    store
        .transact(Commit::Async, |tx| {
            for (w, &c) in counts.iter().enumerate() {
                assert_eq!(tx.read_u64_at(p, w as u64 * 8)?, c, "word {w}");
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn failing_checkpoints_turn_a_log_space_stall_into_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultPlan::new();
    let opts = Options { checkpoint_faults: Some(faults.clone()), ..options() };
    let store = Store::open(dir.path(), opts).unwrap();
    let p = setup(&store);
    faults.fail_after(0, libc::ENOSPC);
    let started = Instant::now();
    let mut committed = 0u64;
    let err = loop {
        match store.transact(Commit::Async, |tx| tx.write_u64_at(p, (committed % WORDS) * 8, committed)) {
            Ok(_) => committed += 1,
            Err(e) => break e,
        }
        assert!(started.elapsed() < Duration::from_secs(60), "commits neither stalled nor failed");
    };
    match &err {
        Error::LogFailed(why) => assert!(why.contains("over its bound"), "{why}"),
        other => panic!("expected LogFailed, got {other:?}"),
    }
    assert!(committed > 0);
    assert!(store.log_bytes() > MAX_LOG / 2);
}

/// One transaction whose record alone is larger than the bound (it runs in place): its
/// commit stalls until checkpoints cover it, then the segment holding it is deleted and the
/// log is under its bound again, so neither this commit nor later ones wait for good. (The
/// record's segment used to stay open while its partition flushed nothing else, so it was
/// never trimmed and every committer stalled: a 64 M-key bulk load never returned.)
#[test]
fn a_record_larger_than_the_bound_is_trimmed_and_commits_go_on() {
    const BIG: usize = 6 << 20;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { segment_bytes: 1 << 20, ..options() };
    let store = Arc::new(Store::open(dir.path(), opts.clone()).unwrap());
    let p = setup(&store);
    let (big, _) = store.transact(Commit::Sync, |tx| tx.alloc(BIG as u64)).unwrap();
    let data: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    let (done_tx, done) = std::sync::mpsc::channel();
    let worker = {
        let (store, data) = (store.clone(), data.clone());
        std::thread::spawn(move || {
            // Sync: the record is on disk when the commit checks the bound, so it stalls.
            let (in_place, _) = store
                .transact(Commit::Sync, |tx| {
                    tx.write(big, &data)?;
                    Ok(tx.is_in_place())
                })
                .unwrap();
            assert!(in_place, "a 6 MiB write runs in place");
            for i in 0..100u64 {
                store.transact(Commit::Async, |tx| tx.write_u64_at(p, i * 8, i)).unwrap();
            }
            done_tx.send(()).unwrap();
        })
    };
    done.recv_timeout(Duration::from_secs(120)).expect("the commits after a record larger than the log bound stalled");
    worker.join().unwrap();
    assert!(store.log_bytes() <= MAX_LOG, "log at {} bytes after the stall ended, bound {MAX_LOG}", store.log_bytes());
    // The checkpoint that trimmed the log may still be finishing (it counts once it returns).
    let waited = Instant::now();
    while store.checkpoint_status().2 == 0 && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, error, taken) = store.checkpoint_status();
    assert_eq!(error, None);
    assert!(taken >= 1, "log pressure started a checkpoint");
    Arc::try_unwrap(store).ok().unwrap().close().unwrap();

    let store = Store::open(dir.path(), opts).unwrap();
    store
        .transact(Commit::Async, |tx| {
            let mut back = vec![0u8; BIG];
            tx.read(big, &mut back)?;
            assert!(back == data, "the large write recovered");
            for i in 0..100u64 {
                assert_eq!(tx.read_u64_at(p, i * 8)?, i);
            }
            Ok(())
        })
        .unwrap();
}

