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

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{ArtOp, BTreeOp, BatchOutcome, Commit, HeapPtr, Options, Store};

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
    /// Also run small transactions on another thread (an Async update of one random word of a
    /// separate 8 MiB array each) beside every batch, then alone for as long as a batch took:
    /// their rate beside the batches against alone. (No log bytes per op then: the log also
    /// carries the small ones.)
    #[arg(long)]
    beside: bool,
    #[command(flatten)]
    pub(super) out: BenchOutput,
    #[arg(long, value_enum, default_value = "auto")]
    io: IoChoice,
}

/// The loaded keys: a bijection of 0..keys, so a key is present iff its preimage is below it.
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555
}

/// Words of the array `--beside`'s small transactions update.
const SMALL_WORDS: u64 = 1 << 20;

/// The small transactions of `--beside`: Async updates of one random word each, of an array
/// of their own (no key of the batch's tree).
struct SmallWork {
    array: HeapPtr,
}

impl SmallWork {
    fn new(store: &Store) -> Result<SmallWork, tusk::Error> {
        let (array, _) = store.transact(Commit::Async, |tx| tx.alloc(SMALL_WORDS * 8))?;
        Ok(SmallWork { array })
    }

    /// Commits until `stop` is set or `until` has passed; returns (commits, seconds).
    fn run(&self, store: &Store, stop: &AtomicBool, until: Option<Duration>) -> Result<(u64, f64), tusk::Error> {
        let mut rng = SmallRng::seed_from_u64(0x5A11);
        let started = Instant::now();
        let mut commits = 0;
        while !stop.load(Ordering::Relaxed) && until.is_none_or(|d| started.elapsed() < d) {
            let w = rng.random_range(0..SMALL_WORDS);
            store.transact(Commit::Async, |tx| {
                let v = tx.read_u64_at(self.array, 8 * w)?;
                tx.write_u64_at(self.array, 8 * w, v + 1)
            })?;
            commits += 1;
        }
        Ok((commits, started.elapsed().as_secs_f64()))
    }
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

    let small = if args.beside { Some(SmallWork::new(&store)?) } else { None };
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let (mut per_s, mut log_bytes_per_op, mut inserted) = (Vec::new(), Vec::new(), 0u64);
    let (mut batch_secs, mut small_beside) = (0.0, (0u64, 0.0));
    // The batch's operations as the caller holds them: memory of the caller, not of the store.
    let mut input_bytes = 0u64;
    for _ in 0..args.rounds {
        let keys: Vec<u64> = (0..args.ops).map(|_| if rng.random_bool(args.updates) { key(rng.random_range(0..args.keys)) } else { rng.random() }).collect();
        let flushed_before = store.log_flush_totals().bytes;
        // Only the chosen tree's operations are built (a 64 M-op batch's would take GBs).
        let bytes: Vec<[u8; 8]> = if args.index == IndexChoice::Art { keys.iter().map(|k| k.to_be_bytes()).collect() } else { Vec::new() };
        let btree_ops: Vec<BTreeOp> = if args.index == IndexChoice::Btree {
            keys.iter().enumerate().map(|(i, &key)| BTreeOp::Upsert { key, value: i as u64 }).collect()
        } else {
            Vec::new()
        };
        let art_ops: Vec<ArtOp<'_>> = bytes.iter().enumerate().map(|(i, key)| ArtOp::Upsert { key, value: i as u64 }).collect();
        drop(keys);
        input_bytes = input_bytes.max(
            (btree_ops.len() * size_of::<BTreeOp>() + bytes.len() * size_of::<[u8; 8]>() + art_ops.len() * size_of::<ArtOp<'_>>()) as u64,
        );
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let (batch, beside) = std::thread::scope(|s| {
            let worker = small.as_ref().map(|w| s.spawn(|| w.run(&store, &stop, None)));
            let batch = match args.index {
                IndexChoice::Btree => store.transact(Commit::Async, |tx| tx.btree("t")?.apply_batch(&btree_ops)),
                IndexChoice::Art => store.transact(Commit::Async, |tx| tx.art("t")?.apply_batch(&art_ops)),
            }
            .map(|(outcome, lsn)| {
                if let Some(lsn) = lsn {
                    store.is_stable(lsn, true);
                }
                outcome
            });
            stop.store(true, Ordering::Relaxed);
            (batch, worker.map(|w| w.join().expect("the small transactions' thread panicked")))
        });
        let outcome: BatchOutcome = batch?;
        if let Some(beside) = beside {
            let (n, secs) = beside?;
            small_beside = (small_beside.0 + n, small_beside.1 + secs);
        }
        batch_secs += started.elapsed().as_secs_f64();
        per_s.push(args.ops as f64 / started.elapsed().as_secs_f64());
        let flushed_after = store.log_flush_totals().bytes;
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
    // Small transactions alone, for as long as a batch took on average.
    let small_ratio = match &small {
        Some(w) => {
            let (n, secs) = w.run(&store, &AtomicBool::new(false), Some(Duration::from_secs_f64(batch_secs / args.rounds as f64)))?;
            let alone = n as f64 / secs;
            let beside = small_beside.0 as f64 / small_beside.1;
            Some((beside, alone))
        }
        None => None,
    };
    let rss = peak_rss();
    store.close()?;
    drop(dir);

    // With --beside the log also carries the small transactions' records: no figure per op.
    let (ops_per_s, bytes_per_op) = (median(&per_s), (!args.beside).then(|| median(&log_bytes_per_op)));
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
                "input_bytes": input_bytes,
                "small_txn_per_s_beside": small_ratio.map(|r| r.0),
                "small_txn_per_s_alone": small_ratio.map(|r| r.1),
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
                ("log bytes per op", bytes_per_op.map_or("- (--beside)".into(), |b| format!("{b:.1}"))),
                ("tree bytes", format!("{} MiB", tree_bytes >> 20)),
                ("peak RSS", rss.map_or("-".into(), |b| format!("{} MiB ({:.2}x the tree)", b >> 20, b as f64 / tree_bytes as f64))),
                (
                    "peak RSS less the batch's input",
                    rss.map_or("-".into(), |b| {
                        let own = b.saturating_sub(input_bytes);
                        format!("{} MiB ({:.2}x the tree; input {} MiB)", own >> 20, own as f64 / tree_bytes as f64, input_bytes >> 20)
                    }),
                ),
                (
                    "small txn/s beside / alone",
                    small_ratio.map_or("-".into(), |(beside, alone)| format!("{} / {} ({:.2}x)", rate(beside), rate(alone), beside / alone)),
                ),
            ],
        );
        outln!("batch ops/s: from the transaction's start until its LSN is durable (Async commit)");
    }
    Ok(())
}
