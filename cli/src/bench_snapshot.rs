//! `tusk bench snapshot`: the experiment of "A comparison of the use of virtual versus physical
//! snapshots for supporting update-intensive workloads" (Šidlauskas, Jensen, Šaltenis, DaMoN
//! 2012) on tusk's heap, plus what the paper left as future work (incremental copies, an
//! adaptive choice).
//!
//! Three parts, each measuring every mode in the same run:
//! - `cycles`: a region of `--heap-mib` is updated one 8-byte word per transaction, on pages
//!   drawn from the seven distributions of `page_dists.rs`; a snapshot is refreshed every F
//!   updates. Per mode × distribution × F: a warm-up snapshot and F updates, then
//!   `--cycles` cycles of (refresh, F updates); the figure is the median cycle time (the
//!   refresh plus the F updates that follow it, which is where a fork's copy-on-write faults
//!   land). Modes run one after another per (distribution, F), their order rotated from one
//!   distribution to the next.
//! - `sizes`: snapshot time against heap size: memcpy with 1..=cores copier threads, each
//!   round followed by a plain parallel memcpy of the same number of bytes with the same
//!   threads (medians of interleaved rounds, reused buffers on both sides); fork; an
//!   incremental refresh with 5% of the pages dirty against a full memcpy; and the
//!   copy-on-write cost per page on the largest heap (writes to distinct pages with a fork
//!   child alive, against the same writes without one).
//! - `queries`: B-link point lookups and count+sum range queries on a memcpy snapshot, on a
//!   fork snapshot (batches over shared memory), and in read-only transactions; interleaved
//!   rounds, medians.
//!
//! After each mode's cycles the region is populated writable again (outside the timing): the
//! pages a fork child shared stay write-protected after it ends, and the next mode's first
//! write to each would otherwise pay a fault that belongs to the fork.
//!
//! Updates run with `Durability::Off` (no log I/O in the figures: the paper measures the
//! snapshot mechanisms, and logging costs every mode the same).

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tusk::{Commit, Durability, HeapPtr, Options, SnapshotMode, SnapshotOptions, Store};

use super::page_dists::{PageDist, PageStream};
use super::report::{median, rate, table};
use super::svg_plot::{write_svg, write_svg_grid, Chart, Series};
use super::{BenchDir, ChartedOutput, CliResult, IoAt};

const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeChoice {
    Memcpy,
    Incremental,
    Fork,
    Auto,
}

impl ModeChoice {
    fn mode(self) -> SnapshotMode {
        match self {
            ModeChoice::Memcpy => SnapshotMode::Memcpy,
            ModeChoice::Incremental => SnapshotMode::Incremental,
            ModeChoice::Fork => SnapshotMode::Fork,
            ModeChoice::Auto => SnapshotMode::Auto,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    Cycles,
    Sizes,
    Queries,
}

#[derive(Args, Debug, Clone)]
pub struct SnapshotArgs {
    /// Parts to run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cycles,sizes,queries")]
    parts: Vec<Part>,
    /// Size of the updated region of the cycle experiment, MiB.
    #[arg(long, default_value_t = 1024)]
    heap_mib: u64,
    /// Updates between snapshots, F (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    every: Vec<u64>,
    /// Update distributions (comma-separated; default: all seven).
    #[arg(long, value_enum, value_delimiter = ',')]
    dist: Vec<PageDist>,
    /// Snapshot modes (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "memcpy,incremental,fork,auto")]
    mode: Vec<ModeChoice>,
    /// Measured cycles per mode × distribution × F (after one warm-up cycle).
    #[arg(long, default_value_t = 3)]
    cycles: usize,
    /// Heap sizes of the snapshot-time-against-size part, MiB (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    sizes_mib: Vec<u64>,
    /// Most copier threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Rounds of the sizes and queries parts (medians are reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Keys of the B-link tree the queries part reads.
    #[arg(long, default_value_t = 1_000_000)]
    query_keys: u64,
    /// Point lookups per round and kind.
    #[arg(long, default_value_t = 200_000)]
    lookups: usize,
    /// Count+sum range queries per round and kind, each over about 1,000 keys.
    #[arg(long, default_value_t = 2_000)]
    ranges: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    pub(super) out: ChartedOutput,
}

/// One measurement; the fields the issue names are always present (null where they do not
/// apply), the rest in `extra`.
struct Measurement {
    kind: &'static str,
    mode: String,
    distribution: Option<&'static str>,
    heap_mib: u64,
    updates_per_snapshot: Option<u64>,
    snapshot_ms: Option<f64>,
    cycle_ms: Option<f64>,
    copy_gb_per_s: Option<f64>,
    plain_memcpy_gb_per_s: Option<f64>,
    queries_per_s: Option<f64>,
    threads: Option<usize>,
    extra: Value,
}

impl Measurement {
    fn new(kind: &'static str, mode: impl Into<String>, heap_mib: u64) -> Measurement {
        Measurement {
            kind,
            mode: mode.into(),
            distribution: None,
            heap_mib,
            updates_per_snapshot: None,
            snapshot_ms: None,
            cycle_ms: None,
            copy_gb_per_s: None,
            plain_memcpy_gb_per_s: None,
            queries_per_s: None,
            threads: None,
            extra: json!({}),
        }
    }

    fn json(&self) -> Value {
        let mut v = json!({
            "bench": "snapshot",
            "kind": self.kind,
            "mode": self.mode,
            "distribution": self.distribution,
            "heap_mib": self.heap_mib,
            "updates_per_snapshot": self.updates_per_snapshot,
            "snapshot_ms": self.snapshot_ms,
            "cycle_ms": self.cycle_ms,
            "copy_gb_per_s": self.copy_gb_per_s,
            "plain_memcpy_gb_per_s": self.plain_memcpy_gb_per_s,
            "queries_per_s": self.queries_per_s,
            "threads": self.threads,
        });
        if let (Some(obj), Some(extra)) = (v.as_object_mut(), self.extra.as_object()) {
            obj.extend(extra.clone());
        }
        v
    }
}

pub fn run(args: SnapshotArgs) -> CliResult {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or(cores).max(1);
    let costs = tusk::snapshot_costs();
    let mut out = Vec::new();
    let mut cow = Measurement::new("cow_probe", "fork", 0);
    cow.extra = json!({
        "cow_us_per_page": costs.cow_per_page.as_secs_f64() * 1e6,
        "fork_ms": costs.fork_time.as_secs_f64() * 1e3,
        "fork_resident_mib": costs.fork_resident_bytes >> 20,
        "copy_gb_per_s_1_thread": costs.copy_bytes_per_s_1 / 1e9,
        "copy_gb_per_s_all_threads": costs.copy_bytes_per_s_n / 1e9,
    });
    out.push(cow);
    if args.parts.contains(&Part::Sizes) {
        sizes(&args, threads, &mut out)?;
    }
    if args.parts.contains(&Part::Queries) {
        queries(&args, &mut out)?;
    }
    if args.parts.contains(&Part::Cycles) {
        cycles(&args, threads, &mut out)?;
    }
    if args.out.json {
        for m in &out {
            outln!("{}", m.json());
        }
    } else {
        print_tables(&out);
    }
    if let Some(dir) = &args.out.plot {
        plot(dir, &out)?;
        if !args.out.json {
            outln!("\nfigures written to {}", dir.display());
        }
    }
    Ok(())
}

/// A store with a page-aligned region of `bytes` under the root "data", backed by memory.
fn region_store(dir: &BenchDir, bytes: u64) -> Result<(Store, HeapPtr), Box<dyn std::error::Error>> {
    let options = Options {
        heap_capacity: bytes + (256 << 20),
        durability: Durability::Off,
        checkpoint_interval: None,
        ..Options::default()
    };
    let store = Store::open(dir.path(), options)?;
    let (p, _) = store.transact(Commit::Async, |tx| {
        let p = tx.alloc(bytes + PAGE)?;
        tx.set_root("data", p)?;
        Ok(p)
    })?;
    store.prefault();
    Ok((store, HeapPtr(p.offset().next_multiple_of(PAGE))))
}

/// Runs `n` updates, one word per transaction on a page drawn from `stream`; returns the time.
fn update(store: &Store, region: HeapPtr, stream: &mut PageStream, n: u64, salt: u64) -> Result<Duration, tusk::Error> {
    let data = store.transact(Commit::Async, |tx| Ok(tx.root("data")?.expect("the region")))?.0;
    let started = Instant::now();
    for i in 0..n {
        let page = stream.next_page();
        let at = region.offset() - data.offset() + page * PAGE + ((i ^ salt) * 8) % PAGE;
        store.transact(Commit::Async, |tx| tx.write_u64_at(data, at, i))?;
    }
    Ok(started.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn snapshot_options(mode: SnapshotMode, threads: usize) -> SnapshotOptions {
    SnapshotOptions { copier_threads: threads, ..SnapshotOptions::from(mode) }
}

fn cycles(args: &SnapshotArgs, threads: usize, out: &mut Vec<Measurement>) -> CliResult {
    let dir = BenchDir::new(args.out.dir.clone())?;
    let bytes = args.heap_mib << 20;
    let (store, region) = region_store(&dir, bytes)?;
    let pages = bytes / PAGE;
    let dists = if args.dist.is_empty() { PageDist::ALL.to_vec() } else { args.dist.clone() };
    let bar = indicatif::ProgressBar::new((dists.len() * args.every.len() * args.mode.len()) as u64);
    if args.out.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    for (di, &dist) in dists.iter().enumerate() {
        for &every in &args.every {
            let mut modes = args.mode.clone();
            let turn = di % modes.len().max(1);
            modes.rotate_left(turn);
            for choice in modes {
                bar.set_message(format!("{} F={every} {:?}", dist.name(), choice));
                let mut stream = PageStream::new(dist, pages, args.seed ^ di as u64);
                let mut snap = store.snapshot_with(snapshot_options(choice.mode(), threads))?;
                update(&store, region, &mut stream, every, 0)?;
                let (mut snap_ms, mut cycle_ms, mut copied, mut pause_ms, mut picked) = (vec![], vec![], vec![], vec![], vec![]);
                for c in 0..args.cycles {
                    let started = Instant::now();
                    let info = snap.refresh()?.clone();
                    let taken = started.elapsed();
                    let updates = update(&store, region, &mut stream, every, c as u64 + 1)?;
                    snap_ms.push(ms(taken));
                    cycle_ms.push(ms(taken + updates));
                    copied.push(info.bytes_copied as f64 / taken.as_secs_f64().max(1e-9) / 1e9);
                    pause_ms.push(ms(info.pause));
                    picked.push(info.mode.name());
                }
                drop(snap);
                // A fork leaves the pages it shared write-protected until each is written
                // once; make them writable again so the next mode does not pay for this one.
                store.prefault();
                let mut m = Measurement::new("cycle", choice.mode().name(), args.heap_mib);
                m.distribution = Some(dist.name());
                m.updates_per_snapshot = Some(every);
                m.snapshot_ms = Some(median(&snap_ms));
                m.cycle_ms = Some(median(&cycle_ms));
                m.copy_gb_per_s = (choice != ModeChoice::Fork).then(|| median(&copied));
                m.threads = Some(threads);
                m.extra = json!({ "pause_ms": median(&pause_ms), "picked": picked });
                out.push(m);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// Copies `src` into `dst` with `threads` threads, split as the snapshot copier splits.
fn plain_memcpy(src: &[u8], dst: &mut [u8], threads: usize) {
    let per = src.len().div_ceil(threads).next_multiple_of(PAGE as usize);
    std::thread::scope(|s| {
        let mut jobs = dst.chunks_mut(per).zip(src.chunks(per));
        let mine = jobs.next();
        for (d, from) in jobs {
            s.spawn(move || d.copy_from_slice(from));
        }
        if let Some((d, from)) = mine {
            d.copy_from_slice(from);
        }
    });
}

fn sizes(args: &SnapshotArgs, threads: usize, out: &mut Vec<Measurement>) -> CliResult {
    let largest = args.sizes_mib.iter().copied().max().unwrap_or(0);
    for &mib in &args.sizes_mib {
        let dir = BenchDir::new(args.out.dir.clone())?;
        let bytes = mib << 20;
        let (store, region) = region_store(&dir, bytes)?;
        let extent_of = |store: &Store| store.heap_used().next_multiple_of(PAGE);
        let extent = extent_of(&store);
        let src = vec![1u8; extent as usize];
        let mut dst = vec![2u8; extent as usize];
        for t in 1..=threads {
            let started = Instant::now();
            let mut snap = store.snapshot_with(snapshot_options(SnapshotMode::Memcpy, t))?;
            let first = started.elapsed();
            let (mut snap_ms, mut plain_ms, mut pause_ms) = (vec![], vec![], vec![]);
            for _ in 0..args.rounds {
                let started = Instant::now();
                let info = snap.refresh()?.clone();
                snap_ms.push(ms(started.elapsed()));
                pause_ms.push(ms(info.pause));
                let started = Instant::now();
                plain_memcpy(&src, &mut dst, t);
                plain_ms.push(ms(started.elapsed()));
            }
            let (s, p) = (median(&snap_ms), median(&plain_ms));
            let mut m = Measurement::new("size", "memcpy", mib);
            m.threads = Some(t);
            m.snapshot_ms = Some(s);
            m.copy_gb_per_s = Some(extent as f64 / s / 1e6);
            m.plain_memcpy_gb_per_s = Some(extent as f64 / p / 1e6);
            m.extra = json!({ "first_snapshot_ms": ms(first), "pause_ms": median(&pause_ms), "bandwidth_ratio": p / s });
            out.push(m);
        }
        // Incremental refresh with 5% of the pages dirty, against a full copy, interleaved
        // (before any fork: pages a fork shared come back split into 4 KiB mappings).
        let pages = bytes / PAGE;
        let mut rng = SmallRng::seed_from_u64(args.seed);
        let mut all: Vec<u64> = (0..pages).collect();
        for t in 1..=threads {
            let mut incremental = store.snapshot_with(snapshot_options(SnapshotMode::Incremental, t))?;
            let mut full = store.snapshot_with(snapshot_options(SnapshotMode::Memcpy, t))?;
            let (mut inc_ms, mut full_ms, mut copied) = (vec![], vec![], vec![]);
            for round in 0..args.rounds {
                all.shuffle(&mut rng);
                dirty_pages(&store, region, &all[..(pages / 20) as usize], round as u64)?;
                let started = Instant::now();
                copied.push(incremental.refresh()?.bytes_copied as f64);
                inc_ms.push(ms(started.elapsed()));
                let started = Instant::now();
                full.refresh()?;
                full_ms.push(ms(started.elapsed()));
            }
            let (i, f) = (median(&inc_ms), median(&full_ms));
            let mut m = Measurement::new("incremental_5pct", "incremental", mib);
            m.snapshot_ms = Some(i);
            m.threads = Some(t);
            m.extra = json!({ "full_memcpy_ms": f, "speedup": f / i, "bytes_copied": median(&copied) });
            out.push(m);
        }

        // Fork: the time to fork the child (the snapshot), not counting its later faults.
        let mut fork_ms = vec![];
        for _ in 0..args.rounds {
            let started = Instant::now();
            let snap = store.snapshot(SnapshotMode::Fork)?;
            fork_ms.push(ms(started.elapsed()));
            drop(snap);
        }
        let mut m = Measurement::new("size", "fork", mib);
        m.snapshot_ms = Some(median(&fork_ms));
        out.push(m);

        if mib == largest {
            out.push(cow_on_heap(&store, region, pages, args)?);
        }
    }
    Ok(())
}

/// Writes one word on each of `pages` of the region, in a few large transactions.
fn dirty_pages(store: &Store, region: HeapPtr, pages: &[u64], salt: u64) -> Result<(), tusk::Error> {
    let data = store.transact(Commit::Async, |tx| Ok(tx.root("data")?.expect("the region")))?.0;
    for chunk in pages.chunks(4096) {
        store.transact(Commit::Async, |tx| {
            for &p in chunk {
                tx.write_u64_at(data, region.offset() - data.offset() + p * PAGE + (salt * 8) % PAGE, p ^ salt)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Copy-on-write cost per page on the benchmark's own heap: single-word writes to distinct
/// random pages with a fork child alive, against the same number of writes to other distinct
/// pages without one (interleaved rounds).
fn cow_on_heap(store: &Store, region: HeapPtr, pages: u64, args: &SnapshotArgs) -> Result<Measurement, Box<dyn std::error::Error>> {
    let per_round = (pages / 4 / args.rounds.max(1) as u64).clamp(1, 20_000) as usize;
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0xC0);
    let mut order: Vec<u64> = (0..pages).collect();
    order.shuffle(&mut rng);
    let mut chunks = order.chunks(per_round);
    let (mut with_fork, mut without) = (vec![], vec![]);
    for round in 0..args.rounds {
        let (Some(a), Some(b)) = (chunks.next(), chunks.next()) else { break };
        let snap = store.snapshot(SnapshotMode::Fork)?;
        let started = Instant::now();
        dirty_pages(store, region, a, round as u64 + 1)?;
        with_fork.push(started.elapsed().as_secs_f64() / a.len() as f64);
        drop(snap);
        let started = Instant::now();
        dirty_pages(store, region, b, round as u64 + 1)?;
        without.push(started.elapsed().as_secs_f64() / b.len() as f64);
    }
    let (f, w) = (median(&with_fork), median(&without));
    let mut m = Measurement::new("cow", "fork", (pages * PAGE) >> 20);
    m.extra = json!({
        "cow_us_per_page": (f - w) * 1e6,
        "write_us_per_page_with_fork": f * 1e6,
        "write_us_per_page_without": w * 1e6,
        "pages_per_round": per_round,
    });
    Ok(m)
}

fn queries(args: &SnapshotArgs, out: &mut Vec<Measurement>) -> CliResult {
    let dir = BenchDir::new(args.out.dir.clone())?;
    let options = Options {
        heap_capacity: (args.query_keys * 64 + (256 << 20)).next_power_of_two(),
        durability: Durability::Off,
        checkpoint_interval: None,
        ..Options::default()
    };
    let store = Store::open(dir.path(), options)?;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut keys: Vec<u64> = (0..args.query_keys).map(|_| rng.random::<u64>() >> 1).collect();
    keys.sort_unstable();
    keys.dedup();
    store.transact(Commit::Async, |tx| tx.btree("orders")?.bulk_load(keys.iter().map(|&k| (k, k ^ 0x5555)), 1.0))?;
    store.prefault();
    let lookups: Vec<u64> = (0..args.lookups).map(|_| keys[rng.random_range(0..keys.len())]).collect();
    let ranges: Vec<(u64, u64)> = (0..args.ranges)
        .map(|_| {
            let i = rng.random_range(0..keys.len().saturating_sub(1000).max(1));
            (keys[i], keys[(i + 999).min(keys.len() - 1)])
        })
        .collect();
    let expected_hits = lookups.len();
    let memcpy = store.snapshot(SnapshotMode::Memcpy)?;
    let fork = store.snapshot(SnapshotMode::Fork)?;
    const TXN_LOOKUPS: usize = 16;
    let kinds = ["txn", "memcpy", "fork"];
    let mut lookup_rates: Vec<Vec<f64>> = vec![vec![]; 3];
    let mut range_rates: Vec<Vec<f64>> = vec![vec![]; 3];
    for _ in 0..args.rounds {
        for (k, kind) in kinds.iter().enumerate() {
            let started = Instant::now();
            let hits = match *kind {
                "txn" => {
                    let mut hits = 0;
                    for chunk in lookups.chunks(TXN_LOOKUPS) {
                        hits += store
                            .transact(Commit::Async, |tx| {
                                let mut t = tx.btree("orders")?;
                                let mut n = 0;
                                for &key in chunk {
                                    n += t.get(key)?.is_some() as usize;
                                }
                                Ok(n)
                            })?
                            .0;
                    }
                    hits
                }
                "memcpy" => {
                    let t = memcpy.btree("orders")?;
                    let mut n = 0;
                    for &key in &lookups {
                        n += t.get(key)?.is_some() as usize;
                    }
                    n
                }
                _ => fork.btree("orders")?.get_many(&lookups)?.iter().filter(|v| v.is_some()).count(),
            };
            lookup_rates[k].push(lookups.len() as f64 / started.elapsed().as_secs_f64());
            if hits != expected_hits {
                return Err(format!("{kind}: {hits} of {expected_hits} lookups found their key").into());
            }
            let started = Instant::now();
            let mut total = 0u128;
            for &(lo, hi) in &ranges {
                let (count, sum) = match *kind {
                    "txn" => {
                        store
                            .transact(Commit::Async, |tx| {
                                let mut t = tx.btree("orders")?;
                                Ok((t.count(lo..=hi)?, t.sum(lo..=hi)?))
                            })?
                            .0
                    }
                    "memcpy" => {
                        let t = memcpy.btree("orders")?;
                        (t.count(lo..=hi)?, t.sum(lo..=hi)?)
                    }
                    _ => {
                        let t = fork.btree("orders")?;
                        (t.count(lo..=hi)?, t.sum(lo..=hi)?)
                    }
                };
                total += count as u128 + sum;
            }
            range_rates[k].push(ranges.len() as f64 / started.elapsed().as_secs_f64());
            std::hint::black_box(total);
        }
    }
    let txn_lookups = median(&lookup_rates[0]);
    for (k, kind) in kinds.iter().enumerate() {
        let mut m = Measurement::new("queries", *kind, store.heap_used() >> 20);
        let rate = median(&lookup_rates[k]);
        m.queries_per_s = Some(rate);
        m.extra = json!({
            "query": "btree_get",
            "keys": keys.len(),
            "count_sum_ranges_per_s": median(&range_rates[k]),
            "vs_txn": rate / txn_lookups,
        });
        out.push(m);
    }
    Ok(())
}

fn print_tables(out: &[Measurement]) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    for m in out.iter().filter(|m| m.kind == "cow_probe") {
        table(
            "snapshot costs measured at start (Auto's inputs)",
            &[
                ("copy-on-write per page", format!("{:.2} µs", m.extra["cow_us_per_page"].as_f64().unwrap_or(f64::NAN))),
                ("fork", format!("{:.2} ms at {} MiB resident", m.extra["fork_ms"].as_f64().unwrap_or(f64::NAN), m.extra["fork_resident_mib"])),
                ("memcpy, 1 thread", format!("{:.2} GB/s", m.extra["copy_gb_per_s_1_thread"].as_f64().unwrap_or(f64::NAN))),
                ("memcpy, all threads", format!("{:.2} GB/s", m.extra["copy_gb_per_s_all_threads"].as_f64().unwrap_or(f64::NAN))),
            ],
        );
    }
    let sizes: Vec<&Measurement> = out.iter().filter(|m| m.kind == "size").collect();
    if !sizes.is_empty() {
        outln!("\nsnapshot time against heap size (medians)");
        outln!("{:>8} {:>12} {:>8} {:>12} {:>10} {:>12} {:>7} {:>10}", "heap MiB", "mode", "threads", "snapshot ms", "GB/s", "memcpy GB/s", "ratio", "pause ms");
        for m in sizes {
            outln!(
                "{:>8} {:>12} {:>8} {:>12} {:>10} {:>12} {:>7} {:>10}",
                m.heap_mib,
                m.mode,
                m.threads.map_or("-".into(), |t| t.to_string()),
                f(m.snapshot_ms, 2),
                f(m.copy_gb_per_s, 2),
                f(m.plain_memcpy_gb_per_s, 2),
                f(m.extra["bandwidth_ratio"].as_f64(), 2),
                f(m.extra["pause_ms"].as_f64(), 3)
            );
        }
    }
    for m in out.iter().filter(|m| m.kind == "incremental_5pct") {
        outln!(
            "incremental refresh, 5% of {} MiB dirty (random pages), {} thread(s): {:.2} ms vs full memcpy {:.2} ms = {:.1}x faster",
            m.heap_mib,
            m.threads.unwrap_or(1),
            m.snapshot_ms.unwrap_or(f64::NAN),
            m.extra["full_memcpy_ms"].as_f64().unwrap_or(f64::NAN),
            m.extra["speedup"].as_f64().unwrap_or(f64::NAN)
        );
    }
    for m in out.iter().filter(|m| m.kind == "cow") {
        outln!(
            "copy-on-write on the {} MiB heap: {:.2} µs per page ({:.2} µs a write with a fork child alive, {:.2} without)",
            m.heap_mib,
            m.extra["cow_us_per_page"].as_f64().unwrap_or(f64::NAN),
            m.extra["write_us_per_page_with_fork"].as_f64().unwrap_or(f64::NAN),
            m.extra["write_us_per_page_without"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let queries: Vec<&Measurement> = out.iter().filter(|m| m.kind == "queries").collect();
    if !queries.is_empty() {
        outln!("\nB-link queries ({} keys, medians)", queries[0].extra["keys"]);
        outln!("{:>8} {:>14} {:>8} {:>18}", "on", "lookups/s", "vs txn", "count+sum ranges/s");
        for m in queries {
            outln!(
                "{:>8} {:>14} {:>8} {:>18}",
                m.mode,
                rate(m.queries_per_s.unwrap_or(0.0)),
                f(m.extra["vs_txn"].as_f64(), 2),
                rate(m.extra["count_sum_ranges_per_s"].as_f64().unwrap_or(0.0))
            );
        }
    }
    let cycles: Vec<&Measurement> = out.iter().filter(|m| m.kind == "cycle").collect();
    if !cycles.is_empty() {
        outln!("\ncycle time: snapshot + F updates (medians, ms; auto/best = Auto against the best fixed mode)");
        outln!("{:>15} {:>9} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8}", "distribution", "F", "memcpy", "incremental", "fork", "auto", "auto/best", "fork/memcpy", "auto picked");
        let mut keys: Vec<(&str, u64)> = cycles.iter().map(|m| (m.distribution.unwrap_or(""), m.updates_per_snapshot.unwrap_or(0))).collect();
        keys.dedup();
        for (dist, every) in keys {
            let of = |mode: &str| cycles.iter().find(|m| m.distribution == Some(dist) && m.updates_per_snapshot == Some(every) && m.mode == mode);
            let cycle = |mode: &str| of(mode).and_then(|m| m.cycle_ms);
            let best = ["memcpy", "incremental", "fork"].iter().filter_map(|m| cycle(m)).fold(f64::INFINITY, f64::min);
            let picked = of("auto").map_or(String::new(), |m| {
                let mut p: Vec<String> = m.extra["picked"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect();
                p.dedup();
                p.join("/")
            });
            outln!(
                "{:>15} {:>9} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8}",
                dist,
                every,
                f(cycle("memcpy"), 1),
                f(cycle("incremental"), 1),
                f(cycle("fork"), 1),
                f(cycle("auto"), 1),
                f(cycle("auto").map(|a| a / best), 2),
                f(cycle("fork").zip(cycle("memcpy")).map(|(a, b)| a / b), 2),
                picked
            );
        }
    }
}

fn plot(dir: &std::path::Path, out: &[Measurement]) -> CliResult {
    std::fs::create_dir_all(dir).at(dir)?;
    // Figure 1: cycle time against F, a panel per distribution, a line per mode.
    let mut panels = Vec::new();
    let mut dists: Vec<&str> = out.iter().filter(|m| m.kind == "cycle").filter_map(|m| m.distribution).collect();
    dists.dedup();
    for dist in dists {
        let mut series = Vec::new();
        for mode in ["memcpy", "incremental", "fork", "auto"] {
            let points: Vec<(f64, f64)> = out
                .iter()
                .filter(|m| m.kind == "cycle" && m.distribution == Some(dist) && m.mode == mode)
                .filter_map(|m| Some((m.updates_per_snapshot? as f64, m.cycle_ms?)))
                .collect();
            if !points.is_empty() {
                series.push(Series { label: mode.into(), points });
            }
        }
        panels.push(Chart { title: dist.into(), x_label: "updates per snapshot (F)".into(), y_label: "cycle time (ms)".into(), log_x: true, log_y: true, series });
    }
    if !panels.is_empty() {
        write_svg_grid(&panels, 4, &dir.join("fig1_cycle_time.svg"))?;
    }
    // Figure 2: snapshot time against heap size.
    let sizes: Vec<&Measurement> = out.iter().filter(|m| m.kind == "size").collect();
    if !sizes.is_empty() {
        let mut series = Vec::new();
        let mut threads: Vec<usize> = sizes.iter().filter_map(|m| m.threads).collect();
        threads.sort_unstable();
        threads.dedup();
        for t in threads {
            let points = sizes.iter().filter(|m| m.mode == "memcpy" && m.threads == Some(t)).filter_map(|m| Some((m.heap_mib as f64, m.snapshot_ms?))).collect();
            series.push(Series { label: format!("memcpy, {t} thread(s)"), points });
        }
        let points = sizes.iter().filter(|m| m.mode == "fork").filter_map(|m| Some((m.heap_mib as f64, m.snapshot_ms?))).collect();
        series.push(Series { label: "fork".into(), points });
        let points = out.iter().filter(|m| m.kind == "incremental_5pct" && m.threads == Some(1)).filter_map(|m| Some((m.heap_mib as f64, m.snapshot_ms?))).collect();
        series.push(Series { label: "incremental, 5% dirty, 1 thread".into(), points });
        write_svg(&Chart { title: "snapshot creation time".into(), x_label: "heap (MiB)".into(), y_label: "ms".into(), log_x: true, log_y: true, series }, &dir.join("fig2_snapshot_time.svg"))?;
        // Figure 3: copy bandwidth against threads, snapshot and plain memcpy, per size.
        let mut series = Vec::new();
        let mut mibs: Vec<u64> = sizes.iter().map(|m| m.heap_mib).collect();
        mibs.dedup();
        for mib in mibs {
            let of = |m: &&&Measurement| m.mode == "memcpy" && m.heap_mib == mib;
            series.push(Series { label: format!("snapshot, {mib} MiB"), points: sizes.iter().filter(of).filter_map(|m| Some((m.threads? as f64, m.copy_gb_per_s?))).collect() });
            series.push(Series { label: format!("plain memcpy, {mib} MiB"), points: sizes.iter().filter(of).filter_map(|m| Some((m.threads? as f64, m.plain_memcpy_gb_per_s?))).collect() });
        }
        write_svg(&Chart { title: "copy bandwidth".into(), x_label: "threads".into(), y_label: "GB/s".into(), log_x: false, log_y: false, series }, &dir.join("fig3_bandwidth.svg"))?;
    }
    Ok(())
}
