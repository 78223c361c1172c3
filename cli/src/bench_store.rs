//! `tusk bench recovery` and `tusk bench checkpoint`: how long recovery takes, how fast
//! checkpoints write, what they cost running transactions, and whether log space stays
//! bounded.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, HeapLoad, HeapPtr, Options, Store};

use super::report::{median, table};
use super::{store_files, BenchDir, BenchOutput, CliResult, IoAt};

const MIB: f64 = (1 << 20) as f64;

#[derive(Args, Debug, Clone)]
pub struct RecoveryArgs {
    /// Heap covered by the checkpoint, in MiB.
    #[arg(long, default_value_t = 1024)]
    heap_mib: u64,
    /// Log written after the checkpoint, in MiB.
    #[arg(long, default_value_t = 1024)]
    log_mib: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[command(flatten)]
    pub(super) out: super::ChartedOutput,
    /// Only build the store (checkpoint + log) in --dir itself, keep it and stop (for
    /// profiling `tusk recover` on it).
    #[arg(long, requires = "dir")]
    pub(super) prepare_only: bool,
    /// Interleaved rounds of (sequential read of the store's files, recovery whole, recovery
    /// on demand); medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Heap sizes (MiB) of the reopen rows: time from `Store::open` to the first answered
    /// read, on demand and whole, cold and warm (default: --heap-mib).
    #[arg(long, value_delimiter = ',')]
    reopen_mib: Vec<u64>,
    /// Log after the checkpoint in the reopen rows' stores, in MiB.
    #[arg(long, default_value_t = 16)]
    reopen_log_mib: u64,
    /// Seconds of Hathi workload after a cold reopen on demand of each reopen size, its
    /// txn/s sampled every 100 ms against a warm store's (0: none).
    #[arg(long, default_value_t = 3.0)]
    reopen_seconds: f64,
    /// Threads of that workload.
    #[arg(long, default_value_t = 2)]
    reopen_threads: usize,
}

#[derive(Args, Debug, Clone)]
pub struct CheckpointArgs {
    #[arg(long, default_value_t = 1024)]
    heap_mib: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seconds of Hathi workload with and without a running checkpoint.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds of the skewed run that watches log space.
    #[arg(long, default_value_t = 60.0)]
    log_seconds: f64,
    /// The log bound the checkpointer aims for in the skewed run, in MiB.
    #[arg(long, default_value_t = 256)]
    max_log_mib: u64,
    /// Interleaved rounds of (disk rate, txn/s without, txn/s with checkpoints, a checkpoint
    /// of the whole dirtied heap); medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(flatten)]
    pub(super) out: BenchOutput,
}

fn options(heap_mib: u64) -> Options {
    Options { heap_capacity: (heap_mib + 64) << 20, checkpoint_interval: None, max_log_bytes: u64::MAX / 4, ..Options::default() }
}

fn options_loading(heap_mib: u64, heap_load: HeapLoad) -> Options {
    Options { heap_load, ..options(heap_mib) }
}

/// Allocates the array and fills it with non-zero words (1 MiB per transaction).
pub(super) fn make_array(store: &Store, heap_mib: u64) -> Result<HeapPtr, tusk::Error> {
    let bytes = heap_mib << 20;
    let (array, _) = store.transact(Commit::Sync, |tx| {
        let p = tx.alloc(bytes)?;
        tx.set_root("bench", p)?;
        Ok(p)
    })?;
    store.prefault();
    let block: Vec<u8> = (0..1u64 << 20).map(|i| ((i * 2654435761) >> 7) as u8 | 1).collect();
    for mib in 0..heap_mib {
        store.transact(Commit::Async, |tx| tx.write_at(array, mib << 20, &block))?;
    }
    Ok(array)
}

/// Hathi transactions (6 random words read and written, async commit) on `threads` threads
/// until `stop`; with `hot`, 90% of the words fall in the first `hot` words of the array.
pub(super) fn hathi(store: &Arc<Store>, array: HeapPtr, words: u64, threads: usize, hot: Option<u64>, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<Result<u64, tusk::Error>>> {
    hathi_counted(store, array, words, threads, hot, stop, None)
}

/// [`hathi`], adding each commit to `progress` as it goes (for throughput against time).
pub(super) fn hathi_counted(
    store: &Arc<Store>,
    array: HeapPtr,
    words: u64,
    threads: usize,
    hot: Option<u64>,
    stop: &Arc<AtomicBool>,
    progress: Option<&Arc<AtomicU64>>,
) -> Vec<std::thread::JoinHandle<Result<u64, tusk::Error>>> {
    (0..threads)
        .map(|t| {
            let (store, stop, progress) = (store.clone(), stop.clone(), progress.cloned());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(99 + t as u64);
                let mut commits = 0u64;
                let mut picks = [0u64; 6];
                while !stop.load(Ordering::Relaxed) {
                    for w in picks.iter_mut() {
                        let range = match hot {
                            Some(h) if rng.random_bool(0.9) => h,
                            _ => words,
                        };
                        *w = rng.random_range(0..range) * 8;
                    }
                    store.transact(Commit::Async, |tx| {
                        for &off in &picks {
                            let v = tx.read_u64_at(array, off)?;
                            tx.write_u64_at(array, off, v + 1)?;
                        }
                        Ok(())
                    })?;
                    commits += 1;
                    if let Some(p) = &progress {
                        p.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(commits)
            })
        })
        .collect()
}

pub(super) fn join(handles: Vec<std::thread::JoinHandle<Result<u64, tusk::Error>>>) -> Result<u64, Box<dyn std::error::Error>> {
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| "workload thread panicked")??;
    }
    Ok(total)
}

/// Opens the store; returns it, the seconds `open` took, and those until every chunk was in
/// memory (the same for a whole load).
fn timed_open(dir: &Path, heap_mib: u64, load: HeapLoad) -> Result<(Store, f64, f64), tusk::Error> {
    let started = Instant::now();
    let store = Store::open(dir, options_loading(heap_mib, load))?;
    let open_s = started.elapsed().as_secs_f64();
    while store.chunks_absent() > 0 {
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok((store, open_s, started.elapsed().as_secs_f64()))
}

pub fn recovery(args: RecoveryArgs) -> CliResult {
    if args.prepare_only {
        let dir = args.out.dir.as_deref().expect("clap requires --dir with --prepare-only");
        return prepare_recovery_store(&args, dir).map(|_| ());
    }
    let dir = BenchDir::new(args.out.dir.clone())?;
    let (ckpt, commits) = prepare_recovery_store(&args, dir.path())?;

    // Rounds: read every file recovery reads, sequentially with O_DIRECT (the page cache
    // dropped for them first, as it is before each recovery), then recover. Recovery writes
    // nothing that changes the next round's work (no checkpoint is taken).
    let mut seq_read = Vec::new();
    let mut recoveries = Vec::new();
    let (mut on_demand_open, mut on_demand_all_in) = (Vec::new(), Vec::new());
    let mut r = None;
    for round in 0..args.rounds.max(1) {
        let files = store_files(dir.path())?;
        drop_cached(&files)?;
        let (bytes, secs) = read_sequentially(&files)?;
        seq_read.push((bytes, secs));
        let mut loads = [HeapLoad::Whole, HeapLoad::OnDemand];
        if round % 2 == 1 {
            loads.reverse();
        }
        for load in loads {
            drop_cached(&files)?;
            let (store, open_s, all_in_s) = timed_open(dir.path(), args.heap_mib, load)?;
            match load {
                HeapLoad::Whole => {
                    recoveries.push(open_s);
                    r = Some(store.recovery_report().clone());
                }
                HeapLoad::OnDemand => {
                    on_demand_open.push(open_s);
                    on_demand_all_in.push(all_in_s);
                }
            }
            store.close()?;
        }
    }
    let reopen_sizes = if args.reopen_mib.is_empty() { vec![args.heap_mib] } else { args.reopen_mib.clone() };
    let speed = (args.reopen_seconds > 0.0).then_some((args.reopen_threads, args.reopen_seconds));
    let (reopens, speeds) = super::bench_reopen::measure(dir.path(), &reopen_sizes, args.reopen_log_mib, args.rounds, speed)?;
    let r = r.expect("at least one round");
    let recovery_s = median(&recoveries);
    let read_s = median(&seq_read.iter().map(|x| x.1).collect::<Vec<_>>());
    let read_bytes = seq_read[0].0;
    // Now a checkpoint covers everything: recovery from the checkpoint alone.
    let store = Store::open(dir.path(), options(args.heap_mib))?;
    store.checkpoint()?;
    store.close()?;
    drop_cached(&store_files(dir.path())?)?;
    let (store, checkpoint_only_s, _) = timed_open(dir.path(), args.heap_mib, HeapLoad::Whole)?;
    let r2 = store.recovery_report().clone();
    store.close()?;

    let log_mib = r.log_bytes as f64 / MIB;
    if args.out.json {
        outln!(
            "{}",
            serde_json::json!({
                "bench": "recovery",
                "heap_mib": args.heap_mib,
                "log_mib": log_mib,
                "recovery_s": recovery_s,
                "recovery_s_rounds": recoveries,
                "sequential_read_s": read_s,
                "sequential_read_bytes": read_bytes,
                "recovery_vs_sequential_read": recovery_s / read_s,
                "checkpoint_load_s": r.checkpoint_load.as_secs_f64(),
                "log_pass_s": r.log_pass.as_secs_f64(),
                "first_pass_beside_load": r.first_pass_beside_load,
                "replay_s": r.replay.as_secs_f64(),
                "records_replayed": r.records_replayed,
                "commits_after_checkpoint": commits,
                "checkpoint_mib": ckpt.bytes_written as f64 / MIB,
                "recovery_s_checkpoint_only": checkpoint_only_s,
                "records_replayed_checkpoint_only": r2.records_replayed,
                "on_demand_open_s": median(&on_demand_open),
                "on_demand_all_in_s": median(&on_demand_all_in),
                "on_demand_all_in_vs_whole": median(&on_demand_all_in) / recovery_s,
                "reopen_log_mib": args.reopen_log_mib,
                "reopens": reopens.iter().map(|x| x.json()).collect::<Vec<_>>(),
                "speed_after_reopen": speeds.iter().map(|(x, read)| x.json(*read)).collect::<Vec<_>>(),
            })
        );
        return Ok(());
    }
    table(
        "tusk bench recovery",
        &[
            ("heap", format!("{} MiB (checkpoint of {:.0} MiB)", args.heap_mib, ckpt.bytes_written as f64 / MIB)),
            ("log after the checkpoint", format!("{log_mib:.0} MiB, {commits} transactions")),
            ("recovery", format!("{recovery_s:.3} s (open to ready; median of {})", fmt_rounds(&recoveries))),
            (
                "sequential read of the same files",
                format!("{read_s:.3} s ({:.0} MiB, O_DIRECT, {:.0} MB/s)", read_bytes as f64 / MIB, read_bytes as f64 / MIB / read_s),
            ),
            ("recovery / sequential read", format!("{:.2}", recovery_s / read_s)),
            ("  checkpoint load", format!("{:.3} s", r.checkpoint_load.as_secs_f64())),
            (
                "  beside it: log scan + first pass",
                format!("{:.3} s{}", r.log_pass.as_secs_f64(), if r.first_pass_beside_load { "" } else { " (scan only: the first pass ran after the load)" }),
            ),
            ("  log scan + replay", format!("{:.3} s, {} records", (r.elapsed - r.checkpoint_load).as_secs_f64(), r.records_replayed)),
            ("recovery, checkpoint only", format!("{checkpoint_only_s:.3} s ({} records replayed)", r2.records_replayed)),
            (
                "on demand: open / all chunks in",
                format!(
                    "{:.3} s / {:.3} s ({:.2}x the whole load; medians of {})",
                    median(&on_demand_open),
                    median(&on_demand_all_in),
                    median(&on_demand_all_in) / recovery_s,
                    fmt_rounds(&on_demand_all_in)
                ),
            ),
        ],
    );
    let mut rows = Vec::new();
    for &mib in &reopen_sizes {
        for cold in [true, false] {
            let m = |load: &str, f: fn(&super::bench_reopen::Reopen) -> f64| super::bench_reopen::median_of(&reopens, mib, load, cold, f);
            rows.push((
                format!("reopen {mib} MiB + {} MiB log, {}", args.reopen_log_mib, if cold { "cold" } else { "warm" }),
                format!(
                    "first read: on demand {:.1} ms, whole {:.1} ms; all in: {:.3} s / {:.3} s; RSS at the first read {:.0} / {:.0} MiB, all in {:.0} / {:.0} MiB",
                    1e3 * m("on-demand", |x| x.first_read_s),
                    1e3 * m("whole", |x| x.first_read_s),
                    m("on-demand", |x| x.all_in_s),
                    m("whole", |x| x.all_in_s),
                    m("on-demand", |x| x.rss_first_read_mib),
                    m("whole", |x| x.rss_first_read_mib),
                    m("on-demand", |x| x.rss_all_in_mib),
                    m("whole", |x| x.rss_all_in_mib)
                ),
            ));
        }
    }
    for (x, (bytes, read_s)) in &speeds {
        rows.push((
            format!("Hathi after a cold reopen, {} MiB, {} threads", x.heap_mib, x.threads),
            format!(
                "≥ 0.9 of warm ({:.0} k txn/s) from {} on; all chunks in at {}; a sequential read of the {:.0} MiB of files takes {read_s:.3} s",
                x.warm_txn_per_s / 1e3,
                x.full_speed_s.map_or("never".into(), |t| format!("{t:.2} s")),
                x.all_in_s.map_or("never".into(), |t| format!("{t:.2} s")),
                *bytes as f64 / MIB
            ),
        ));
    }
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    table("reopen: open to the first read (a root lookup and one B-link get)", &rows);
    if let Some(plot) = &args.out.plot {
        super::bench_reopen::plot_speed(&speeds, plot)?;
    }
    Ok(())
}

/// A checkpoint of an `--heap-mib` array, then Hathi commits until `--log-mib` of log follow
/// it, in `dir`; the store closed. Returns the checkpoint's report and the commits logged.
fn prepare_recovery_store(args: &RecoveryArgs, dir: &std::path::Path) -> Result<(tusk::CheckpointReport, u64), Box<dyn std::error::Error>> {
    let store = Arc::new(Store::open(dir, options(args.heap_mib))?);
    let array = make_array(&store, args.heap_mib)?;
    let ckpt = store.checkpoint()?;
    // Log after the checkpoint until it holds `log_mib`.
    let base_log = store.log_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let workers = hathi(&store, array, (args.heap_mib << 20) / 8, args.threads, None, &stop);
    while store.log_bytes().saturating_sub(base_log) < args.log_mib << 20 {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let commits = join(workers)?;
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;
    store.close()?;
    Ok((ckpt, commits))
}

fn fmt_rounds(xs: &[f64]) -> String {
    xs.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(", ")
}

/// Bytes of one sequential read or write of the baselines.
const SEQ_IO: usize = 8 << 20;


/// Drops the page cache's clean pages of `files` (no root needed), so that the next read
/// comes from the disk.
pub(super) fn drop_cached(files: &[PathBuf]) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::fd::AsRawFd;
    for path in files {
        let f = std::fs::File::open(path).at(path)?;
        // SAFETY: advice on a descriptor we own; it changes no memory of ours.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(format!("{}: posix_fadvise: {}", path.display(), std::io::Error::from_raw_os_error(rc)).into());
        }
    }
    Ok(())
}

/// Reads `files` one after the other from start to end in 8 MiB O_DIRECT reads: the bytes
/// and the seconds.
pub(super) fn read_sequentially(files: &[PathBuf]) -> Result<(u64, f64), Box<dyn std::error::Error>> {
    use std::os::fd::AsRawFd;
    use tusk_storage::io::{open_direct_read, sync::pread_full, AlignedBuf};
    let mut buf = AlignedBuf::new();
    buf.extend_zeros(SEQ_IO);
    let started = Instant::now();
    let mut total = 0u64;
    for path in files {
        let f = open_direct_read(path)?;
        let mut off = 0u64;
        loop {
            let got = pread_full(f.as_raw_fd(), off, buf.as_mut_slice())?;
            total += got as u64;
            off += got as u64;
            if got < SEQ_IO {
                break;
            }
        }
    }
    Ok((total, started.elapsed().as_secs_f64()))
}

/// Sequential write rate of the disk under `dir`, in MB/s: `mib` MiB in 8 MiB O_DIRECT
/// writes, one after the other, then one fdatasync (what `dd oflag=direct bs=8M` does; the
/// best a single sequential writer gets).
fn disk_rate(dir: &Path, mib: u64) -> Result<f64, Box<dyn std::error::Error>> {
    let (written, took) = stream_to_disk(dir, mib << 20, None, || false)?;
    Ok((written as f64 / MIB) / took.as_secs_f64())
}

/// Writes `dir/stream.tmp` in 8 MiB O_DIRECT writes, `pass` bytes at a time, each pass
/// closed by one fdatasync and the next written over it (as checkpoints do with their
/// recycled segment). Without `pace`: one pass. With `pace` (bytes per second): writes wait
/// so that the stream never runs ahead of that rate, and passes go on until `stop` says so
/// (asked before each write; the pass under way then ends with its fdatasync). Returns the
/// bytes written and the time from the first write to the last fdatasync.
fn stream_to_disk(dir: &Path, pass: u64, pace: Option<f64>, stop: impl Fn() -> bool) -> Result<(u64, Duration), Box<dyn std::error::Error>> {
    use std::os::fd::AsRawFd;
    use tusk_storage::io::sync::{fdatasync, pwrite_all};
    use tusk_storage::io::open_direct;
    let path = dir.join("stream.tmp");
    let _ = std::fs::remove_file(&path);
    let file = open_direct(&path, true).at(&path)?;
    let buf = super::patterned_buf(SEQ_IO);
    let started = Instant::now();
    let mut written = 0u64;
    // Paced: wait (in short sleeps, to notice `stop`) until the rate allows the next write.
    // The first write goes out even when `stop` came first (a thread started late on a busy
    // machine): a stream of no bytes has no rate (CI saw `stream_mb_per_s` 0 so).
    let held_back = |written: u64| -> bool {
        let Some(rate) = pace else { return false };
        loop {
            if stop() && written > 0 {
                return true;
            }
            let wait = written as f64 / rate.max(1.0) - started.elapsed().as_secs_f64();
            if wait <= 0.0 {
                return false;
            }
            std::thread::sleep(Duration::from_secs_f64(wait.min(0.01)));
        }
    };
    loop {
        let mut off = 0u64;
        while off < pass && !held_back(written) {
            pwrite_all(file.as_raw_fd(), off, buf.as_slice()).at(&path)?;
            off += SEQ_IO as u64;
            written += SEQ_IO as u64;
        }
        fdatasync(file.as_raw_fd()).at(&path)?;
        if pace.is_none() || stop() {
            break;
        }
    }
    let took = started.elapsed();
    drop(file);
    std::fs::remove_file(&path).at(&path)?;
    Ok((written, took))
}

/// What runs beside the workload in a round of `bench checkpoint`.
#[derive(Clone, Copy)]
enum Load {
    Quiet,
    Checkpoints,
    /// O_DIRECT writes at `bytes_per_s`, `pass` bytes between fdatasyncs.
    Stream { bytes_per_s: f64, pass: u64 },
}

pub fn checkpoint(args: CheckpointArgs) -> CliResult {
    let dir = BenchDir::new(args.out.dir.clone())?;
    let store = Arc::new(Store::open(dir.path(), options(args.heap_mib))?);
    let array = make_array(&store, args.heap_mib)?;
    let words = (args.heap_mib << 20) / 8;
    // A full checkpoint (every chunk is new).
    let full = store.checkpoint()?;

    // Throughput with nothing else running, with checkpoints back to back, and with a plain
    // stream of O_DIRECT writes of the same bytes at the same rate (what the disk alone
    // costs the workload on this machine: no copy, no checksum, no STM).
    // Returns txn/s, the checkpoints taken, and the bytes per second written beside.
    let run = |load: Load| -> Result<(f64, u64, u64), Box<dyn std::error::Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = hathi(&store, array, words, args.threads, None, &stop);
        let started = Instant::now();
        let over = || started.elapsed().as_secs_f64() >= args.duration;
        // At the priority of the store's background checkpointer.
        let background = || {
            let _ = tusk_storage::sched::lower_current_thread_priority(tusk_storage::sched::BACKGROUND_NICE);
        };
        let (taken, bytes) = std::thread::scope(|s| match load {
            Load::Quiet => {
                std::thread::sleep(Duration::from_secs_f64(args.duration));
                Ok((0, 0))
            }
            Load::Checkpoints => s
                .spawn(|| -> Result<(u64, u64), Box<dyn std::error::Error + Send + Sync>> {
                    background();
                    let (mut taken, mut bytes) = (0, 0);
                    while !over() {
                        bytes += store.checkpoint()?.bytes_written;
                        taken += 1;
                    }
                    // The last checkpoint may end after the workload's duration: the rate
                    // is over the loop's own time.
                    Ok((taken, (bytes as f64 / started.elapsed().as_secs_f64()) as u64))
                })
                .join()
                .expect("the checkpoint loop does not panic"),
            Load::Stream { bytes_per_s, pass } => {
                let (here, over) = (dir.path(), &over);
                s.spawn(move || -> Result<(u64, u64), Box<dyn std::error::Error + Send + Sync>> {
                    background();
                    let (written, took) = stream_to_disk(here, pass, Some(bytes_per_s), over).map_err(|e| e.to_string())?;
                    Ok((0, (written as f64 / took.as_secs_f64()) as u64))
                })
                .join()
                .expect("the stream does not panic")
            }
        })
        .map_err(|e| e.to_string())?;
        stop.store(true, Ordering::Relaxed);
        let commits = join(workers)?;
        Ok((commits as f64 / started.elapsed().as_secs_f64(), taken, bytes))
    };
    // Interleaved rounds: the disk's rate, txn/s without checkpoints, with checkpoints, and
    // with the plain stream paced at the rate the checkpoints just wrote, then a quiet
    // checkpoint of the heap the workload just dirtied (random words over the whole heap:
    // every chunk), timed against the disk rate of the same round.
    let (mut disk, mut ckpt_rate, mut without, mut with, mut during, mut ckpt_chunks) = (vec![], vec![], vec![], vec![], 0, vec![]);
    let (mut streamed, mut stream_rate, mut ckpt_rate_with_trim) = (vec![], vec![], vec![]);
    for _ in 0..args.rounds.max(1) {
        disk.push(disk_rate(dir.path(), args.heap_mib.min(1024))?);
        without.push(run(Load::Quiet)?.0);
        let (w, taken, bytes_per_s) = run(Load::Checkpoints)?;
        with.push(w);
        during += taken;
        // One pass per checkpoint: the bytes of the heap's chunk images.
        let pass = (args.heap_mib << 20).next_multiple_of(SEQ_IO as u64);
        let (s, _, written_per_s) = run(Load::Stream { bytes_per_s: bytes_per_s as f64, pass })?;
        streamed.push(s);
        stream_rate.push(written_per_s as f64 / MIB);
        let c = store.checkpoint()?;
        ckpt_rate.push(c.bytes_written as f64 / MIB / c.valid_after.as_secs_f64());
        ckpt_rate_with_trim.push(c.bytes_written as f64 / MIB / c.elapsed.as_secs_f64());
        ckpt_chunks.push(c.written as f64 / c.chunks as f64);
    }
    let disk_mb_per_s = median(&disk);
    let checkpoint_mb_per_s = median(&ckpt_rate);
    let ckpt_vs_disk = median(&ckpt_rate.iter().zip(&disk).map(|(c, d)| c / d).collect::<Vec<_>>());
    let with_trim_vs_disk = median(&ckpt_rate_with_trim.iter().zip(&disk).map(|(c, d)| c / d).collect::<Vec<_>>());
    let checkpoint_with_trim_mb_per_s = median(&ckpt_rate_with_trim);
    let txn_ratio = median(&with.iter().zip(&without).map(|(w, o)| w / o).collect::<Vec<_>>());
    let stream_ratio = median(&streamed.iter().zip(&without).map(|(s, o)| s / o).collect::<Vec<_>>());
    let beyond_stream = median(&with.iter().zip(&streamed).map(|(w, s)| w / s).collect::<Vec<_>>());
    let (streamed, stream_mb_per_s) = (median(&streamed), median(&stream_rate));
    let (without, with, checkpoints_during) = (median(&without), median(&with), during);
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;
    store.close()?;

    // Skewed updates for `log_seconds` with background checkpoints every second: log space
    // must stay near `max_log_mib` although most chunks stay clean.
    let skew_dir = dir.path().join("skew");
    let opts = Options { checkpoint_interval: Some(Duration::from_secs(1)), max_log_bytes: args.max_log_mib << 20, segment_bytes: 16 << 20, ..options(args.heap_mib) };
    let store = Arc::new(Store::open(&skew_dir, opts)?);
    let array = make_array(&store, args.heap_mib)?;
    store.checkpoint()?;
    let stop = Arc::new(AtomicBool::new(false));
    let workers = hathi(&store, array, words, args.threads, Some(words / 100), &stop);
    let started = Instant::now();
    let max_seen = AtomicU64::new(0);
    while started.elapsed().as_secs_f64() < args.log_seconds {
        std::thread::sleep(Duration::from_millis(100));
        max_seen.fetch_max(store.log_bytes(), Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    let skew_commits = join(workers)?;
    let skew_txn_per_s = skew_commits as f64 / started.elapsed().as_secs_f64();
    let (last, ckpt_error, skew_checkpoints) = store.checkpoint_status();
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;
    store.close()?;
    if let Some(e) = ckpt_error {
        return Err(format!("background checkpoint failed: {e}").into());
    }
    let max_log_bytes_seen = max_seen.load(Ordering::Relaxed);

    if args.out.json {
        outln!(
            "{}",
            serde_json::json!({
                "bench": "checkpoint",
                "heap_mib": args.heap_mib,
                "checkpoint_mb_per_s": checkpoint_mb_per_s,
                "disk_mb_per_s": disk_mb_per_s,
                "checkpoint_vs_disk": ckpt_vs_disk,
                "checkpoint_vs_disk_rounds": ckpt_rate.iter().zip(&disk).map(|(c, d)| c / d).collect::<Vec<_>>(),
                "checkpoint_with_cleanup_mb_per_s": checkpoint_with_trim_mb_per_s,
                "checkpoint_with_cleanup_vs_disk": with_trim_vs_disk,
                "checkpoint_written_fraction_rounds": ckpt_chunks,
                "full_checkpoint_s": full.elapsed.as_secs_f64(),
                "first_full_checkpoint_mb_per_s": full.bytes_written as f64 / MIB / full.elapsed.as_secs_f64(),
                "txn_per_s_without_checkpoint": without,
                "txn_per_s_during_checkpoint": with,
                "txn_ratio_during_checkpoint": txn_ratio,
                "txn_per_s_during_stream": streamed,
                "stream_mb_per_s": stream_mb_per_s,
                "txn_ratio_during_stream": stream_ratio,
                "checkpoint_vs_stream_txn": beyond_stream,
                "rounds": args.rounds,
                "checkpoints_during": checkpoints_during,
                "log_seconds": args.log_seconds,
                "max_log_bytes": args.max_log_mib << 20,
                "max_log_bytes_seen": max_log_bytes_seen,
                "skewed_commits": skew_commits,
                "skewed_txn_per_s": skew_txn_per_s,
                "skewed_checkpoints": skew_checkpoints,
                "last_checkpoint_reused_chunks": last.as_ref().map(|c| c.reused),
                "last_checkpoint_rewritten_for_log": last.as_ref().map(|c| c.rewritten_for_log),
            })
        );
        return Ok(());
    }
    table(
        "tusk bench checkpoint",
        &[
            ("heap", format!("{} MiB", args.heap_mib)),
            ("first full checkpoint", format!("{:.0} MB/s ({:.3} s)", full.bytes_written as f64 / MIB / full.elapsed.as_secs_f64(), full.elapsed.as_secs_f64())),
            (
                "checkpoint of the dirtied heap",
                format!(
                    "{checkpoint_mb_per_s:.0} MB/s until valid; {checkpoint_with_trim_mb_per_s:.0} MB/s with the clean-up after (medians of {} rounds)",
                    args.rounds
                ),
            ),
            ("disk sequential write", format!("{disk_mb_per_s:.0} MB/s (8 MiB O_DIRECT writes, one fdatasync)")),
            ("checkpoint / disk", format!("{ckpt_vs_disk:.2} until valid, {with_trim_vs_disk:.2} with the clean-up (medians of the rounds' ratios)")),
            ("txn/s without checkpoint", format!("{without:.0}")),
            ("txn/s during checkpoints", format!("{with:.0} ({checkpoints_during} checkpoints)")),
            ("ratio", format!("{txn_ratio:.3} (median of the rounds' ratios)")),
            ("txn/s during a plain stream", format!("{streamed:.0} (the checkpoints' bytes at their rate, {stream_mb_per_s:.0} MB/s)")),
            ("ratio", format!("{stream_ratio:.3} (median of the rounds' ratios)")),
            ("checkpoints / plain stream", format!("{beyond_stream:.3} (txn/s; median of the rounds' ratios)")),
            (
                "skewed run log space",
                format!(
                    "max {:.1} MiB seen over {:.0} s (bound {} MiB), {skew_checkpoints} checkpoints, {skew_txn_per_s:.0} txn/s",
                    max_log_bytes_seen as f64 / MIB,
                    args.log_seconds,
                    args.max_log_mib
                ),
            ),
        ],
    );
    Ok(())
}
