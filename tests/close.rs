//! Closing a store leaves it ready for a fast reopen: with automatic checkpoints, a close
//! whose log tail is longer than `close_checkpoint_above` takes a checkpoint first, so the
//! next open replays nothing; and every close cuts the zeros its log wrote ahead, so the
//! next open has nothing to repair.

mod common;

use std::path::Path;
use std::time::Duration;

use tusk::{Commit, HeapPtr, Options, Store};
use tusk_storage::log_format::FLUSH_ALIGN;
use tusk_storage::zeros::all_zero;

/// Words written per transaction, and transactions: about 2 MiB of log in all.
const WORDS: u64 = 256;
const TXNS: u64 = 1000;

fn options() -> Options {
    Options {
        heap_capacity: 64 << 20,
        log_partitions: 1,
        // Automatic, but far enough apart that none runs during a test.
        checkpoint_interval: Some(Duration::from_secs(3600)),
        ..Options::default()
    }
}

/// Writes `txns` transactions of `WORDS` words each; returns the block they wrote.
fn write_log(store: &Store, txns: u64) -> HeapPtr {
    let p = common::alloc_data_root(store, WORDS * 8);
    for t in 0..txns {
        store
            .transact(Commit::Async, |tx| {
                for i in 0..WORDS {
                    tx.write_u64_at(p, i * 8, t * WORDS + i)?;
                }
                Ok(())
            })
            .unwrap();
    }
    p
}

fn last_txn_is_there(store: &Store, txns: u64) {
    let (words, _) = store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("root");
            (0..WORDS).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<_>, _>>()
        })
        .unwrap();
    assert_eq!(words, (0..WORDS).map(|i| (txns - 1) * WORDS + i).collect::<Vec<_>>());
}

/// Closes a store with `txns` transactions of log in `options`; returns the reopened store.
fn close_and_reopen(dir: &Path, options: Options, txns: u64) -> Store {
    let store = Store::open(dir, options.clone()).unwrap();
    write_log(&store, txns);
    assert!(store.log_bytes() > 0);
    assert_eq!(store.checkpoint_status().2, 0, "no checkpoint before the close");
    store.close().unwrap();
    let store = Store::open(dir, options).unwrap();
    last_txn_is_there(&store, txns);
    store
}

#[test]
fn a_close_after_a_long_log_checkpoints_and_the_reopen_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = close_and_reopen(dir.path(), options(), TXNS);
    let report = store.recovery_report();
    assert!(report.checkpoint.as_ref().is_some_and(|c| c.manifest.epoch >= 1), "the close took a checkpoint");
    assert_eq!(report.records_replayed, 0, "the checkpoint at close holds every commit");
}

#[test]
fn a_close_after_a_short_log_or_with_the_rule_off_only_flushes() {
    for (name, options, txns) in [
        ("short log", options(), 3),
        ("rule off", Options { close_checkpoint_above: u64::MAX, ..options() }, TXNS),
        ("manual checkpoints", Options { checkpoint_interval: None, ..options() }, TXNS),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = close_and_reopen(dir.path(), options, txns);
        let report = store.recovery_report();
        assert!(report.checkpoint.is_none(), "{name}: no checkpoint at close");
        assert!(report.records_replayed > txns, "{name}: the log was replayed ({})", report.records_replayed);
    }
}

/// Whether the last flush-aligned block of each of `dir`'s log segments is zero: zeros the
/// log wrote ahead of its last flush, which a reopen must cut off (a journal commit).
fn segments_end_in_zeros(dir: &Path) -> Vec<bool> {
    common::segments(dir, 0)
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).unwrap();
            assert!(bytes.len() as u64 >= FLUSH_ALIGN);
            all_zero(&bytes[bytes.len() - FLUSH_ALIGN as usize..])
        })
        .collect()
}

#[test]
fn a_close_cuts_the_zeros_written_ahead_which_a_crash_leaves() {
    for crash in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Options { close_checkpoint_above: u64::MAX, ..options() }).unwrap();
        // Small Sync commits: each flush is short, so the log zeroes ahead of it.
        let p = common::alloc_data_root(&store, 64);
        for i in 0..20u64 {
            store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 0, i)).unwrap();
        }
        if crash {
            store.crash();
        } else {
            store.close().unwrap();
        }
        let ends = segments_end_in_zeros(dir.path());
        assert!(!ends.is_empty());
        if crash {
            assert_eq!(ends.last(), Some(&true), "a crash leaves the zeros written ahead (else this test sees nothing)");
        } else {
            assert!(ends.iter().all(|&zeros| !zeros), "a clean close leaves no zeros to cut: {ends:?}");
        }
        let store = Store::open(dir.path(), options()).unwrap();
        let (last, _) = store.transact(Commit::Async, |tx| tx.read_u64_at(p, 0)).unwrap();
        assert_eq!(last, 19, "crash {crash}");
    }
}

/// Writes about `txns` × 2 KiB of log with `Options` that keep it in one segment.
fn one_segment() -> Options {
    Options { segment_bytes: 256 << 20, ..options() }
}

fn flip_byte(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_reopen_after_a_clean_close_reads_only_the_log_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = close_and_reopen(dir.path(), one_segment(), TXNS);
    let report = store.recovery_report().clone();
    let total = report.log_bytes + report.log_bytes_below_checkpoint;
    assert!(total > 3 << 19, "the log holds the transactions: {total}");
    assert!(report.log_bytes < (1 << 20) + (64 << 10), "read from the last mark on: {} of {total}", report.log_bytes);
    assert!(report.records_scanned < TXNS / 2, "{} records read", report.records_scanned);
    drop(store);

    // The same files with a damaged seal: read whole, the same heap.
    let seal = tusk_storage::log_seal::seal_path(dir.path());
    flip_byte(&seal, 10);
    let store = Store::open(dir.path(), one_segment()).unwrap();
    last_txn_is_there(&store, TXNS);
    let report = store.recovery_report();
    assert!(report.records_scanned > TXNS && report.log_bytes_below_checkpoint == 0, "a damaged seal is ignored");
}

#[test]
fn a_sealed_log_still_reaches_back_for_the_previous_checkpoint_and_past_a_crash() {
    const SPAN: u64 = 128;
    let dir = tempfile::tempdir().unwrap();
    let options = one_segment();
    let store = Store::open(dir.path(), options.clone()).unwrap();
    write_log(&store, TXNS);
    store.checkpoint().unwrap();
    // Then over 1 MiB of log that writes each word once: a record the scan wrongly skipped
    // leaves its words zero.
    let q = store.transact(Commit::Sync, |tx| tx.alloc(TXNS * SPAN * 8)).unwrap().0;
    store.transact(Commit::Sync, |tx| tx.set_root("spread", q)).unwrap();
    for t in 0..TXNS {
        store
            .transact(Commit::Async, |tx| (0..SPAN).try_for_each(|i| tx.write_u64_at(q, (t * SPAN + i) * 8, t + 1)))
            .unwrap();
    }
    store.close().unwrap();
    let expected = |store: &Store| {
        let words = store.transact(Commit::Async, |tx| (0..TXNS * SPAN).map(|w| tx.read_u64_at(q, w * 8)).collect::<Result<Vec<_>, _>>()).unwrap().0;
        assert!(words.iter().enumerate().all(|(w, &v)| v == w as u64 / SPAN + 1), "every record after the first checkpoint applied");
        last_txn_is_there(store, TXNS);
    };

    // The newest checkpoint damaged (in a copy): a whole load falls back to the first one and
    // needs the log from its oldest chunk on, which the scan for the newest left out.
    let twin = tempfile::tempdir().unwrap();
    common::copy_dir(dir.path(), twin.path());
    let mut images: Vec<_> = std::fs::read_dir(twin.path().join("ckpt")).unwrap().map(|e| e.unwrap().path()).collect();
    images.sort();
    assert!(images.len() >= 2, "{images:?}");
    flip_byte(images.last().unwrap(), 4096 + 100);
    let store = Store::open(twin.path(), Options { heap_load: tusk::HeapLoad::Whole, ..options.clone() }).unwrap();
    let report = store.recovery_report();
    assert!(report.checkpoint.as_ref().unwrap().fallback.is_some(), "fell back");
    expected(&store);
    drop(store);

    // After a crash of a later run: that run's segments follow the sealed one.
    let store = Store::open(dir.path(), options.clone()).unwrap();
    assert!(store.recovery_report().log_bytes_below_checkpoint >= 1 << 20, "the seal served the first reopen");
    expected(&store);
    store.transact(Commit::Sync, |tx| tx.write_u64_at(q, 0, 1)).unwrap();
    store.crash();
    let store = Store::open(dir.path(), options).unwrap();
    expected(&store);
}

/// A partition whose last segment filled with one large record, was closed at once and then
/// trimmed by a checkpoint has no segment to seal: the close must say nothing of it, not fail
/// (found by `crashtest` with large transactions: "the child failed to close the store
/// cleanly: …/00000000000000000016.seg: No such file or directory").
#[test]
fn a_close_after_a_full_segment_was_trimmed_seals_nothing_there() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options { log_partitions: 2, segment_bytes: 64 << 10, close_checkpoint_above: u64::MAX, ..options() };
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let p = common::alloc_data_root(&store, 4 * (128 << 10));
    // Threads take the partitions in turn: four of them fill a segment in each with one record.
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = &store;
            s.spawn(move || {
                let bytes = vec![t as u8 + 1; 128 << 10];
                store.transact(Commit::Async, |tx| tx.write_at(p, t * (128 << 10), &bytes)).unwrap();
            });
        }
    });
    store.checkpoint().unwrap();
    store.close().unwrap();
    let store = Store::open(dir.path(), options).unwrap();
    for t in 0..4u64 {
        let mut got = vec![0u8; 128 << 10];
        store.transact(Commit::Async, |tx| tx.read_at(p, t * (128 << 10), &mut got)).unwrap();
        assert!(got.iter().all(|&b| b == t as u8 + 1), "block {t}");
    }
}
