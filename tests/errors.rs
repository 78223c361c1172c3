//! One test per bad input or fault, each asserting the exact `tusk::Error` variant, plus the
//! allocator's reuse/zeroing/bounds guarantees, explicit conflicts, `Durability::Off`, and
//! the log-failure contract (refuse commits, keep what was acknowledged).

mod common;

use common::{opts_off, small_opts};
use tusk::{Commit, Error, FaultPlan, HeapPtr, Io, Options, Store, ROOT_NAME_MAX};

fn alloc_root(store: &Store, name: &str, len: u64) -> HeapPtr {
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(len)?;
            tx.set_root(name, p)?;
            Ok(p)
        })
        .unwrap()
        .0
}

fn read_word(store: &Store, p: HeapPtr, i: u64) -> u64 {
    store.transact(Commit::Async, |tx| tx.read_u64_at(p, 8 * i)).unwrap().0
}

#[test]
fn heap_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 1u64 << 20;
    let store = Store::open(dir.path(), Options { heap_capacity: cap, ..small_opts() }).unwrap();

    // One allocation larger than the whole heap.
    let err = store.transact(Commit::Async, |tx| tx.alloc(2 << 20)).unwrap_err();
    assert!(matches!(err, Error::HeapExhausted { requested, capacity } if requested == 2 << 20 && capacity == cap), "{err:?}");
    // A length whose page count overflows.
    let err = store.transact(Commit::Async, |tx| tx.alloc(u64::MAX)).unwrap_err();
    assert!(matches!(err, Error::HeapExhausted { requested: u64::MAX, .. }), "{err:?}");

    // Fill the heap with 64 KiB blocks until it refuses; each committed one stays usable.
    let mut blocks = Vec::new();
    let err = loop {
        match store.transact(Commit::Async, |tx| {
            let p = tx.alloc(64 << 10)?;
            tx.write_u64_at(p, (64 << 10) - 8, 0xB10C)?;
            Ok(p)
        }) {
            Ok((p, _)) => blocks.push(p),
            Err(e) => break e,
        }
        assert!(blocks.len() < 64, "a 1 MiB heap cannot hold 64 blocks of 64 KiB");
    };
    assert!(matches!(err, Error::HeapExhausted { requested, capacity } if requested == 64 << 10 && capacity == cap), "{err:?}");
    assert!(blocks.len() >= 10, "only {} blocks of 64 KiB fit in 1 MiB", blocks.len());
    let used = store.heap_used();
    assert!(used <= cap, "brk {used} beyond capacity {cap}");
    // The failed transaction allocated nothing.
    let again = store.transact(Commit::Async, |tx| tx.alloc(64 << 10)).unwrap_err();
    assert!(matches!(again, Error::HeapExhausted { .. }));
    assert_eq!(store.heap_used(), used, "an aborted allocation must not move brk");
    for &p in &blocks {
        assert_eq!(store.transact(Commit::Async, |tx| tx.read_u64_at(p, (64 << 10) - 8)).unwrap().0, 0xB10C);
    }
    // Freeing one makes room again, and the store keeps working.
    store.transact(Commit::Sync, |tx| tx.free(blocks[3])).unwrap();
    let (p, _) = store.transact(Commit::Sync, |tx| tx.alloc(64 << 10)).unwrap();
    assert_eq!(p, blocks[3], "the freed run is reused");
    store.close().unwrap();
}

#[test]
fn out_of_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "a", 24);
    let off = p.offset();

    let err = store.transact(Commit::Async, |tx| tx.write_at(p, 20, &[1, 2, 3, 4, 5])).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { ptr, offset: 20, len: 5, alloc_len: 24 } if ptr == off), "{err:?}");
    let err = store.transact(Commit::Async, |tx| tx.write_u64_at(p, 24, 7)).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { offset: 24, len: 8, alloc_len: 24, .. }), "{err:?}");
    let err = store.transact(Commit::Async, |tx| tx.read_u64_at(p, 17)).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { offset: 17, len: 8, alloc_len: 24, .. }), "{err:?}");
    let err = store
        .transact(Commit::Async, |tx| {
            let mut buf = [0u8; 25];
            tx.read(p, &mut buf)
        })
        .unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { offset: 0, len: 25, alloc_len: 24, .. }), "{err:?}");
    // An offset that overflows when the length is added.
    let err = store.transact(Commit::Async, |tx| tx.write_at(p, u64::MAX - 1, &[1, 2, 3])).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { offset, len: 3, .. } if offset == u64::MAX - 1), "{err:?}");

    // Exactly up to the end is fine, and the failed writes left nothing behind.
    store.transact(Commit::Sync, |tx| tx.write_at(p, 16, &[9; 8])).unwrap();
    let (bytes, _) = store
        .transact(Commit::Async, |tx| {
            let mut buf = [0u8; 24];
            tx.read(p, &mut buf)?;
            Ok(buf)
        })
        .unwrap();
    let mut want = [0u8; 24];
    want[16..].copy_from_slice(&[9; 8]);
    assert_eq!(bytes, want);

    // A transaction whose closure failed with OutOfBounds commits none of its earlier writes.
    let err = store
        .transact(Commit::Sync, |tx| {
            tx.write_u64_at(p, 0, 0xDEAD)?;
            tx.write_u64_at(p, 20, 1)
        })
        .unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { .. }));
    assert_eq!(read_word(&store, p, 0), 0, "a failed transaction must not commit its writes");
    store.close().unwrap();
}

#[test]
fn double_free() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let small = alloc_root(&store, "s", 40);
    let large = alloc_root(&store, "l", 10_000);

    store.transact(Commit::Sync, |tx| tx.free(small)).unwrap();
    let err = store.transact(Commit::Sync, |tx| tx.free(small)).unwrap_err();
    assert!(matches!(err, Error::DoubleFree(p) if p == small.offset()), "{err:?}");

    // Twice in one transaction.
    let err = store
        .transact(Commit::Sync, |tx| {
            tx.free(large)?;
            tx.free(large)
        })
        .unwrap_err();
    assert!(matches!(err, Error::DoubleFree(p) if p == large.offset()), "{err:?}");
    // That transaction aborted: the large block is still live and can be freed once.
    assert_eq!(store.transact(Commit::Async, |tx| tx.len(large)).unwrap().0, 10_000);
    store.transact(Commit::Sync, |tx| tx.free(large)).unwrap();
    let err = store.transact(Commit::Sync, |tx| tx.free(large)).unwrap_err();
    assert!(matches!(err, Error::DoubleFree(p) if p == large.offset()), "{err:?}");

    // Accessing freed memory names the pointer as invalid.
    let err = store.transact(Commit::Async, |tx| tx.read_u64(small)).unwrap_err();
    assert!(matches!(err, Error::InvalidPointer(p) if p == small.offset()), "{err:?}");

    // Still a double free after a restart (the allocator state is recovered).
    store.close().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let err = store.transact(Commit::Sync, |tx| tx.free(large)).unwrap_err();
    assert!(matches!(err, Error::DoubleFree(p) if p == large.offset()), "{err:?}");
    store.close().unwrap();
}

#[test]
fn invalid_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "a", 64);
    let cap = small_opts().heap_capacity;
    let bad = [
        HeapPtr::NULL,
        HeapPtr(8),
        HeapPtr(4096),                     // the root table
        HeapPtr(p.offset() + 8),           // inside an allocation
        HeapPtr(p.offset() + 3),           // unaligned
        HeapPtr(store.heap_used() + 4096), // never allocated
        HeapPtr(cap + 4096),               // beyond the heap
        HeapPtr(u64::MAX - 7),
    ];
    for q in bad {
        let err = store.transact(Commit::Async, |tx| tx.free(q)).unwrap_err();
        assert!(matches!(err, Error::InvalidPointer(x) if x == q.offset()), "free({q:?}): {err:?}");
        let err = store.transact(Commit::Async, |tx| tx.read_u64(q)).unwrap_err();
        assert!(matches!(err, Error::InvalidPointer(x) if x == q.offset()), "read({q:?}): {err:?}");
        let err = store.transact(Commit::Async, |tx| tx.write_u64(q, 1)).unwrap_err();
        assert!(matches!(err, Error::InvalidPointer(x) if x == q.offset()), "write({q:?}): {err:?}");
        let err = store.transact(Commit::Async, |tx| tx.len(q)).unwrap_err();
        assert!(matches!(err, Error::InvalidPointer(x) if x == q.offset()), "len({q:?}): {err:?}");
    }
    // The valid pointer is untouched by all of that.
    assert_eq!(store.transact(Commit::Async, |tx| tx.len(p)).unwrap().0, 64);
    assert_eq!(read_word(&store, p, 0), 0);
    store.close().unwrap();
}

#[test]
fn root_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "x", 8);
    let long = "n".repeat(ROOT_NAME_MAX + 1);
    let max = "m".repeat(ROOT_NAME_MAX);
    assert_eq!(ROOT_NAME_MAX, 64);

    let err = store.transact(Commit::Async, |tx| tx.set_root(&long, p)).unwrap_err();
    assert!(matches!(err, Error::RootNameTooLong { len: 65, max: 64 }), "{err:?}");
    let err = store.transact(Commit::Async, |tx| tx.root(&long)).unwrap_err();
    assert!(matches!(err, Error::RootNameTooLong { len: 65, max: 64 }), "{err:?}");
    let err = store.transact(Commit::Async, |tx| tx.remove_root(&long)).unwrap_err();
    assert!(matches!(err, Error::RootNameTooLong { len: 65, max: 64 }), "{err:?}");
    // Length counts bytes, not chars: 33 two-byte chars are 66 bytes.
    let wide = "é".repeat(33);
    let err = store.transact(Commit::Async, |tx| tx.set_root(&wide, p)).unwrap_err();
    assert!(matches!(err, Error::RootNameTooLong { len: 66, max: 64 }), "{err:?}");

    let err = store.transact(Commit::Async, |tx| tx.set_root("", p)).unwrap_err();
    assert!(matches!(err, Error::RootNameEmpty), "{err:?}");
    let err = store.transact(Commit::Async, |tx| tx.root("")).unwrap_err();
    assert!(matches!(err, Error::RootNameEmpty), "{err:?}");
    let err = store.transact(Commit::Async, |tx| tx.remove_root("")).unwrap_err();
    assert!(matches!(err, Error::RootNameEmpty), "{err:?}");

    // 64 bytes is allowed and survives a restart; names that share a prefix stay apart.
    store.transact(Commit::Sync, |tx| tx.set_root(&max, p)).unwrap();
    store.transact(Commit::Sync, |tx| tx.set_root(&max[..63], HeapPtr(p.offset()))).unwrap();
    assert!(store.transact(Commit::Sync, |tx| tx.remove_root(&max[..63])).unwrap().0);
    store.close().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(store.transact(Commit::Async, |tx| tx.root(&max)).unwrap().0, Some(p));
    assert_eq!(store.transact(Commit::Async, |tx| tx.root(&max[..63])).unwrap().0, None);
    assert_eq!(store.transact(Commit::Async, |tx| tx.root("x")).unwrap().0, Some(p));
    store.close().unwrap();
}

#[test]
fn root_table_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "r0", 8);
    for i in 1..128 {
        store.transact(Commit::Async, |tx| tx.set_root(&format!("r{i}"), p)).unwrap();
    }
    let err = store.transact(Commit::Async, |tx| tx.set_root("one-too-many", p)).unwrap_err();
    assert!(matches!(err, Error::RootTableFull(128)), "{err:?}");
    // Replacing an existing root still works, and removing one frees a slot.
    store.transact(Commit::Async, |tx| tx.set_root("r5", HeapPtr::NULL)).unwrap();
    assert!(store.transact(Commit::Async, |tx| tx.remove_root("r7")).unwrap().0);
    store.transact(Commit::Async, |tx| tx.set_root("one-too-many", p)).unwrap();
    assert_eq!(store.transact(Commit::Async, |tx| tx.root("one-too-many")).unwrap().0, Some(p));
    store.close().unwrap();
}

#[test]
fn store_path_is_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"hello").unwrap();
    let err = Store::open(&file, small_opts()).err().expect("opening a regular file must fail");
    assert!(matches!(&err, Error::NotADirectory(p) if p == &file), "{err:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"hello", "the file is left alone");
}

/// A lock held elsewhere for a moment after its store closed (a forked child holds a copy
/// of the lock file until it execs; here another holder of the same lock file releases it
/// 200 ms later) does not fail the open: the open waits for it. Found as a `Locked` reopen
/// in `cli/tests/crashtest.rs`, whose sibling tests fork children.
#[test]
fn an_open_waits_for_a_lock_released_a_moment_later() {
    let dir = tempfile::tempdir().unwrap();
    Store::open(dir.path(), small_opts()).unwrap().close().unwrap();
    let held = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("LOCK")).unwrap();
    held.try_lock().expect("the closed store released its lock");
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(held);
    });
    let started = std::time::Instant::now();
    let store = Store::open(dir.path(), small_opts()).expect("opened once the lock was released");
    assert!(started.elapsed() >= std::time::Duration::from_millis(150), "the open waited for the lock");
    releaser.join().unwrap();
    store.close().unwrap();
}

#[test]
fn directory_locked_by_another_store() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&first, "a", 8);
    let err = Store::open(dir.path(), small_opts()).err().expect("a second open must fail");
    assert!(matches!(&err, Error::Locked(d) if d == dir.path()), "{err:?}");
    // The failed open did not disturb the first store.
    first.transact(Commit::Sync, |tx| tx.write_u64(p, 5)).unwrap();
    first.close().unwrap();

    let second = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(read_word(&second, p, 0), 5);
    let err = Store::open(dir.path(), small_opts()).err().expect("locked again");
    assert!(matches!(err, Error::Locked(_)), "{err:?}");
    // A crash (or drop) releases the lock too.
    second.crash();
    let third = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(read_word(&third, p, 0), 5);
    drop(third);
    let fourth = Store::open(dir.path(), small_opts()).unwrap();
    fourth.close().unwrap();
}

/// Sync commits, then the log fails with `errno`: the failing commit and every later one
/// report `LogFailed`; after a reopen without faults every acknowledged commit is there.
fn log_failure(errno: i32) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new();
    let opts = Options { io: Io::Faulty(plan.clone()), ..small_opts() };
    let store = Store::open(dir.path(), opts).unwrap();
    let p = alloc_root(&store, "words", 8 * 32);
    let mut last = 0;
    for i in 0..10u64 {
        let (_, lsn) = store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 8 * i, 100 + i)).unwrap();
        last = lsn.unwrap();
        assert!(store.is_stable(last, false));
    }
    plan.fail_after(0, errno);
    let err = store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 80, 999)).unwrap_err();
    let os = format!("os error {errno}");
    assert!(matches!(&err, Error::LogFailed(why) if why.contains(&os)), "{err:?}");
    assert!(plan.failures() >= 1);
    // Later commits, in every mode, are refused with the same error.
    for mode in [Commit::Async, Commit::Sync, Commit::Partition] {
        let err = store.transact(mode, |tx| tx.write_u64_at(p, 88, 7)).unwrap_err();
        assert!(matches!(&err, Error::LogFailed(why) if why.contains(&os)), "{mode:?}: {err:?}");
    }
    assert!(store.durable_lsn() >= last);
    assert!(!store.is_stable(last + 1, true), "nothing after the failure becomes stable");
    let closed = store.close();
    assert!(matches!(closed, Err(Error::LogFailed(_))), "close after a log failure: {closed:?}");

    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = store.transact(Commit::Async, |tx| tx.root("words")).unwrap().0.unwrap();
    for i in 0..10 {
        assert_eq!(read_word(&store, p, i), 100 + i, "acknowledged word {i} lost");
    }
    assert_eq!(read_word(&store, p, 11), 0, "a refused commit must leave no trace");
    assert!(store.recovery_report().recovered_lsn >= last);
    // The recovered store accepts commits again.
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 88, 1)).unwrap();
    store.close().unwrap();
}

#[test]
fn log_write_fails_with_enospc() {
    log_failure(libc::ENOSPC);
}

#[test]
fn log_write_fails_with_eio() {
    log_failure(libc::EIO);
}

/// Two threads commit (mostly Sync, some Async and Partition) on two log partitions while
/// the fault plan fails the log after a few writes. Every value acknowledged by a Sync
/// commit survives the reopen; nothing newer than the last attempt appears.
#[test]
fn log_failure_under_concurrent_commits() {
    for (round, errno) in [(3u64, libc::ENOSPC), (7, libc::EIO), (12, libc::ENOSPC)] {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let opts = Options { io: Io::Faulty(plan.clone()), log_partitions: 2, ..small_opts() };
        let store = Store::open(dir.path(), opts).unwrap();
        let p = alloc_root(&store, "counters", 16);
        plan.fail_after(round, errno);
        let results: Vec<(u64, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let mut acked = 0u64;
                        for v in 1..10_000u64 {
                            let mode = match v % 5 {
                                0 => Commit::Async,
                                1 => Commit::Partition,
                                _ => Commit::Sync,
                            };
                            let attempted = v;
                            match store.transact(mode, |tx| tx.write_u64_at(p, 8 * t, v)) {
                                Ok(_) if mode == Commit::Sync => acked = v,
                                Ok(_) => {}
                                Err(Error::LogFailed(_)) => return (acked, attempted),
                                Err(e) => panic!("unexpected error {e:?}"),
                            }
                        }
                        panic!("the fault plan never failed a write");
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(plan.failures() >= 1);
        let _ = store.close();
        let store = Store::open(dir.path(), Options { log_partitions: 2, ..small_opts() }).unwrap();
        for (t, &(acked, attempted)) in results.iter().enumerate() {
            let got = read_word(&store, p, t as u64);
            assert!(got >= acked && got <= attempted, "errno {errno}, thread {t}: recovered {got}, acked {acked}, attempted {attempted}");
        }
        store.close().unwrap();
    }
}

#[test]
fn conflict_between_interleaved_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "c", 16);

    // Both read the word, both write it: the first commit wins, the second conflicts.
    let mut t1 = store.begin();
    let mut t2 = store.begin();
    let a = t1.read_u64(p).unwrap();
    let b = t2.read_u64(p).unwrap();
    t1.write_u64(p, a + 1).unwrap();
    t2.write_u64(p, b + 10).unwrap();
    assert!(t1.commit(Commit::Sync).unwrap().is_some());
    let err = t2.commit(Commit::Sync).unwrap_err();
    assert!(matches!(err, Error::Conflict), "{err:?}");
    // Retried from the start, the second transaction sees the first one's write.
    t2.restart();
    let b = t2.read_u64(p).unwrap();
    assert_eq!(b, 1);
    t2.write_u64(p, b + 10).unwrap();
    t2.commit(Commit::Sync).unwrap();
    assert_eq!(read_word(&store, p, 0), 11);

    // A transaction that read a word another one then changed is doomed: a later read of a
    // changed word reports Conflict instead of an inconsistent value (opacity).
    let mut t3 = store.begin();
    assert_eq!(t3.read_u64_at(p, 0).unwrap(), 11);
    store
        .transact(Commit::Sync, |tx| {
            tx.write_u64_at(p, 0, 20)?;
            tx.write_u64_at(p, 8, 20)
        })
        .unwrap();
    let err = t3.read_u64_at(p, 8).unwrap_err();
    assert!(matches!(err, Error::Conflict), "{err:?}");
    let err = t3.commit(Commit::Sync).unwrap_err();
    assert!(matches!(err, Error::Conflict), "a doomed transaction cannot commit: {err:?}");
    t3.abort();

    // An explicitly aborted transaction leaves nothing behind.
    let mut t4 = store.begin();
    t4.write_u64_at(p, 8, 12345).unwrap();
    t4.abort();
    assert_eq!(read_word(&store, p, 1), 20);
    drop((t1, t2));
    store.close().unwrap();
}

#[test]
fn durability_off() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts_off()).unwrap();
    assert_eq!(store.io_backend(), None);
    let p = alloc_root(&store, "volatile", 8);
    let mut last = 0;
    for (i, mode) in [Commit::Sync, Commit::Async, Commit::Partition].into_iter().enumerate() {
        let (_, lsn) = store.transact(mode, |tx| tx.write_u64(p, i as u64 + 1)).unwrap();
        let lsn = lsn.expect("update transactions get an LSN without durability too");
        assert!(lsn > last, "LSNs grow");
        last = lsn;
        assert!(!store.is_stable(lsn, false));
        assert!(!store.is_stable(lsn, true), "is_stable is always false with Durability::Off");
    }
    assert_eq!(store.last_lsn(), last);
    assert_eq!(read_word(&store, p, 0), 3);
    store.close().unwrap();

    // Nothing survives, whether reopened with or without durability.
    let store = Store::open(dir.path(), opts_off()).unwrap();
    assert_eq!(store.transact(Commit::Async, |tx| tx.root("volatile")).unwrap().0, None);
    store.close().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(store.transact(Commit::Async, |tx| tx.root("volatile")).unwrap().0, None);
    assert_eq!(store.recovery_report().records_replayed, 0, "Durability::Off wrote no log records");
    store.close().unwrap();
}

#[test]
fn freed_memory_is_reused_and_zeroed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    for len in [1u64, 8, 100, 500, 2040] {
        let (p, _) = store
            .transact(Commit::Sync, |tx| {
                let p = tx.alloc(len)?;
                tx.write(p, &vec![0xA5; len as usize])?;
                Ok(p)
            })
            .unwrap();
        store.transact(Commit::Sync, |tx| tx.free(p)).unwrap();
        let (q, _) = store.transact(Commit::Sync, |tx| tx.alloc(len)).unwrap();
        assert_eq!(q, p, "a freed block of {len} bytes is reused by the next allocation of its class");
        let (bytes, _) = store
            .transact(Commit::Async, |tx| {
                let mut buf = vec![0xEE; len as usize];
                tx.read(q, &mut buf)?;
                Ok(buf)
            })
            .unwrap();
        assert!(bytes.iter().all(|&b| b == 0), "reused block of {len} bytes is not zeroed");
        assert_eq!(store.transact(Commit::Async, |tx| tx.len(q)).unwrap().0, len);
    }

    // Large runs: exact reuse, and a smaller request split off a larger freed run.
    let big = 5 * 4096 + 100;
    let (p, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(big)?;
            tx.write(p, &vec![0x5A; big as usize])?;
            Ok(p)
        })
        .unwrap();
    store.transact(Commit::Sync, |tx| tx.free(p)).unwrap();
    let (q, _) = store.transact(Commit::Sync, |tx| tx.alloc(big)).unwrap();
    assert_eq!(q, p, "an exactly fitting freed run is reused");
    let zeroed = |store: &Store, q: HeapPtr, len: u64| {
        store
            .transact(Commit::Async, |tx| {
                let mut buf = vec![0xEE; len as usize];
                tx.read(q, &mut buf)?;
                Ok(buf.iter().all(|&b| b == 0))
            })
            .unwrap()
            .0
    };
    assert!(zeroed(&store, q, big));
    store.transact(Commit::Sync, |tx| tx.write(q, &vec![0x77; big as usize])).unwrap();
    store.transact(Commit::Sync, |tx| tx.free(q)).unwrap();
    let used = store.heap_used();
    let (r, _) = store.transact(Commit::Sync, |tx| tx.alloc(3000)).unwrap();
    assert_eq!(store.heap_used(), used, "a 3000-byte block comes out of the freed run, not brk");
    assert!(r.offset() > q.offset() && r.offset() < q.offset() + big, "split from the freed run's tail");
    assert!(zeroed(&store, r, 3000));
    // Reuse also holds after a restart, and the rest of the run is still free.
    store.close().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    assert!(zeroed(&store, r, 3000));
    let used = store.heap_used();
    let (s, _) = store.transact(Commit::Sync, |tx| tx.alloc(5 * 4096 - 16)).unwrap();
    assert_eq!(store.heap_used(), used, "the remaining 5 pages of the run are reused after a restart");
    assert_eq!(s.offset(), q.offset(), "the front of the run");
    assert!(zeroed(&store, s, 5 * 4096 - 16));
    store.close().unwrap();
}

#[test]
fn large_allocations_work_and_are_bounds_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let sizes = [2041u64, 4096, 5000, 3 * 4096 + 1, 100_000];
    let ptrs: Vec<HeapPtr> = sizes
        .iter()
        .map(|&len| {
            store
                .transact(Commit::Sync, |tx| {
                    let p = tx.alloc(len)?;
                    let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                    tx.write(p, &data)?;
                    Ok(p)
                })
                .unwrap()
                .0
        })
        .collect();
    // Disjoint and page-crossing.
    for (i, (&p, &len)) in ptrs.iter().zip(&sizes).enumerate() {
        for (&q, &qlen) in ptrs.iter().zip(&sizes).skip(i + 1) {
            assert!(p.offset() + len <= q.offset() || q.offset() + qlen <= p.offset(), "allocations overlap");
        }
    }
    let check = |store: &Store| {
        for (&p, &len) in ptrs.iter().zip(&sizes) {
            store
                .transact(Commit::Async, |tx| {
                    assert_eq!(tx.len(p)?, len);
                    let mut buf = vec![0u8; len as usize];
                    tx.read(p, &mut buf)?;
                    assert!(buf.iter().enumerate().all(|(i, &b)| b == (i as u64 * 7 + len) as u8), "contents of {len}");
                    let err = tx.write_at(p, len - 1, &[1, 2]).unwrap_err();
                    assert!(matches!(err, Error::OutOfBounds { offset, len: 2, alloc_len, .. } if offset == len - 1 && alloc_len == len), "{err:?}");
                    let err = tx.read_u64_at(p, len).unwrap_err();
                    assert!(matches!(err, Error::OutOfBounds { alloc_len, .. } if alloc_len == len), "{err:?}");
                    let mut one = [0u8; 1];
                    let err = tx.read_at(p, len, &mut one).unwrap_err();
                    assert!(matches!(err, Error::OutOfBounds { .. }), "{err:?}");
                    Ok(())
                })
                .unwrap();
        }
    };
    check(&store);
    store.close().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    check(&store);
    store.close().unwrap();
}

#[test]
fn durability_off_still_locks_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts_off()).unwrap();
    let err = Store::open(dir.path(), opts_off()).err().expect("locked");
    assert!(matches!(err, Error::Locked(_)), "{err:?}");
    store.close().unwrap();
    Store::open(dir.path(), opts_off()).unwrap().close().unwrap();
}

/// A `Transaction` from `begin` may be used again after a successful commit: it then runs as
/// a new transaction, and must not trust what it learned about allocations before.
#[test]
fn transaction_reused_after_commit_checks_pointers_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "p", 32);
    let mut tx = store.begin();
    tx.write_u64(p, 1).unwrap();
    assert!(tx.commit(Commit::Sync).unwrap().is_some());
    // Another transaction frees the block.
    store.transact(Commit::Sync, |t| t.free(p)).unwrap();
    // The first transaction, reused, must see that p is no longer an allocation.
    let err = tx.write_u64(p, 2).and_then(|()| tx.commit(Commit::Sync).map(|_| ())).unwrap_err();
    assert!(matches!(err, Error::InvalidPointer(x) if x == p.offset()), "{err:?}");
    drop(tx);
    // The free list is intact: the next allocation of that class gets p back, zeroed.
    let (q, _) = store.transact(Commit::Sync, |t| t.alloc(32)).unwrap();
    assert_eq!(q, p);
    assert_eq!(read_word(&store, q, 0), 0, "a write through a stale pointer reached freed memory");
    let (r, _) = store.transact(Commit::Sync, |t| t.alloc(32)).unwrap();
    assert_ne!(r, q, "the allocator handed out the same block twice");
    store.close().unwrap();
}

#[test]
fn reopen_with_a_heap_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small_opts()).unwrap();
    let p = alloc_root(&store, "big", 3 << 20);
    store.close().unwrap();
    // brk lies beyond 1 MiB although no logged write does: the superblock check refuses.
    let err = Store::open(dir.path(), Options { heap_capacity: 1 << 20, ..small_opts() }).err().expect("too small");
    assert!(matches!(&err, Error::CapacityTooSmall { needed, capacity: 1048576, .. } if *needed > 3 << 20), "{err:?}");

    let store = Store::open(dir.path(), small_opts()).unwrap();
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, (3 << 20) - 8, 1)).unwrap();
    store.close().unwrap();
    // Now a logged write lies beyond 1 MiB: replay refuses.
    let err = Store::open(dir.path(), Options { heap_capacity: 1 << 20, ..small_opts() }).err().expect("too small");
    assert!(matches!(&err, Error::CapacityTooSmall { capacity: 1048576, .. }), "{err:?}");
    // A large enough heap still opens it, with everything in place.
    let store = Store::open(dir.path(), Options { heap_capacity: 8 << 20, ..small_opts() }).unwrap();
    assert_eq!(store.transact(Commit::Async, |tx| tx.read_u64_at(p, (3 << 20) - 8)).unwrap().0, 1);
    store.close().unwrap();
}
