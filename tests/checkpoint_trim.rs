//! Log trimming (issue 3, "Tests": a test that the log really is trimmed): after
//! checkpoints, exactly the closed segments that neither kept checkpoint needs are gone, and
//! what remains still holds every LSN after the oldest chunk LSN they need, in both
//! partitions, so recovery from either checkpoint works.

mod common;

use common::{records, segments};
use tusk::{Commit, HeapPtr, Options, Store};
use tusk_storage::checkpoint_format::{list_manifests, Manifest};

const DATA: u64 = 256 << 10;

fn options() -> Options {
    Options {
        heap_capacity: 16 << 20,
        stripes_log2: 12,
        log_partitions: 2,
        chunk_size: 16 << 10,
        segment_bytes: 1 << 16,
        checkpoint_interval: None,
        ..Options::default()
    }
}

/// Two threads (so both partitions fill) write 512-byte runs into their half of the data.
fn churn(store: &Store, p: HeapPtr, txns: u64, seed: u64) {
    churn_committing(store, p, txns, seed, Commit::Async);
}

fn churn_committing(store: &Store, p: HeapPtr, txns: u64, seed: u64, commit: Commit) {
    std::thread::scope(|s| {
        for t in 0..2u64 {
            s.spawn(move || {
                for i in 0..txns {
                    let at = t * DATA / 2 + (i * 4099 + seed * 131) % (DATA / 2 - 512);
                    let byte = (i + seed + t) as u8 | 1;
                    store.transact(commit, |tx| tx.write_at(p, at, &[byte; 512])).unwrap();
                }
            });
        }
    });
}

#[test]
fn trimming_deletes_exactly_what_no_kept_checkpoint_needs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    let (p, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(DATA)?;
            tx.set_root("data", p)?;
            Ok(p)
        })
        .unwrap();
    let mut trimmed = 0;
    for round in 0..3 {
        churn(&store, p, 400, round);
        trimmed += store.checkpoint().unwrap().trimmed_segments;
    }
    assert!(trimmed > 0, "three rounds of ~400 KiB of log each trimmed nothing");
    let last = store.last_lsn();
    store.close().unwrap();

    let kept: Vec<Manifest> = list_manifests(dir.path())
        .unwrap()
        .iter()
        .map(|(_, path)| Manifest::decode(&std::fs::read(path).unwrap()).unwrap())
        .collect();
    assert_eq!(kept.len(), 2);
    let needed_after = kept.iter().map(|m| m.min_lsn()).min().unwrap();
    let mut lsns = Vec::new();
    for partition in 0..2 {
        let segs = segments(dir.path(), partition);
        assert!(!segs.is_empty(), "partition {partition} lost every segment");
        for (i, seg) in segs.iter().enumerate() {
            let recs = records(seg);
            lsns.extend(recs.iter().map(|r| r.lsn));
            // The last segment of a partition may still have been open at the checkpoint.
            let closed = i + 1 < segs.len();
            let max = recs.iter().map(|r| r.lsn).max().unwrap_or(0);
            assert!(!closed || max > needed_after, "{} holds only LSNs ≤ {max}, all older than {needed_after}: not trimmed", seg.display());
        }
    }
    lsns.sort_unstable();
    lsns.dedup();
    let missing: Vec<u64> = (needed_after + 1..=last).filter(|l| lsns.binary_search(l).is_err()).take(5).collect();
    assert!(missing.is_empty(), "trimming removed LSNs the kept checkpoints need: {missing:?}");

    // Recovery from the newest checkpoint replays only the log after it.
    let store = Store::open(dir.path(), options()).unwrap();
    let report = store.recovery_report();
    assert_eq!(report.checkpoint.as_ref().unwrap().manifest.epoch, kept[0].epoch);
    assert_eq!(report.recovered_lsn, last);
    store.close().unwrap();
}

/// Three rounds of churn, a checkpoint after the first two: the log kept for the older
/// checkpoint holds segments wholly below the newer one. Sync commits, so that every commit
/// is a flush of its own and each round fills many segments whatever the timing. Returns
/// the data's pointer, its contents and the newest manifest's lowest chunk LSN.
fn store_with_log_below_its_checkpoint(dir: &std::path::Path) -> (HeapPtr, Vec<u8>, u64) {
    let store = Store::open(dir, options()).unwrap();
    let p = common::alloc_data_root(&store, DATA);
    for round in 0..3 {
        churn_committing(&store, p, 150, round, Commit::Sync);
        if round < 2 {
            store.checkpoint().unwrap();
        }
    }
    let contents = read_data(&store, p);
    store.close().unwrap();
    let (_, newest) = &list_manifests(dir).unwrap()[0];
    let covered = Manifest::decode(&std::fs::read(newest).unwrap()).unwrap().min_lsn();
    (p, contents, covered)
}

fn read_data(store: &Store, p: HeapPtr) -> Vec<u8> {
    let mut buf = vec![0u8; DATA as usize];
    store.transact(Commit::Async, |tx| tx.read(p, &mut buf)).unwrap();
    buf
}

/// The segments recovery may leave unread: every one but a partition's last whose next
/// segment starts at or below `covered + 1` (so it holds only LSNs ≤ `covered`).
fn wholly_covered(dir: &std::path::Path, covered: u64) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for partition in 0..2 {
        let segs = segments(dir, partition);
        for pair in segs.windows(2) {
            let next_first = records(&pair[1]).first().map(|r| r.lsn);
            if next_first.is_some_and(|f| f <= covered + 1) {
                out.push(pair[0].clone());
            }
        }
    }
    out
}

/// Recovery does not read log segments whose records the checkpoint's images all hold
/// already: exactly those are left out, what is recovered is the same, and damage in them
/// (which no longer matters) goes unseen.
#[test]
fn recovery_reads_no_segment_wholly_below_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (p, contents, covered) = store_with_log_below_its_checkpoint(dir.path());
    let below = wholly_covered(dir.path(), covered);
    assert!(below.len() >= 2, "the setup left {} segments below the checkpoint", below.len());
    let below_bytes: u64 = below.iter().map(|s| std::fs::metadata(s).unwrap().len()).sum();

    let store = Store::open(dir.path(), options()).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(report.segments_below_checkpoint, below.len());
    assert_eq!(report.log_bytes_below_checkpoint, below_bytes);
    assert!(report.checkpoint.as_ref().unwrap().fallback.is_none());
    assert!(read_data(&store, p) == contents, "recovered data differs");
    // Every segment is still listed (for trimming), each unread one with a range that
    // bounds its records.
    for s in &below {
        let info = report.segment_files.iter().find(|i| &i.path == s).expect("an unread segment is still listed");
        let max = records(s).iter().map(|r| r.lsn).max().unwrap();
        assert!(max <= info.max_lsn && info.max_lsn <= covered, "{}: max LSN {max}, listed as {}", s.display(), info.max_lsn);
    }
    store.close().unwrap();

    // Damage in a segment below the checkpoint changes nothing recovery needs.
    let victim = &below[0];
    let first = records(victim)[0];
    common::flip_byte(victim, first.offset + first.len / 2, 0x40);
    let store = Store::open(dir.path(), options()).unwrap();
    assert!(read_data(&store, p) == contents, "recovered data differs after damage below the checkpoint");
    store.close().unwrap();
}

/// When the newest checkpoint's images turn out damaged, recovery falls back to the older
/// one, whose replay needs the log the scan left out for the newer: it reads it.
#[test]
fn a_fallback_reads_the_log_below_the_damaged_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (p, contents, covered) = store_with_log_below_its_checkpoint(dir.path());
    assert!(!wholly_covered(dir.path(), covered).is_empty());
    let (newest, _) = list_manifests(dir.path()).unwrap()[0];
    let (image, offset, len) = common::image_location(dir.path(), newest, 0);
    common::flip_byte(&image, offset + len / 2, 0x01);

    let store = Store::open(dir.path(), options()).unwrap();
    let report = store.recovery_report().clone();
    let loaded = report.checkpoint.as_ref().unwrap();
    assert!(loaded.fallback.is_some() && loaded.manifest.epoch < newest, "recovery did not fall back");
    let older_covers = loaded.manifest.min_lsn();
    assert_eq!(report.segments_below_checkpoint, wholly_covered(dir.path(), older_covers).len());
    assert!(read_data(&store, p) == contents, "recovered data differs after the fallback");
    store.close().unwrap();
}
