//! `tusk bench batch`: `apply_batch` of random upserts into a loaded tree (B-link, or the ART
//! with 8-byte big-endian keys), one transaction per batch (Async), as users apply batches of
//! updates before a GPU mirror sync.
//!
//! The tree is loaded with `--keys` distinct random keys in one transaction (its rate is
//! reported too): the B-link tree by `bulk_load`, the ART (which has no bulk load) by one
//! `apply_batch` of them all. Each round then applies `--ops` upserts — a fraction `--updates` (half
//! by default) to keys present, the others to new random keys — in one transaction, timed from its start until its LSN is durable, with the
//! log bytes flushed meanwhile. Rounds are measured one after another on the same tree (it
//! grows by the new keys); the figures are their medians. The process's peak resident memory
//! is reported against the tree's bytes.

use std::time::Instant;

use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{ArtOp, BTreeOp, BatchOutcome, Commit, Options, Store};

use super::bench_index::IndexChoice;
use super::report::{median, rate, table};
use super::{BenchDir, BenchOutput, CliResult, IoChoice};

#[derive(Args, Debug, Clone)]
pub struct BatchArgs {
    /// The tree.
    #[arg(long, value_enum, default_value = "btree")]
    index: IndexChoice,
    /// Keys bulk loaded before the batches (distinct, random).
    #[arg(long, default_value_t = 16_000_000)]
    keys: u64,
    /// Upserts per batch (one transaction each).
    #[arg(long, default_value_t = 1_000_000)]
    ops: usize,
    /// Fraction of a batch's upserts that update a loaded key; the others insert new random
    /// keys (0: a batch of new keys only, as a load by `apply_batch`).
    #[arg(long, default_value_t = 0.5)]
    updates: f64,
    /// Batches measured; the figures are their medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    pub(super) out: BenchOutput,
    #[arg(long, value_enum, default_value = "auto")]
    io: IoChoice,
}

/// The loaded keys: a bijection of 0..keys, so a key is present iff its preimage is below it.
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555
}

/// Peak resident memory of this process, in bytes (`VmHWM` of /proc/self/status).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib << 10)
}

pub fn run(args: BatchArgs) -> CliResult {
    if args.keys == 0 || args.ops == 0 || args.rounds == 0 {
        return Err("--keys, --ops and --rounds must be ≥ 1".into());
    }
    if !(0.0..=1.0).contains(&args.updates) {
        return Err("--updates must be a fraction from 0 to 1".into());
    }
    let dir = BenchDir::new(args.out.dir.clone())?;
    let grown = args.keys + ((args.ops as f64 * (1.0 - args.updates)).ceil() as u64) * args.rounds as u64;
    let heap = (grown * 160 + (256 << 20)).next_multiple_of(1 << 20);
    let store = Store::open(dir.path(), Options { heap_capacity: heap, io: args.io.to_io(), ..Options::default() })?;
    store.prefault();

    let mut pairs: Vec<(u64, u64)> = (0..args.keys).map(|i| (key(i), i)).collect();
    pairs.sort_unstable();
    let started = Instant::now();
    match args.index {
        IndexChoice::Btree => {
            store.transact(Commit::Async, |tx| tx.btree("t")?.bulk_load(pairs.iter().copied(), 1.0))?;
        }
        IndexChoice::Art => {
            let keys: Vec<[u8; 8]> = pairs.iter().map(|&(k, _)| k.to_be_bytes()).collect();
            let ops: Vec<ArtOp<'_>> = keys.iter().zip(&pairs).map(|(key, &(_, value))| ArtOp::Upsert { key, value }).collect();
            store.transact(Commit::Async, |tx| tx.art("t")?.apply_batch(&ops))?;
        }
    }
    store.is_stable(store.last_lsn(), true);
    let load_per_s = args.keys as f64 / started.elapsed().as_secs_f64();
    drop(pairs);

    let mut rng = SmallRng::seed_from_u64(args.seed);
    let (mut per_s, mut log_bytes_per_op, mut inserted) = (Vec::new(), Vec::new(), 0u64);
    for _ in 0..args.rounds {
        let keys: Vec<u64> = (0..args.ops).map(|_| if rng.random_bool(args.updates) { key(rng.random_range(0..args.keys)) } else { rng.random() }).collect();
        let (_, flushed_before) = store.log_flush_totals();
        let (outcome, lsn, started);
        match args.index {
            IndexChoice::Btree => {
                let ops: Vec<BTreeOp> = keys.iter().enumerate().map(|(i, &key)| BTreeOp::Upsert { key, value: i as u64 }).collect();
                started = Instant::now();
                (outcome, lsn) = store.transact(Commit::Async, |tx| tx.btree("t")?.apply_batch(&ops))?;
            }
            IndexChoice::Art => {
                let bytes: Vec<[u8; 8]> = keys.iter().map(|k| k.to_be_bytes()).collect();
                let ops: Vec<ArtOp<'_>> = bytes.iter().enumerate().map(|(i, key)| ArtOp::Upsert { key, value: i as u64 }).collect();
                started = Instant::now();
                (outcome, lsn) = store.transact(Commit::Async, |tx| tx.art("t")?.apply_batch(&ops))?;
            }
        }
        let outcome: BatchOutcome = outcome;
        if let Some(lsn) = lsn {
            store.is_stable(lsn, true);
        }
        per_s.push(args.ops as f64 / started.elapsed().as_secs_f64());
        let (_, flushed_after) = store.log_flush_totals();
        log_bytes_per_op.push((flushed_after - flushed_before) as f64 / args.ops as f64);
        inserted += outcome.inserted;
    }
    let (keys, tree_bytes) = match args.index {
        IndexChoice::Btree => {
            let (stats, _) = store.transact(Commit::Async, |tx| tx.btree("t")?.check())?;
            (stats.keys, stats.nodes * tusk_index::btree::layout::NODE_SIZE)
        }
        IndexChoice::Art => {
            let (stats, _) = store.transact(Commit::Async, |tx| tx.art("t")?.check())?;
            (stats.keys, stats.bytes)
        }
    };
    assert_eq!(keys, args.keys + inserted, "every upsert of a new key is in the tree");
    let rss = peak_rss();
    store.close()?;
    drop(dir);

    let (ops_per_s, bytes_per_op) = (median(&per_s), median(&log_bytes_per_op));
    if args.out.json {
        outln!(
            "{}",
            serde_json::json!({
                "bench": "batch",
                "index": args.index.name(),
                "keys": args.keys,
                "ops": args.ops,
                "updates": args.updates,
                "rounds": args.rounds,
                "bulk_load_per_s": load_per_s,
                "ops_per_s": ops_per_s,
                "log_bytes_per_op": bytes_per_op,
                "tree_bytes": tree_bytes,
                "peak_rss_bytes": rss,
            })
        );
    } else {
        table(
            &format!(
                "tusk bench batch: apply_batch of {} random upserts into a {}-key {}, medians of {} rounds",
                args.ops,
                args.keys,
                match args.index {
                    IndexChoice::Btree => "B-link tree",
                    IndexChoice::Art => "ART (8-byte keys)",
                },
                args.rounds
            ),
            &[
                (
                    match args.index {
                        IndexChoice::Btree => "bulk load keys/s",
                        IndexChoice::Art => "load (one batch) keys/s",
                    },
                    rate(load_per_s),
                ),
                ("batch ops/s", rate(ops_per_s)),
                ("log bytes per op", format!("{bytes_per_op:.1}")),
                ("tree bytes", format!("{} MiB", tree_bytes >> 20)),
                ("peak RSS", rss.map_or("-".into(), |b| format!("{} MiB ({:.2}x the tree)", b >> 20, b as f64 / tree_bytes as f64))),
            ],
        );
        outln!("batch ops/s: from the transaction's start until its LSN is durable (Async commit)");
    }
    Ok(())
}
