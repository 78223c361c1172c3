//! Damaged logs: a torn tail is cut off and reported and everything before it recovered;
//! damage anywhere else refuses to open with `Error::Corrupt` naming the file and the
//! record's offset; an LSN gap stops replay, Partition-flagged records beyond it are applied,
//! and the recovery marker keeps later opens identical without swallowing new commits.

mod common;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::Scope;
use std::time::Duration;

use common::{flush_end, partition_of_lsn, records, segments, small_opts, Rec};
use tusk::{Commit, Error, FaultPlan, FileKind, HeapPtr, Io, Lsn, Options, Store};

const SLOTS: u64 = 32;

fn setup(store: &Store) -> HeapPtr {
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(SLOTS * 8)?;
            tx.set_root("slots", p)?;
            Ok(p)
        })
        .unwrap()
        .0
}

fn slots(store: &Store) -> Vec<u64> {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root("slots")?.expect("slots root");
            (0..SLOTS).map(|i| tx.read_u64_at(p, 8 * i)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap()
        .0
}

fn put(store: &Store, p: HeapPtr, slot: u64, value: u64, mode: Commit) -> Lsn {
    store.transact(mode, |tx| tx.write_u64_at(p, 8 * slot, value)).unwrap().1.unwrap()
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

fn truncate(path: &Path, len: u64) {
    OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    OpenOptions::new().write(true).open(path).unwrap().write_all_at(bytes, at).unwrap();
}

fn flip(path: &Path, at: u64) {
    let mut data = std::fs::read(path).unwrap();
    data[at as usize] ^= 0x40;
    std::fs::write(path, data).unwrap();
}

/// A store with the slots and `n` Sync commits (slot i = 1000 + i), closed. Returns the
/// commits' LSNs.
fn store_with_commits(dir: &Path, opts: &Options, n: u64) -> Vec<Lsn> {
    let store = Store::open(dir, opts.clone()).unwrap();
    let p = setup(&store);
    let lsns = (0..n).map(|i| put(&store, p, i % SLOTS, 1000 + i, Commit::Sync)).collect();
    store.close().unwrap();
    lsns
}

fn expected_slots(n: u64) -> Vec<u64> {
    let mut want = vec![0; SLOTS as usize];
    for i in 0..n {
        want[(i % SLOTS) as usize] = 1000 + i;
    }
    want
}

// ---------------------------------------------------------------- (a) torn tails

#[derive(Clone, Copy, Debug)]
enum Tear {
    /// Random bytes after the last record.
    Garbage,
    /// The last record cut in the middle of its payload.
    CutRecord,
    /// The last record cut inside its frame header.
    CutHeader,
    /// The last record's payload damaged (its write did not complete).
    DamagedLastRecord,
}

#[test]
fn torn_tail_is_cut_and_reported() {
    for tear in [Tear::Garbage, Tear::CutRecord, Tear::CutHeader, Tear::DamagedLastRecord] {
        let dir = tempfile::tempdir().unwrap();
        let opts = small_opts();
        let n = 20;
        let lsns = store_with_commits(dir.path(), &opts, n);
        let last_seg = segments(dir.path(), 0).last().cloned().expect("a segment");
        let recs = records(&last_seg);
        let last_rec = *recs.last().unwrap();
        assert_eq!(last_rec.lsn, *lsns.last().unwrap());
        let len = flush_end(&last_seg);
        // Every flush is closed by a pad frame up to a 4 KiB boundary (O_DIRECT); zeros
        // written ahead of the flushes may follow.
        let pad = len - (last_rec.offset + last_rec.len);
        assert!(pad > 0 && len.is_multiple_of(4096), "the last flush ends with a pad: {pad} bytes, flush end {len}");

        // (where the damage starts, whether the last commit survives)
        let (torn_at, last_survives) = match tear {
            Tear::Garbage => {
                let garbage: Vec<u8> = (0..37u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 | 1).collect();
                write_at(&last_seg, len, &garbage);
                (len, true)
            }
            Tear::CutRecord => {
                truncate(&last_seg, last_rec.offset + last_rec.len / 2);
                (last_rec.offset, false)
            }
            Tear::CutHeader => {
                truncate(&last_seg, last_rec.offset + 10);
                (last_rec.offset, false)
            }
            Tear::DamagedLastRecord => {
                flip(&last_seg, last_rec.offset + 24);
                (last_rec.offset, false)
            }
        };
        // Everything from the damage to the end of the file is cut.
        let cut = file_len(&last_seg) - torn_at;

        let store = Store::open(dir.path(), opts.clone()).unwrap_or_else(|e| panic!("{tear:?}: open failed: {e}"));
        let report = store.recovery_report().clone();
        assert_eq!(report.torn_tails.len(), 1, "{tear:?}: {report:?}");
        let torn = &report.torn_tails[0];
        assert_eq!(torn.path, last_seg, "{tear:?}");
        assert_eq!(torn.offset, torn_at, "{tear:?}");
        assert_eq!(torn.bytes, cut, "{tear:?}");
        assert!(!torn.reason.is_empty());
        assert_eq!(report.gap_at, None);
        let survivors = if last_survives { n } else { n - 1 };
        let want_lsn = if last_survives { lsns[n as usize - 1] } else { lsns[n as usize - 2] };
        assert_eq!(report.recovered_lsn, want_lsn, "{tear:?}: {report:?}");
        assert_eq!(slots(&store), expected_slots(survivors), "{tear:?}: every complete record before the tear is recovered");

        // The store goes on after the repair; a later open sees a clean log.
        let p = store.transact(Commit::Async, |tx| tx.root("slots")).unwrap().0.unwrap();
        let next = put(&store, p, SLOTS - 1, 77, Commit::Sync);
        assert_eq!(next, want_lsn + 1, "{tear:?}: LSNs continue after the recovered ones");
        // The cut is made beside the store's first moments, and always before the log's next
        // segment (which the commit above needed).
        assert_eq!(file_len(&last_seg), torn_at, "{tear:?}: the torn tail is cut off on disk");
        store.close().unwrap();
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        let report = store.recovery_report();
        assert!(report.torn_tails.is_empty(), "{tear:?}: {report:?}");
        assert_eq!(report.recovered_lsn, next);
        let mut want = expected_slots(survivors);
        want[SLOTS as usize - 1] = 77;
        assert_eq!(slots(&store), want, "{tear:?}");
        store.close().unwrap();
    }
}

/// Zeros after the last flush of a partition's last segment are the space the writer wrote
/// ahead of its flushes: not a tear, nothing is reported or lost, and opening cuts them off.
#[test]
fn zeros_after_the_last_flush_are_no_tear() {
    for extra in [0usize, 4096, 64 << 10] {
        let dir = tempfile::tempdir().unwrap();
        let opts = small_opts();
        let n = 20;
        let lsns = store_with_commits(dir.path(), &opts, n);
        let last_seg = segments(dir.path(), 0).last().cloned().expect("a segment");
        let end = flush_end(&last_seg);
        write_at(&last_seg, file_len(&last_seg), &vec![0u8; extra]);
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        let report = store.recovery_report().clone();
        assert!(report.torn_tails.is_empty(), "{extra} zeros: {report:?}");
        assert_eq!(report.recovered_lsn, *lsns.last().unwrap());
        assert_eq!(slots(&store), expected_slots(n));
        store.close().unwrap();
        assert_eq!(file_len(&last_seg), end, "opening cuts the zeros off, by the close at the latest");
    }
}

/// The writer cuts the zeros off a segment before it starts the next one: zeros to the end
/// of a segment that is not its partition's last are damage, named with file and offset.
#[test]
fn zeros_at_the_end_of_an_earlier_segment_are_damage() {
    let dir = tempfile::tempdir().unwrap();
    let opts = small_opts();
    store_with_commits(dir.path(), &opts, 5);
    let segs = segments(dir.path(), 0);
    let last = segs.last().unwrap();
    let end = flush_end(last);
    write_at(last, file_len(last), &[0u8; 8192]);
    let name = last.file_name().unwrap().to_str().unwrap();
    let seq: u64 = name.strip_suffix(".seg").unwrap().parse().unwrap();
    let next = last.with_file_name(format!("{:020}.seg", seq + 1));
    std::fs::write(&next, []).unwrap();
    let err = Store::open(dir.path(), opts.clone()).err().expect("zeros ending an earlier segment are damage");
    let text = err.to_string();
    assert!(text.contains(&last.display().to_string()) && text.contains(&end.to_string()), "{text}");
}

/// A segment created just before a crash, whose header never reached the disk, is a torn
/// tail too: it is reported and removed.
#[test]
fn empty_last_segment_is_a_torn_tail() {
    for contents in [&[][..], &[0u8; 32][..], &[0u8; 7][..]] {
        let dir = tempfile::tempdir().unwrap();
        let opts = small_opts();
        store_with_commits(dir.path(), &opts, 5);
        let segs = segments(dir.path(), 0);
        let last = segs.last().unwrap();
        // As the writer does before it starts a segment: the zeros ahead are cut off.
        truncate(last, flush_end(last));
        let name = last.file_name().unwrap().to_str().unwrap();
        let seq: u64 = name.strip_suffix(".seg").unwrap().parse().unwrap();
        let extra = last.with_file_name(format!("{:020}.seg", seq + 1));
        std::fs::write(&extra, contents).unwrap();

        let store = Store::open(dir.path(), opts.clone()).unwrap();
        let report = store.recovery_report().clone();
        assert_eq!(report.torn_tails.len(), 1, "{report:?}");
        assert_eq!(report.torn_tails[0].path, extra);
        assert_eq!(report.torn_tails[0].offset, 0);
        assert_eq!(report.torn_tails[0].bytes, contents.len() as u64);
        assert_eq!(slots(&store), expected_slots(5));
        store.close().unwrap();
        assert!(!extra.exists(), "the headerless segment is removed, by the close at the latest");
    }
}

// ---------------------------------------------------------------- (b) damage elsewhere

fn expect_corrupt(dir: &Path, opts: &Options, path: &Path, offset: u64, what: &str) {
    for attempt in 0..2 {
        let err = Store::open(dir, opts.clone()).err().unwrap_or_else(|| panic!("{what}: opening a damaged log must fail"));
        match &err {
            Error::Corrupt { kind, path: p, offset: o, reason } => {
                assert_eq!(*kind, FileKind::LogSegment, "{what}: {err}");
                assert_eq!(p, path, "{what}: {err}");
                assert_eq!(*o, Some(offset), "{what}: {err}");
                assert!(!reason.is_empty());
                // The message: the file kind, the path once, the offset, what is wrong, and
                // what tusk did.
                let message = err.to_string();
                let head = format!("log segment {}, offset {offset}: ", path.display());
                assert!(message.starts_with(&head), "{what}: {message}");
                assert_eq!(message.matches(&path.display().to_string()).count(), 1, "{what}: the path once: {message}");
                assert!(message.ends_with("; refused to open the store"), "{what}: {message}");
            }
            other => panic!("{what} (attempt {attempt}): expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn damage_in_the_middle_of_the_last_segment_is_an_error() {
    let opts = small_opts();
    let n = 20;
    // Field offsets inside a record: magic, payload length, checksum, LSN, partition,
    // write count, the first write's heap offset, and the payload's last byte.
    for field in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        store_with_commits(dir.path(), &opts, n);
        let seg = segments(dir.path(), 0).last().cloned().unwrap();
        let recs = records(&seg);
        assert!(recs.len() as u64 >= n + 2, "format, setup and the commits share the segment");
        let victim = recs[4];
        let data = std::fs::read(&seg).unwrap();
        let payload_len = u32::from_le_bytes(data[victim.offset as usize + 4..][..4].try_into().unwrap()) as u64;
        let at = victim.offset
            + match field {
                0 => 0,
                1 => 4,
                2 => 8,
                3 => 16,
                4 => 24,
                5 => 32,
                6 => 36,
                _ => 16 + payload_len - 1,
            };
        flip(&seg, at);
        let before = std::fs::read(&seg).unwrap();
        expect_corrupt(dir.path(), &opts, &seg, victim.offset, &format!("byte {at} (field {field}) of the record at {}", victim.offset));
        assert_eq!(std::fs::read(&seg).unwrap(), before, "a failed open must not change the damaged file");
    }
}

/// A record whose checksum matches but whose write list does not hold its count of writes
/// (what only a writer bug could leave): recovery refuses to open the store, naming the
/// segment and the record, whether the record is in the middle or at the very end of the log
/// (its checksum rules out a torn write, so it is not cut as a torn tail).
#[test]
fn a_record_with_a_valid_checksum_and_a_malformed_write_list_is_an_error() {
    let opts = small_opts();
    for middle in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        store_with_commits(dir.path(), &opts, 20);
        let seg = segments(dir.path(), 0).last().cloned().unwrap();
        let recs = records(&seg);
        let victim = if middle { recs[recs.len() / 2] } else { *recs.last().unwrap() };
        let mut data = std::fs::read(&seg).unwrap();
        let at = victim.offset as usize;
        // Frame header (16 bytes), LSN (8), flags (1), partition 0 (one varint byte), then
        // the write count (one varint byte below 128): one write more than the list holds.
        let count_at = at + 26;
        assert!(data[count_at] < 127, "a one-byte count");
        data[count_at] += 1;
        let len = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()) as usize;
        let crc = crc32fast::hash(&data[at + 16..at + 16 + len]);
        data[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&seg, &data).unwrap();
        let what = if middle { "malformed record in the middle" } else { "malformed last record" };
        expect_corrupt(dir.path(), &opts, &seg, victim.offset, what);
        let message = Store::open(dir.path(), opts.clone()).err().unwrap().to_string();
        assert!(message.contains("write runs past the record (its checksum matches)"), "{what}: {message}");
        assert!(std::fs::read(&seg).unwrap() == data, "{what}: a failed open must not change the file");
    }
}

#[test]
fn damage_in_an_earlier_segment_is_an_error() {
    // Small segments and 4 KiB records: several segments per partition.
    let opts = Options { segment_bytes: 64 << 10, ..small_opts() };
    let write_pages = |dir: &Path| {
        let store = Store::open(dir, opts.clone()).unwrap();
        let p = store
            .transact(Commit::Sync, |tx| {
                let p = tx.alloc(4096)?;
                tx.set_root("page", p)?;
                Ok(p)
            })
            .unwrap()
            .0;
        for i in 0..40u8 {
            store.transact(Commit::Sync, |tx| tx.write(p, &[i; 4096])).unwrap();
        }
        store.close().unwrap();
    };
    for case in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        write_pages(dir.path());
        let segs = segments(dir.path(), 0);
        assert!(segs.len() >= 3, "expected several segments, got {}", segs.len());
        let first = &segs[0];
        let recs: Vec<Rec> = records(first);
        let last_rec = *recs.last().unwrap();
        let (offset, what) = match case {
            0 => {
                // The last record of a segment that is not the partition's last: no torn
                // tail is possible there.
                flip(first, last_rec.offset + 20);
                (last_rec.offset, "last record of the first segment damaged")
            }
            1 => {
                truncate(first, last_rec.offset + last_rec.len / 2);
                (last_rec.offset, "first segment cut inside its last record")
            }
            2 => {
                // Flushes end with a pad to a 4 KiB boundary: the garbage starts at the file's end.
                let end = file_len(first);
                assert_eq!(end, flush_end(first), "an earlier segment ends with its last flush");
                write_at(first, end, &[0xAB; 40]);
                (end, "garbage after the first segment's records")
            }
            _ => {
                flip(&segs[1], 3);
                (0, "the second segment's header damaged")
            }
        };
        let path = if case == 3 { segs[1].clone() } else { first.clone() };
        expect_corrupt(dir.path(), &opts, &path, offset, what);
    }
}

// ---------------------------------------------------------------- (c) gaps

type Job<'a> = Box<dyn FnOnce() + Send + 'a>;

/// A thread that runs closures on request (its log partition is fixed for its life).
struct Worker<'a> {
    jobs: mpsc::Sender<Job<'a>>,
}

impl<'a> Worker<'a> {
    fn spawn<'env>(s: &'a Scope<'a, 'env>) -> Worker<'a> {
        let (jobs, rx) = mpsc::channel::<Job<'a>>();
        s.spawn(move || {
            for job in rx {
                job();
            }
        });
        Worker { jobs }
    }

    fn run<R: Send + 'a>(&self, f: impl FnOnce() -> R + Send + 'a) -> R {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .unwrap();
        rx.recv().expect("the worker panicked")
    }
}

/// Spawns threads until one appends its `Async` commits to log partition 0 and one to
/// partition 1 (of 2). (Commits that wait append to partition 0 whatever their thread.)
fn workers_per_partition<'a, 'env>(s: &'a Scope<'a, 'env>, store: &'a Store, dir: &Path, probe: HeapPtr) -> [Worker<'a>; 2] {
    let mut found: [Option<Worker<'a>>; 2] = [None, None];
    for i in 0..64u64 {
        let w = Worker::spawn(s);
        let lsn = w.run(move || put(store, probe, 0, i, Commit::Async));
        assert!(store.is_stable(lsn, true), "the probe's record becomes durable");
        let part = partition_of_lsn(dir, 2, lsn).expect("the probe's record is on disk") as usize;
        if found[part].is_none() {
            found[part] = Some(w);
        }
        if found.iter().all(Option::is_some) {
            return found.map(Option::unwrap);
        }
    }
    panic!("no thread landed on one of the two partitions");
}

/// Cuts partition 1's last record, LSN `g` (an Async commit of partition 1's thread), from the
/// closed store's log and reopens it: recovery finds a gap at `g` and applies the one
/// Partition record beyond it (in partition 0, where commits that wait append).
fn reopen_with_partition_1_cut_at(dir: &Path, opts: Options, g: u64) -> Store {
    let seg1 = segments(dir, 1).last().cloned().unwrap();
    let victim = *records(&seg1).last().unwrap();
    assert_eq!(victim.lsn, g, "LSN {g} is partition 1's last record");
    truncate(&seg1, victim.offset);
    let store = Store::open(dir, opts).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(report.gap_at, Some(g), "{report:?}");
    assert_eq!(report.partition_records_after_gap, 1, "{report:?}");
    store
}

fn probe_alloc(store: &Store) -> HeapPtr {
    alloc_under_root(store, "probe", 8, Commit::Sync).0
}

/// Allocates `len` bytes under the root `root` in a commit of `mode`: the block and the LSN.
fn alloc_under_root(store: &Store, root: &str, len: u64, mode: Commit) -> (HeapPtr, Option<u64>) {
    store
        .transact(mode, |tx| {
            let p = tx.alloc(len)?;
            tx.set_root(root, p)?;
            Ok(p)
        })
        .unwrap()
}

fn all_records(dir: &Path, partitions: u32) -> Vec<(PathBuf, Rec)> {
    let mut out = Vec::new();
    for p in 0..partitions {
        for seg in segments(dir, p) {
            out.extend(records(&seg).into_iter().map(|r| (seg.clone(), r)));
        }
    }
    out
}

/// After a first recovery that found a gap: new commits from several threads (all modes),
/// a crash, and two more opens that must see the marker, agree with the first recovery and
/// keep every new commit.
fn commits_after_gap_survive(dir: &Path, opts: &Options, after_first: Vec<u64>, marker_lsn: Lsn) {
    let store = Store::open(dir, opts.clone()).unwrap();
    assert_eq!(slots(&store), after_first);
    let p = store.transact(Commit::Async, |tx| tx.root("slots")).unwrap().0.unwrap();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0..4u64 {
                    let mode = [Commit::Async, Commit::Sync, Commit::Partition][((t + i) % 3) as usize];
                    let lsn = put(store, p, 16 + t * 4 + i, 5000 + t * 10 + i, mode);
                    assert!(lsn > marker_lsn, "a new commit took LSN {lsn} at or below the marker {marker_lsn}");
                }
            });
        }
    });
    let last = put(&store, p, 31, 9999, Commit::Sync);
    store.crash();

    let mut want = after_first;
    for t in 0..3u64 {
        for i in 0..4u64 {
            want[(16 + t * 4 + i) as usize] = 5000 + t * 10 + i;
        }
    }
    want[31] = 9999;
    for round in 0..2 {
        let store = Store::open(dir, opts.clone()).unwrap();
        let report = store.recovery_report().clone();
        assert_eq!(report.gap_at, None, "round {round}: the marker resolves the old gap: {report:?}");
        assert_eq!(report.marker_needed, None, "round {round}: {report:?}");
        assert_eq!(report.lost_after_gap, 0, "round {round}: {report:?}");
        assert_eq!(report.recovered_lsn, last, "round {round}: {report:?}");
        assert_eq!(slots(&store), want, "round {round}: state after the second recovery");
        store.close().unwrap();
    }
}

/// Two partitions; a partition's log is cut back so that an LSN in the middle disappears
/// while higher LSNs remain in the other partition.
#[test]
fn gap_from_a_truncated_partition() {
    gap_from_cut_partition(false);
}

/// The same, with the missing record torn (half written) rather than cut cleanly.
#[test]
fn gap_from_a_torn_partition_tail() {
    gap_from_cut_partition(true);
}

fn gap_from_cut_partition(torn: bool) {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { log_partitions: 2, ..small_opts() };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let p = setup(&store);
    for i in 0..8 {
        put(&store, p, i, 100 + i, Commit::Sync);
    }
    let probe = probe_alloc(&store);
    let (g, tail) = std::thread::scope(|s| {
        let [w0, w1] = workers_per_partition(s, &store, dir.path(), probe);
        let store = &store;
        // The victim, on partition 1; everything after it goes to partition 0.
        let g = w1.run(move || put(store, p, 8, 808, Commit::Async));
        let tail = w0.run(move || {
            [
                (put(store, p, 9, 909, Commit::Partition), true),
                (put(store, p, 10, 1010, Commit::Sync), false),
                (put(store, p, 11, 1111, Commit::Partition), true),
                (put(store, p, 12, 1212, Commit::Async), false),
            ]
        });
        (g, tail)
    });
    assert_eq!(tail.iter().map(|t| t.0).collect::<Vec<_>>(), (g + 1..=g + 4).collect::<Vec<_>>());
    store.close().unwrap();

    // Cut partition 1 back to just before LSN g: its last record.
    let seg1 = segments(dir.path(), 1).last().cloned().unwrap();
    let recs = records(&seg1);
    let victim = *recs.last().unwrap();
    assert_eq!(victim.lsn, g, "LSN {g} is partition 1's last record");
    truncate(&seg1, if torn { victim.offset + victim.len / 2 } else { victim.offset });

    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(report.gap_at, Some(g), "{report:?}");
    assert_eq!(report.recovered_lsn, g - 1, "{report:?}");
    assert_eq!(report.max_lsn, g + 4, "{report:?}");
    assert_eq!(report.partition_records_after_gap, 2, "{report:?}");
    assert_eq!(report.lost_after_gap, 2, "{report:?}");
    assert_eq!(report.marker_needed, Some((g - 1, g + 4)), "{report:?}");
    if torn {
        assert_eq!(report.torn_tails.len(), 1, "{report:?}");
        assert_eq!((&report.torn_tails[0].path, report.torn_tails[0].offset), (&seg1, victim.offset));
        assert_eq!(file_len(&seg1), victim.offset);
    } else {
        assert!(report.torn_tails.is_empty(), "a cut at a record boundary is a clean end: {report:?}");
    }
    let mut want = vec![0u64; SLOTS as usize];
    for i in 0..8 {
        want[i as usize] = 100 + i;
    }
    want[9] = 909;
    want[11] = 1111;
    assert_eq!(slots(&store), want, "replay stops at the gap, Partition records beyond it are applied");
    let marker = store.last_lsn();
    assert_eq!(marker, g + 5, "the marker takes the LSN after the largest one in the log");
    store.close().unwrap();
    let on_disk = all_records(dir.path(), 2);
    let m: Vec<_> = on_disk.iter().filter(|(_, r)| r.marker).collect();
    assert_eq!(m.len(), 1, "one recovery marker on disk");
    assert_eq!(m[0].1.lsn, marker);

    commits_after_gap_survive(dir.path(), &opts, want, marker);
}

/// A large transaction runs in place; its record is Partition-flagged and lands beyond an LSN
/// gap. Replayed there, it must bring only the bytes it wrote: the other words of its lines
/// hold the lost transaction's writes in the heap it committed from, and must not come back
/// with it. (Its record used to hold its lines whole: `crashtest --txn-words 8000` found
/// lost words reappearing after a gap.)
#[test]
fn an_in_place_partition_record_beyond_a_gap_brings_only_its_own_writes() {
    const LINES: u64 = 5000;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { log_partitions: 2, ..small_opts() };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let big = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(LINES * 64)?;
            tx.set_root("big", p)?;
            Ok(p)
        })
        .unwrap()
        .0;
    let probe = probe_alloc(&store);
    let g = std::thread::scope(|s| {
        let [w0, w1] = workers_per_partition(s, &store, dir.path(), probe);
        let store = &store;
        // The victim: words 1 and 2 of the first lines, on partition 1.
        let g = w1.run(move || {
            let (_, lsn) = store
                .transact(Commit::Async, |tx| (0..8).try_for_each(|l| tx.write_at(big, 64 * l + 8, &[808u64.to_le_bytes(), 808u64.to_le_bytes()].concat())))
                .unwrap();
            lsn.unwrap()
        });
        w0.run(move || {
            let (in_place, lsn) = store
                .transact(Commit::Partition, |tx| {
                    for l in 0..LINES {
                        tx.write_u64_at(big, 64 * l, 909)?;
                    }
                    tx.write_at(big, 64 * 3 + 17, &[0xAB, 0xCD, 0xEF])?;
                    Ok(tx.is_in_place())
                })
                .unwrap();
            assert!(in_place, "{LINES} lines run in place");
            assert!(lsn.unwrap() > g);
        });
        g
    });
    store.close().unwrap();
    let store = reopen_with_partition_1_cut_at(dir.path(), opts, g);
    let words = store
        .transact(Commit::Async, |tx| (0..LINES * 8).map(|w| tx.read_u64_at(big, 8 * w)).collect::<Result<Vec<u64>, _>>())
        .unwrap()
        .0;
    for l in 0..LINES as usize {
        let mut want = [909, 0, 0, 0, 0, 0, 0, 0];
        if l == 3 {
            want[2] = 0xEF_CD_AB_00;
        }
        assert_eq!(words[8 * l..8 * l + 8], want, "line {l}: the Partition record's writes, and nothing of the lost one");
    }
    store.close().unwrap();
}

/// The same gap made by the log itself: an Async commit on partition 1 stays buffered,
/// partition 0's flush succeeds and its next one fails (fault injection; partitions flush
/// independently), so the Async commit on partition 1 is lost while a later Async and a
/// Partition commit on partition 0 reach the disk.
#[test]
fn gap_from_a_failed_partition_flush() {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new();
    let opts = Options {
        log_partitions: 2,
        io: Io::Faulty(plan.clone()),
        // Only commits that wait kick the writer: Async records stay buffered.
        group_commit_interval: Duration::from_secs(3600),
        ..small_opts()
    };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let p = setup(&store);
    for i in 0..8 {
        put(&store, p, i, 100 + i, Commit::Sync);
    }
    let probe = probe_alloc(&store);
    let (g, y) = std::thread::scope(|s| {
        let [w0, w1] = workers_per_partition(s, &store, dir.path(), probe);
        let store = &store;
        std::thread::sleep(Duration::from_millis(20));
        let g = w1.run(move || put(store, p, 8, 808, Commit::Async));
        let z = w0.run(move || put(store, p, 9, 909, Commit::Async));
        assert_eq!(z, g + 1);
        assert!(store.durable_lsn() < g, "the Async commits must still be buffered");
        // The next flush (partition 0's, led by this Partition commit) succeeds; the one
        // after it (partition 0's again, led by the next, whose thread's own partition is 1:
        // commits that wait append to partition 0) fails.
        plan.fail_after(1, libc::EIO);
        let y = w0.run(move || store.transact(Commit::Partition, |tx| tx.write_u64_at(p, 8 * 10, 1010)));
        let failed = w1.run(move || store.transact(Commit::Partition, |tx| tx.write_u64_at(p, 8 * 11, 1111)));
        assert!(matches!(failed, Err(Error::LogFailed(_))), "{failed:?}");
        (g, y)
    });
    let (_, y) = y.expect("the Partition commit's own partition was written");
    assert_eq!(y, Some(g + 2));
    assert_eq!(plan.failures(), 1);
    let err = store.transact(Commit::Async, |tx| tx.write_u64_at(p, 0, 1)).unwrap_err();
    assert!(matches!(err, Error::LogFailed(_)), "{err:?}");
    assert!(store.durable_lsn() < g);
    assert!(matches!(store.close(), Err(Error::LogFailed(_))));

    let opts = Options { io: Io::Auto, group_commit_interval: Duration::from_millis(1), ..opts };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(report.gap_at, Some(g), "{report:?}");
    assert_eq!(report.recovered_lsn, g - 1, "{report:?}");
    assert_eq!(report.partition_records_after_gap, 1, "{report:?}");
    assert_eq!(report.lost_after_gap, 1, "{report:?}");
    let mut want = vec![0u64; SLOTS as usize];
    for i in 0..8 {
        want[i as usize] = 100 + i;
    }
    want[10] = 1010;
    assert_eq!(slots(&store), want);
    let marker = store.last_lsn();
    assert_eq!(marker, g + 3);
    store.close().unwrap();

    commits_after_gap_survive(dir.path(), &opts, want, marker);
}

/// The arenas' form of the case below: a thread's arena took its step from brk in a durable
/// commit; a lost commit of the same thread carves a block from it, and a Partition record
/// beyond the gap writes into that block. The arena hands the block out again after recovery,
/// and it must read as zeros there too.
#[test]
fn an_arenas_free_pages_are_zero_after_a_partition_record_beyond_a_gap() {
    use tusk_storage::layout::ARENAS;
    const LEN: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { log_partitions: 2, ..small_opts() };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let probe = probe_alloc(&store);
    let (first, block, g) = std::thread::scope(|s| {
        let [w0, w1] = workers_per_partition(s, &store, dir.path(), probe);
        let store = &store;
        // Partition 1's thread: its arena's step, durable; then the victim (Async, on
        // partition 1) carves from it.
        let (first, _) = w1.run(move || alloc_under_root(store, "first", LEN, Commit::Sync));
        let (block, g) = w1.run(move || alloc_under_root(store, "block", LEN, Commit::Async));
        let g = g.unwrap();
        w0.run(move || {
            let (_, lsn) = store.transact(Commit::Partition, |tx| tx.write_at(block, 0, &[0x5A; LEN as usize])).unwrap();
            assert!(lsn.unwrap() > g);
        });
        (first, block, g)
    });
    assert_eq!(block.offset(), first.offset() + 2 * 4096, "the victim's block came from the same arena step");
    store.close().unwrap();
    let store = reopen_with_partition_1_cut_at(dir.path(), opts, g);
    let mut tx = store.begin();
    assert!(tx.root("first").unwrap().is_some() && tx.root("block").unwrap().is_none(), "only the victim is lost");
    tx.abort();
    // A thread whose arena is the victim's (threads take arenas in turn) is handed the block
    // again; its bytes must be zeros.
    let bytes = (0..2 * ARENAS)
        .find_map(|_| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut tx = store.begin();
                    let p = tx.alloc(LEN).unwrap();
                    let mut bytes = vec![0xFFu8; LEN as usize];
                    tx.read(p, &mut bytes).unwrap();
                    tx.abort();
                    (p == block).then_some(bytes)
                })
                .join()
                .unwrap()
            })
        })
        .expect("a thread of the victim's arena");
    assert!(bytes.iter().all(|&b| b == 0), "the arena's free pages hold the lost gap's bytes");
    store.close().unwrap();
}

/// A commit that took a block from brk is lost in a gap, and a `Partition` commit that wrote
/// into that block is replayed beyond it: its bytes land beyond brk as recovered. Memory
/// beyond brk is handed out as zero, so recovery zeroes it again: the next allocation from
/// brk (the same block) reads zeros, not the lost gap's bytes. (`checkpoint_model.rs` found
/// it as a reallocated region holding such a write.)
#[test]
fn memory_beyond_brk_is_zero_after_a_partition_record_beyond_a_gap() {
    const LEN: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { log_partitions: 2, ..small_opts() };
    let store = Store::open(dir.path(), opts.clone()).unwrap();
    let probe = probe_alloc(&store);
    let (g, block) = std::thread::scope(|s| {
        let [w0, w1] = workers_per_partition(s, &store, dir.path(), probe);
        let store = &store;
        // The victim, on partition 1: takes a block from brk.
        let (block, g) = w1.run(move || {
            let (block, lsn) = alloc_under_root(store, "block", LEN, Commit::Async);
            (block, lsn.unwrap())
        });
        // Beyond it, on partition 0: a Partition commit writes into that block.
        w0.run(move || {
            let (_, lsn) = store.transact(Commit::Partition, |tx| tx.write_at(block, 0, &[0x5A; LEN as usize])).unwrap();
            assert!(lsn.unwrap() > g);
        });
        (g, block)
    });
    store.close().unwrap();
    let store = reopen_with_partition_1_cut_at(dir.path(), opts, g);
    let (bytes, _) = store
        .transact(Commit::Sync, |tx| {
            assert_eq!(tx.root("block")?, None, "the victim is lost");
            let p = tx.alloc(LEN)?;
            assert_eq!(p, block, "brk hands out the same block again");
            let mut bytes = vec![0xFFu8; LEN as usize];
            tx.read_at(p, 0, &mut bytes)?;
            Ok(bytes)
        })
        .unwrap();
    assert!(bytes.iter().all(|&b| b == 0), "a new allocation holds the lost gap's bytes");
    store.close().unwrap();
}
