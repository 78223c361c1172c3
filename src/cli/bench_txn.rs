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

use super::report::{rate, table};
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
    #[arg(long, value_enum, default_value = "async")]
    commit: CommitChoice,
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

pub fn run(args: TxnArgs) -> CliResult {
    let Workload::Hathi = args.workload;
    let dir = BenchDir::new(args.dir.clone())?;
    let mut options = Options {
        heap_capacity: (args.heap_mib + 64) << 20,
        io: args.io.to_io(),
        durability: if args.commit == CommitChoice::Off { Durability::Off } else { Durability::On },
        ..Options::default()
    };
    if let Some(p) = args.partitions {
        options.log_partitions = p;
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
                (args.commit.mode(), args.commit == CommitChoice::Split, args.words, args.prefetch);
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

    let txn_per_s = total.commits as f64 / elapsed;
    let p50_us = total.latency.value_at_quantile(0.50) as f64 / 1000.0;
    let p99_us = total.latency.value_at_quantile(0.99) as f64 / 1000.0;
    let abort_rate = 1.0 - total.commits as f64 / total.attempts.max(1) as f64;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "txn",
                "workload": "hathi",
                "commit": args.commit.name(),
                "threads": args.threads,
                "duration_s": elapsed,
                "heap_mib": args.heap_mib,
                "words_per_txn": args.words,
                "prefetch": args.prefetch,
                "commits": total.commits,
                "txn_per_s": txn_per_s,
                "p50_us": p50_us,
                "p99_us": p99_us,
                "abort_rate": abort_rate,
                "io": io,
                "durable_lsn": durable,
            })
        );
    } else {
        table(
            &format!("tusk bench txn: hathi, {} commit, {} threads", args.commit.name(), args.threads),
            &[
                ("txn/s", rate(txn_per_s)),
                ("commits", total.commits.to_string()),
                ("commit latency p50", format!("{p50_us:.2} us")),
                ("commit latency p99", format!("{p99_us:.2} us")),
                ("abort rate", format!("{:.4}%", abort_rate * 100.0)),
                ("heap", format!("{} MiB, {} words/txn, prefetch {}", args.heap_mib, args.words, args.prefetch)),
                ("log I/O", io),
                ("elapsed", format!("{elapsed:.2} s")),
            ],
        );
    }
    Ok(())
}
