//! Replay: records in LSN order up to the first gap, then the Partition-flagged records
//! beyond it. Recovery markers (written by an earlier recovery that found a gap) declare
//! LSN ranges resolved: inside them missing LSNs are no gap, non-Partition records are
//! skipped and Partition records applied, exactly as that earlier recovery did.

use std::path::Path;
use std::time::{Duration, Instant};

use tusk_storage::log_format::{decode_validated, FLAG_PARTITION};
use tusk_storage::Heap;

use crate::checkpoint::{load_checkpoint, LoadedCheckpoint};
use crate::scan::{scan, RecordRef, Scan, TornTail};
use tusk_storage::log_files::log_dir;
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
    /// Records applied to the heap (markers and checkpoint records excluded).
    pub records_replayed: u64,
    /// Every LSN ≤ this is in the recovered state.
    pub recovered_lsn: u64,
    /// The first missing LSN, if the log has records beyond a gap.
    pub gap_at: Option<u64>,
    /// Partition-flagged records applied beyond the gap.
    pub partition_records_after_gap: u64,
    /// Records beyond the gap that were dropped (asynchronous commits lost in the crash).
    pub lost_after_gap: u64,
    /// The largest LSN in the log or the checkpoint; new LSNs continue after it.
    pub max_lsn: u64,
    pub torn_tails: Vec<TornTail>,
    /// The segment files read, with their LSN ranges.
    pub segment_files: Vec<tusk_storage::log_files::SegmentInfo>,
    /// The checkpoint recovery started from, if any.
    pub checkpoint: Option<LoadedCheckpoint>,
    /// Time spent loading the checkpoint's chunk images.
    pub checkpoint_load: Duration,
    /// Time spent replaying the log.
    pub replay: Duration,
    /// When set, the caller must append a marker resolving `(from, to]` before new commits.
    pub marker_needed: Option<(u64, u64)>,
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
}

fn is_void(voids: &[(u64, u64)], lsn: u64) -> Option<u64> {
    voids.iter().find(|&&(from, to)| from < lsn && lsn <= to).map(|&(_, to)| to)
}

/// What replaying the log would do, decided before touching the heap.
pub struct Plan {
    pub scan: Scan,
    pub checkpoint: Option<LoadedCheckpoint>,
    /// Records to apply, in LSN order.
    pub to_apply: Vec<RecordRef>,
    pub report: RecoveryReport,
}

/// Scans the log and decides what recovery does: from which checkpoint, which records up to
/// the first gap, which Partition records beyond it. With `heap`, the checkpoint is loaded
/// into it; with `repair`, torn tails are cut off on disk.
pub fn plan(dir: &Path, heap: Option<&Heap>, repair: bool) -> Result<Plan, RecoveryError> {
    let started = Instant::now();
    // The checkpoint's images and the log are independent reads: do both at once.
    let (checkpoint, checkpoint_load, scanned) = std::thread::scope(|s| {
        let log = s.spawn(|| scan(dir, repair));
        let checkpoint = load_checkpoint(dir, heap);
        let checkpoint_load = started.elapsed();
        (checkpoint, checkpoint_load, log.join().expect("log scan panicked"))
    });
    let checkpoint = checkpoint?;
    let mut scan = scanned?;
    // Each partition's records ascend already: a stable sort merges the runs in linear time.
    scan.records.sort_by_key(|r| r.lsn);
    for pair in scan.records.windows(2) {
        if pair[0].lsn == pair[1].lsn {
            return Err(RecoveryError::DuplicateLsn {
                lsn: pair[0].lsn,
                first: scan.segments[pair[0].segment as usize].path.clone(),
                second: scan.segments[pair[1].segment as usize].path.clone(),
            });
        }
    }
    // Records at or below the oldest chunk LSN are in every image already.
    let base = checkpoint.as_ref().map_or(0, |c| c.manifest.min_lsn());
    let checkpoint_max = checkpoint.as_ref().map_or(0, |c| c.manifest.max_lsn());
    let voids: Vec<(u64, u64)> = scan.records.iter().filter_map(|r| r.void).collect();
    let mut report = RecoveryReport {
        segments: scan.segments.len(),
        log_bytes: scan.log_bytes,
        records_scanned: scan.records.len() as u64,
        max_lsn: scan.records.last().map_or(0, |r| r.lsn).max(checkpoint_max),
        checkpoint_load,
        ..RecoveryReport::default()
    };
    let mut to_apply: Vec<RecordRef> = Vec::new();
    let mut expected = base + 1;
    for r in scan.records.iter().filter(|r| r.lsn > base) {
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
                    to_apply.push(*r);
                }
                continue;
            }
            report.gap_at = Some(expected);
        }
        if r.flags & FLAG_PARTITION != 0 {
            to_apply.push(*r);
            report.partition_records_after_gap += 1;
        } else if r.void.is_none() {
            report.lost_after_gap += 1;
        }
    }
    report.recovered_lsn = expected - 1;
    // Every LSN up to the checkpoint's newest chunk LSN was durable before the checkpoint
    // became valid; a log that stops short of it has lost records.
    let required = checkpoint.as_ref().map_or(0, |c| checkpoint_max.max(c.fallback.as_ref().map_or(0, |f| f.required_lsn)));
    if report.recovered_lsn < required {
        let (path, why) = match checkpoint.as_ref().and_then(|c| c.fallback.as_ref()) {
            Some(f) => (f.path.clone(), format!("{}; the log needed to recover without it ends at LSN {}", f.reason, report.recovered_lsn)),
            None => (log_dir(dir), format!("the log ends at LSN {} but the checkpoint needs it through LSN {required}", report.recovered_lsn)),
        };
        return Err(RecoveryError::Corrupt { path, offset: 0, reason: why });
    }
    report.records_replayed = to_apply.len() as u64;
    if report.max_lsn > report.recovered_lsn {
        report.marker_needed = Some((report.recovered_lsn, report.max_lsn));
    }
    report.torn_tails = std::mem::take(&mut scan.torn);
    report.segment_files = scan.infos.clone();
    Ok(Plan { scan, checkpoint, to_apply, report })
}

/// Recovers `dir` into `heap` (which must be zero): the newest usable checkpoint, then the
/// log. With `repair`, torn log tails are cut off.
pub fn recover(dir: &Path, heap: &Heap, repair: bool) -> Result<RecoveryReport, RecoveryError> {
    let started = Instant::now();
    let Plan { scan, checkpoint, to_apply, mut report } = plan(dir, Some(heap), repair)?;
    let replay_started = Instant::now();
    let chunk_size = checkpoint.as_ref().map_or(1 << 20, |c| c.manifest.chunk_size);
    apply_parallel(&scan, &to_apply, heap, chunk_size, |chunk| checkpoint.as_ref().map_or(0, |c| c.chunk_lsn(chunk)))?;
    report.checkpoint = checkpoint;
    report.replay = replay_started.elapsed();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Applies `records` (in LSN order) on all cores: worker `t` owns the chunks `c` with
/// `c % workers == t` and applies, in LSN order, every write piece that lands in them and is
/// newer than the chunk's image. Chunks written are stamped dirty (epoch 1) at the end, so
/// the next checkpoint rewrites exactly them.
fn apply_parallel(
    scan: &Scan,
    records: &[RecordRef],
    heap: &Heap,
    chunk_size: u64,
    chunk_lsn: impl Fn(u64) -> u64 + Sync,
) -> Result<(), RecoveryError> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let chunks = heap.capacity().div_ceil(chunk_size) as usize;
    let lsns: Vec<u64> = (0..chunks as u64).map(&chunk_lsn).collect();
    let results: Vec<Result<Vec<bool>, RecoveryError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|t| {
                let lsns = &lsns;
                s.spawn(move || {
                    let mut worker = Worker::new(scan, heap, chunk_size, workers, t, lsns);
                    // Replay is bound by cache misses on the heap: each record is decoded
                    // once, PREFETCH_AHEAD records before it is applied; its lines are
                    // prefetched then and its pieces kept in a ring until their turn.
                    for r in records.iter().take(PREFETCH_AHEAD) {
                        worker.stage(r);
                    }
                    for (i, r) in records.iter().enumerate() {
                        worker.apply(i, r)?;
                        if let Some(ahead) = records.get(i + PREFETCH_AHEAD) {
                            worker.stage(ahead);
                        }
                    }
                    Ok(worker.touched)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("replay worker panicked")).collect()
    });
    for touched in results {
        for (chunk, _) in touched?.iter().enumerate().filter(|(_, &t)| t) {
            let start = chunk as u64 * chunk_size;
            heap.stamp_dirty(start, chunk_size.min(heap.capacity() - start), 1);
        }
    }
    Ok(())
}

/// How many records ahead replay decodes and prefetches (8, 16, 24 and 32 measured the
/// same within the noise of a loaded 2-core machine).
const PREFETCH_AHEAD: usize = 16;

/// A piece of a logged write that lies in one chunk of this worker's and is newer than the
/// chunk's image.
#[derive(Clone, Copy)]
struct Piece<'a> {
    offset: u64,
    bytes: &'a [u8],
}

/// A staged record: its pieces for this worker, or why it cannot be applied.
#[derive(Default)]
struct Staged<'a> {
    pieces: Vec<Piece<'a>>,
    /// The end of a write past the heap's capacity (u64::MAX on overflow).
    too_far: Option<u64>,
}

struct Worker<'a> {
    scan: &'a Scan,
    heap: &'a Heap,
    chunk_size: u64,
    /// Per chunk, the LSN a record must exceed for this worker to apply its writes there:
    /// the chunk image's LSN for this worker's chunks, u64::MAX for the others' (one lookup
    /// instead of a modulo and a lookup per write).
    floors: Vec<u64>,
    /// Chunks this worker wrote.
    touched: Vec<bool>,
    /// Record `i` is staged in slot `i % PREFETCH_AHEAD`; slots are reused so replay
    /// allocates nothing per record.
    ring: Vec<Staged<'a>>,
    staged: usize,
}

impl<'a> Worker<'a> {
    fn new(scan: &'a Scan, heap: &'a Heap, chunk_size: u64, workers: u64, me: u64, lsns: &'a [u64]) -> Worker<'a> {
        let ring = (0..PREFETCH_AHEAD).map(|_| Staged::default()).collect();
        let floors = lsns.iter().enumerate().map(|(c, &lsn)| if c as u64 % workers == me { lsn } else { u64::MAX }).collect();
        Worker { scan, heap, chunk_size, floors, touched: vec![false; lsns.len()], ring, staged: 0 }
    }

    fn mine(&self, chunk: u64, lsn: u64) -> bool {
        self.floors.get(chunk as usize).is_some_and(|&floor| lsn > floor)
    }

    /// Decodes the next record (records are staged in order), keeps the pieces this worker
    /// applies and prefetches the heap lines they write.
    fn stage(&mut self, r: &RecordRef) {
        let at = self.staged % self.ring.len();
        let mut slot = std::mem::take(&mut self.ring[at]);
        slot.pieces.clear();
        slot.too_far = None;
        let Some(view) = decode_validated(self.scan.segments[r.segment as usize].data(), r.offset as usize) else {
            unreachable!("the scan validated this record");
        };
        let capacity = self.heap.capacity();
        for (offset, bytes) in view.writes() {
            let end = offset.checked_add(bytes.len() as u64);
            if !end.is_some_and(|end| end <= capacity) {
                slot.too_far = Some(end.unwrap_or(u64::MAX));
                break;
            }
            // The common case: one aligned word (the Hathi workload writes nothing else).
            if bytes.len() == 8 && offset % 8 == 0 {
                if self.mine(offset / self.chunk_size, r.lsn) {
                    self.heap.prefetch(offset);
                    slot.pieces.push(Piece { offset, bytes });
                }
                continue;
            }
            let mut at = offset;
            let mut rest = bytes;
            while !rest.is_empty() {
                let chunk = at / self.chunk_size;
                let take = ((chunk + 1) * self.chunk_size - at).min(rest.len() as u64) as usize;
                if self.mine(chunk, r.lsn) {
                    self.heap.prefetch(at);
                    slot.pieces.push(Piece { offset: at, bytes: &rest[..take] });
                }
                at += take as u64;
                rest = &rest[take..];
            }
        }
        self.ring[at] = slot;
        self.staged += 1;
    }

    /// Applies record `i` (staged earlier) to the heap.
    fn apply(&mut self, i: usize, r: &RecordRef) -> Result<(), RecoveryError> {
        debug_assert!(i < self.staged && self.staged <= i + self.ring.len());
        let slot = &self.ring[i % self.ring.len()];
        let heap = self.heap;
        for piece in &slot.pieces {
            if piece.bytes.len() == 8 && piece.offset % 8 == 0 {
                heap.store_word(piece.offset, u64::from_le_bytes(piece.bytes.try_into().expect("8 bytes")));
            } else {
                heap.write_bytes(piece.offset, piece.bytes);
            }
            self.touched[(piece.offset / self.chunk_size) as usize] = true;
        }
        if let Some(needed) = slot.too_far {
            return Err(RecoveryError::CapacityTooSmall {
                path: self.scan.segments[r.segment as usize].path.clone(),
                offset: r.offset as u64,
                needed,
                capacity: heap.capacity(),
            });
        }
        Ok(())
    }
}
