//! Replay: records in LSN order up to the first gap, then the Partition-flagged records
//! beyond it. Recovery markers (written by an earlier recovery that found a gap) declare
//! LSN ranges resolved: inside them missing LSNs are no gap, non-Partition records are
//! skipped and Partition records applied, exactly as that earlier recovery did.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tusk_storage::log_format::{decode_validated, FLAG_PARTITION};
use tusk_storage::layout::{arena_off, ARENAS, BRK_OFF, DATA_START};
use tusk_storage::{Heap, PAGE_SIZE};

use crate::apply::{region_bytes, Bucketed, Unappliable};
use crate::checkpoint::{chunk_lsn, load_checkpoint, newest_manifest, HeapLoad, LoadedCheckpoint};
use tusk_storage::checkpoint_format::Manifest;
use crate::scan::{scan, RecordRef, Scan, TornTail};
use tusk_storage::log_files::log_dir;
use crate::{FileKind, RecoveryError};

/// What recovery did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Log segment files read.
    pub segments: usize,
    /// Bytes of log read.
    pub log_bytes: u64,
    /// Log segments not read, and their bytes: every record in them is at or below the
    /// checkpoint's lowest chunk LSN, so in every chunk image already.
    pub segments_below_checkpoint: usize,
    pub log_bytes_below_checkpoint: u64,
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
    /// Time spent replaying the log once the checkpoint had loaded.
    pub replay: Duration,
    /// The replay's first pass (decoding the records, sorting their writes by heap region)
    /// ran beside the checkpoint's load: the newest checkpoint loaded, so the pass made for
    /// its chunk LSNs while its images were read was used (see [`recover`]).
    pub first_pass_beside_load: bool,
    /// Time the log's scan took on its own thread beside the load, with the replay's first
    /// pass when that ran there too: where it exceeds `checkpoint_load`, the log, not the
    /// images, held recovery up.
    pub log_pass: Duration,
    /// When set, the caller must append a marker resolving `(from, to]` before new commits.
    pub marker_needed: Option<(u64, u64)>,
    /// How the checkpoint's images came into the heap: on demand (the heap reads each chunk
    /// when first used; `chunks_absent` were not read yet when recovery returned), or whole.
    /// The mode recovery ran in (with no checkpoint, nothing was read either way).
    pub heap_load: HeapLoad,
    /// Chunks of the checkpoint not read yet when recovery returned (on demand only).
    pub chunks_absent: u64,
    /// Why the heap was loaded whole although on demand was asked for: a damaged image found
    /// while the store opened (naming it), after which recovery fell back as a whole load does.
    pub loaded_whole_because: Option<String>,
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
    /// What recovery left to change on disk when it was not to repair (torn tails and zeros
    /// to cut off, headerless segments to remove): `Store::open` makes these changes on a
    /// thread of their own, and no new log segment is made before they are done.
    pub repairs: Vec<crate::scan::Repair>,
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
/// into it. Changes nothing on disk (the repairs it would make are in `scan.repairs`).
pub fn plan(dir: &Path, heap: Option<&Heap>) -> Result<Plan, RecoveryError> {
    let started = Instant::now();
    // Records at or below the oldest chunk LSN are in every image already, so log segments
    // holding only such records need not be read. Which checkpoint loads is known only once
    // its images have been checked: the scan goes by the newest manifest meanwhile.
    let covered = newest_manifest(dir).map_or(0, |m| m.min_lsn());
    // The checkpoint's images and the log are independent reads: do both at once.
    let (checkpoint, checkpoint_load, scanned) = std::thread::scope(|s| {
        let log = s.spawn(|| scan(dir, covered));
        let checkpoint = load_checkpoint(dir, heap, HeapLoad::Whole);
        let checkpoint_load = started.elapsed();
        (checkpoint, checkpoint_load, log.join().expect("log scan panicked"))
    });
    let checkpoint = checkpoint?;
    let scanned = scanned?;
    let scan = rescan_for(dir, &checkpoint, covered, &scanned)?.unwrap_or(scanned);
    let (to_apply, mut report) = decide(&scan, checkpoint.as_ref().map(|c| &c.manifest))?;
    check_reaches(dir, &report, &checkpoint)?;
    report.checkpoint_load = checkpoint_load;
    Ok(Plan { scan, checkpoint, to_apply, report })
}

/// `scanned` was made for a checkpoint covering `covered`. Where damaged images made
/// recovery fall back to an older checkpoint (or to the whole log), the replay needs a new
/// scan that keeps the records the first one left out: that scan, else `None`.
fn rescan_for(dir: &Path, checkpoint: &Option<LoadedCheckpoint>, covered: u64, scanned: &Scan) -> Result<Option<Scan>, RecoveryError> {
    let base = checkpoint.as_ref().map_or(0, |c| c.manifest.min_lsn());
    // Whole segments skipped, or the start of a sealed one (see tusk-storage's `log_seal`).
    if base < covered && scanned.below_checkpoint_bytes > 0 {
        return crate::scan::scan(dir, base).map(Some);
    }
    Ok(None)
}

/// The records to apply after the checkpoint of `manifest` (`None`: from the log alone), in
/// LSN order, and the report of what the scan found and the replay will do.
fn decide(scan: &Scan, manifest: Option<&Manifest>) -> Result<(Vec<RecordRef>, RecoveryReport), RecoveryError> {
    let base = manifest.map_or(0, |m| m.min_lsn());
    let checkpoint_max = manifest.map_or(0, |m| m.max_lsn());
    let voids = &scan.voids;
    let mut report = RecoveryReport {
        segments: scan.segments.len(),
        log_bytes: scan.log_bytes,
        segments_below_checkpoint: scan.below_checkpoint.len(),
        log_bytes_below_checkpoint: scan.below_checkpoint_bytes,
        records_scanned: scan.record_count() as u64,
        ..RecoveryReport::default()
    };
    let mut to_apply: Vec<RecordRef> = Vec::with_capacity(scan.record_count());
    let mut expected = base + 1;
    let mut previous: Option<RecordRef> = None;
    for r in scan.merged() {
        if let Some(p) = previous.filter(|p| p.lsn == r.lsn) {
            return Err(RecoveryError::DuplicateLsn {
                lsn: r.lsn,
                first: scan.segments[p.segment as usize].path.clone(),
                second: scan.segments[r.segment as usize].path.clone(),
            });
        }
        previous = Some(r);
        if r.lsn <= base {
            continue;
        }
        if report.gap_at.is_none() {
            while expected < r.lsn {
                match is_void(voids, expected) {
                    Some(to) => expected = (to + 1).min(r.lsn),
                    None => break,
                }
            }
            if r.lsn == expected {
                expected += 1;
                let skipped = is_void(voids, r.lsn).is_some() && r.flags() & FLAG_PARTITION == 0;
                if !r.is_marker() && !skipped {
                    to_apply.push(r);
                }
                continue;
            }
            report.gap_at = Some(expected);
        }
        if r.flags() & FLAG_PARTITION != 0 {
            to_apply.push(r);
            report.partition_records_after_gap += 1;
        } else if !r.is_marker() {
            report.lost_after_gap += 1;
        }
    }
    report.max_lsn = previous.map_or(0, |r| r.lsn).max(checkpoint_max);
    report.recovered_lsn = expected - 1;
    report.records_replayed = to_apply.len() as u64;
    if report.max_lsn > report.recovered_lsn {
        report.marker_needed = Some((report.recovered_lsn, report.max_lsn));
    }
    report.torn_tails = scan.torn.clone();
    report.segment_files = scan.infos.clone();
    Ok((to_apply, report))
}

/// Every LSN up to the checkpoint's newest chunk LSN was durable before the checkpoint
/// became valid; a log that stops short of it has lost records.
fn check_reaches(dir: &Path, report: &RecoveryReport, checkpoint: &Option<LoadedCheckpoint>) -> Result<(), RecoveryError> {
    let required = checkpoint.as_ref().map_or(0, |c| c.manifest.max_lsn().max(c.fallback.as_ref().map_or(0, |f| f.required_lsn)));
    if report.recovered_lsn >= required {
        return Ok(());
    }
    Err(match checkpoint.as_ref().and_then(|c| c.fallback.as_ref()) {
        Some(f) => RecoveryError::Corrupt {
            kind: f.kind,
            path: f.path.clone(),
            offset: None,
            reason: format!(
                "{}; the log that must stand in for it reaches only LSN {} (LSN {} is missing), short of LSN {required}",
                f.reason,
                report.recovered_lsn,
                report.recovered_lsn + 1
            ),
        },
        None => RecoveryError::Corrupt {
            kind: FileKind::Log,
            path: log_dir(dir),
            offset: None,
            reason: format!(
                "reaches only LSN {} (LSN {} is missing), short of LSN {required} that the checkpoint needs",
                report.recovered_lsn,
                report.recovered_lsn + 1
            ),
        },
    })
}

/// The replay's first pass made while the checkpoint loaded, for the newest manifest's
/// checkpoint: used if that is the checkpoint that loaded.
struct Early<'a> {
    epoch: u64,
    report: RecoveryReport,
    bucketed: Bucketed<'a>,
}

/// Decides the replay and makes its first pass for `manifest`'s checkpoint, as if it will
/// load: `None` where anything stands in the way (the replay then takes the usual path and
/// reports the trouble from there).
fn bucket_early<'a>(scan: &'a Scan, manifest: &Manifest, capacity: u64) -> Option<Early<'a>> {
    let (to_apply, report) = decide(scan, Some(manifest)).ok()?;
    let chunk_size = manifest.chunk_size;
    let lsns: Vec<u64> = (0..capacity.div_ceil(chunk_size)).map(|i| chunk_lsn(manifest, i)).collect();
    let bucketed = Bucketed::new(to_apply.len(), record_writes(scan, &to_apply), capacity, chunk_size, &lsns, region_bytes(chunk_size)).ok()?;
    Some(Early { epoch: manifest.epoch, report, bucketed })
}

/// Recovers `dir` into `heap` (which must be zero): the newest usable checkpoint, then the
/// log. With `repair`, torn log tails are cut off once the replay has succeeded (a store
/// refused for damage is left as it was).
///
/// The replay's first pass (decoding the records and sorting their writes by heap region,
/// see [`crate::apply`]) needs the checkpoint's chunk LSNs, not its images: it runs for the
/// newest manifest beside the images' load, after the log scan, and is used when that
/// checkpoint is the one that loads (otherwise it is made again for the one that did).
///
/// With [`HeapLoad::OnDemand`] the images are read as the replay and later accesses reach
/// them; a damaged one met before recovery returns fails it with
/// [`RecoveryError::DamagedOnDemand`] ([`recover_heap`] then loads whole instead).
pub fn recover(dir: &Path, heap: &Heap, repair: bool, load: HeapLoad) -> Result<RecoveryReport, RecoveryError> {
    let started = Instant::now();
    let newest = newest_manifest(dir);
    let covered = newest.as_ref().map_or(0, |m| m.min_lsn());
    let (load, loaded_whole_because) = match (load, &newest) {
        (HeapLoad::OnDemand, Some(manifest)) => on_demand_or_whole(dir, manifest)?,
        _ => (load, None),
    };
    // Outside the scope, so that the early first pass may keep borrowing it after.
    let first_scan: OnceLock<Scan> = OnceLock::new();
    let (checkpoint, checkpoint_load, early) = std::thread::scope(|s| {
        let (first_scan, newest) = (&first_scan, &newest);
        let log = s.spawn(move || -> Result<(Option<Early<'_>>, Duration), RecoveryError> {
            let scanned = scan(dir, covered)?;
            let scanned = first_scan.get_or_init(move || scanned);
            let early = newest.as_ref().and_then(|m| bucket_early(scanned, m, heap.capacity()));
            Ok((early, started.elapsed()))
        });
        let checkpoint = load_checkpoint(dir, Some(heap), load);
        let checkpoint_load = started.elapsed();
        (checkpoint, checkpoint_load, log.join().expect("log scan panicked"))
    });
    let checkpoint = checkpoint?;
    let (early, log_pass) = early?;
    let first = first_scan.get().expect("the scan succeeded");
    let replay_started;
    let rescanned;
    let (scan, mut report, written_to) = match early.filter(|e| checkpoint.as_ref().is_some_and(|c| c.fallback.is_none() && c.manifest.epoch == e.epoch)) {
        Some(Early { mut report, bucketed, .. }) => {
            check_reaches(dir, &report, &checkpoint)?;
            replay_started = Instant::now();
            let touched = bucketed.write_into(heap);
            report.first_pass_beside_load = true;
            (first, report, stamp_written(heap, &touched, checkpoint.as_ref().map_or(1 << 20, |c| c.manifest.chunk_size)))
        }
        None => {
            rescanned = rescan_for(dir, &checkpoint, covered, first)?;
            let scan = rescanned.as_ref().unwrap_or(first);
            let (to_apply, report) = decide(scan, checkpoint.as_ref().map(|c| &c.manifest))?;
            check_reaches(dir, &report, &checkpoint)?;
            replay_started = Instant::now();
            let chunk_size = checkpoint.as_ref().map_or(1 << 20, |c| c.manifest.chunk_size);
            let written_to = apply_parallel(scan, &to_apply, heap, chunk_size, |chunk| checkpoint.as_ref().map_or(0, |c| c.chunk_lsn(chunk)))?;
            (scan, report, written_to)
        }
    };
    claim_arenas(heap);
    zero_beyond_brk(heap, written_to);
    zero_arena_tails(heap, written_to);
    // The superblock's chunk is what the store reads first: bring it in here, so that its
    // damage, like any the replay met, is listed below.
    let _ = heap.ready(0, tusk_storage::layout::DATA_START.min(heap.capacity()));
    if let Some((_, damage)) = heap.damaged_chunks().into_iter().next() {
        debug_assert!(load == HeapLoad::OnDemand, "a whole load finds its damage before the replay");
        return Err(RecoveryError::DamagedOnDemand { path: damage.path, offset: damage.offset, reason: damage.reason });
    }
    if repair {
        for r in &scan.repairs {
            r.apply()?;
        }
    } else {
        report.repairs = scan.repairs.clone();
    }
    report.checkpoint_load = checkpoint_load;
    report.log_pass = log_pass;
    report.checkpoint = checkpoint;
    report.replay = replay_started.elapsed();
    report.heap_load = load;
    report.loaded_whole_because = loaded_whole_because;
    report.chunks_absent = heap.absent_chunks();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A log after the checkpoint longer than this share of the heap the checkpoint covers
/// (and than [`ON_DEMAND_MIN_LOG`]) makes a reopen on demand load whole instead.
pub const ON_DEMAND_LOG_SHARE: u64 = 16;
pub const ON_DEMAND_MIN_LOG: u64 = 64 << 20;

/// On demand, unless the log after `manifest` is long: its replay then reaches most chunks
/// (a uniform update every 64 bytes of log touches a 1 MiB chunk ~16 times per MiB), its
/// deferred writes would cost about the log's size in memory, and a whole load beside the
/// log's scan brings the heap in sooner than chunk-by-chunk reads (on this machine, 1 GiB of
/// heap and of log: all chunks in after 1.56x a whole load's time).
fn on_demand_or_whole(dir: &Path, manifest: &Manifest) -> Result<(HeapLoad, Option<String>), RecoveryError> {
    let tail = crate::scan::log_bytes_after(dir, manifest.min_lsn())?;
    let limit = (manifest.covered / ON_DEMAND_LOG_SHARE).max(ON_DEMAND_MIN_LOG);
    if tail <= limit {
        return Ok((HeapLoad::OnDemand, None));
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    Ok((
        HeapLoad::Whole,
        Some(format!(
            "the log after the checkpoint ({:.0} MiB) is longer than {:.0} MiB (1/{ON_DEMAND_LOG_SHARE} of the {:.0} MiB it covers, at least {:.0} MiB): \
             its replay reaches most chunks, and a whole load beside the log's scan brings them in sooner",
            mib(tail),
            mib(limit),
            mib(manifest.covered),
            mib(ON_DEMAND_MIN_LOG)
        )),
    ))
}

/// How a reopen of `dir` on demand would bring its newest checkpoint in (for `tusk inspect`):
/// on demand, or whole and why (see [`ON_DEMAND_LOG_SHARE`]).
pub fn reopen_load(dir: &Path) -> Result<(HeapLoad, Option<String>), RecoveryError> {
    match newest_manifest(dir) {
        Some(manifest) => on_demand_or_whole(dir, &manifest),
        None => Ok((HeapLoad::OnDemand, None)),
    }
}

/// Recovers `dir` into a new heap of `capacity` bytes (see [`recover`]). On demand, a damaged
/// image met while opening makes it start again loading whole, which falls back to the
/// checkpoint before (the report says why, in `loaded_whole_because`).
pub fn recover_heap(dir: &Path, capacity: u64, repair: bool, load: HeapLoad) -> Result<(Heap, RecoveryReport), RecoveryError> {
    let heap = Heap::new(capacity)?;
    let why = match recover(dir, &heap, repair, load) {
        Ok(report) => return Ok((heap, report)),
        Err(e @ RecoveryError::DamagedOnDemand { .. }) => e.to_string(),
        Err(e) => return Err(e),
    };
    drop(heap);
    let heap = Heap::new(capacity)?;
    let mut report = recover(dir, &heap, repair, HeapLoad::Whole)?;
    report.loaded_whole_because = Some(why);
    Ok((heap, report))
}

/// Record `i` of `records`: its LSN and writes, read from the scan's segments.
fn record_writes<'s: 'r, 'r>(scan: &'s Scan, records: &'r [RecordRef]) -> impl Fn(usize) -> (u64, tusk_storage::log_format::WriteIter<'s>) + Sync + 'r {
    move |i: usize| {
        let r = &records[i];
        let Some(view) = decode_validated(scan.segments[r.segment as usize].data(), r.offset()) else {
            unreachable!("the scan validated this record");
        };
        (r.lsn, view.writes())
    }
}

/// Zeroes the heap from brk up to `written_to` (the end of the last chunk replay wrote),
/// where replay wrote beyond brk. Memory beyond brk was never handed out, and the allocator
/// hands it out as zero; but a `Partition` record replayed beyond an LSN gap may have written
/// into a block that a lost commit had taken from brk, which brk, as recovered, no longer
/// covers. Left there, those bytes would show up in the next allocation from brk
/// (`tests/checkpoint_model.rs` found it: a reallocated region held a lost-gap write;
/// `tests/log_damage.rs::memory_beyond_brk_is_zero_after_a_partition_record_beyond_a_gap`).
fn zero_beyond_brk(heap: &Heap, written_to: u64) {
    let brk = heap.load_word(BRK_OFF);
    if brk >= DATA_START {
        zero_range(heap, brk, written_to);
    }
}

/// Makes the recovered arenas (`txn/src/alloc.rs`) agree with brk. Every take writes an
/// arena's whole line, but its step came from brk in whichever commit took it: a `Partition`
/// record applied beyond a gap may bring back a take whose step's commit was lost (README,
/// Guarantees: such commits should not allocate). brk is raised over such an arena's range and
/// reserve, so that brk does not hand out their pages a second time and the zeroing beyond brk
/// spares what the Partition commit wrote; a range whose words make no sense is emptied.
fn claim_arenas(heap: &Heap) {
    let brk = heap.load_word(BRK_OFF);
    if brk < DATA_START {
        return;
    }
    let mut claimed = brk;
    for a in 0..ARENAS {
        for range in [arena_off(a), arena_off(a) + 16] {
            let (from, end) = (heap.load_word(range), heap.load_word(range + 8));
            if from == 0 && end == 0 {
                continue;
            }
            if from < DATA_START || from > end || end > heap.capacity() {
                heap.store_word(range, 0);
                heap.store_word(range + 8, 0);
                heap.stamp_dirty(range, 16, 1);
            } else {
                claimed = claimed.max(end);
            }
        }
    }
    if claimed > brk {
        heap.store_word(BRK_OFF, claimed);
        heap.stamp_dirty(BRK_OFF, 8, 1);
    }
}

/// The same for the large-run arenas (`txn/src/alloc.rs`): an arena hands out its pages from
/// its next free byte to its end, and its reserve's, as zero, and a lost commit may have carved
/// a block there that a `Partition` record beyond the gap then wrote into. Zeroed up to
/// `written_to` as beyond brk.
fn zero_arena_tails(heap: &Heap, written_to: u64) {
    let brk = heap.load_word(BRK_OFF);
    for a in 0..ARENAS {
        for range in [arena_off(a), arena_off(a) + 16] {
            let (from, end) = (heap.load_word(range), heap.load_word(range + 8));
            if from >= DATA_START && from < end && end <= brk {
                zero_range(heap, from, end.min(written_to));
            }
        }
    }
}

/// Zeroes `[from, to)` (nothing when empty) and stamps it dirty, so that the next checkpoint
/// keeps the zeros (a chunk in the range may have come from the checkpoint as it was).
fn zero_range(heap: &Heap, from: u64, to: u64) {
    if to <= from {
        return;
    }
    let zeros = vec![0u8; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64);
        heap.write_bytes(at, &zeros[..n as usize]);
        at += n;
    }
    heap.stamp_dirty(from, to - from, 1);
}

/// Applies `records` (in LSN order) on all cores (see [`crate::apply`]). Chunks written
/// are stamped dirty (epoch 1) at the end, so the next checkpoint rewrites exactly them.
/// Returns the end of the last chunk written (0 when none was).
fn apply_parallel(
    scan: &Scan,
    records: &[RecordRef],
    heap: &Heap,
    chunk_size: u64,
    chunk_lsn: impl Fn(u64) -> u64,
) -> Result<u64, RecoveryError> {
    let chunks = heap.capacity().div_ceil(chunk_size);
    let lsns: Vec<u64> = (0..chunks).map(chunk_lsn).collect();
    let bucketed = Bucketed::new(records.len(), record_writes(scan, records), heap.capacity(), chunk_size, &lsns, region_bytes(chunk_size)).map_err(|unappliable| {
        let r = &records[unappliable.record()];
        let path = scan.segments[r.segment as usize].path.clone();
        match unappliable {
            Unappliable::TooFar { needed, .. } => {
                RecoveryError::CapacityTooSmall { path, offset: r.offset() as u64, needed, capacity: heap.capacity() }
            }
            // The scan checked the record's checksum, not its write list (see `scan_frame`):
            // these are the bytes the writer wrote, so this is no torn tail.
            Unappliable::Malformed { reason, .. } => RecoveryError::Corrupt {
                kind: FileKind::LogSegment,
                path,
                offset: Some(r.offset() as u64),
                reason: format!("{reason} (its checksum matches)"),
            },
        }
    })?;
    let touched = bucketed.write_into(heap);
    Ok(stamp_written(heap, &touched, chunk_size))
}

/// Stamps the chunks the replay wrote (`touched`) dirty (epoch 1), so the next checkpoint
/// rewrites exactly them; returns the end of the last one (0 when none was). One page per
/// chunk: the checkpointer takes a chunk with any page above its last epoch as changed, and
/// snapshots and mirrors start with a whole copy, so the other pages' stamps told nobody
/// anything, while stamping every page of every chunk a log touched cost a reopen on demand
/// time in the heap's size (a 16 GiB heap's 4 M stamps and 32 MiB of epoch words).
fn stamp_written(heap: &Heap, touched: &[bool], chunk_size: u64) -> u64 {
    let mut written_to = 0;
    for (chunk, _) in touched.iter().enumerate().filter(|(_, &t)| t) {
        let start = chunk as u64 * chunk_size;
        let len = chunk_size.min(heap.capacity() - start);
        heap.stamp_dirty(start, PAGE_SIZE.min(len), 1);
        written_to = start + len;
    }
    written_to
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arena or a reserve brought back past brk (its step's commit lost, a Partition take
    /// of it replayed) is claimed by raising brk to its end, so brk cannot hand its pages out
    /// again and the zeroing beyond brk spares them; a range whose words make no sense is
    /// emptied; a sound one below brk is left as it is.
    #[test]
    fn arenas_past_brk_are_claimed_and_nonsense_emptied() {
        let heap = Heap::new(1 << 24).unwrap();
        let brk = DATA_START + (1 << 20);
        heap.store_word(BRK_OFF, brk);
        let words = |a: u64, next: u64, end: u64| {
            heap.store_word(arena_off(a), next);
            heap.store_word(arena_off(a) + 8, end);
        };
        let reserve = |a: u64, from: u64, end: u64| {
            heap.store_word(arena_off(a) + 16, from);
            heap.store_word(arena_off(a) + 24, end);
        };
        words(0, DATA_START + 4096, DATA_START + 8192);
        words(1, brk + 4096, brk + (1 << 19));
        words(2, brk + 8192, brk + 4096);
        words(3, DATA_START + 8192, DATA_START + 12288);
        reserve(3, brk + (1 << 19), brk + (1 << 20));
        reserve(4, DATA_START - 4096, DATA_START + 4096);
        claim_arenas(&heap);
        let read = |a: u64, at: u64| (heap.load_word(arena_off(a) + at), heap.load_word(arena_off(a) + at + 8));
        assert_eq!(heap.load_word(BRK_OFF), brk + (1 << 20), "brk covers arena 1 and arena 3's reserve");
        assert_eq!(read(0, 0), (DATA_START + 4096, DATA_START + 8192));
        assert_eq!(read(1, 0), (brk + 4096, brk + (1 << 19)));
        assert_eq!(read(2, 0), (0, 0), "next past end: emptied");
        assert_eq!((read(3, 0), read(3, 16)), ((DATA_START + 8192, DATA_START + 12288), (brk + (1 << 19), brk + (1 << 20))));
        assert_eq!(read(4, 16), (0, 0), "a reserve below the data: emptied");
    }
}
