//! Snapshot readers: every mode equals the heap at its LSN while writers run, both trees on a
//! snapshot equal their models at that LSN, refresh equals a fresh copy, fork children are
//! errors (not hangs) when they die and are never left behind, and the edge cases (empty
//! store, no durability, too little memory, a store dropped under its snapshots).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use common::{alloc_data_root, opts_off, small_opts};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{BTreeOp, Commit, Error, HeapPtr, Options, Snapshot, SnapshotMode, SnapshotOptions, Store};

const MODES: [SnapshotMode; 4] = [SnapshotMode::Memcpy, SnapshotMode::Incremental, SnapshotMode::Fork, SnapshotMode::Auto];

/// Spans written by one committed transaction.
type Writes = Vec<(u64, Vec<u8>)>;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn snapshots_are_send_and_sync() {
    assert_send_sync::<Snapshot>();
}

/// Replays the commits with LSN ≤ `lsn` over a zeroed region of `len` bytes.
fn model_at(commits: &[(u64, Writes)], base: u64, len: usize, lsn: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    for (_, writes) in commits.iter().take_while(|(l, _)| *l <= lsn) {
        for (off, data) in writes {
            let at = (off - base) as usize;
            bytes[at..at + data.len()].copy_from_slice(data);
        }
    }
    bytes
}

/// Two writers commit random spans into a region while this thread takes snapshots (and
/// refreshes them) in `mode`; each snapshot's bytes of the region must equal the commits up
/// to its LSN, replayed in LSN order.
fn snapshot_bytes_equal_the_model(options: Options, mode: SnapshotMode) {
    const REGION: u64 = 6 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options).unwrap();
    let base = alloc_data_root(&store, REGION).offset();
    let stop = AtomicBool::new(false);
    let commits: Mutex<Vec<(u64, Writes)>> = Mutex::new(Vec::new());
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        for seed in 0..2u64 {
            let (store, stop, commits) = (&store, &stop, &commits);
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                while !stop.load(Ordering::Relaxed) {
                    let writes: Writes = (0..rng.random_range(1..4))
                        .map(|_| {
                            let len = rng.random_range(1..300u64);
                            let off = base + rng.random_range(0..REGION - len);
                            (off, (0..len).map(|_| rng.random()).collect())
                        })
                        .collect();
                    let (_, lsn) = store
                        .transact(Commit::Async, |tx| {
                            for (off, data) in &writes {
                                tx.write_at(HeapPtr(base), off - base, data)?;
                            }
                            Ok(())
                        })
                        .unwrap();
                    commits.lock().unwrap().push((lsn.unwrap(), writes));
                }
            });
        }
        let mut snap = store.snapshot(mode).unwrap();
        for round in 0..6 {
            std::thread::sleep(std::time::Duration::from_millis(15));
            if round > 0 {
                snap.refresh().unwrap();
            }
            let mut bytes = vec![0u8; REGION as usize];
            snap.read(HeapPtr(base), &mut bytes).unwrap();
            seen.push((snap.lsn(), snap.mode(), bytes));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let mut commits = commits.into_inner().unwrap();
    commits.sort_by_key(|(l, _)| *l);
    assert!(commits.len() > 50, "writers ran: {} commits", commits.len());
    for (lsn, picked, bytes) in seen {
        let expected = model_at(&commits, base, REGION as usize, lsn);
        let first_diff = bytes.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{mode:?} (picked {picked:?}) at LSN {lsn}: region differs from the model");
    }
}

#[test]
fn every_mode_equals_the_heap_at_its_lsn_while_writers_run() {
    for mode in MODES {
        snapshot_bytes_equal_the_model(small_opts(), mode);
    }
}

#[test]
fn snapshots_of_a_store_without_durability_equal_the_model() {
    for mode in [SnapshotMode::Memcpy, SnapshotMode::Fork] {
        snapshot_bytes_equal_the_model(opts_off(), mode);
    }
}

/// Updates both trees from a writer thread, recording each commit's operations; snapshots
/// in every mode must pass both validators and equal the models replayed to their LSN.
#[test]
fn both_trees_on_a_snapshot_equal_their_models_at_its_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    store.transact(Commit::Sync, |tx| {
        tx.btree("orders")?;
        tx.art("users")?;
        Ok(())
    })
    .unwrap();
    type Batch = (Vec<BTreeOp>, Vec<(Vec<u8>, Option<u64>)>);
    let stop = AtomicBool::new(false);
    let log: Mutex<Vec<(u64, Batch)>> = Mutex::new(Vec::new());
    let mut snaps = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = SmallRng::seed_from_u64(9);
            while !stop.load(Ordering::Relaxed) {
                let ops: Vec<BTreeOp> = (0..rng.random_range(1..200))
                    .map(|_| {
                        let k = rng.random_range(0..20_000u64);
                        if rng.random_bool(0.2) { BTreeOp::Remove { key: k } } else { BTreeOp::Upsert { key: k, value: rng.random() } }
                    })
                    .collect();
                let art: Vec<(Vec<u8>, Option<u64>)> = (0..rng.random_range(1..50))
                    .map(|_| {
                        let key = format!("user/{:05}", rng.random_range(0..5_000u32)).into_bytes();
                        (key, (!rng.random_bool(0.2)).then(|| rng.random()))
                    })
                    .collect();
                let (_, lsn) = store
                    .transact(Commit::Async, |tx| {
                        tx.btree("orders")?.apply_batch(&ops)?;
                        let mut users = tx.art("users")?;
                        for (k, v) in &art {
                            match v {
                                Some(v) => users.insert(k, *v)?,
                                None => users.remove(k)?,
                            };
                        }
                        Ok(())
                    })
                    .unwrap();
                log.lock().unwrap().push((lsn.unwrap(), (ops, art)));
            }
        });
        // The probes below need trees with some keys (40 commits: about 800 users, some 20 of
        // them probed): on a loaded machine 20 ms may not be enough for the writer's first
        // commits (a snapshot at LSN 4 once held no probed key).
        let started = std::time::Instant::now();
        while log.lock().unwrap().len() < 40 && started.elapsed() < std::time::Duration::from_secs(60) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        for mode in MODES.iter().cycle().take(8) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            snaps.push(store.snapshot(*mode).unwrap());
        }
        stop.store(true, Ordering::Relaxed);
    });
    let log = log.into_inner().unwrap();
    assert!(log.len() > 20, "the writer ran: {} commits", log.len());
    for snap in &snaps {
        let (mut orders, mut users) = (BTreeMap::new(), BTreeMap::new());
        for (_, (ops, art)) in log.iter().filter(|(l, _)| *l <= snap.lsn()) {
            for op in ops {
                match *op {
                    BTreeOp::Upsert { key, value } => orders.insert(key, value),
                    BTreeOp::Remove { key } => orders.remove(&key),
                };
            }
            for (k, v) in art {
                match v {
                    Some(v) => users.insert(k.clone(), *v),
                    None => users.remove(k),
                };
            }
        }
        let what = format!("{:?} snapshot at LSN {}", snap.mode(), snap.lsn());
        let tree = snap.btree("orders").unwrap();
        assert_eq!(tree.check().unwrap().keys, orders.len() as u64, "{what}");
        let all: Vec<(u64, u64)> = tree.range(..).collect::<Result<_, _>>().unwrap();
        assert_eq!(all, orders.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), "{what}: B-link contents");
        assert_eq!(tree.count(100..5_000).unwrap(), orders.range(100..5_000).count() as u64, "{what}");
        assert_eq!(tree.sum(..=7_777).unwrap(), orders.range(..=7_777).map(|(_, v)| *v as u128).sum::<u128>(), "{what}");
        let probe: Vec<u64> = (0..300).map(|i| i * 67).collect();
        let expected: Vec<Option<u64>> = probe.iter().map(|k| orders.get(k).copied()).collect();
        assert_eq!(tree.get_many(&probe).unwrap(), expected, "{what}: batched lookups");
        assert_eq!(tree.get(probe[3]).unwrap(), expected[3], "{what}");

        let art = snap.art("users").unwrap();
        assert_eq!(art.check().unwrap().keys, users.len() as u64, "{what}");
        let all: Vec<(Vec<u8>, u64)> = art.range::<&[u8]>(..).collect::<Result<_, _>>().unwrap();
        assert_eq!(all, users.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>(), "{what}: ART contents");
        let in_prefix = |p: &'static [u8]| users.iter().filter(move |(k, _)| k.starts_with(p));
        assert_eq!(art.count_prefix(b"user/01").unwrap(), in_prefix(b"user/01").count() as u64, "{what}");
        assert_eq!(art.sum_prefix(b"user/02").unwrap(), in_prefix(b"user/02").map(|(_, v)| *v as u128).sum::<u128>(), "{what}");
        let listed: Vec<Vec<u8>> = art.prefix(b"user/03").map(|e| e.unwrap().0).collect();
        assert_eq!(listed, in_prefix(b"user/03").map(|(k, _)| k.clone()).collect::<Vec<_>>(), "{what}");
        let lo: &[u8] = b"user/01000";
        let hi: &[u8] = b"user/02000";
        assert_eq!(art.count(lo..hi).unwrap(), users.range(lo.to_vec()..hi.to_vec()).count() as u64, "{what}");
        assert_eq!(art.get(b"user/00001").unwrap(), users.get(b"user/00001".as_slice()).copied(), "{what}");
        let probe: Vec<Vec<u8>> = (0..300).map(|i| format!("user/{:05}", i * 37).into_bytes()).chain([b"user/".to_vec(), Vec::new()]).collect();
        let refs: Vec<&[u8]> = probe.iter().map(Vec::as_slice).collect();
        let expected: Vec<Option<u64>> = probe.iter().map(|k| users.get(k).copied()).collect();
        assert!(expected.iter().any(Option::is_some) && expected.iter().any(Option::is_none), "{what}: probe hits and misses");
        assert_eq!(art.get_many(&refs).unwrap(), expected, "{what}: ART batched lookups");
    }
}

fn bytes_of(snap: &Snapshot, len: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len as usize];
    snap.read(HeapPtr(0), &mut bytes).unwrap();
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// After any rounds of random updates, an incremental refresh holds the same bytes as a
    /// fresh full copy taken at the same moment.
    #[test]
    fn refresh_equals_a_fresh_memcpy(rounds in proptest::collection::vec(proptest::collection::vec((0u64..(2 << 20), any::<u8>(), 1usize..5000), 1..40), 1..5)) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Options { checkpoint_interval: None, ..small_opts() }).unwrap();
        let base = alloc_data_root(&store, 3 << 20);
        let mut incremental = store.snapshot(SnapshotMode::Incremental).unwrap();
        for writes in rounds {
            store.transact(Commit::Async, |tx| {
                for &(off, byte, len) in &writes {
                    tx.write_at(base, off, &vec![byte; len])?;
                }
                Ok(())
            }).unwrap();
            let info = incremental.refresh().unwrap().clone();
            let fresh = store.snapshot(SnapshotMode::Memcpy).unwrap();
            prop_assert_eq!(info.lsn, fresh.lsn());
            prop_assert!(info.bytes_copied < fresh.info().bytes_copied, "a refresh copies only dirty pages");
            let extent = fresh.info().extent;
            prop_assert!(bytes_of(&incremental, extent) == bytes_of(&fresh, extent), "refresh differs from a fresh copy");
        }
    }
}

/// Forks while three threads commit and allocate (malloc included) as fast as they can:
/// every child must answer, at its LSN.
#[test]
fn fork_snapshots_from_a_process_with_busy_threads() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (store, stop) = (&store, &stop);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let garbage: Vec<String> = (0..64).map(|j| format!("{t}-{i}-{j}")).collect();
                    store
                        .transact(Commit::Async, |tx| {
                            tx.btree("busy")?.insert(t << 32 | i, garbage.len() as u64)?;
                            Ok(())
                        })
                        .unwrap();
                    i += 1;
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        for _ in 0..20 {
            let snap = store.snapshot(SnapshotMode::Fork).unwrap();
            let tree = snap.btree("busy").unwrap();
            let n = tree.len().unwrap();
            assert_eq!(tree.check().unwrap().keys, n);
            assert_eq!(tree.count(..).unwrap(), n);
        }
        stop.store(true, Ordering::Relaxed);
    });
}

/// Whether `pid` is still a child of this process (a zombie counts).
fn is_our_child(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|rest| rest.split_whitespace().nth(1).map(str::to_string)))
        .flatten()
        .is_some_and(|ppid| ppid == std::process::id().to_string())
}

#[test]
fn a_killed_fork_child_is_an_error_not_a_hang_and_leaves_no_zombie() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    store.transact(Commit::Sync, |tx| tx.btree("t")?.insert(1, 2).map(|_| ())).unwrap();
    let snap = store.snapshot(SnapshotMode::Fork).unwrap();
    let pid = snap.child_pid().unwrap();
    assert_eq!(snap.btree("t").unwrap().get(1).unwrap(), Some(2));
    // The signal itself, not the `kill` program (procps is not on a minimal machine).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).expect("SIGKILL the fork child");
    let started = std::time::Instant::now();
    match snap.root("t") {
        Err(Error::SnapshotChild { pid: p, reason }) => {
            assert_eq!(p, pid);
            assert!(reason.contains("signal 9"), "{reason}");
        }
        other => panic!("expected SnapshotChild, got {other:?}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "the error came at once");
    assert!(!is_our_child(pid), "the dead child was reaped");
    // The store is unaffected and a new snapshot works.
    assert_eq!(store.snapshot(SnapshotMode::Fork).unwrap().btree("t").unwrap().get(1).unwrap(), Some(2));
}

#[test]
fn dropping_a_fork_snapshot_ends_its_child() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let mut snap = store.snapshot(SnapshotMode::Fork).unwrap();
    let first = snap.child_pid().unwrap();
    snap.refresh().unwrap();
    let second = snap.child_pid().unwrap();
    assert_ne!(first, second);
    // The old child ends and is reaped in the background, promptly.
    let started = std::time::Instant::now();
    while is_our_child(first) && started.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!is_our_child(first), "a refresh ends the old child, and it is reaped");
    drop(snap);
    assert!(!is_our_child(second), "dropping the snapshot ends its child");
}

#[test]
fn snapshot_of_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    for mode in MODES {
        let snap = store.snapshot(mode).unwrap();
        assert!(matches!(snap.btree("nothing"), Err(Error::NoSuchRoot(n)) if n == "nothing"), "{mode:?}");
        assert!(matches!(snap.art("nothing"), Err(Error::NoSuchRoot(_))));
        assert_eq!(snap.root("nothing").unwrap(), None);
        assert!(matches!(snap.root(""), Err(Error::RootNameEmpty)));
        assert_eq!(snap.lsn(), store.last_lsn());
    }
}

#[test]
fn a_root_that_is_not_an_index_is_a_typed_error_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_data_root(&store, 64);
    for mode in MODES {
        let snap = store.snapshot(mode).unwrap();
        assert!(matches!(snap.btree("data"), Err(Error::NotAnIndex { offset, .. }) if offset == p.offset()), "{mode:?}");
        assert!(matches!(snap.art("data"), Err(Error::NotAnIndex { .. })), "{mode:?}");
    }
}

#[test]
fn a_copy_larger_than_the_memory_limit_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_data_root(&store, 8 << 20);
    store.transact(Commit::Sync, |tx| tx.write_at(p, 100, b"kept")).unwrap();
    let options = SnapshotOptions { memory_limit: Some(1 << 20), ..SnapshotOptions::from(SnapshotMode::Memcpy) };
    match store.snapshot_with(options.clone()) {
        Err(Error::SnapshotMemory { needed, available }) => {
            assert!(needed > 8 << 20, "needed {needed}");
            assert_eq!(available, 1 << 20);
        }
        other => panic!("expected SnapshotMemory, got {:?}", other.map(|s| s.lsn())),
    }
    // Auto falls back to a fork when a copy does not fit, and says why.
    let auto = store.snapshot_with(SnapshotOptions { mode: SnapshotMode::Auto, ..options }).unwrap();
    assert_eq!(auto.mode(), SnapshotMode::Fork, "{}", auto.info().reason);
    assert!(auto.info().reason.contains("does not fit"), "{}", auto.info().reason);
    // The store carries on, and a snapshot within the limit sees everything.
    store.transact(Commit::Sync, |tx| tx.write_at(p, 200, b"more")).unwrap();
    let snap = store.snapshot(SnapshotMode::Memcpy).unwrap();
    let mut buf = [0u8; 4];
    snap.read(HeapPtr(p.offset() + 100), &mut buf).unwrap();
    assert_eq!(&buf, b"kept");
    snap.read(HeapPtr(p.offset() + 200), &mut buf).unwrap();
    assert_eq!(&buf, b"more");
}

#[test]
fn snapshots_outlive_their_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    store.transact(Commit::Sync, |tx| {
        tx.btree("t")?.bulk_load((0..1000u64).map(|k| (k, k * 2)), 1.0)?;
        Ok(())
    })
    .unwrap();
    let mut snaps: Vec<Snapshot> = MODES.iter().map(|&m| store.snapshot(m).unwrap()).collect();
    drop(store);
    for snap in &mut snaps {
        let tree = snap.btree("t").unwrap();
        assert_eq!(tree.sum(..).unwrap(), (0..1000u128).map(|k| k * 2).sum::<u128>(), "{:?}", snap.mode());
        assert!(matches!(snap.refresh(), Err(Error::Closed)), "{:?}", snap.mode());
        assert_eq!(snap.btree("t").unwrap().len().unwrap(), 1000, "a failed refresh keeps the snapshot");
    }
    // The directory is free again: the store can be reopened while the snapshots live.
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(store.snapshot(SnapshotMode::Memcpy).unwrap().btree("t").unwrap().len().unwrap(), 1000);
}

#[test]
fn auto_says_what_it_picked_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_data_root(&store, 16 << 20);
    let mut snap = store.snapshot(SnapshotMode::Auto).unwrap();
    assert_eq!(snap.mode(), SnapshotMode::Memcpy, "the first Auto snapshot is a full copy");
    store.transact(Commit::Sync, |tx| tx.write_at(p, 4096 * 3, &[7u8; 64])).unwrap();
    let info = snap.refresh().unwrap();
    assert_eq!(info.mode, SnapshotMode::Incremental, "one dirty page: {}", info.reason);
    assert!(info.reason.contains("estimates"), "{}", info.reason);
    assert!(info.bytes_copied <= 4 * 4096, "copied {}", info.bytes_copied);
    let mut buf = [0u8; 64];
    snap.read(HeapPtr(p.offset() + 4096 * 3), &mut buf).unwrap();
    assert_eq!(buf, [7u8; 64]);
}
