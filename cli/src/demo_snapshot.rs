//! The snapshot part of `tusk demo`: for each snapshot mode (memcpy, incremental, fork,
//! auto), transfer and index update threads keep committing (the workers of `demo.rs` and
//! `demo_index.rs`) while this thread takes a snapshot (and, for incremental and auto, a few
//! refreshes) and reader threads run range counts and sums on the B-link tree of orders and
//! prefix counts and sums on the ART of customers of the snapshot.
//!
//! Every snapshot is checked, not only timed: the bank's balances read from it add up to
//! accounts × the initial balance (money is conserved at every LSN, so a snapshot that mixed
//! two LSNs would show it), both trees pass their validators, the B-link tree's key count
//! equals its range count over all keys, the ART's per-region prefix counts add up to its
//! length, and the whole-tree totals are the same after the readers ran as before (the
//! snapshot does not move while writers commit).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Snapshot, SnapshotInfo, SnapshotMode, Store};

use super::demo_bank::{Bank, ACCOUNTS_ROOT, INITIAL_BALANCE};
use super::demo_index::{self, Model, CUSTOMERS, ORDERS, REGIONS};
use super::report::human_rate;

const MODES: [SnapshotMode; 4] = [SnapshotMode::Memcpy, SnapshotMode::Incremental, SnapshotMode::Fork, SnapshotMode::Auto];
/// Refreshes after the first snapshot, for the modes that keep an image (incremental, auto).
const REFRESHES: usize = 3;
/// Writers run this long before the first snapshot of a mode.
const WARM_UP: Duration = Duration::from_millis(25);
/// Width of a B-link range query: about 1/4096 of the u64 key space.
const RANGE_WIDTH: u64 = 1 << 52;

/// How the phase runs.
pub struct Settings {
    /// Seconds of queries per mode (split between a mode's snapshot and its refreshes).
    pub seconds: f64,
    pub readers: usize,
    /// Transfer threads (each < the bank's per-thread stats slots).
    pub bank_writers: usize,
    /// Index update threads.
    pub index_writers: usize,
}

/// What the phase did, for the demo's summary.
pub struct Summary {
    pub snapshots: usize,
    pub queries: u64,
    pub transfers: u64,
    pub index_updates: u64,
    pub seconds: f64,
    /// Modes that could not run here, with the error.
    pub unavailable: Vec<(SnapshotMode, String)>,
}

/// One mode's run.
struct ModeRun {
    mode: SnapshotMode,
    /// The first snapshot and each refresh, in order.
    states: Vec<SnapshotInfo>,
    queries: u64,
    query_seconds: f64,
    /// Seconds of the checks (not in `query_seconds`).
    check_seconds: f64,
    transfers: u64,
    index_updates: u64,
    seconds: f64,
    /// Why the mode could not (fully) run here: taking a snapshot failed with an error of the
    /// environment (no fork, too little memory), not a wrong answer.
    unavailable: Option<String>,
    failures: Vec<String>,
}

/// Answers of a snapshot that must not change while it is queried.
#[derive(Debug, PartialEq)]
struct Totals {
    orders: u64,
    orders_sum: u128,
    customers: u64,
    region0: u64,
    region0_sum: u128,
}

/// Runs the phase; `per_thread` (the bank's committed transfers per stats slot) and the index
/// model come back updated with what the writers committed.
pub fn run(
    store: &Store,
    bank: &Bank,
    per_thread: &mut [u64],
    model: Model,
    settings: &Settings,
) -> Result<(Model, Summary), Box<dyn std::error::Error>> {
    if settings.bank_writers > per_thread.len() {
        return Err(format!("{} transfer threads but {} stats slots", settings.bank_writers, per_thread.len()).into());
    }
    // Auto measures this machine's copy, fork and copy-on-write costs on first use; measured
    // here, outside the timed snapshots.
    let costs_started = Instant::now();
    tusk::snapshot_costs();
    let costs_s = costs_started.elapsed().as_secs_f64();
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("snap  {spinner} {msg}")?);
    let mut shares = demo_index::split(model, settings.index_writers);
    let mut runs = Vec::new();
    for (m, &mode) in MODES.iter().enumerate() {
        spinner.set_message(format!("{} snapshots with {} reader(s) while writers run", mode.name(), settings.readers));
        spinner.tick();
        let seed = 0x50A9_0000 + 0x100 * m as u64;
        runs.push(run_mode(store, bank, mode, seed, &mut shares, per_thread, settings)?);
    }
    spinner.finish_and_clear();
    print_table(&runs, settings, costs_s);
    let failures: Vec<&String> = runs.iter().flat_map(|r| &r.failures).collect();
    if let Some(first) = failures.first() {
        return Err(format!("snapshot checks failed ({} mismatch{}), first: {first}", failures.len(), if failures.len() > 1 { "es" } else { "" }).into());
    }
    let summary = Summary {
        snapshots: runs.iter().map(|r| r.states.len()).sum(),
        queries: runs.iter().map(|r| r.queries).sum(),
        transfers: runs.iter().map(|r| r.transfers).sum(),
        index_updates: runs.iter().map(|r| r.index_updates).sum(),
        seconds: runs.iter().map(|r| r.seconds).sum(),
        unavailable: runs.iter().filter_map(|r| Some((r.mode, r.unavailable.clone()?))).collect(),
    };
    Ok((demo_index::merge(shares), summary))
}

/// One mode: writers start, then snapshots, checks and reader windows; then writers stop.
fn run_mode(
    store: &Store,
    bank: &Bank,
    mode: SnapshotMode,
    seed: u64,
    shares: &mut Vec<Model>,
    per_thread: &mut [u64],
    settings: &Settings,
) -> Result<ModeRun, Box<dyn std::error::Error>> {
    let (transfers, audits, updates, index_queries) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let index_writers = shares.len();
    let taken = std::mem::take(shares);
    let started = Instant::now();
    let (driven, seconds, bank_results, index_results) = std::thread::scope(|s| {
        let bank_handles: Vec<_> = (0..settings.bank_writers)
            .map(|t| {
                let (transfers, audits, stop) = (&transfers, &audits, &stop);
                s.spawn(move || bank.work(store, t, seed + t as u64, transfers, audits, stop))
            })
            .collect();
        let index_handles: Vec<_> = taken
            .into_iter()
            .enumerate()
            .map(|(t, share)| {
                let (updates, index_queries, stop) = (&updates, &index_queries, &stop);
                s.spawn(move || demo_index::worker(store, share, t, index_writers, seed + 0x80 + t as u64, updates, index_queries, stop))
            })
            .collect();
        std::thread::sleep(WARM_UP);
        // Whatever happens here, the writers are stopped before the scope waits for them.
        let driven = drive(store, bank, mode, seed, settings);
        stop.store(true, Ordering::Relaxed);
        let seconds = started.elapsed().as_secs_f64();
        let bank_results: Vec<_> = bank_handles.into_iter().map(|h| h.join()).collect();
        let index_results: Vec<_> = index_handles.into_iter().map(|h| h.join()).collect();
        (driven, seconds, bank_results, index_results)
    });
    for (t, r) in bank_results.into_iter().enumerate() {
        per_thread[t] += r.map_err(|_| "transfer thread panicked")??;
    }
    for r in index_results {
        shares.push(r.map_err(|_| "index update thread panicked")??);
    }
    let mut run = driven?;
    run.transfers = transfers.load(Ordering::Relaxed);
    run.index_updates = updates.load(Ordering::Relaxed);
    run.seconds = seconds;
    Ok(run)
}

/// Whether an error taking a snapshot in `mode` is one of the environment (reported for the
/// mode, the demo goes on) rather than of tusk (the demo fails).
fn unavailable_here(mode: SnapshotMode, e: &tusk::Error) -> bool {
    mode == SnapshotMode::Fork || matches!(e, tusk::Error::SnapshotMemory { .. })
}

/// Takes the mode's snapshot and refreshes; checks each, then queries it for its window.
fn drive(store: &Store, bank: &Bank, mode: SnapshotMode, seed: u64, settings: &Settings) -> Result<ModeRun, Box<dyn std::error::Error>> {
    let states = match mode {
        SnapshotMode::Incremental | SnapshotMode::Auto => 1 + REFRESHES,
        SnapshotMode::Memcpy | SnapshotMode::Fork => 1,
    };
    let window = Duration::from_secs_f64(settings.seconds.max(0.0) / states as f64);
    let mut run = ModeRun {
        mode,
        states: Vec::new(),
        queries: 0,
        query_seconds: 0.0,
        check_seconds: 0.0,
        transfers: 0,
        index_updates: 0,
        seconds: 0.0,
        unavailable: None,
        failures: Vec::new(),
    };
    let mut snap = match store.snapshot(mode) {
        Ok(snap) => snap,
        Err(e) if unavailable_here(mode, &e) => {
            run.unavailable = Some(e.to_string());
            return Ok(run);
        }
        Err(e) => return Err(format!("{} snapshot: {e}", mode.name()).into()),
    };
    for i in 0..states {
        if i > 0 {
            match snap.refresh().map(|_| ()) {
                Ok(()) => {}
                Err(e) if unavailable_here(mode, &e) => {
                    run.unavailable = Some(format!("refresh {i}: {e}"));
                    break;
                }
                Err(e) => return Err(format!("{} snapshot, refresh {i}: {e}", mode.name()).into()),
            }
        }
        run.states.push(snap.info().clone());
        let what = format!("{} snapshot{} at LSN {} (made by {})", mode.name(), if i > 0 { format!(" refresh {i}") } else { String::new() }, snap.lsn(), snap.mode().name());
        let checking = Instant::now();
        let before = check(&snap, bank, &what, &mut run.failures)?;
        run.check_seconds += checking.elapsed().as_secs_f64();
        let (queries, seconds) = query(&snap, settings.readers, window, seed + 0x40 * i as u64)?;
        run.queries += queries;
        run.query_seconds += seconds;
        let checking = Instant::now();
        let after = totals(&snap)?;
        run.check_seconds += checking.elapsed().as_secs_f64();
        if after != before {
            run.failures.push(format!("{what}: whole-tree answers moved while writers ran: {before:?} then {after:?}"));
        }
    }
    Ok(run)
}

/// The whole-tree count and sum of orders, the number of customers and the count and sum of
/// one region's customers.
fn totals(snap: &Snapshot) -> Result<Totals, tusk::Error> {
    let orders = snap.btree(ORDERS)?;
    let customers = snap.art(CUSTOMERS)?;
    let region0 = demo_index::region_prefix(0);
    Ok(Totals {
        orders: orders.count(..)?,
        orders_sum: orders.sum(..)?,
        customers: customers.len()?,
        region0: customers.count_prefix(&region0)?,
        region0_sum: customers.sum_prefix(&region0)?,
    })
}

/// Checks one snapshot (see the module documentation); each mismatch is pushed to `failures`.
fn check(snap: &Snapshot, bank: &Bank, what: &str, failures: &mut Vec<String>) -> Result<Totals, tusk::Error> {
    let mut fail = |msg: String| failures.push(format!("{what}: {msg}"));
    let root = snap.root(ACCOUNTS_ROOT)?;
    if root != Some(bank.ptr) {
        fail(format!("root {ACCOUNTS_ROOT} is {root:?}, not {:?}", bank.ptr));
    }
    let mut balances = vec![0u8; (bank.accounts * 8) as usize];
    snap.read(bank.ptr, &mut balances)?;
    let money: u128 = balances.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as u128).sum();
    let want = bank.accounts as u128 * INITIAL_BALANCE as u128;
    if money != want {
        fail(format!("money not conserved: the balances add up to {money}, not {want}"));
    }

    let orders = snap.btree(ORDERS)?;
    let ostats = orders.check()?;
    let (olen, ocount, osum) = (orders.len()?, orders.count(..)?, orders.sum(..)?);
    if ostats.keys != olen || ocount != olen {
        fail(format!("orders: validator counts {} keys, len {olen}, count(..) {ocount}", ostats.keys));
    }
    let customers = snap.art(CUSTOMERS)?;
    let cstats = customers.check()?;
    let clen = customers.len()?;
    let mut by_region = 0u64;
    for region in 0..REGIONS {
        by_region += customers.count_prefix(&demo_index::region_prefix(region))?;
    }
    if cstats.keys != clen || by_region != clen {
        fail(format!("customers: validator counts {} keys, len {clen}, the {REGIONS} region prefixes {by_region}", cstats.keys));
    }
    let region0 = demo_index::region_prefix(0);
    Ok(Totals {
        orders: ocount,
        orders_sum: osum,
        customers: clen,
        region0: customers.count_prefix(&region0)?,
        region0_sum: customers.sum_prefix(&region0)?,
    })
}

/// `readers` threads query `snap` for `window`; returns the queries answered (each count or
/// sum is one) and the seconds they took.
fn query(snap: &Snapshot, readers: usize, window: Duration, seed: u64) -> Result<(u64, f64), tusk::Error> {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let results: Vec<Result<u64, tusk::Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers.max(1))
            .map(|r| {
                let stop = &stop;
                s.spawn(move || reader(snap, seed + r as u64, stop))
            })
            .collect();
        std::thread::sleep(window);
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(tusk::Error::SnapshotQuery("a reader thread panicked".into())))).collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut queries = 0;
    for r in results {
        queries += r?;
    }
    Ok((queries, seconds))
}

/// One reader: a range count and sum of orders, then a prefix count and sum of customers (one
/// region's ids starting with one hex digit, as the index workers query), until `stop`.
fn reader(snap: &Snapshot, seed: u64, stop: &AtomicBool) -> Result<u64, tusk::Error> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let orders = snap.btree(ORDERS)?;
    let customers = snap.art(CUSTOMERS)?;
    let mut queries = 0;
    while !stop.load(Ordering::Relaxed) {
        let lo: u64 = rng.random();
        let range = lo..lo.saturating_add(RANGE_WIDTH);
        orders.count(range.clone())?;
        orders.sum(range)?;
        let mut prefix = demo_index::region_prefix(rng.random_range(0..REGIONS));
        prefix.push(b"0123456789abcdef"[rng.random_range(0..16)]);
        customers.count_prefix(&prefix)?;
        customers.sum_prefix(&prefix)?;
        queries += 4;
    }
    Ok(queries)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

fn median<T: Ord + Copy>(mut v: Vec<T>) -> Option<T> {
    v.sort();
    v.get(v.len() / 2).copied()
}

/// The modes that made a run's states, runs of one mode written once ("memcpy, incremental ×3").
fn made_by(states: &[SnapshotInfo]) -> String {
    let mut parts: Vec<(SnapshotMode, usize)> = Vec::new();
    for s in states {
        match parts.last_mut() {
            Some((m, n)) if *m == s.mode => *n += 1,
            _ => parts.push((s.mode, 1)),
        }
    }
    let parts: Vec<String> = parts.iter().map(|&(m, n)| if n > 1 { format!("{} ×{n}", m.name()) } else { m.name().to_string() }).collect();
    parts.join(", ")
}

fn print_table(runs: &[ModeRun], settings: &Settings, costs_s: f64) {
    let title = format!(
        "snapshot readers: {} reader thread(s) for {:.2} s per mode, while {} transfer + {} index update thread(s) commit",
        settings.readers, settings.seconds, settings.bank_writers, settings.index_writers
    );
    outln!("{title}");
    outln!("{}", "-".repeat(title.len()));
    outln!(
        "{:<12} {:<24} {:>8} {:>9} {:>9} {:>10} {:>11} {:>10} {:>12} {:>12}  checks",
        "mode", "made by", "snap ms", "pause ms", "MiB copy", "refresh ms", "refresh MiB", "queries/s", "transfers/s", "index upd/s"
    );
    for r in runs {
        let Some(first) = r.states.first() else {
            outln!("{:<12} unavailable here: {}", r.mode.name(), r.unavailable.as_deref().unwrap_or("no snapshot"));
            continue;
        };
        let refreshes = &r.states[1..];
        let refresh_ms = median(refreshes.iter().map(|s| s.elapsed).collect()).map_or("-".into(), ms);
        let refresh_mib = median(refreshes.iter().map(|s| s.bytes_copied).collect()).map_or("-".into(), mib);
        let pause = r.states.iter().map(|s| s.pause).max().unwrap_or_default();
        let checks = if r.failures.is_empty() { format!("pass ({} snapshot{})", r.states.len(), if r.states.len() > 1 { "s" } else { "" }) } else { format!("FAIL ({})", r.failures.len()) };
        outln!(
            "{:<12} {:<24} {:>8} {:>9} {:>9} {:>10} {:>11} {:>10} {:>12} {:>12}  {checks}",
            r.mode.name(),
            made_by(&r.states),
            ms(first.elapsed),
            ms(pause),
            mib(first.bytes_copied),
            refresh_ms,
            refresh_mib,
            human_rate(r.queries as f64 / r.query_seconds.max(1e-9)),
            human_rate(r.transfers as f64 / r.seconds.max(1e-9)),
            human_rate(r.index_updates as f64 / r.seconds.max(1e-9)),
        );
        if let Some(e) = &r.unavailable {
            outln!("{:<12} stopped early: {e}", "");
        }
    }
    let extent = runs.iter().flat_map(|r| r.states.last()).map(|s| s.extent).max().unwrap_or(0);
    outln!(
        "snap ms: the first snapshot; pause: the longest hold of commits; refresh: the median of {REFRESHES}; MiB copied counts pages written during a copy again; heap extent {} MiB",
        mib(extent)
    );
    outln!(
        "checks (money, validators, counts) of each snapshot took {:.2} s in all, writers running; auto's costs measured in {:.0} ms",
        runs.iter().map(|r| r.check_seconds).sum::<f64>(),
        costs_s * 1e3
    );
    if let Some(last) = runs.iter().find(|r| r.mode == SnapshotMode::Auto).and_then(|r| r.states.last()) {
        outln!("auto's last pick: {} ({})", last.mode.name(), last.reason);
    }
    for f in runs.iter().flat_map(|r| &r.failures) {
        outln!("MISMATCH {f}");
    }
    outln!();
}
