//! `tusk demo`: the main job. Loads a bank of accounts, runs transfers and audits on all
//! cores with live throughput; loads a B-link tree and an ART and runs updates with lookups,
//! range counts and prefix queries (`demo_index.rs`); queries snapshots of every mode while
//! transfers and index updates go on, checking each snapshot (`demo_snapshot.rs`); closes,
//! reopens (recovering from the checkpoint and the log), and verifies that every committed
//! transfer survived, money was conserved, and both trees hold exactly what was committed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tusk::{Commit, Options, Store};

use super::report::{self, human_rate, table};
use super::demo_bank::{alloc_bank, Bank, ACCOUNTS_ROOT, INITIAL_BALANCE, STATS_ROOT};
use super::{demo_gpu, demo_index, demo_replicated, demo_snapshot, CliResult, IoAt};

const LOAD_BATCH: u64 = 8_192;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Store directory (recreated by every run).
    #[arg(long, default_value = "tusk-demo")]
    dir: PathBuf,
    /// Seconds of mixed workload.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1_000_000)]
    accounts: u64,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Keys loaded into each index (B-link tree of orders, ART of customers).
    #[arg(long, default_value_t = 200_000)]
    index_keys: u64,
    /// Seconds of index updates and queries.
    #[arg(long, default_value_t = 2.0)]
    index_seconds: f64,
    /// Seconds of snapshot queries per snapshot mode (memcpy, incremental, fork, auto) while
    /// transfers and index updates go on; 0 skips the snapshot phase.
    #[arg(long, default_value_t = 0.25)]
    snapshot_seconds: f64,
    /// Reader threads querying each snapshot (default: half the worker threads, at least 1;
    /// transfer and index update threads take the other half, at least 1 each).
    #[arg(long)]
    snapshot_readers: Option<usize>,
    /// Run the bank on a replicated group of this many nodes on loopback instead (kills the
    /// leader halfway, brings it back, verifies every node).
    #[arg(long)]
    nodes: Option<usize>,
}

/// Removes an earlier demo store; refuses to touch a directory that is not one.
fn prepare_dir(dir: &Path) -> CliResult {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()).into());
    }
    let is_store = dir.join("LOCK").exists() || dir.join("log").exists() || dir.join("n1").join("raft.redb").exists();
    let is_empty = std::fs::read_dir(dir).at(dir)?.next().is_none();
    if !is_store && !is_empty {
        return Err(format!("{}: exists and is not a tusk store; choose another --dir", dir.display()).into());
    }
    std::fs::remove_dir_all(dir).at(dir)?;
    Ok(())
}

fn options(accounts: u64, index_keys: u64) -> Options {
    Options {
        heap_capacity: (accounts * 8 + index_keys * 512 + (256 << 20)).next_power_of_two(),
        checkpoint_interval: Some(Duration::from_secs(1)),
        ..Options::default()
    }
}

pub fn run(args: DemoArgs) -> CliResult {
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let accounts = args.accounts.max(2);
    prepare_dir(&args.dir)?;
    if let Some(nodes) = args.nodes {
        if nodes < 3 {
            return Err("a group that survives its leader's death needs --nodes 3 or more".into());
        }
        return demo_replicated::run(&args.dir, demo_replicated::Plan { nodes, accounts, threads, seconds: args.seconds });
    }
    let store = Store::open(&args.dir, options(accounts, args.index_keys))?;
    outln!(
        "tusk demo: {} accounts, {threads} threads, store {} (log I/O: {})",
        accounts,
        args.dir.display(),
        store.io_backend().unwrap_or_default()
    );

    // Load.
    let load_started = Instant::now();
    let bar = ProgressBar::new(accounts);
    bar.set_style(ProgressStyle::with_template("load   [{bar:40}] {pos}/{len} accounts {rate}")?.with_key("rate", report::rate_key).progress_chars("=> "));
    let ((bank, stats), _) = store.transact(Commit::Sync, |tx| alloc_bank(tx, accounts, threads))?;
    let mut loaded = 0;
    while loaded < accounts {
        let end = (loaded + LOAD_BATCH).min(accounts);
        store.transact(Commit::Async, |tx| {
            for i in loaded..end {
                tx.write_u64_at(bank, i * 8, INITIAL_BALANCE)?;
            }
            Ok(())
        })?;
        bar.set_position(end);
        loaded = end;
    }
    let (_, lsn) = store.transact(Commit::Sync, |tx| tx.write_u64_at(stats, 0, 0))?;
    bar.finish();
    let load_s = load_started.elapsed().as_secs_f64();
    assert!(store.is_stable(lsn.unwrap_or(0), false), "a Sync commit returns once durable");
    let first = store.checkpoint()?;
    outln!(
        "ckpt   epoch {}: {} chunks written ({:.1} MiB) in {:.3} s, log trimmed to {:.1} MiB",
        first.epoch,
        first.written,
        first.bytes_written as f64 / (1 << 20) as f64,
        first.elapsed.as_secs_f64(),
        first.log_bytes as f64 / (1 << 20) as f64
    );

    // Mixed workload.
    let committed = Arc::new(AtomicU64::new(0));
    let audits = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let store = Arc::new(store);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (store, committed, audits, stop) = (store.clone(), committed.clone(), audits.clone(), stop.clone());
            std::thread::spawn(move || Bank { ptr: bank, stats, accounts }.work(&store, t, t as u64 + 1, &committed, &audits, &stop))
        })
        .collect();
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("run    {spinner} {msg}")?);
    let run_started = Instant::now();
    let mut last = (Instant::now(), 0u64);
    while run_started.elapsed().as_secs_f64() < args.seconds {
        std::thread::sleep(Duration::from_millis(250));
        let now = (Instant::now(), committed.load(Ordering::Relaxed));
        let tps = (now.1 - last.1) as f64 / (now.0 - last.0).as_secs_f64();
        let (last_ckpt, _, taken) = store.checkpoint_status();
        let ckpt = last_ckpt.map_or(String::new(), |c| {
            format!(", checkpoint {} ({} written, {} clean chunks, log {:.1} MiB)", c.epoch, c.written, c.reused, c.log_bytes as f64 / (1 << 20) as f64)
        });
        spinner.set_message(format!("{} txn/s, {} committed, durable LSN {}, {taken} checkpoints{ckpt}", human_rate(tps), now.1, store.durable_lsn()));
        spinner.tick();
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    let mut per_thread = Vec::new();
    for w in workers {
        per_thread.push(w.join().map_err(|_| "worker panicked")??);
    }
    let run_s = run_started.elapsed().as_secs_f64();
    spinner.finish_with_message(format!("{} transfers committed", committed.load(Ordering::Relaxed)));
    let transfers: u64 = per_thread.iter().sum();
    let store = Arc::try_unwrap(store).map_err(|_| "store still shared")?;

    // Indexes: load, then updates and queries.
    let index_keys = args.index_keys.max(threads as u64 * 16);
    let (model, index_load_s) = demo_index::load(&store, index_keys, threads)?;
    let (model, mixed) = demo_index::mixed(&store, model, threads, args.index_seconds)?;

    // Snapshot readers while transfers and index updates go on.
    let half = (threads / 2).max(1);
    let settings = demo_snapshot::Settings {
        seconds: args.snapshot_seconds,
        readers: args.snapshot_readers.unwrap_or(half).max(1),
        bank_writers: half,
        index_writers: half,
    };
    let (model, snapshots) = if args.snapshot_seconds > 0.0 {
        let bank = Bank { ptr: bank, stats, accounts };
        let (model, summary) = demo_snapshot::run(&store, &bank, &mut per_thread, model, &settings)?;
        (model, Some(summary))
    } else {
        (model, None)
    };

    // The GPU mirror (or its CPU engine) answers batches; checked against the trees.
    let (model, gpu) = demo_gpu::run(&store, model)?;

    let last_lsn = store.last_lsn();
    let (_, ckpt_error, checkpoints) = store.checkpoint_status();
    if let Some(e) = ckpt_error {
        return Err(format!("background checkpoint failed: {e}").into());
    }
    store.close()?;

    // Reopen: recovery replays the log after the last checkpoint (little, as the close took
    // one when more than `close_checkpoint_above` of log lay after it).
    let reopen_started = Instant::now();
    let store = Store::open(&args.dir, options(accounts, args.index_keys))?;
    let reopen_s = reopen_started.elapsed().as_secs_f64();
    let report = store.recovery_report().clone();
    let ((total, counted), _) = store.transact(Commit::Async, |tx| {
        let bank = tx.root(ACCOUNTS_ROOT)?.ok_or(tusk::Error::InvalidPointer(0))?;
        let stats = tx.root(STATS_ROOT)?.ok_or(tusk::Error::InvalidPointer(0))?;
        let mut total = 0u64;
        for i in 0..accounts {
            total += tx.read_u64_at(bank, i * 8)?;
        }
        let mut counted = Vec::new();
        for t in 0..threads as u64 {
            counted.push(tx.read_u64_at(stats, t * 8)?);
        }
        Ok((total, counted))
    })?;
    let indexes = demo_index::verify(&store, &model)?;
    store.close()?;
    let indexes_ok = indexes.trees_valid && indexes.contents_equal && indexes.queries_equal;
    let money_ok = total == accounts * INITIAL_BALANCE;
    let transfers_ok = counted == per_thread;

    table(
        "tusk demo summary",
        &[
            ("accounts loaded", format!("{accounts} in {load_s:.2} s")),
            ("transfers committed", format!("{transfers} in {run_s:.2} s ({} txn/s)", human_rate(transfers as f64 / run_s))),
            ("read-only audits", audits.load(Ordering::Relaxed).to_string()),
            ("last LSN", last_lsn.to_string()),
            ("checkpoints", format!("{} during the run, after the one after loading", checkpoints)),
            (
                "reopen",
                format!(
                    "{reopen_s:.3} s: checkpoint {} loaded in {:.3} s, {} records replayed from {:.1} MiB of log in {:.3} s \
                     ({:.1} MiB of log below the checkpoint not read)",
                    report.checkpoint.as_ref().map_or("none".to_string(), |c| c.manifest.epoch.to_string()),
                    report.checkpoint_load.as_secs_f64(),
                    report.records_replayed,
                    report.log_bytes as f64 / (1 << 20) as f64,
                    report.replay.as_secs_f64(),
                    report.log_bytes_below_checkpoint as f64 / (1 << 20) as f64
                ),
            ),
            ("recovered LSN", report.recovered_lsn.to_string()),
            ("torn tails cut", report.torn_tails.len().to_string()),
            ("money conserved", format!("{} (total {total})", if money_ok { "yes" } else { "NO" })),
            ("every transfer present", if transfers_ok { "yes".to_string() } else { format!("NO: {counted:?} vs {per_thread:?}") }),
            ("indexes loaded", format!("{index_keys} orders (B-link) + {index_keys} customers (ART) in {index_load_s:.2} s")),
            (
                "index workload",
                format!(
                    "{} update txns and {} query txns in {:.2} s ({} txn/s)",
                    mixed.updates,
                    mixed.queries,
                    mixed.seconds,
                    human_rate((mixed.updates + mixed.queries) as f64 / mixed.seconds)
                ),
            ),
            (
                "snapshot readers",
                snapshots.as_ref().map_or("skipped (--snapshot-seconds 0)".to_string(), |s| {
                    let mut line = format!(
                        "{} snapshots checked (money, validators, counts: pass), {} queries, while {} transfers and {} index update txns committed in {:.2} s",
                        s.snapshots, s.queries, s.transfers, s.index_updates, s.seconds
                    );
                    for (mode, e) in &s.unavailable {
                        line += &format!("; {} unavailable here: {e}", mode.name());
                    }
                    line
                }),
            ),
            ("GPU mirror", gpu.line.clone()),
            (
                "indexes after reopen",
                format!(
                    "{} orders, {} customers; validators {}, contents {}, range/prefix queries {}",
                    indexes.orders,
                    indexes.customers,
                    yes_no(indexes.trees_valid),
                    if indexes.contents_equal { "equal the model" } else { "DIFFER from the model" },
                    if indexes.queries_equal { "equal the model" } else { "DIFFER from the model" }
                ),
            ),
        ],
    );
    if money_ok && transfers_ok && indexes_ok {
        Ok(())
    } else {
        Err("verification after reopen failed".into())
    }
}

fn yes_no(ok: bool) -> &'static str {
    if ok {
        "pass"
    } else {
        "FAIL"
    }
}
