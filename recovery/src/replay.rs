//! Replay: records in LSN order up to the first gap, then the Partition-flagged records
//! beyond it. Recovery markers (written by an earlier recovery that found a gap) declare
//! LSN ranges resolved: inside them missing LSNs are no gap, non-Partition records are
//! skipped and Partition records applied, exactly as that earlier recovery did.

use std::path::Path;
use std::time::{Duration, Instant};

use tusk_storage::log_format::{decode_frame, Frame, FLAG_PARTITION};
use tusk_storage::Heap;

use crate::scan::{scan, RecordRef, Scan, TornTail};
use crate::RecoveryError;

/// What recovery did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Log segment files read.
    pub segments: usize,
    /// Bytes of log read.
    pub log_bytes: u64,
    /// Valid records found (replayed or not).
    pub records_scanned: u64,
    /// Records applied to the heap (markers excluded).
    pub records_replayed: u64,
    /// Every LSN ≤ this is in the recovered state.
    pub recovered_lsn: u64,
    /// The first missing LSN, if the log has records beyond a gap.
    pub gap_at: Option<u64>,
    /// Partition-flagged records applied beyond the gap.
    pub partition_records_after_gap: u64,
    /// Records beyond the gap that were dropped (asynchronous commits lost in the crash).
    pub lost_after_gap: u64,
    /// The largest LSN in the log; new LSNs continue after it.
    pub max_lsn: u64,
    pub torn_tails: Vec<TornTail>,
    /// When set, the caller must append a marker resolving `(from, to]` before new commits.
    pub marker_needed: Option<(u64, u64)>,
    /// Wall time of the scan and replay.
    pub elapsed: Duration,
}

fn is_void(voids: &[(u64, u64)], lsn: u64) -> Option<u64> {
    voids.iter().find(|&&(from, to)| from < lsn && lsn <= to).map(|&(_, to)| to)
}

/// Recovers `dir`'s log into `heap` (which must be zero). With `repair`, torn tails are cut.
pub fn recover(dir: &Path, heap: &Heap, repair: bool) -> Result<RecoveryReport, RecoveryError> {
    let started = Instant::now();
    let mut scan = scan(dir, repair)?;
    scan.records.sort_unstable_by_key(|r| r.lsn);
    for pair in scan.records.windows(2) {
        if pair[0].lsn == pair[1].lsn {
            return Err(RecoveryError::DuplicateLsn {
                lsn: pair[0].lsn,
                first: scan.segments[pair[0].segment as usize].path.clone(),
                second: scan.segments[pair[1].segment as usize].path.clone(),
            });
        }
    }
    let voids: Vec<(u64, u64)> = scan.records.iter().filter_map(|r| r.void).collect();
    let mut report = RecoveryReport {
        segments: scan.segments.len(),
        log_bytes: scan.log_bytes,
        records_scanned: scan.records.len() as u64,
        max_lsn: scan.records.last().map_or(0, |r| r.lsn),
        ..RecoveryReport::default()
    };
    let mut expected = 1u64;
    for r in &scan.records {
        if report.gap_at.is_none() {
            while expected < r.lsn {
                match is_void(&voids, expected) {
                    Some(to) => expected = (to + 1).min(r.lsn),
                    None => break,
                }
            }
            if r.lsn == expected {
                expected += 1;
                let skipped = is_void(&voids, r.lsn).is_some() && r.flags & FLAG_PARTITION == 0;
                if r.void.is_none() && !skipped {
                    apply(&scan, r, heap)?;
                    report.records_replayed += 1;
                }
                continue;
            }
            report.gap_at = Some(expected);
        }
        if r.flags & FLAG_PARTITION != 0 {
            apply(&scan, r, heap)?;
            report.records_replayed += 1;
            report.partition_records_after_gap += 1;
        } else if r.void.is_none() {
            report.lost_after_gap += 1;
        }
    }
    report.recovered_lsn = expected - 1;
    if report.max_lsn > report.recovered_lsn {
        report.marker_needed = Some((report.recovered_lsn, report.max_lsn));
    }
    report.torn_tails = std::mem::take(&mut scan.torn);
    report.elapsed = started.elapsed();
    Ok(report)
}

fn apply(scan: &Scan, r: &RecordRef, heap: &Heap) -> Result<(), RecoveryError> {
    let segment = &scan.segments[r.segment as usize];
    let Frame::Record(view, _) = decode_frame(&segment.data, r.offset as usize) else {
        unreachable!("the scan validated this record");
    };
    for (offset, bytes) in view.writes() {
        let end = offset.checked_add(bytes.len() as u64);
        match end {
            Some(end) if end <= heap.capacity() => heap.write_bytes(offset, bytes),
            _ => {
                return Err(RecoveryError::CapacityTooSmall {
                    path: segment.path.clone(),
                    offset: r.offset as u64,
                    needed: end.unwrap_or(u64::MAX),
                    capacity: heap.capacity(),
                })
            }
        }
    }
    Ok(())
}
