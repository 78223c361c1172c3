//! Checkpoints: recovery from checkpoint + log, incremental skipping of clean chunks, log
//! trimming, and the fallback when a chunk image is damaged.

mod common;

use tusk::{Commit, HeapLoad, HeapPtr, Options, Store};

fn options() -> Options {
    Options {
        heap_capacity: 64 << 20,
        chunk_size: 64 << 10,
        segment_bytes: 1 << 16,
        checkpoint_interval: None,
        // The fallbacks below are a whole load's (tests/on_demand.rs has the on-demand ones).
        heap_load: HeapLoad::Whole,
        ..Options::default()
    }
}

/// Fills `words` u64s at `p` with `f(i)` in transactions of 512 words.
fn fill(store: &Store, p: HeapPtr, words: u64, f: impl Fn(u64) -> u64) {
    common::fill_words(store, p, 0..words, 512, f)
}

fn check(store: &Store, words: u64, f: impl Fn(u64) -> u64) {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("root");
            for i in 0..words {
                assert_eq!(tx.read_u64_at(p, i * 8)?, f(i), "word {i}");
            }
            Ok(())
        })
        .unwrap();
}

const WORDS: u64 = 256 * 1024; // 2 MiB: 32 chunks of 64 KiB

fn setup(dir: &std::path::Path) -> (Store, HeapPtr) {
    let store = Store::open(dir, options()).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    (store, p)
}

#[test]
fn recovery_uses_checkpoint_and_trims_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = setup(dir.path());
    fill(&store, p, WORDS, |i| i * 3);
    assert!(store.is_stable(store.last_lsn(), true));
    let log_before = store.log_bytes();
    let report = store.checkpoint().unwrap();

    assert!(report.written >= 32, "first checkpoint writes every chunk: {report:?}");
    assert!(report.trimmed_segments > 0, "the log the checkpoint covers is deleted: {report:?}");
    // Valid before the clean-up that deletes the trimmed log.
    assert!(report.valid_after > std::time::Duration::ZERO && report.valid_after <= report.elapsed, "{report:?}");
    assert!(store.log_bytes() < log_before / 2, "log {} bytes after, {log_before} before", store.log_bytes());
    fill(&store, p, 1000, |i| i + 7);
    store.close().unwrap();

    let store = Store::open(dir.path(), options()).unwrap();
    let r = store.recovery_report();
    let ckpt = r.checkpoint.as_ref().expect("recovered from a checkpoint");
    assert_eq!(ckpt.manifest.epoch, report.epoch);
    assert!(r.records_replayed < 200, "only the log after the checkpoint is replayed: {}", r.records_replayed);
    check(&store, WORDS, |i| if i < 1000 { i + 7 } else { i * 3 });
}

#[test]
fn incremental_checkpoint_skips_clean_chunks_and_recovers_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = setup(dir.path());
    fill(&store, p, WORDS, |i| i);
    let first = store.checkpoint().unwrap();
    // Dirty two chunks only: words in the 3rd and the 20th 64 KiB of the array.
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 3 * 65536 + 8, 111)).unwrap();
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 20 * 65536, 222)).unwrap();
    let second = store.checkpoint().unwrap();
    assert_eq!(second.chunks, first.chunks);
    assert!(second.written <= 5, "only dirty chunks (and chunk 0) are rewritten: {second:?}");
    assert!(second.reused >= second.chunks - 5, "{second:?}");
    store.crash();

    let store = Store::open(dir.path(), options()).unwrap();
    let expect = |i: u64| match i {
        i if i == (3 * 65536 + 8) / 8 => 111,
        i if i == 20 * 65536 / 8 => 222,
        i => i,
    };
    check(&store, WORDS, expect);
    // After recovery, a checkpoint again rewrites only what recovery replayed.
    let third = store.checkpoint().unwrap();
    assert!(third.reused > 0, "{third:?}");
    store.close().unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    check(&store, WORDS, expect);
}

#[test]
fn damaged_chunk_image_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = setup(dir.path());
    fill(&store, p, WORDS, |i| i ^ 0x55);
    store.checkpoint().unwrap();
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 8 * 70_000, 9)).unwrap();
    let second = store.checkpoint().unwrap();
    store.close().unwrap();

    // Damage the image of the changed word's chunk, which the second checkpoint wrote.
    let chunk = (p.offset() + 8 * 70_000) / (64 << 10);
    let (victim, offset, _) = common::image_location(dir.path(), second.epoch, chunk);
    assert!(victim.ends_with(format!("seg-{:010}.ckpt", second.epoch)));
    common::flip_byte(&victim, offset + 5000, 0xFF);

    let store = Store::open(dir.path(), options()).unwrap();
    let loaded = store.recovery_report().checkpoint.as_ref().unwrap();
    assert_eq!(loaded.manifest.epoch, second.epoch - 1, "fell back to the previous checkpoint");
    assert_eq!(loaded.fallback.as_ref().unwrap().path, victim);
    check(&store, WORDS, |i| if i == 70_000 { 9 } else { i ^ 0x55 });
}

#[test]
fn damaged_chunk_without_the_log_to_replace_it_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = setup(dir.path());
    fill(&store, p, WORDS, |i| i);
    store.checkpoint().unwrap();
    fill(&store, p, WORDS, |i| i + 1);
    store.checkpoint().unwrap();
    fill(&store, p, WORDS, |i| i + 2);
    let third = store.checkpoint().unwrap();
    store.close().unwrap();
    // Remove every manifest but the newest: nothing older to fall back to, log trimmed.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("MANIFEST-") && !name.ends_with(&format!("{:010}", third.epoch)) {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let (victim, _, _) = common::image_location(dir.path(), third.epoch, 5);
    assert!(victim.ends_with(format!("seg-{:010}.ckpt", third.epoch)), "every chunk changed: the third checkpoint wrote it");
    std::fs::remove_file(&victim).unwrap();
    match Store::open(dir.path(), options()) {
        Err(tusk::Error::Corrupt { path, .. }) => assert_eq!(path, victim),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("opened without the data of a lost chunk image"),
    }
}
