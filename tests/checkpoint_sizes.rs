//! Checkpoints whose chunks do not tile the heap evenly, and options that change between
//! opens: a heap smaller than one chunk, a heap whose last chunk is partial, a different
//! chunk size or a larger heap at reopen. Each checkpoint must work and recover exactly.

use tusk::{Commit, Options, Store};

fn options(heap_capacity: u64, chunk_size: u64) -> Options {
    Options {
        heap_capacity,
        chunk_size,
        stripes_log2: 12,
        log_partitions: 1,
        segment_bytes: 1 << 16,
        checkpoint_interval: None,
        ..Options::default()
    }
}

/// Allocates `len` bytes under the root "data", fills them with a pattern, checkpoints
/// (twice: full, then incremental after one more write) and crashes.
fn fill_checkpoint_crash(dir: &std::path::Path, opts: Options, len: u64) {
    let store = Store::open(dir, opts).unwrap();
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(len)?;
            tx.set_root("data", p)?;
            (0..len / 8).try_for_each(|i| tx.write_u64_at(p, i * 8, i ^ 0xF00D))
        })
        .unwrap();
    store.checkpoint().unwrap();
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.root("data")?.unwrap();
            tx.write_u64_at(p, len - 8, 42)
        })
        .unwrap();
    store.checkpoint().unwrap();
    store.crash();
}

fn check(store: &Store, len: u64) {
    let (words, _) = store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("data root");
            (0..len / 8).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap();
    for (i, &w) in words.iter().enumerate() {
        let want = if i as u64 == len / 8 - 1 { 42 } else { i as u64 ^ 0xF00D };
        assert_eq!(w, want, "word {i}");
    }
}

#[test]
fn heap_smaller_than_one_chunk() {
    let dir = tempfile::tempdir().unwrap();
    // The default chunk size (1 MiB) with a 256 KiB heap.
    let opts = options(256 << 10, 1 << 20);
    fill_checkpoint_crash(dir.path(), opts.clone(), 64 << 10);
    let store = Store::open(dir.path(), opts).unwrap();
    assert!(store.recovery_report().checkpoint.is_some(), "recovered from the checkpoint");
    check(&store, 64 << 10);
    store.checkpoint().unwrap();
    store.close().unwrap();
    // The checkpoint needs only the allocated bytes, not a whole chunk or the old capacity.
    let store = Store::open(dir.path(), options(192 << 10, 1 << 20)).unwrap();
    assert!(store.recovery_report().checkpoint.is_some());
    check(&store, 64 << 10);
}

#[test]
fn heap_whose_last_chunk_is_partial() {
    let dir = tempfile::tempdir().unwrap();
    // 5.5 chunks of heap, nearly all of it allocated.
    let opts = options(11 * (32 << 10), 64 << 10);
    fill_checkpoint_crash(dir.path(), opts.clone(), 300 << 10);
    let store = Store::open(dir.path(), opts).unwrap();
    assert!(store.recovery_report().checkpoint.is_some());
    check(&store, 300 << 10);
}

#[test]
fn chunk_size_and_heap_capacity_change_between_opens() {
    let dir = tempfile::tempdir().unwrap();
    let len = 1 << 20;
    fill_checkpoint_crash(dir.path(), options(4 << 20, 64 << 10), len);
    // Recovery reads the checkpoint in its own chunk size; the next checkpoint uses the new one.
    let bigger = options(16 << 20, 16 << 10);
    let store = Store::open(dir.path(), bigger.clone()).unwrap();
    check(&store, len);
    let report = store.checkpoint().unwrap();
    assert_eq!(report.reused, 0, "images of another chunk size cannot be reused: {report:?}");
    store.close().unwrap();
    let store = Store::open(dir.path(), bigger).unwrap();
    assert_eq!(store.recovery_report().checkpoint.as_ref().unwrap().manifest.chunk_size, 16 << 10);
    check(&store, len);
}
