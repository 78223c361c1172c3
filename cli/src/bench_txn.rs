//! `tusk bench txn`: the Hathi workload. Each transaction reads and writes `words` random
//! 8-byte words of one allocation spanning `heap_mib` MiB; all threads run for `duration`
//! seconds. Reports throughput and commit latency (from the start of the transaction to the
//! return of its commit, retries included).
//!
//! For the modes that wait for the disk (partition, sync), each run is followed, on the same
//! file system, by the latency of one O_DIRECT append + fdatasync of the run's mean flush
//! size: the floor a commit that waits for its flush cannot go under. The ratio
//! p50(commit) / p50(write + fdatasync) is how far the log is from that floor.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, Durability, Options, Store};
use tusk_storage::log_format::FLUSH_ALIGN;

use super::report::{median, rate};
use super::{BenchDir, ChartedOutput, CliResult, IoAt, IoChoice};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Workload {
    /// 6 random 8-byte words read and written per transaction (Hathi, DaMoN 2012).
    Hathi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CommitChoice {
    Sync,
    Async,
    Partition,
    /// Async commits, with `is_stable(lsn, wait)` every 2 ms per thread.
    Split,
    /// No log at all (`Durability::Off`): the cost of the STM alone.
    Off,
    /// No log, but beside the workload one thread per log partition appends and fdatasyncs,
    /// with O_DIRECT, as many bytes as often as the round's `async` run flushed (list it
    /// after `async`): the cost of the log's disk I/O alone on this machine.
    OffIo,
    /// No transaction at all: the same words read and written with plain loads and stores
    /// of a heap of the same size, populated the same way. What the machine gives this
    /// access pattern, at each thread count: no STM can beat it, and its scaling bounds the
    /// STM's.
    Floor,
}

impl CommitChoice {
    fn name(self) -> &'static str {
        match self {
            CommitChoice::Sync => "sync",
            CommitChoice::Async => "async",
            CommitChoice::Partition => "partition",
            CommitChoice::Split => "split",
            CommitChoice::Off => "off",
            CommitChoice::OffIo => "off-io",
            CommitChoice::Floor => "floor",
        }
    }

    fn mode(self) -> Commit {
        match self {
            CommitChoice::Sync => Commit::Sync,
            CommitChoice::Partition => Commit::Partition,
            CommitChoice::Async | CommitChoice::Split | CommitChoice::Off | CommitChoice::OffIo | CommitChoice::Floor => Commit::Async,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct TxnArgs {
    #[arg(long, value_enum, default_value = "hathi")]
    workload: Workload,
    /// Committing threads; several (comma-separated, e.g. `1,64`) are run interleaved and
    /// their throughput ratio (most / fewest threads) reported per mode.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    threads: Vec<usize>,
    /// Commit mode; several (comma-separated) are run interleaved, `--rounds` times each,
    /// and reported with their ratios.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "async")]
    commit: Vec<CommitChoice>,
    /// Runs per commit mode (the median run is reported).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Size of the word array the transactions touch, in MiB.
    #[arg(long, default_value_t = 1024)]
    heap_mib: u64,
    /// Words read and written per transaction.
    #[arg(long, default_value_t = 6)]
    words: usize,
    #[command(flatten)]
    pub(super) out: ChartedOutput,
    #[arg(long, value_enum, default_value = "auto")]
    io: IoChoice,
    /// Log partitions (default: one per core).
    #[arg(long)]
    partitions: Option<usize>,
    /// Group-commit interval in microseconds (default: the library's).
    #[arg(long)]
    group_commit_us: Option<u64>,
    /// The log's space bound in MiB (`Options::max_log_bytes`; default: the library's). A
    /// checkpoint starts at half of it and commits stall near it until one trims the log, so
    /// a log written faster than checkpoints can copy the heap is throttled to their pace.
    #[arg(long)]
    max_log_mib: Option<u64>,
    /// Issue `Transaction::prefetch` for the words before touching them.
    #[arg(long)]
    prefetch: bool,
}

struct ThreadResult {
    commits: u64,
    attempts: u64,
    latency: Histogram<u64>,
}

impl ThreadResult {
    fn empty() -> ThreadResult {
        ThreadResult { commits: 0, attempts: 0, latency: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds") }
    }

    /// Adds one thread's result to this total.
    fn add(&mut self, r: ThreadResult) -> Result<(), hdrhistogram::errors::AdditionError> {
        self.commits += r.commits;
        self.attempts += r.attempts;
        self.latency.add(&r.latency)
    }
}

/// Bounds of each half of the write + fdatasync probe.
const PROBE_MIN_WRITES: u32 = 25;
const PROBE_MAX_WRITES: u32 = 150;
const PROBE_TIME: Duration = Duration::from_millis(250);
/// Space the overwrite probe preallocates and cycles through (the log's zero-ahead span).
const PROBE_OVERWRITE_SPAN: usize = tusk_storage::log_format::ZERO_AHEAD as usize;

/// Records into `latency` the time of O_DIRECT appends of `size` bytes, each followed by
/// fdatasync, to a fresh file in `dir`: what one log flush of that size costs this file
/// system without the log around it (the log's flushes are appends to a segment file too).
/// A run takes half its probe just before the store opens and half just after it closes,
/// so that both see the disk as the run did (the machine's other I/O comes and goes); each
/// half starts with a syncfs, so that it does not wait for our own earlier writes.
/// With `overwrite`, the file is first written (zeros, fdatasync, untimed) over
/// [`PROBE_OVERWRITE_SPAN`] and the timed writes cycle through that allocated space: the cost
/// of a log flush into the segment's zero-ahead space (an in-place overwrite whose fdatasync
/// commits no file-system metadata), the fair floor once flushes no longer append.
fn probe_write_sync(dir: &Path, size: usize, overwrite: bool, latency: &mut Histogram<u64>) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::fd::AsRawFd;
    use tusk_storage::io::sync::{fdatasync, pwrite_all, sync_file_system};
    use tusk_storage::io::{open_direct, AlignedBuf};
    // The previous run's files were just deleted and this run's store just closed: let the
    // file system finish that work first, or the probe measures our own clean-up.
    sync_file_system(dir).at(dir)?;
    let path = dir.join("write-sync-probe.tmp");
    let _ = std::fs::remove_file(&path);
    let file = open_direct(&path, true).at(&path)?;
    let buf = super::patterned_buf(size);
    // Overwrite: how many writes of `size` fit the preallocated span (at least one).
    let span_writes = if overwrite { (PROBE_OVERWRITE_SPAN / size).max(1) as u64 } else { u64::MAX };
    if overwrite {
        let mut zeros = AlignedBuf::new();
        zeros.extend_zeros(size);
        for i in 0..span_writes {
            pwrite_all(file.as_raw_fd(), i * size as u64, zeros.as_slice()).at(&path)?;
        }
        fdatasync(file.as_raw_fd()).at(&path)?;
    }
    let started = Instant::now();
    let mut writes = 0u32;
    while writes < PROBE_MIN_WRITES || (writes < PROBE_MAX_WRITES && started.elapsed() < PROBE_TIME) {
        let offset = (writes as u64 % span_writes) * size as u64;
        let t = Instant::now();
        pwrite_all(file.as_raw_fd(), offset, buf.as_slice()).at(&path)?;
        fdatasync(file.as_raw_fd()).at(&path)?;
        latency.saturating_record(t.elapsed().as_nanos() as u64);
        writes += 1;
    }
    drop(file);
    std::fs::remove_file(&path).at(&path)?;
    Ok(())
}

/// The log I/O of an `async` run, replayed beside an `off-io` run.
#[derive(Clone, Copy, Debug)]
struct LogIo {
    partitions: usize,
    /// Mean bytes per flush (a multiple of the O_DIRECT block).
    flush_bytes: usize,
    /// Flushes per second of each partition.
    flushes_per_s: f64,
}

/// Until `stop`: one thread per partition appends `flush_bytes` with O_DIRECT to its own
/// file in `dir` and fdatasyncs it, `flushes_per_s` times a second (what the log writer
/// does for `Async` commits, without the log). Returns the flushes done.
fn replay_log_io(dir: &Path, io: LogIo, stop: &AtomicBool) -> Result<u64, String> {
    use std::os::fd::AsRawFd;
    use tusk_storage::io::sync::{fdatasync, pwrite_all};
    use tusk_storage::io::open_direct;
    let interval = Duration::from_secs_f64(1.0 / io.flushes_per_s.max(1.0));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..io.partitions)
            .map(|p| {
                s.spawn(move || -> Result<u64, String> {
                    let path = dir.join(format!("log-io-{p}.tmp"));
                    let file = open_direct(&path, true).map_err(|e| format!("{}: {e}", path.display()))?;
                    let buf = super::patterned_buf(io.flush_bytes);
                    let (mut flushes, mut next) = (0u64, Instant::now());
                    while !stop.load(Ordering::Relaxed) {
                        next += interval;
                        if let Some(wait) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let offset = flushes * io.flush_bytes as u64;
                        pwrite_all(file.as_raw_fd(), offset, buf.as_slice())
                            .and_then(|()| fdatasync(file.as_raw_fd()))
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                        flushes += 1;
                    }
                    drop(file);
                    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                    Ok(flushes)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("log I/O thread panicked")).sum()
    })
}

/// One thread of a run until `stop`: draws `words` random word offsets below `words_total`
/// (seeded by the thread's number, so every mode sees the same words), runs `txn` on them
/// (which returns its attempts) and records its latency.
fn thread_loop(
    thread: usize,
    words: usize,
    words_total: u64,
    stop: &AtomicBool,
    mut txn: impl FnMut(&[u64]) -> Result<u64, tusk::Error>,
) -> Result<ThreadResult, tusk::Error> {
    let mut rng = SmallRng::seed_from_u64(0x7A5C + thread as u64);
    let mut result = ThreadResult::empty();
    let mut picks = vec![0u64; words];
    while !stop.load(Ordering::Relaxed) {
        for w in picks.iter_mut() {
            *w = rng.random_range(0..words_total) * 8;
        }
        let start = Instant::now();
        result.attempts += txn(&picks)?;
        result.latency.saturating_record(start.elapsed().as_nanos() as u64);
        result.commits += 1;
    }
    Ok(result)
}

/// `floor`: the workload on a bare heap of the run's size (a `Heap`, populated before the
/// clock starts, as the store's is), each word loaded and stored plainly: no transaction, no
/// stripe, no log.
fn run_floor(args: &TxnArgs, threads: usize) -> Result<ModeResult, Box<dyn std::error::Error>> {
    let bytes = args.heap_mib << 20;
    let heap = tusk_storage::Heap::new(bytes)?;
    heap.prefault(0, bytes);
    let (words_total, words, prefetch) = (bytes / 8, args.words, args.prefetch);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let (total, elapsed) = std::thread::scope(|s| -> Result<(ThreadResult, f64), Box<dyn std::error::Error>> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (heap, stop, barrier) = (&heap, &stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    thread_loop(t, words, words_total, stop, |picks| {
                        if prefetch {
                            for &off in picks {
                                heap.prefetch(off);
                            }
                        }
                        for &off in picks {
                            heap.store_word(off, heap.load_word(off) + 1);
                        }
                        Ok(1)
                    })
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(args.duration));
        stop.store(true, Ordering::Relaxed);
        let mut total = ThreadResult::empty();
        for h in handles {
            total.add(h.join().map_err(|_| "benchmark thread panicked")??)?;
        }
        Ok((total, started.elapsed().as_secs_f64()))
    })?;
    Ok(ModeResult {
        commit: CommitChoice::Floor,
        threads,
        txn_per_s: total.commits as f64 / elapsed,
        commits: total.commits,
        elapsed,
        p50_us: total.latency.value_at_quantile(0.50) as f64 / 1000.0,
        p99_us: total.latency.value_at_quantile(0.99) as f64 / 1000.0,
        abort_rate: 0.0,
        io: "none".into(),
        durable_lsn: 0,
        partitions: 0,
        flushes: 0,
        flush_write_us: None,
        checkpoints: 0,
        flush_bytes: 0,
        write_sync_us: None,
        floor_ratio: None,
        overwrite_sync_us: None,
        overwrite_ratio: None,
    })
}

/// One run of one commit mode on a fresh store (`log_io`: what `off-io` replays).
fn run_once(args: &TxnArgs, threads: usize, commit: CommitChoice, log_io: Option<LogIo>) -> Result<ModeResult, Box<dyn std::error::Error>> {
    if commit == CommitChoice::Floor {
        return run_floor(args, threads);
    }
    let dir = BenchDir::new(args.out.dir.clone())?;
    let waits_for_disk = matches!(commit, CommitChoice::Partition | CommitChoice::Sync);
    // Before the run the flush size is not known yet: the half taken then is of one O_DIRECT
    // block (the size of a flush of a few records) and counts only if the run's mean flush
    // size turns out to be that block.
    let mut probe = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut over_probe = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    if waits_for_disk {
        std::fs::create_dir_all(dir.path()).at(dir.path())?;
        probe_write_sync(dir.path(), FLUSH_ALIGN as usize, false, &mut probe)?;
        probe_write_sync(dir.path(), FLUSH_ALIGN as usize, true, &mut over_probe)?;
    }
    let mut options = Options {
        heap_capacity: (args.heap_mib + 64) << 20,
        io: args.io.to_io(),
        durability: if matches!(commit, CommitChoice::Off | CommitChoice::OffIo) { Durability::Off } else { Durability::On },
        ..Options::default()
    };
    if let Some(p) = args.partitions {
        options.log_partitions = p;
    }
    if let Some(us) = args.group_commit_us {
        options.group_commit_interval = Duration::from_micros(us);
    }
    if let Some(mib) = args.max_log_mib {
        options.max_log_bytes = mib << 20;
    }
    let partitions = options.log_partitions;
    let store = Arc::new(Store::open(dir.path(), options)?);
    let bytes = args.heap_mib << 20;
    let words_total = bytes / 8;
    let (array, _) = store.transact(Commit::Sync, |tx| {
        let p = tx.alloc(bytes)?;
        tx.set_root("hathi", p)?;
        Ok(p)
    })?;
    store.prefault();

    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, stop, barrier) = (store.clone(), stop.clone(), barrier.clone());
            let (mode, split, words, prefetch) =
                (commit.mode(), commit == CommitChoice::Split, args.words, args.prefetch);
            std::thread::spawn(move || -> Result<ThreadResult, tusk::Error> {
                let mut last_check = Instant::now();
                let mut last_lsn = 0;
                barrier.wait();
                thread_loop(t, words, words_total, &stop, |picks| {
                    let mut attempts = 0;
                    let (_, lsn) = store.transact(mode, |tx| {
                        attempts += 1;
                        if prefetch {
                            for &off in picks {
                                tx.prefetch(array, off);
                            }
                        }
                        for &off in picks {
                            let v = tx.read_u64_at(array, off)?;
                            tx.write_u64_at(array, off, v + 1)?;
                        }
                        Ok(())
                    })?;
                    last_lsn = lsn.unwrap_or(last_lsn);
                    if split && last_check.elapsed() >= Duration::from_millis(2) {
                        store.is_stable(last_lsn, true);
                        last_check = Instant::now();
                    }
                    Ok(attempts)
                })
            })
        })
        .collect();
    let replay = match (commit, log_io) {
        (CommitChoice::OffIo, Some(io)) => Some(io),
        (CommitChoice::OffIo, None) => return Err("--commit off-io replays the log I/O of an async run: list async before it".into()),
        _ => None,
    };
    barrier.wait();
    let started = Instant::now();
    let replayed = std::thread::scope(|s| {
        let (here, stop) = (dir.path(), &stop);
        let replaying = replay.map(|io| s.spawn(move || replay_log_io(here, io, stop)));
        std::thread::sleep(Duration::from_secs_f64(args.duration));
        stop.store(true, Ordering::Relaxed);
        replaying.map(|h| h.join().expect("log I/O replay panicked")).transpose()
    })?;
    let mut total = ThreadResult::empty();
    for h in handles {
        total.add(h.join().map_err(|_| "benchmark thread panicked")??)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let io = store.io_backend().unwrap_or_else(|| "none".into());
    let durable = store.durable_lsn();
    let (flushes, flushed_bytes, writing) = match (replayed, replay) {
        (Some(flushes), Some(io)) => (flushes, flushes * io.flush_bytes as u64, None),
        _ => {
            let totals = store.log_flush_totals();
            (totals.flushes, totals.bytes, Some(totals.writing))
        }
    };
    let flush_write_us = writing.filter(|_| flushes > 0).map(|w| w.as_secs_f64() * 1e6 / flushes as f64);
    let io = if replay.is_some() { "replayed".into() } else { io };
    let (_, _, checkpoints) = store.checkpoint_status();
    match Arc::try_unwrap(store) {
        Ok(store) => store.close()?,
        Err(_) => return Err("store still shared after the run".into()),
    }
    let flush_bytes = (flushed_bytes / flushes.max(1)).max(1).next_multiple_of(FLUSH_ALIGN) as usize;
    let write_sync_us = if waits_for_disk {
        if flush_bytes != FLUSH_ALIGN as usize {
            probe.reset();
            over_probe.reset();
        }
        probe_write_sync(dir.path(), flush_bytes, false, &mut probe)?;
        probe_write_sync(dir.path(), flush_bytes, true, &mut over_probe)?;
        Some(probe.value_at_quantile(0.50) as f64 / 1000.0)
    } else {
        None
    };
    let overwrite_sync_us = waits_for_disk.then(|| over_probe.value_at_quantile(0.50) as f64 / 1000.0);
    let p50_us = total.latency.value_at_quantile(0.50) as f64 / 1000.0;

    Ok(ModeResult {
        commit,
        threads,
        txn_per_s: total.commits as f64 / elapsed,
        commits: total.commits,
        elapsed,
        p50_us,
        p99_us: total.latency.value_at_quantile(0.99) as f64 / 1000.0,
        abort_rate: 1.0 - total.commits as f64 / total.attempts.max(1) as f64,
        io,
        durable_lsn: durable,
        partitions,
        flushes,
        flush_write_us,
        checkpoints,
        flush_bytes,
        write_sync_us,
        floor_ratio: write_sync_us.map(|w| p50_us / w),
        overwrite_sync_us,
        overwrite_ratio: overwrite_sync_us.map(|w| p50_us / w),
    })
}

struct ModeResult {
    commit: CommitChoice,
    threads: usize,
    txn_per_s: f64,
    commits: u64,
    elapsed: f64,
    p50_us: f64,
    p99_us: f64,
    abort_rate: f64,
    io: String,
    durable_lsn: u64,
    /// Log partitions of the store.
    partitions: usize,
    flushes: u64,
    /// Mean time one flush's write and sync took (none where the flushes were replayed).
    flush_write_us: Option<f64>,
    /// Checkpoints the store took during the run (by its interval or its log space bound).
    checkpoints: u64,
    /// Mean bytes per log flush, rounded up to the O_DIRECT block.
    flush_bytes: usize,
    /// p50 of one write + fdatasync of `flush_bytes`, measured right after the run.
    write_sync_us: Option<f64>,
    /// p50 commit / p50 write + fdatasync, of this run.
    floor_ratio: Option<f64>,
    /// p50 of one overwrite of preallocated space + fdatasync of `flush_bytes` (the floor
    /// once flushes land in zero-ahead space).
    overwrite_sync_us: Option<f64>,
    /// p50 commit / p50 overwrite + fdatasync, of this run.
    overwrite_ratio: Option<f64>,
}

impl ModeResult {
    fn json(&self, args: &TxnArgs) -> serde_json::Value {
        serde_json::json!({
            "bench": "txn",
            "workload": "hathi",
            "commit": self.commit.name(),
            "threads": self.threads,
            "duration_s": self.elapsed,
            "heap_mib": args.heap_mib,
            "words_per_txn": args.words,
            "prefetch": args.prefetch,
            "commits": self.commits,
            "txn_per_s": self.txn_per_s,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "abort_rate": self.abort_rate,
            "io": self.io,
            "durable_lsn": self.durable_lsn,
            "flushes": self.flushes,
            "commits_per_flush": (self.flushes > 0).then(|| self.commits as f64 / self.flushes as f64),
            "flush_write_us": self.flush_write_us,
            "checkpoints": self.checkpoints,
            "max_log_mib": args.max_log_mib,
            "flush_bytes": self.flush_bytes,
            "write_sync_p50_us": self.write_sync_us,
            "p50_over_write_sync": self.floor_ratio,
            "overwrite_sync_p50_us": self.overwrite_sync_us,
            "p50_over_overwrite_sync": self.overwrite_ratio,
        })
    }
}

pub fn run(args: TxnArgs) -> CliResult {
    let Workload::Hathi = args.workload;
    let mut threads = args.threads.clone();
    threads.dedup();
    if threads.contains(&0) {
        return Err("--threads takes counts of at least 1".into());
    }
    // Every (threads, mode), run interleaved round by round.
    let cases: Vec<(usize, CommitChoice)> = threads.iter().flat_map(|&t| args.commit.iter().map(move |&c| (t, c))).collect();
    let mut runs: Vec<Vec<ModeResult>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.rounds.max(1) {
        // Per thread count, the log I/O of this round's async run (for off-io).
        let mut log_io: Vec<(usize, LogIo)> = Vec::new();
        for (i, &(t, commit)) in cases.iter().enumerate() {
            let replay = log_io.iter().find(|(n, _)| *n == t).map(|(_, io)| *io);
            let r = run_once(&args, t, commit, replay)?;
            if commit == CommitChoice::Async {
                let flushes_per_s = r.flushes as f64 / r.elapsed / r.partitions.max(1) as f64;
                log_io.push((t, LogIo { partitions: r.partitions, flush_bytes: r.flush_bytes, flushes_per_s }));
            }
            runs[i].push(r);
        }
    }
    // The median run of each case by throughput; the floor ratio is the median of each
    // run's own ratio (commit and probe measured in the same round).
    let results: Vec<(ModeResult, Option<f64>, Option<f64>)> = runs
        .into_iter()
        .map(|mut r| {
            let floor = Some(median(&r.iter().filter_map(|m| m.floor_ratio).collect::<Vec<_>>())).filter(|m| !m.is_nan());
            let over = Some(median(&r.iter().filter_map(|m| m.overwrite_ratio).collect::<Vec<_>>())).filter(|m| !m.is_nan());
            r.sort_by(|a, b| a.txn_per_s.total_cmp(&b.txn_per_s));
            (r.swap_remove(r.len() / 2), floor, over)
        })
        .collect();
    let rate_of = |t: usize, c: CommitChoice| results.iter().find(|(r, _, _)| r.commit == c && r.threads == t).map(|(r, _, _)| r.txn_per_s);
    let suffix = |t: usize| if threads.len() > 1 { format!("@{t}") } else { String::new() };
    let mut ratios: Vec<(String, f64)> = Vec::new();
    for &t in &threads {
        for (name, num, den) in [
            ("off/floor", CommitChoice::Off, CommitChoice::Floor),
            ("async/off", CommitChoice::Async, CommitChoice::Off),
            ("off-io/off", CommitChoice::OffIo, CommitChoice::Off),
            ("async/off-io", CommitChoice::Async, CommitChoice::OffIo),
            ("split/async", CommitChoice::Split, CommitChoice::Async),
            ("partition/async", CommitChoice::Partition, CommitChoice::Async),
            ("sync/async", CommitChoice::Sync, CommitChoice::Async),
        ] {
            if let (Some(a), Some(b)) = (rate_of(t, num), rate_of(t, den)) {
                ratios.push((format!("{name}{}", suffix(t)), a / b));
            }
        }
    }
    for (r, floor, over) in &results {
        if let Some(f) = floor {
            ratios.push((format!("{}{} p50/write+fdatasync", r.commit.name(), suffix(r.threads)), *f));
        }
        if let Some(f) = over {
            ratios.push((format!("{}{} p50/overwrite+fdatasync", r.commit.name(), suffix(r.threads)), *f));
        }
    }
    if let (Some(&few), Some(&most)) = (threads.iter().min(), threads.iter().max()) {
        if most > few {
            for &c in &args.commit {
                if let (Some(a), Some(b)) = (rate_of(most, c), rate_of(few, c)) {
                    ratios.push((format!("{} txn/s @{most}/@{few}", c.name()), a / b));
                }
            }
        }
    }
    if let Some(dir) = &args.out.plot {
        let runs: Vec<&ModeResult> = results.iter().map(|(r, _, _)| r).collect();
        plot(dir, &args.commit, &threads, &runs)?;
    }
    if args.out.json {
        if results.len() == 1 {
            outln!("{}", results[0].0.json(&args));
        } else {
            let ratios: serde_json::Map<String, serde_json::Value> =
                ratios.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect();
            outln!(
                "{}",
                serde_json::json!({
                    "bench": "txn",
                    "rounds": args.rounds,
                    "modes": results.iter().map(|(r, _, _)| r.json(&args)).collect::<Vec<_>>(),
                    "ratios": ratios,
                })
            );
        }
        return Ok(());
    }
    let thread_list: Vec<String> = threads.iter().map(|t| t.to_string()).collect();
    outln!(
        "tusk bench txn: hathi, {} threads, {} MiB, {} words/txn, prefetch {}, median of {} round(s)",
        thread_list.join(","), args.heap_mib, args.words, args.prefetch, args.rounds.max(1)
    );
    outln!(
        "{:<10} {:>7} {:>12} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:>9} {:>11} {:>11}",
        "commit", "threads", "txn/s", "p50 us", "p99 us", "aborts", "log I/O", "flush B", "txn/flush", "flush us", "w+sync us", "ow+sync us"
    );
    for (r, _, _) in &results {
        outln!(
            "{:<10} {:>7} {:>12} {:>10.2} {:>10.2} {:>8.3}% {:>9} {:>8} {:>9} {:>9} {:>11} {:>11}",
            r.commit.name(),
            r.threads,
            rate(r.txn_per_s),
            r.p50_us,
            r.p99_us,
            r.abort_rate * 100.0,
            r.io,
            r.flush_bytes,
            if r.flushes > 0 { format!("{:.1}", r.commits as f64 / r.flushes as f64) } else { "-".into() },
            r.flush_write_us.map_or_else(|| "-".into(), |w| format!("{w:.1}")),
            r.write_sync_us.map_or_else(|| "-".into(), |w| format!("{w:.1}")),
            r.overwrite_sync_us.map_or_else(|| "-".into(), |w| format!("{w:.1}")),
        );
    }
    for (name, v) in ratios {
        outln!("{name:<38} {v:.3}");
    }
    Ok(())
}

/// `DIR/txn.svg`: throughput per mode (a bar per thread count), and p50 / p99 commit latency;
/// with several thread counts also `DIR/txn_threads.svg`, throughput against threads.
fn plot(dir: &Path, modes: &[CommitChoice], threads: &[usize], results: &[&ModeResult]) -> CliResult {
    use super::svg_plot::{write_bars_grid, write_svg, Bars, Chart, Series};
    std::fs::create_dir_all(dir).at(dir)?;
    let categories: Vec<String> = modes.iter().map(|m| m.name().to_string()).collect();
    let value = |t: usize, m: CommitChoice, f: fn(&ModeResult) -> f64| {
        results.iter().find(|r| r.threads == t && r.commit == m).map_or(f64::NAN, |r| f(r))
    };
    let per_threads = |t: usize| if t == 1 { "1 thread".to_string() } else { format!("{t} threads") };
    let throughput = Bars {
        title: "Hathi workload: txn/s per commit mode".into(),
        y_label: "txn/s".into(),
        log_y: threads.len() > 1,
        categories: categories.clone(),
        series: threads.iter().map(|&t| (per_threads(t), modes.iter().map(|&m| value(t, m, |r| r.txn_per_s)).collect())).collect(),
    };
    let mut latency = Bars { title: "commit latency".into(), y_label: "µs (log)".into(), log_y: true, categories, series: Vec::new() };
    for &t in threads {
        latency.series.push((format!("p50, {}", per_threads(t)), modes.iter().map(|&m| value(t, m, |r| r.p50_us)).collect()));
        latency.series.push((format!("p99, {}", per_threads(t)), modes.iter().map(|&m| value(t, m, |r| r.p99_us)).collect()));
    }
    write_bars_grid(&[throughput, latency], 2, &dir.join("txn.svg"))?;
    if threads.len() > 1 {
        // Scaling: a line per mode, txn/s against threads, beside a line of perfect scaling
        // from the fewest threads' rate of the fastest mode there.
        let mut series: Vec<Series> = modes
            .iter()
            .map(|&m| Series { label: m.name().to_string(), points: threads.iter().map(|&t| (t as f64, value(t, m, |r| r.txn_per_s))).filter(|p| p.1.is_finite()).collect() })
            .collect();
        let fewest = threads[0];
        let base = modes.iter().map(|&m| value(fewest, m, |r| r.txn_per_s)).filter(|v| v.is_finite()).fold(0.0, f64::max);
        if base > 0.0 {
            series.push(Series { label: format!("linear from {}", per_threads(fewest)), points: threads.iter().map(|&t| (t as f64, base * t as f64 / fewest as f64)).collect() });
        }
        let chart = Chart { title: "Hathi workload: txn/s against threads".into(), x_label: "threads".into(), y_label: "txn/s".into(), log_x: false, log_y: false, series };
        write_svg(&chart, &dir.join("txn_threads.svg"))?;
    }
    Ok(())
}
