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
    std::thread::scope(|s| {
        for t in 0..2u64 {
            s.spawn(move || {
                for i in 0..txns {
                    let at = t * DATA / 2 + (i * 4099 + seed * 131) % (DATA / 2 - 512);
                    let byte = (i + seed + t) as u8 | 1;
                    store.transact(Commit::Async, |tx| tx.write_at(p, at, &[byte; 512])).unwrap();
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
