//! `tusk bench txn`: the Hathi workload. Each transaction reads and writes `words` random
//! 8-byte words of one allocation spanning `heap_mib` MiB; all threads run for `duration`
//! seconds. Reports throughput and commit latency (from the start of the transaction to the
//! return of its commit, retries included).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, Durability, Options, Store};

use super::report::rate;
use super::{BenchDir, CliResult, IoChoice};

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
}

impl CommitChoice {
    fn name(self) -> &'static str {
        match self {
            CommitChoice::Sync => "sync",
            CommitChoice::Async => "async",
            CommitChoice::Partition => "partition",
            CommitChoice::Split => "split",
            CommitChoice::Off => "off",
        }
    }

    fn mode(self) -> Commit {
        match self {
            CommitChoice::Sync => Commit::Sync,
            CommitChoice::Partition => Commit::Partition,
            CommitChoice::Async | CommitChoice::Split | CommitChoice::Off => Commit::Async,
        }
    }
}

#[derive(Args, Debug)]
pub struct TxnArgs {
    #[arg(long, value_enum, default_value = "hathi")]
    workload: Workload,
    #[arg(long, default_value_t = 2)]
    threads: usize,
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
    /// Store directory (default: a fresh temporary directory, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    io: IoChoice,
    /// Log partitions (default: one per core).
    #[arg(long)]
    partitions: Option<usize>,
    /// Group-commit interval in microseconds (default: the library's).
    #[arg(long)]
    group_commit_us: Option<u64>,
    /// Issue `Transaction::prefetch` for the words before touching them.
    #[arg(long)]
    prefetch: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

struct ThreadResult {
    commits: u64,
    attempts: u64,
    latency: Histogram<u64>,
}

/// One run of one commit mode on a fresh store.
fn run_once(args: &TxnArgs, commit: CommitChoice) -> Result<ModeResult, Box<dyn std::error::Error>> {
    let dir = BenchDir::new(args.dir.clone())?;
    let mut options = Options {
        heap_capacity: (args.heap_mib + 64) << 20,
        io: args.io.to_io(),
        durability: if commit == CommitChoice::Off { Durability::Off } else { Durability::On },
        ..Options::default()
    };
    if let Some(p) = args.partitions {
        options.log_partitions = p;
    }
    if let Some(us) = args.group_commit_us {
        options.group_commit_interval = Duration::from_micros(us);
    }
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
    let barrier = Arc::new(Barrier::new(args.threads + 1));
    let handles: Vec<_> = (0..args.threads)
        .map(|t| {
            let (store, stop, barrier) = (store.clone(), stop.clone(), barrier.clone());
            let (mode, split, words, prefetch) =
                (commit.mode(), commit == CommitChoice::Split, args.words, args.prefetch);
            std::thread::spawn(move || -> Result<ThreadResult, tusk::Error> {
                let mut rng = SmallRng::seed_from_u64(0x7A5C + t as u64);
                let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
                let (mut commits, mut attempts) = (0u64, 0u64);
                let mut picks = vec![0u64; words];
                let mut last_check = Instant::now();
                let mut last_lsn = 0;
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    for w in picks.iter_mut() {
                        *w = rng.random_range(0..words_total) * 8;
                    }
                    let start = Instant::now();
                    let (_, lsn) = store.transact(mode, |tx| {
                        attempts += 1;
                        if prefetch {
                            for &off in &picks {
                                tx.prefetch(array, off);
                            }
                        }
                        for &off in &picks {
                            let v = tx.read_u64_at(array, off)?;
                            tx.write_u64_at(array, off, v + 1)?;
                        }
                        Ok(())
                    })?;
                    let now = Instant::now();
                    latency.saturating_record((now - start).as_nanos() as u64);
                    commits += 1;
                    last_lsn = lsn.unwrap_or(last_lsn);
                    if split && now - last_check >= Duration::from_millis(2) {
                        store.is_stable(last_lsn, true);
                        last_check = Instant::now();
                    }
                }
                Ok(ThreadResult { commits, attempts, latency })
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(args.duration));
    stop.store(true, Ordering::Relaxed);
    let mut total = ThreadResult { commits: 0, attempts: 0, latency: Histogram::new_with_bounds(1, 60_000_000_000, 3)? };
    for h in handles {
        let r = h.join().map_err(|_| "benchmark thread panicked")??;
        total.commits += r.commits;
        total.attempts += r.attempts;
        total.latency.add(&r.latency)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let io = store.io_backend().unwrap_or_else(|| "none".into());
    let durable = store.durable_lsn();
    match Arc::try_unwrap(store) {
        Ok(store) => store.close()?,
        Err(_) => return Err("store still shared after the run".into()),
    }

    Ok(ModeResult {
        commit,
        txn_per_s: total.commits as f64 / elapsed,
        commits: total.commits,
        elapsed,
        p50_us: total.latency.value_at_quantile(0.50) as f64 / 1000.0,
        p99_us: total.latency.value_at_quantile(0.99) as f64 / 1000.0,
        abort_rate: 1.0 - total.commits as f64 / total.attempts.max(1) as f64,
        io,
        durable_lsn: durable,
    })
}

struct ModeResult {
    commit: CommitChoice,
    txn_per_s: f64,
    commits: u64,
    elapsed: f64,
    p50_us: f64,
    p99_us: f64,
    abort_rate: f64,
    io: String,
    durable_lsn: u64,
}

impl ModeResult {
    fn json(&self, args: &TxnArgs) -> serde_json::Value {
        serde_json::json!({
            "bench": "txn",
            "workload": "hathi",
            "commit": self.commit.name(),
            "threads": args.threads,
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
        })
    }
}

pub fn run(args: TxnArgs) -> CliResult {
    let Workload::Hathi = args.workload;
    let mut runs: Vec<Vec<ModeResult>> = args.commit.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.rounds.max(1) {
        for (i, &commit) in args.commit.iter().enumerate() {
            runs[i].push(run_once(&args, commit)?);
        }
    }
    // The median run of each mode.
    let results: Vec<ModeResult> = runs
        .into_iter()
        .map(|mut r| {
            r.sort_by(|a, b| a.txn_per_s.total_cmp(&b.txn_per_s));
            r.swap_remove(r.len() / 2)
        })
        .collect();
    let rate_of = |c: CommitChoice| results.iter().find(|r| r.commit == c).map(|r| r.txn_per_s);
    let mut ratios = Vec::new();
    for (name, num, den) in [
        ("async/off", CommitChoice::Async, CommitChoice::Off),
        ("split/async", CommitChoice::Split, CommitChoice::Async),
        ("partition/async", CommitChoice::Partition, CommitChoice::Async),
        ("sync/async", CommitChoice::Sync, CommitChoice::Async),
    ] {
        if let (Some(a), Some(b)) = (rate_of(num), rate_of(den)) {
            ratios.push((name, a / b));
        }
    }
    if args.json {
        if results.len() == 1 {
            println!("{}", results[0].json(&args));
        } else {
            let ratios: serde_json::Map<String, serde_json::Value> =
                ratios.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect();
            println!(
                "{}",
                serde_json::json!({
                    "bench": "txn",
                    "rounds": args.rounds,
                    "modes": results.iter().map(|r| r.json(&args)).collect::<Vec<_>>(),
                    "ratios": ratios,
                })
            );
        }
        return Ok(());
    }
    println!(
        "tusk bench txn: hathi, {} threads, {} MiB, {} words/txn, prefetch {}, median of {} round(s)",
        args.threads, args.heap_mib, args.words, args.prefetch, args.rounds.max(1)
    );
    println!("{:<10} {:>12} {:>10} {:>10} {:>9} {:>9}", "commit", "txn/s", "p50 us", "p99 us", "aborts", "log I/O");
    for r in &results {
        println!(
            "{:<10} {:>12} {:>10.2} {:>10.2} {:>8.3}% {:>9}",
            r.commit.name(),
            rate(r.txn_per_s),
            r.p50_us,
            r.p99_us,
            r.abort_rate * 100.0,
            r.io
        );
    }
    for (name, v) in ratios {
        println!("{name:<16} {v:.3}");
    }
    Ok(())
}
