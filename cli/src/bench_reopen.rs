//! `tusk bench recovery --reopen-mib M[,...]`: the time from `Store::open` to the first
//! answered read against the heap's size, on demand and whole (issue 32). Each store holds an
//! array of M MiB and a B-link tree of [`TREE_KEYS`] keys in one checkpoint, then
//! `--reopen-log-mib` of Hathi commits after it; each reopen is timed to its return, to a
//! root lookup plus one B-link `get`, and to the moment every chunk is in memory, with the
//! store's files dropped from the page cache (cold) or just read (warm).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tusk::{Commit, HeapLoad, Options, Store};

use super::bench_store::{drop_cached, hathi, hathi_counted, join, make_array, read_sequentially};
use super::report::median;
use super::store_files;

/// Keys of the B-link tree the first read looks one up in.
pub const TREE_KEYS: u64 = 200_000;
const KEY_READ: u64 = 123_457;

fn options(heap_mib: u64, load: HeapLoad) -> Options {
    Options { heap_capacity: (heap_mib + 64) << 20, checkpoint_interval: None, max_log_bytes: u64::MAX / 4, heap_load: load, ..Options::default() }
}

/// One reopen, timed.
#[derive(Clone, Debug)]
pub struct Reopen {
    pub heap_mib: u64,
    pub load: &'static str,
    pub cold: bool,
    /// `Store::open` returned.
    pub open_s: f64,
    /// The root looked up and one B-link `get` answered (from the open's start).
    pub first_read_s: f64,
    /// Every chunk in memory (from the open's start; the open itself for a whole load).
    pub all_in_s: f64,
    /// The process's resident memory after the first read and once every chunk is in, MiB.
    pub rss_first_read_mib: f64,
    pub rss_all_in_mib: f64,
}

/// The process's resident memory (`VmRSS`), MiB; NaN where /proc does not say.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
    kib.map_or(f64::NAN, |k| k / 1024.0)
}

/// Builds the store for `heap_mib` in `dir`: the array, the tree, a checkpoint, then
/// `log_mib` of Hathi commits after it; closed.
pub fn prepare(dir: &Path, heap_mib: u64, log_mib: u64) -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(Store::open(dir, options(heap_mib, HeapLoad::Whole))?);
    let array = make_array(&store, heap_mib)?;
    for start in (0..TREE_KEYS).step_by(20_000) {
        store.transact(Commit::Async, |tx| {
            let mut t = tx.btree("t")?;
            for k in start..(start + 20_000).min(TREE_KEYS) {
                t.insert(k * 7, k)?;
            }
            Ok(())
        })?;
    }
    store.checkpoint()?;
    let base = store.log_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let workers = hathi(&store, array, (heap_mib << 20) / 8, 2, None, &stop);
    while store.log_bytes().saturating_sub(base) < log_mib << 20 {
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    join(workers)?;
    Arc::try_unwrap(store).map_err(|_| "store still shared")?.close()?;
    Ok(())
}

/// Reopens the store in `dir` once.
pub fn reopen(dir: &Path, heap_mib: u64, load: HeapLoad, cold: bool) -> Result<Reopen, Box<dyn std::error::Error>> {
    let files = store_files(dir)?;
    if cold {
        drop_cached(&files)?;
    } else {
        for f in &files {
            std::io::copy(&mut std::fs::File::open(f)?, &mut std::io::sink())?;
        }
    }
    let started = Instant::now();
    let store = Store::open(dir, options(heap_mib, load))?;
    let open_s = started.elapsed().as_secs_f64();
    let (value, _) = store.transact(Commit::Async, |tx| tx.btree("t")?.get(KEY_READ * 7))?;
    let first_read_s = started.elapsed().as_secs_f64();
    let rss_first_read_mib = rss_mib();
    if value != Some(KEY_READ) {
        return Err(format!("{}: key {} reads {value:?} after the reopen, not {KEY_READ}", dir.display(), KEY_READ * 7).into());
    }
    while store.chunks_absent() > 0 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let all_in_s = started.elapsed().as_secs_f64();
    let rss_all_in_mib = rss_mib();
    store.close()?;
    let load = match load {
        HeapLoad::OnDemand => "on-demand",
        HeapLoad::Whole => "whole",
    };
    Ok(Reopen { heap_mib, load, cold, open_s, first_read_s, all_in_s, rss_first_read_mib, rss_all_in_mib })
}

/// `rounds` interleaved rounds over every (load, cache) pair for each size; every reopen.
/// With `speed` (threads, seconds), then the Hathi workload's speed after a cold reopen on
/// demand of each size, beside a sequential read of its files (O_DIRECT: bytes, seconds).
#[allow(clippy::type_complexity)]
pub fn measure(
    dir: &Path,
    sizes: &[u64],
    log_mib: u64,
    rounds: usize,
    speed: Option<(usize, f64)>,
) -> Result<(Vec<Reopen>, Vec<(SpeedAfterReopen, (u64, f64))>), Box<dyn std::error::Error>> {
    let (mut out, mut speeds) = (Vec::new(), Vec::new());
    for &mib in sizes {
        let store_dir = dir.join(format!("reopen-{mib}"));
        prepare(&store_dir, mib, log_mib)?;
        for round in 0..rounds.max(1) {
            let mut order = [(HeapLoad::OnDemand, true), (HeapLoad::Whole, true), (HeapLoad::OnDemand, false), (HeapLoad::Whole, false)];
            if round % 2 == 1 {
                order.reverse();
            }
            for (load, cold) in order {
                out.push(reopen(&store_dir, mib, load, cold)?);
            }
        }
        if let Some((threads, seconds)) = speed {
            let files = store_files(&store_dir)?;
            drop_cached(&files)?;
            let read = read_sequentially(&files)?;
            speeds.push((speed_after_reopen(&store_dir, mib, threads, seconds)?, read));
        }
        std::fs::remove_dir_all(&store_dir)?;
    }
    Ok((out, speeds))
}

impl Reopen {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "heap_mib": self.heap_mib,
            "load": self.load,
            "cold": self.cold,
            "open_s": self.open_s,
            "first_read_s": self.first_read_s,
            "all_in_s": self.all_in_s,
            "rss_first_read_mib": self.rss_first_read_mib,
            "rss_all_in_mib": self.rss_all_in_mib,
        })
    }
}

/// The median of `f` over the reopens of one size, load and cache state.
pub fn median_of(rows: &[Reopen], mib: u64, load: &str, cold: bool, f: impl Fn(&Reopen) -> f64) -> f64 {
    median(&rows.iter().filter(|r| r.heap_mib == mib && r.load == load && r.cold == cold).map(f).collect::<Vec<_>>())
}

/// Hathi throughput against the time since a reopen on demand (issue 32, target 2).
#[derive(Clone, Debug)]
pub struct SpeedAfterReopen {
    pub heap_mib: u64,
    pub threads: usize,
    /// `Store::open` on demand, cold.
    pub open_s: f64,
    /// (seconds since the open's start, txn/s over the window ending there, chunks absent).
    pub samples: Vec<(f64, f64, u64)>,
    /// txn/s of the same store once every chunk was in (its last second).
    pub warm_txn_per_s: f64,
    /// Seconds since the open's start from which a window and the next second's (their
    /// median) ran at ≥ 0.9 of warm.
    pub full_speed_s: Option<f64>,
    pub all_in_s: Option<f64>,
}

/// Window of one throughput sample.
const SAMPLE: Duration = Duration::from_millis(100);

/// Reopens `dir` (prepared by [`prepare`]) on demand with the page cache dropped and runs
/// Hathi on `threads` threads for `seconds`, sampling txn/s every 100 ms; then one more
/// second with every chunk in, for the warm rate.
pub fn speed_after_reopen(dir: &Path, heap_mib: u64, threads: usize, seconds: f64) -> Result<SpeedAfterReopen, Box<dyn std::error::Error>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    drop_cached(&store_files(dir)?)?;
    let started = Instant::now();
    let store = Arc::new(Store::open(dir, options(heap_mib, HeapLoad::OnDemand))?);
    let open_s = started.elapsed().as_secs_f64();
    let array = store.transact(Commit::Async, |tx| tx.root("bench"))?.0.ok_or("the reopen store has no bench array")?;
    let words = (heap_mib << 20) / 8;
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let workers = hathi_counted(&store, array, words, threads, None, &stop, Some(&done));
    let mut samples = Vec::new();
    let (mut last, mut all_in_s, mut warm_from) = (0, None, None);
    loop {
        std::thread::sleep(SAMPLE);
        let now = done.load(Ordering::Relaxed);
        let t = started.elapsed().as_secs_f64();
        let absent = store.chunks_absent();
        samples.push((t, (now - last) as f64 / SAMPLE.as_secs_f64(), absent));
        last = now;
        if absent == 0 && all_in_s.is_none() {
            all_in_s = Some(t);
        }
        if t >= seconds && all_in_s.is_some() {
            let from = *warm_from.get_or_insert(samples.len());
            if samples.len() - from >= (1.0 / SAMPLE.as_secs_f64()) as usize {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    join(workers)?;
    let warm_from = warm_from.expect("the loop ends in the warm second");
    let warm_txn_per_s = median(&samples[warm_from..].iter().map(|s| s.1).collect::<Vec<_>>());
    // From the first window at ≥ 0.9 of warm whose next second does so too (as a median: on
    // a busy machine single windows dip).
    let second = (1.0 / SAMPLE.as_secs_f64()) as usize;
    let fast = |rate: f64| rate >= 0.9 * warm_txn_per_s;
    let full_speed_s = (0..=samples.len().saturating_sub(second))
        .find(|&i| fast(samples[i].1) && fast(median(&samples[i..i + second].iter().map(|s| s.1).collect::<Vec<_>>())))
        .map(|i| samples[i].0 - SAMPLE.as_secs_f64());
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;
    store.close()?;
    Ok(SpeedAfterReopen { heap_mib, threads, open_s, samples, warm_txn_per_s, full_speed_s, all_in_s })
}

impl SpeedAfterReopen {
    /// With the sequential read of the store's files (bytes, seconds) measured beside it.
    pub fn json(&self, read: (u64, f64)) -> serde_json::Value {
        serde_json::json!({
            "heap_mib": self.heap_mib,
            "threads": self.threads,
            "open_s": self.open_s,
            "warm_txn_per_s": self.warm_txn_per_s,
            "full_speed_s": self.full_speed_s,
            "all_in_s": self.all_in_s,
            "sequential_read_bytes": read.0,
            "sequential_read_s": read.1,
            "samples": self.samples.iter().map(|&(t, rate, absent)| serde_json::json!([t, rate, absent])).collect::<Vec<_>>(),
        })
    }
}

/// `reopen_speed.svg` in `dir`: txn/s against seconds since the open, one line per size, as a
/// fraction of that store's warm rate.
pub fn plot_speed(speeds: &[(SpeedAfterReopen, (u64, f64))], dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use super::svg_plot::{write_svg, Chart, Series};
    std::fs::create_dir_all(dir)?;
    let series = speeds
        .iter()
        .map(|(x, _)| Series {
            label: format!("{} MiB heap", x.heap_mib),
            points: x.samples.iter().map(|&(t, rate, _)| (t, rate / x.warm_txn_per_s)).collect(),
        })
        .collect();
    let chart = Chart {
        title: "Hathi after a cold reopen on demand".into(),
        x_label: "seconds since Store::open".into(),
        y_label: "txn/s / warm txn/s".into(),
        log_x: false,
        log_y: false,
        series,
    };
    write_svg(&chart, &dir.join("reopen_speed.svg"))
}
