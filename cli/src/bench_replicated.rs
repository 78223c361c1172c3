//! `tusk bench replicated`: `Sync` commits on a replicated group of nodes on loopback against
//! one store alone, in the same run. Each client thread commits tiny inserts (a word written
//! in its own array, and its count) with `Commit::Sync`: alone, once its record is on this
//! disk; in the group, once a majority holds it. Thread counts and the two setups alternate
//! within each round; throughput, p50 and p99 commit latency, and their ratios per round.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use tusk::{Commit, HeapPtr, Options, Store};
use tusk_replica::ReplicatedNode;

use super::group::{LocalGroup, Settings};
use super::report::{median, rate};
use super::{BenchDir, BenchOutput, CliResult};

#[derive(Args, Debug, Clone)]
pub struct ReplicatedArgs {
    /// Client threads (comma-separated; each count is run alone and on the group).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    threads: Vec<usize>,
    /// Nodes of the group.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Seconds each run commits for.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Rounds (the figures are medians over them).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Proposals the leader has in flight at once (comma-separated: each is run; default the
    /// node's default).
    #[arg(long, value_delimiter = ',')]
    proposals_in_flight: Vec<usize>,
    /// Worker threads of each node's async runtime (default the node's default).
    #[arg(long)]
    runtime_threads: Option<usize>,
    /// Instead of the tiny inserts: one `Sync` transaction that writes this many MiB, alone
    /// and on the group (its record travels in 2 MiB pieces), once a round; seconds until it
    /// returns, and until every node has applied it.
    #[arg(long)]
    large_mib: Option<u64>,
    #[command(flatten)]
    pub out: BenchOutput,
}

/// Words of each thread's insert array (inserts wrap around it).
const SLOTS: u64 = 4096;

fn options() -> Options {
    Options { heap_capacity: 256 << 20, checkpoint_interval: Some(Duration::from_secs(1)), ..Options::default() }
}

/// One run's figures.
#[derive(Clone, Copy)]
struct Figures {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// A group run and the alone run beside it.
struct Run {
    threads: usize,
    in_flight: usize,
    alone: Figures,
    group: Figures,
}

/// `threads` clients committing for `duration` through `commit` (thread, its array, its
/// insert number) → whether it committed.
fn drive(threads: usize, duration: Duration, arrays: &[HeapPtr], commit: &(dyn Fn(usize, HeapPtr, u64) -> bool + Sync)) -> Figures {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let (hist, elapsed) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, barrier, array) = (&stop, &barrier, arrays[t]);
                s.spawn(move || {
                    let mut hist = Histogram::<u64>::new(3).expect("a histogram");
                    barrier.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        if commit(t, array, n) {
                            hist.record(began.elapsed().as_nanos() as u64).expect("in range");
                            n += 1;
                        }
                    }
                    hist
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let mut all = Histogram::<u64>::new(3).expect("a histogram");
        for w in workers {
            all.add(w.join().expect("worker")).expect("same bounds");
        }
        (all, started.elapsed())
    });
    Figures {
        per_s: hist.len() as f64 / elapsed.as_secs_f64(),
        p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
    }
}

fn insert(tx: &mut tusk::Transaction<'_>, array: HeapPtr, n: u64) -> Result<(), tusk::Error> {
    tx.write_u64_at(array, 8 * (1 + n % SLOTS), n)?;
    tx.write_u64_at(array, 0, n + 1)
}

fn arrays(threads: usize, mut commit: impl FnMut(&mut dyn FnMut(&mut tusk::Transaction<'_>) -> Result<Vec<HeapPtr>, tusk::Error>) -> Result<Vec<HeapPtr>, Box<dyn std::error::Error>>) -> Result<Vec<HeapPtr>, Box<dyn std::error::Error>> {
    commit(&mut |tx| (0..threads).map(|_| tx.alloc(8 * (SLOTS + 1))).collect())
}

fn alone(dir: &Path, threads: usize, duration: Duration) -> Result<Figures, Box<dyn std::error::Error>> {
    let store = Store::open(dir, options())?;
    let arrays = arrays(threads, |f| Ok(store.transact(Commit::Sync, |tx| f(tx))?.0))?;
    let figures = drive(threads, duration, &arrays, &|_, array, n| store.transact(Commit::Sync, |tx| insert(tx, array, n)).is_ok());
    store.close()?;
    Ok(figures)
}

fn group(dir: &Path, nodes: usize, threads: usize, duration: Duration, settings: Settings) -> Result<Figures, Box<dyn std::error::Error>> {
    let group = LocalGroup::start(dir, nodes, options(), settings)?;
    let l = group.leader(Duration::from_secs(30)).ok_or("no leader elected")?;
    let figures = {
        let slot = group.node(l).ok_or("the leader is down")?;
        let leader: &ReplicatedNode = slot.as_ref().expect("up");
        let arrays = arrays(threads, |f| Ok(leader.transact(Commit::Sync, |tx| f(tx))?.0))?;
        drive(threads, duration, &arrays, &|_, array, n| leader.transact(Commit::Sync, |tx| insert(tx, array, n)).is_ok())
    };
    group.close()?;
    Ok(figures)
}

/// A large transaction's figures: seconds until its commit returned alone, on the group, and
/// until every node of the group had applied it.
struct Large {
    alone_s: f64,
    group_s: f64,
    applied_s: f64,
}

fn large_options(mib: u64) -> Options {
    Options { heap_capacity: ((2 * mib + 256) << 20).next_multiple_of(1 << 30), ..options() }
}

/// One transaction writing `bytes` at a new allocation.
fn write_large(tx: &mut tusk::Transaction<'_>, bytes: &[u8]) -> Result<(), tusk::Error> {
    let p = tx.alloc(bytes.len() as u64)?;
    tx.write(p, bytes)?;
    tx.set_root("large", p)
}

fn large_round(dir: &Path, nodes: usize, mib: u64, settings: Settings) -> Result<Large, Box<dyn std::error::Error>> {
    let bytes = super::bench_catchup::random_bytes(1, mib << 20);
    let store = Store::open(dir.join("alone"), large_options(mib))?;
    let began = Instant::now();
    store.transact(Commit::Sync, |tx| write_large(tx, &bytes))?;
    let alone_s = began.elapsed().as_secs_f64();
    store.close()?;
    let group = LocalGroup::start(&dir.join("group"), nodes, large_options(mib), Settings { commit_timeout: Duration::from_secs(600), ..settings })?;
    let l = group.leader(Duration::from_secs(30)).ok_or("no leader elected")?;
    let began = Instant::now();
    let (_, at) = group.node(l).ok_or("the leader is down")?.as_ref().expect("up").transact(Commit::Sync, |tx| write_large(tx, &bytes))?;
    let group_s = began.elapsed().as_secs_f64();
    let at = at.ok_or("a Sync commit on the group gives its position")?;
    for i in 0..nodes {
        let slot = group.node(i).ok_or(format!("node {} is down", i + 1))?;
        if !slot.as_ref().expect("up").wait_applied(at, Duration::from_secs(600)) {
            return Err(format!("node {} did not apply the large transaction", i + 1).into());
        }
    }
    let applied_s = began.elapsed().as_secs_f64();
    group.close()?;
    Ok(Large { alone_s, group_s, applied_s })
}

fn run_large(args: &ReplicatedArgs, mib: u64, settings: Settings) -> CliResult {
    if mib == 0 {
        return Err("--large-mib must be ≥ 1".into());
    }
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let dir = BenchDir::new(args.out.dir.clone())?;
        rounds.push(large_round(dir.path(), args.nodes, mib, settings)?);
    }
    let m = |v: &dyn Fn(&Large) -> f64| median(&rounds.iter().map(v).collect::<Vec<_>>());
    let (alone_s, group_s, applied_s) = (m(&|r| r.alone_s), m(&|r| r.group_s), m(&|r| r.applied_s));
    let ratio = m(&|r| r.alone_s / r.group_s);
    let mb = (mib << 20) as f64 / 1e6;
    if args.out.json {
        outln!(
            "{}",
            serde_json::json!({
                "bench": "replicated", "nodes": args.nodes, "large_mib": mib, "rounds": args.rounds,
                "alone_s": alone_s, "group_s": group_s, "all_applied_s": applied_s, "group_vs_alone": ratio,
            })
        );
    } else {
        outln!("tusk bench replicated: one Sync transaction of {mib} MiB, {} nodes on loopback against one store, medians of {} round(s)", args.nodes, args.rounds);
        outln!("{:>12} {:>10} {:>12} {:>10} {:>16} {:>13}", "alone s", "MB/s", "group s", "MB/s", "all applied s", "group/alone");
        outln!("{alone_s:>12.3} {:>10.0} {group_s:>12.3} {:>10.0} {applied_s:>16.3} {ratio:>13.3}", mb / alone_s, mb / group_s);
    }
    Ok(())
}

pub fn run(args: ReplicatedArgs) -> CliResult {
    if args.nodes < 1 || args.rounds == 0 || args.threads.contains(&0) || args.proposals_in_flight.contains(&0) {
        return Err("--nodes, --rounds, every --threads and --proposals-in-flight must be ≥ 1".into());
    }
    let duration = Duration::from_secs_f64(args.duration);
    let defaults = Settings { runtime_threads: args.runtime_threads.unwrap_or(Settings::default().runtime_threads), ..Settings::default() };
    if defaults.runtime_threads == 0 {
        return Err("--runtime-threads must be ≥ 1".into());
    }
    if let Some(mib) = args.large_mib {
        return run_large(&args, mib, defaults);
    }
    let in_flight = if args.proposals_in_flight.is_empty() { vec![defaults.proposals_in_flight] } else { args.proposals_in_flight.clone() };
    // Each group run beside the alone run of its round and thread count.
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..args.rounds {
        for &threads in &args.threads {
            let dir = BenchDir::new(args.out.dir.clone())?;
            let mut groups = Vec::new();
            // The order flips every round, so that neither setup always runs first.
            if round % 2 == 1 {
                for (k, &f) in in_flight.iter().enumerate() {
                    groups.push((f, group(&dir.path().join(format!("group{k}")), args.nodes, threads, duration, Settings { proposals_in_flight: f, ..defaults })?));
                }
            }
            let a = alone(&dir.path().join("alone"), threads, duration)?;
            if round % 2 == 0 {
                for (k, &f) in in_flight.iter().enumerate() {
                    groups.push((f, group(&dir.path().join(format!("group{k}")), args.nodes, threads, duration, Settings { proposals_in_flight: f, ..defaults })?));
                }
            }
            for (in_flight, group) in groups {
                runs.push(Run { threads, in_flight, alone: a, group });
            }
        }
    }
    if !args.out.json {
        outln!("tusk bench replicated: Sync inserts, {} nodes on loopback against one store, {} s runs, medians of {} round(s)", args.nodes, args.duration, args.rounds);
        outln!("{:>8} {:>9} {:>12} {:>9} {:>9} {:>12} {:>9} {:>9} {:>13} {:>13}", "threads", "in flight", "alone/s", "p50 us", "p99 us", "group/s", "p50 us", "p99 us", "group/alone", "p50 +us");
    }
    for &threads in &args.threads {
        for &f in &in_flight {
            let mine: Vec<&Run> = runs.iter().filter(|r| r.threads == threads && r.in_flight == f).collect();
            let m = |v: &dyn Fn(&Run) -> f64| median(&mine.iter().map(|r| v(r)).collect::<Vec<_>>());
            let (a_s, a50, a99) = (m(&|r| r.alone.per_s), m(&|r| r.alone.p50_us), m(&|r| r.alone.p99_us));
            let (g_s, g50, g99) = (m(&|r| r.group.per_s), m(&|r| r.group.p50_us), m(&|r| r.group.p99_us));
            let ratio = m(&|r| r.group.per_s / r.alone.per_s);
            let p50_delta = m(&|r| r.group.p50_us - r.alone.p50_us);
            if args.out.json {
                outln!(
                    "{}",
                    serde_json::json!({
                        "bench": "replicated", "nodes": args.nodes, "threads": threads, "proposals_in_flight": f, "rounds": args.rounds,
                        "alone_per_s": a_s, "alone_p50_us": a50, "alone_p99_us": a99,
                        "group_per_s": g_s, "group_p50_us": g50, "group_p99_us": g99,
                        "group_vs_alone": ratio, "p50_delta_us": p50_delta,
                    })
                );
            } else {
                outln!("{threads:>8} {f:>9} {:>12} {a50:>9.1} {a99:>9.1} {:>12} {g50:>9.1} {g99:>9.1} {ratio:>13.3} {p50_delta:>13.1}", rate(a_s), rate(g_s));
            }
        }
    }
    Ok(())
}
