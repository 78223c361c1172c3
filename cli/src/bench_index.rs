//! `tusk bench index`: the B-link tree and the ART against their peers (`std::collections::BTreeMap`
//! and the `congee` ART crate), measured in the same run on the same key sequence.
//!
//! Per index × key order, on a fresh store:
//! - insert: every operation of the order, each thread a contiguous share of the sequence, in
//!   transactions of `--txn-keys` inserts committed `Async`; the clock stops once the last LSN is
//!   durable, so the rate is of durable inserts;
//! - bulk load (B-link tree only): the distinct sorted pairs into a fresh tree, one transaction;
//! - point lookups of random present keys, `--lookups-per-txn` per read-only transaction: a
//!   `get` per key, then (tusk only) the same keys with one `get_many` per transaction;
//! - range scans of `--scan-len` keys from random present keys (keys delivered per second);
//! - count + sum over ranges of about `--agg-width` keys (ranges per second);
//! - memory per key: heap bytes of the index's nodes (tusk) and allocator bytes (peers).
//!
//! Every phase checks its answers (lengths, hits, counts equal to the peer's), so a rate is
//! never of a run that computed something else.
//!
//! `--threads` takes a list (a row per thread count, e.g. `1,2` for the scaling in one run);
//! `--rounds N` measures every row N times, interleaved (round r measures every row before
//! round r + 1 starts), and reports each figure's median; `--inserts-only` measures the tusk
//! insert phase alone (no peer, no other phase) and also reports the retries per insert
//! transaction (conflicts under concurrent inserts).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Instant;

use clap::{Args, ValueEnum};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, HeapPtr, Options, Store};

use super::key_orders::KeyOrder;
use super::report::{median, rate};
use super::{BenchDir, ChartedOutput, CliResult, IoAt, IoChoice};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IndexChoice {
    /// The B-link tree (u64 keys); peer: `std::collections::BTreeMap`.
    Btree,
    /// The ART with 8-byte big-endian keys; peer: `congee`.
    Art,
}

impl IndexChoice {
    pub(crate) fn name(self) -> &'static str {
        match self {
            IndexChoice::Btree => "btree",
            IndexChoice::Art => "art",
        }
    }

    fn peer(self) -> &'static str {
        match self {
            IndexChoice::Btree => "std::collections::BTreeMap",
            IndexChoice::Art => "congee",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct IndexArgs {
    /// Indexes to measure (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "btree,art")]
    index: Vec<IndexChoice>,
    /// Insert operations per order (the mesh order yields about twice as many).
    #[arg(long, default_value_t = 1_000_000)]
    keys: usize,
    /// Key orders (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ascending,descending,almost-sorted,shuffled,gaussian,mesh")]
    order: Vec<KeyOrder>,
    /// Threads for every phase (peers behind a lock when > 1); a comma-separated list measures
    /// a row per thread count.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// Measurements of every row, interleaved; the figures reported are the medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Measure only tusk's inserts (no peer, no lookups, scans, aggregates or bulk load).
    #[arg(long)]
    inserts_only: bool,
    /// Inserts per transaction; a comma-separated list measures a row per size (with
    /// `--inserts-only` the table gives each row's rate against the smallest size's).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    txn_keys: Vec<usize>,
    /// Point lookups measured (default: as many as distinct keys, at most 2 M).
    #[arg(long)]
    lookups: Option<usize>,
    /// Point lookups per read-only transaction.
    #[arg(long, default_value_t = 16)]
    lookups_per_txn: usize,
    /// Range scans measured.
    #[arg(long, default_value_t = 20_000)]
    scans: usize,
    /// Keys per range scan.
    #[arg(long, default_value_t = 100)]
    scan_len: usize,
    /// Count + sum queries measured.
    #[arg(long, default_value_t = 2_000)]
    aggs: usize,
    /// Distinct keys spanned by each count + sum range.
    #[arg(long, default_value_t = 1_000)]
    agg_width: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    pub(super) out: ChartedOutput,
    #[arg(long, value_enum, default_value = "auto")]
    io: IoChoice,
}

/// The figures of one index × order.
#[derive(Debug, Default)]
struct Row {
    index: &'static str,
    order: &'static str,
    peer: &'static str,
    keys: usize,
    distinct: usize,
    threads: usize,
    /// Inserts per transaction.
    txn_keys: usize,
    /// Rounds the figures are the medians of.
    rounds: usize,
    insert_per_s: f64,
    /// Conflicts (retried attempts) per committed insert transaction.
    insert_retries_per_txn: f64,
    peer_insert_per_s: f64,
    bulk_load_per_s: Option<f64>,
    peer_bulk_load_per_s: Option<f64>,
    lookup_per_s: f64,
    /// The same lookups through `get_many` (tusk only: the peers have no batched form).
    lookup_many_per_s: f64,
    peer_lookup_per_s: f64,
    range_keys_per_s: f64,
    peer_range_keys_per_s: f64,
    count_sum_per_s: f64,
    peer_count_sum_per_s: f64,
    bytes_per_key: f64,
    peer_bytes_per_key: f64,
}

/// What a phase asks of an index: tusk's trees and the peers answer the same questions.
trait Contender: Sync {
    fn insert(&self, ops: &[(u64, u64)]) -> Result<(), tusk::Error>;
    /// How many of `keys` are present.
    fn lookup(&self, keys: &[u64]) -> Result<u64, tusk::Error>;
    /// Keys delivered by a scan of up to `len` keys from `from`.
    fn scan(&self, from: u64, len: usize) -> Result<u64, tusk::Error>;
    /// (count, sum of values) of the keys in `lo..hi`.
    fn count_sum(&self, lo: u64, hi: u64) -> Result<(u64, u128), tusk::Error>;
}

/// Runs `work` on `threads` threads, thread t getting the t-th contiguous share of `items`;
/// returns the seconds taken and the sum of what the threads returned. The clock starts once
/// every thread is up, so that a short phase on many threads does not count their start.
fn parallel<T: Sync>(threads: usize, items: &[T], work: impl Fn(&[T]) -> Result<u64, tusk::Error> + Sync) -> Result<(f64, u64), tusk::Error> {
    let ready = std::sync::Barrier::new(threads + 1);
    let (results, elapsed): (Vec<Result<u64, tusk::Error>>, f64) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let share = &items[t * items.len() / threads..(t + 1) * items.len() / threads];
                let (work, ready) = (&work, &ready);
                s.spawn(move || {
                    ready.wait();
                    work(share)
                })
            })
            .collect();
        ready.wait();
        let started = Instant::now();
        let results = handles.into_iter().map(|h| h.join().expect("benchmark thread panicked")).collect();
        (results, started.elapsed().as_secs_f64())
    });
    let mut total = 0;
    for r in results {
        total += r?;
    }
    Ok((elapsed, total))
}

/// A tusk index in a store: the tree's descriptor and how to reach it in a transaction.
struct TuskIndex<'s> {
    store: &'s Store,
    kind: IndexChoice,
    tree: HeapPtr,
    txn_keys: usize,
    lookups_per_txn: usize,
    /// Insert transaction attempts and commits, for the retry rate.
    insert_attempts: AtomicU64,
    insert_txns: AtomicU64,
}

fn art_key(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

impl TuskIndex<'_> {
    fn create<'s>(store: &'s Store, kind: IndexChoice, name: &str, args: &IndexArgs, txn_keys: usize) -> Result<TuskIndex<'s>, tusk::Error> {
        let (tree, _) = store.transact(Commit::Sync, |tx| match kind {
            IndexChoice::Btree => Ok(tx.btree(name)?.ptr()),
            IndexChoice::Art => Ok(tx.art(name)?.ptr()),
        })?;
        Ok(TuskIndex {
            store,
            kind,
            tree,
            txn_keys,
            lookups_per_txn: args.lookups_per_txn.max(1),
            insert_attempts: AtomicU64::new(0),
            insert_txns: AtomicU64::new(0),
        })
    }

    fn len(&self) -> Result<u64, tusk::Error> {
        let (n, _) = self.store.transact(Commit::Async, |tx| match self.kind {
            IndexChoice::Btree => tx.btree_at(self.tree)?.len(),
            IndexChoice::Art => tx.art_at(self.tree)?.len(),
        })?;
        Ok(n)
    }

    /// Heap bytes held by the index's nodes and leaves (from its validator).
    /// Counts the present `keys`, `lookups_per_txn` to a read-only transaction: a `get` per
    /// key, or (`batched`) one `get_many` per transaction.
    fn lookups(&self, keys: &[u64], batched: bool) -> Result<u64, tusk::Error> {
        let mut found = 0;
        for batch in keys.chunks(self.lookups_per_txn) {
            // A `get` per key counts as it goes, allocating nothing, as the peers' lookups do.
            let (hits, _) = self.store.transact(Commit::Async, |tx| {
                let present = |values: Vec<Option<u64>>| values.iter().filter(|v| v.is_some()).count() as u64;
                match (self.kind, batched) {
                    (IndexChoice::Btree, true) => Ok(present(tx.btree_at(self.tree)?.get_many(batch)?)),
                    (IndexChoice::Btree, false) => {
                        let mut t = tx.btree_at(self.tree)?;
                        batch.iter().try_fold(0, |n, &k| Ok(n + u64::from(t.get(k)?.is_some())))
                    }
                    (IndexChoice::Art, true) => {
                        let keys: Vec<[u8; 8]> = batch.iter().map(|&k| art_key(k)).collect();
                        let keys: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                        Ok(present(tx.art_at(self.tree)?.get_many(&keys)?))
                    }
                    (IndexChoice::Art, false) => {
                        let mut a = tx.art_at(self.tree)?;
                        batch.iter().try_fold(0, |n, &k| Ok(n + u64::from(a.get(&art_key(k))?.is_some())))
                    }
                }
            })?;
            found += hits;
        }
        Ok(found)
    }

    fn bytes(&self) -> Result<u64, tusk::Error> {
        let (n, _) = self.store.transact(Commit::Async, |tx| match self.kind {
            IndexChoice::Btree => Ok(tx.btree_at(self.tree)?.check()?.nodes * tusk_index::btree::layout::NODE_SIZE),
            IndexChoice::Art => Ok(tx.art_at(self.tree)?.check()?.bytes),
        })?;
        Ok(n)
    }
}

impl Contender for TuskIndex<'_> {
    fn insert(&self, ops: &[(u64, u64)]) -> Result<(), tusk::Error> {
        let mut attempts = 0u64;
        let mut txns = 0u64;
        for batch in ops.chunks(self.txn_keys) {
            txns += 1;
            self.store.transact(Commit::Async, |tx| {
                attempts += 1;
                match self.kind {
                    IndexChoice::Btree => {
                        let mut t = tx.btree_at(self.tree)?;
                        for &(k, v) in batch {
                            t.insert(k, v)?;
                        }
                    }
                    IndexChoice::Art => {
                        let mut a = tx.art_at(self.tree)?;
                        for &(k, v) in batch {
                            a.insert(&art_key(k), v)?;
                        }
                    }
                }
                Ok(())
            })?;
        }
        self.insert_attempts.fetch_add(attempts, Ordering::Relaxed);
        self.insert_txns.fetch_add(txns, Ordering::Relaxed);
        Ok(())
    }

    fn lookup(&self, keys: &[u64]) -> Result<u64, tusk::Error> {
        self.lookups(keys, false)
    }

    fn scan(&self, from: u64, len: usize) -> Result<u64, tusk::Error> {
        let (n, _) = self.store.transact(Commit::Async, |tx| {
            let mut n = 0u64;
            match self.kind {
                IndexChoice::Btree => {
                    for item in tx.btree_at(self.tree)?.range(from..)?.take(len) {
                        item?;
                        n += 1;
                    }
                }
                IndexChoice::Art => {
                    for item in tx.art_at(self.tree)?.range(art_key(from)..)?.take(len) {
                        item?;
                        n += 1;
                    }
                }
            }
            Ok(n)
        })?;
        Ok(n)
    }

    fn count_sum(&self, lo: u64, hi: u64) -> Result<(u64, u128), tusk::Error> {
        let (cs, _) = self.store.transact(Commit::Async, |tx| match self.kind {
            IndexChoice::Btree => {
                let mut t = tx.btree_at(self.tree)?;
                Ok((t.count(lo..hi)?, t.sum(lo..hi)?))
            }
            IndexChoice::Art => {
                let mut a = tx.art_at(self.tree)?;
                let (lo, hi) = (art_key(lo), art_key(hi));
                Ok((a.count(lo..hi)?, a.sum(lo..hi)?))
            }
        })?;
        Ok(cs)
    }
}

/// `std::collections::BTreeMap`, behind a lock (taken once per call, as tusk takes one
/// transaction per call).
struct StdMap(RwLock<BTreeMap<u64, u64>>);

impl Contender for StdMap {
    fn insert(&self, ops: &[(u64, u64)]) -> Result<(), tusk::Error> {
        for &(k, v) in ops {
            self.0.write().expect("unpoisoned").insert(k, v);
        }
        Ok(())
    }

    fn lookup(&self, keys: &[u64]) -> Result<u64, tusk::Error> {
        let map = self.0.read().expect("unpoisoned");
        Ok(keys.iter().filter(|k| map.contains_key(k)).count() as u64)
    }

    fn scan(&self, from: u64, len: usize) -> Result<u64, tusk::Error> {
        let map = self.0.read().expect("unpoisoned");
        Ok(map.range(from..).take(len).count() as u64)
    }

    fn count_sum(&self, lo: u64, hi: u64) -> Result<(u64, u128), tusk::Error> {
        let map = self.0.read().expect("unpoisoned");
        Ok(map.range(lo..hi).fold((0, 0), |(n, s), (_, &v)| (n + 1, s + v as u128)))
    }
}

/// The `congee` ART (concurrent, optimistic lock coupling; needs no lock of ours).
struct Congee(congee::Congee<usize, usize>);

impl Contender for Congee {
    fn insert(&self, ops: &[(u64, u64)]) -> Result<(), tusk::Error> {
        let guard = self.0.pin();
        for &(k, v) in ops {
            self.0.insert(k as usize, v as usize, &guard).expect("congee allocation");
        }
        Ok(())
    }

    fn lookup(&self, keys: &[u64]) -> Result<u64, tusk::Error> {
        let guard = self.0.pin();
        Ok(keys.iter().filter(|&&k| self.0.get(&(k as usize), &guard).is_some()).count() as u64)
    }

    fn scan(&self, from: u64, len: usize) -> Result<u64, tusk::Error> {
        let guard = self.0.pin();
        let mut out = vec![(0usize, 0usize); len];
        Ok(self.0.range(&(from as usize), &usize::MAX, &mut out, &guard) as u64)
    }

    fn count_sum(&self, lo: u64, hi: u64) -> Result<(u64, u128), tusk::Error> {
        let guard = self.0.pin();
        // congee has no aggregate: scan into a buffer sized to the range, as a user would.
        let mut out = vec![(0usize, 0usize); 4096];
        let n = self.0.range(&(lo as usize), &(hi as usize), &mut out, &guard);
        Ok((n as u64, out[..n].iter().map(|&(_, v)| v as u128).sum()))
    }
}

/// Bytes the C allocator holds for the program right now, from glibc's own accounting (every
/// arena's chunks in use plus its mmapped ones). Not a counting global allocator: its shared
/// counters, written by every allocation of every thread, were one cache line all threads of a
/// many-core run fought over (BENCHMARKS.md, "16 cores"). NaN where the C library is not glibc.
fn heap_allocated() -> f64 {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `mallinfo2` only reads the allocator's statistics (under its arena locks).
        let info = unsafe { libc::mallinfo2() };
        (info.uordblks + info.hblkhd) as f64
    }
    #[cfg(not(target_env = "gnu"))]
    {
        f64::NAN
    }
}

/// The distinct keys of `ops` with their last value, sorted.
fn final_pairs(ops: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut pairs = ops.to_vec();
    // Values are operation positions: the largest per key is the last upsert.
    pairs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(pairs.len());
    for p in pairs {
        match out.last_mut() {
            Some(last) if last.0 == p.0 => *last = p,
            _ => out.push(p),
        }
    }
    out
}

struct Probes {
    lookups: Vec<u64>,
    scans: Vec<u64>,
    aggs: Vec<(u64, u64, u64, u128)>,
}

fn probes(args: &IndexArgs, pairs: &[(u64, u64)]) -> Probes {
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x9e37_79b9);
    let n = pairs.len();
    let lookups = args.lookups.unwrap_or(n.min(2_000_000));
    let lookups = (0..lookups).map(|_| pairs[rng.random_range(0..n)].0).collect();
    let scans = (0..args.scans).map(|_| pairs[rng.random_range(0..n)].0).collect();
    let width = args.agg_width.min(n - 1).max(1);
    let aggs = (0..args.aggs)
        .map(|_| {
            let i = rng.random_range(0..n - width.min(n - 1));
            let (lo, hi) = (pairs[i].0, pairs[(i + width).min(n - 1)].0);
            let count = ((i + width).min(n - 1) - i) as u64;
            let sum = pairs[i..i + count as usize].iter().map(|&(_, v)| v as u128).sum();
            (lo, hi, count, sum)
        })
        .collect();
    Probes { lookups, scans, aggs }
}

/// Inserts `ops` on `t` threads; returns the inserts per second, counting until `settle`
/// returns (for tusk: until the last LSN is durable).
fn measure_inserts(c: &dyn Contender, t: usize, ops: &[(u64, u64)], settle: impl Fn() -> Result<(), tusk::Error>) -> Result<f64, tusk::Error> {
    let started = Instant::now();
    parallel(t, ops, |share| c.insert(share).map(|_| 0))?;
    settle()?;
    Ok(ops.len() as f64 / started.elapsed().as_secs_f64())
}

/// Measures every phase on one contender; returns (insert, lookup, scan keys, aggs) per second.
#[allow(clippy::too_many_arguments)]
fn measure(c: &dyn Contender, args: &IndexArgs, t: usize, ops: &[(u64, u64)], probes: &Probes, settle: impl Fn() -> Result<(), tusk::Error>, name: &str) -> Result<[f64; 4], Box<dyn std::error::Error>> {
    let insert = measure_inserts(c, t, ops, settle)?;
    let (secs, found) = parallel(t, &probes.lookups, |share| c.lookup(share))?;
    if found != probes.lookups.len() as u64 {
        return Err(format!("{name}: {found} of {} present keys found", probes.lookups.len()).into());
    }
    let lookup = found as f64 / secs;
    let (secs, scanned) = parallel(t, &probes.scans, |share| {
        share.iter().try_fold(0, |n, &k| Ok(n + c.scan(k, args.scan_len)?))
    })?;
    if scanned < probes.scans.len() as u64 {
        return Err(format!("{name}: scans from present keys returned {scanned} keys for {} scans", probes.scans.len()).into());
    }
    let scan = scanned as f64 / secs;
    let (secs, _) = parallel(t, &probes.aggs, |share| {
        for &(lo, hi, count, sum) in share {
            let got = c.count_sum(lo, hi)?;
            if got != (count, sum) {
                panic!("{name}: count/sum of [{lo}, {hi}) is {got:?}, expected ({count}, {sum})");
            }
        }
        Ok(0)
    })?;
    let aggs = probes.aggs.len() as f64 / secs;
    Ok([insert, lookup, scan, aggs])
}

fn run_row(args: &IndexArgs, kind: IndexChoice, order: KeyOrder, threads: usize, txn_keys: usize) -> Result<Row, Box<dyn std::error::Error>> {
    let ops = order.generate(args.keys, args.seed);
    let pairs = final_pairs(&ops);
    if pairs.len() < 2 {
        return Err("--keys must give at least 2 distinct keys".into());
    }
    let probes = probes(args, &pairs);
    let mut row = Row {
        index: kind.name(),
        order: order.name(),
        peer: kind.peer(),
        keys: ops.len(),
        distinct: pairs.len(),
        threads,
        txn_keys,
        rounds: 1,
        ..Row::default()
    };

    // tusk: a fresh store sized for the index (nodes of ≤ 512 bytes per ~14 keys, or ART leaves).
    let dir = BenchDir::new(args.out.dir.clone())?;
    let heap = ((pairs.len() as u64 * 160) + (256 << 20)).next_multiple_of(1 << 20);
    let options = Options { heap_capacity: heap, io: args.io.to_io(), ..Options::default() };
    let store = Store::open(dir.path(), options)?;
    store.prefault();
    let index = TuskIndex::create(&store, kind, "bench", args, txn_keys)?;
    let settle = || {
        store.is_stable(store.last_lsn(), true);
        Ok(())
    };
    if args.inserts_only {
        row.insert_per_s = measure_inserts(&index, threads, &ops, settle)?;
    } else {
        [row.insert_per_s, row.lookup_per_s, row.range_keys_per_s, row.count_sum_per_s] = measure(&index, args, threads, &ops, &probes, settle, "tusk")?;
        let (secs, found) = parallel(threads, &probes.lookups, |share| index.lookups(share, true))?;
        if found != probes.lookups.len() as u64 {
            return Err(format!("tusk get_many: {found} of {} present keys found", probes.lookups.len()).into());
        }
        row.lookup_many_per_s = found as f64 / secs;
    }
    let (attempts, txns) = (index.insert_attempts.load(Ordering::Relaxed), index.insert_txns.load(Ordering::Relaxed));
    row.insert_retries_per_txn = attempts.saturating_sub(txns) as f64 / txns.max(1) as f64;
    let len = index.len()?;
    if len != pairs.len() as u64 {
        return Err(format!("tusk {}: {len} keys after the inserts, expected {}", kind.name(), pairs.len()).into());
    }
    if args.inserts_only {
        store.close()?;
        return Ok(row);
    }
    row.bytes_per_key = index.bytes()? as f64 / pairs.len() as f64;
    if kind == IndexChoice::Btree {
        let started = Instant::now();
        let (loaded, _) = store.transact(Commit::Async, |tx| {
            let mut t = tx.btree("bulk")?;
            t.bulk_load(pairs.iter().copied(), 1.0)
        })?;
        settle()?;
        assert_eq!(loaded, pairs.len() as u64, "bulk load takes every pair");
        row.bulk_load_per_s = Some(pairs.len() as f64 / started.elapsed().as_secs_f64());
    }
    store.close()?;
    drop(dir);

    // The peer, on the same operations.
    let before = heap_allocated();
    match kind {
        IndexChoice::Btree => {
            let map = StdMap(RwLock::new(BTreeMap::new()));
            let [insert, lookup, scan, aggs] = measure(&map, args, threads, &ops, &probes, || Ok(()), "BTreeMap")?;
            row.peer_bytes_per_key = (heap_allocated() - before) / pairs.len() as f64;
            (row.peer_insert_per_s, row.peer_lookup_per_s, row.peer_range_keys_per_s, row.peer_count_sum_per_s) =
                (insert, lookup, scan, aggs);
            drop(map);
            let started = Instant::now();
            let built: BTreeMap<u64, u64> = pairs.iter().copied().collect();
            row.peer_bulk_load_per_s = Some(pairs.len() as f64 / started.elapsed().as_secs_f64());
            assert_eq!(built.len(), pairs.len());
        }
        IndexChoice::Art => {
            let tree = Congee(congee::Congee::default());
            let [insert, lookup, scan, aggs] = measure(&tree, args, threads, &ops, &probes, || Ok(()), "congee")?;
            row.peer_bytes_per_key = (heap_allocated() - before) / pairs.len() as f64;
            (row.peer_insert_per_s, row.peer_lookup_per_s, row.peer_range_keys_per_s, row.peer_count_sum_per_s) =
                (insert, lookup, scan, aggs);
        }
    }
    Ok(row)
}

pub fn run(args: IndexArgs) -> CliResult {
    if args.threads.contains(&0) || args.txn_keys.contains(&0) || args.keys < 2 || args.rounds == 0 {
        return Err("--threads and --txn-keys must be ≥ 1, --keys ≥ 2 and --rounds ≥ 1".into());
    }
    if args.agg_width > 4096 {
        return Err("--agg-width is at most 4096 (congee's scan buffer)".into());
    }
    let mut cells = Vec::new();
    for &kind in &args.index {
        for &order in &args.order {
            for &threads in &args.threads {
                for &txn_keys in &args.txn_keys {
                    cells.push((kind, order, threads, txn_keys));
                }
            }
        }
    }
    // measured[i]: the rounds of cell i, interleaved so that load changes hit every cell.
    let mut measured: Vec<Vec<Row>> = cells.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        for (i, &(kind, order, threads, txn_keys)) in cells.iter().enumerate() {
            if !args.out.json {
                eprintln!(
                    "measuring {} / {} ({} keys, {threads} threads, {txn_keys} keys per txn, round {} of {})...",
                    kind.name(),
                    order.name(),
                    args.keys,
                    round + 1,
                    args.rounds
                );
            }
            measured[i].push(run_row(&args, kind, order, threads, txn_keys)?);
        }
    }
    let rows: Vec<Row> = measured.into_iter().map(median_row).collect();
    if let Some(dir) = &args.out.plot {
        plot(dir, &rows)?;
    }
    if args.out.json {
        for row in &rows {
            outln!("{}", row_json(row, args.inserts_only));
        }
    } else if args.inserts_only {
        print_insert_table(&rows);
    } else {
        print_table(&rows);
    }
    Ok(())
}

/// One row whose every figure is the median of that figure over `rounds` (same cell).
fn median_row(rounds: Vec<Row>) -> Row {
    let m = |f: fn(&Row) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let mo = |f: fn(&Row) -> Option<f64>| rounds.iter().map(f).collect::<Option<Vec<f64>>>().map(|v| median(&v));
    let first = &rounds[0];
    Row {
        index: first.index,
        order: first.order,
        peer: first.peer,
        keys: first.keys,
        distinct: first.distinct,
        threads: first.threads,
        txn_keys: first.txn_keys,
        rounds: rounds.len(),
        insert_per_s: m(|r| r.insert_per_s),
        insert_retries_per_txn: m(|r| r.insert_retries_per_txn),
        peer_insert_per_s: m(|r| r.peer_insert_per_s),
        bulk_load_per_s: mo(|r| r.bulk_load_per_s),
        peer_bulk_load_per_s: mo(|r| r.peer_bulk_load_per_s),
        lookup_per_s: m(|r| r.lookup_per_s),
        lookup_many_per_s: m(|r| r.lookup_many_per_s),
        peer_lookup_per_s: m(|r| r.peer_lookup_per_s),
        range_keys_per_s: m(|r| r.range_keys_per_s),
        peer_range_keys_per_s: m(|r| r.peer_range_keys_per_s),
        count_sum_per_s: m(|r| r.count_sum_per_s),
        peer_count_sum_per_s: m(|r| r.peer_count_sum_per_s),
        bytes_per_key: m(|r| r.bytes_per_key),
        peer_bytes_per_key: m(|r| r.peer_bytes_per_key),
    }
}

fn print_insert_table(rows: &[Row]) {
    outln!(
        "{:<6} {:<13} {:>10} {:>8} {:>9} {:>7} {:>12} {:>9} {:>14}",
        "index", "order", "keys", "threads", "txn keys", "rounds", "insert/s", "vs small", "retries/txn"
    );
    for r in rows {
        outln!(
            "{:<6} {:<13} {:>10} {:>8} {:>9} {:>7} {:>12} {:>9.2} {:>14.4}",
            r.index,
            r.order,
            r.keys,
            r.threads,
            r.txn_keys,
            r.rounds,
            rate(r.insert_per_s),
            r.insert_per_s / smallest_txn_rate(rows, r),
            r.insert_retries_per_txn
        );
    }
    outln!("insert/s: durable inserts (Async commits, the clock stops at the last LSN durable), medians of the rounds");
    outln!("vs small: insert/s against the row of the same index, order and threads with the fewest keys per transaction");
}

/// The insert rate of the row like `r` (index, order, threads) with the fewest keys per
/// transaction.
fn smallest_txn_rate(rows: &[Row], r: &Row) -> f64 {
    rows.iter()
        .filter(|o| o.index == r.index && o.order == r.order && o.threads == r.threads)
        .min_by_key(|o| o.txn_keys)
        .map_or(f64::NAN, |o| o.insert_per_s)
}

/// The row as JSON; with `inserts_only`, the phases not measured are null.
fn row_json(r: &Row, inserts_only: bool) -> serde_json::Value {
    let measured = |x: f64| (!inserts_only).then_some(x);
    serde_json::json!({
        "bench": "index",
        "index": r.index,
        "order": r.order,
        "keys": r.keys,
        "distinct_keys": r.distinct,
        "threads": r.threads,
        "txn_keys": r.txn_keys,
        "rounds": r.rounds,
        "inserts_only": inserts_only,
        "insert_per_s": r.insert_per_s,
        "insert_retries_per_txn": r.insert_retries_per_txn,
        "bulk_load_per_s": r.bulk_load_per_s,
        "lookup_per_s": measured(r.lookup_per_s),
        "lookup_many_per_s": measured(r.lookup_many_per_s),
        "range_keys_per_s": measured(r.range_keys_per_s),
        "count_sum_per_s": measured(r.count_sum_per_s),
        "bytes_per_key": measured(r.bytes_per_key),
        "peer": r.peer,
        "peer_insert_per_s": measured(r.peer_insert_per_s),
        "peer_bulk_load_per_s": r.peer_bulk_load_per_s,
        "peer_lookup_per_s": measured(r.peer_lookup_per_s),
        "peer_range_keys_per_s": measured(r.peer_range_keys_per_s),
        "peer_count_sum_per_s": measured(r.peer_count_sum_per_s),
        "peer_bytes_per_key": measured(r.peer_bytes_per_key),
        "lookup_ratio": measured(r.lookup_per_s / r.peer_lookup_per_s),
        "lookup_many_ratio": measured(r.lookup_many_per_s / r.peer_lookup_per_s),
    })
}

fn print_table(rows: &[Row]) {
    outln!(
        "{:<6} {:<13} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>12} {:>12} {:>8}",
        "index", "order", "keys", "insert/s", "peer ins/s", "bulk/s", "get/s", "get_many/s", "peer get/s", "ratio", "many", "scan keys/s", "cnt+sum/s", "B/key"
    );
    for r in rows {
        outln!(
            "{:<6} {:<13} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8.2} {:>8.2} {:>12} {:>12} {:>8.1}",
            r.index,
            r.order,
            r.keys,
            rate(r.insert_per_s),
            rate(r.peer_insert_per_s),
            r.bulk_load_per_s.map_or("-".into(), rate),
            rate(r.lookup_per_s),
            rate(r.lookup_many_per_s),
            rate(r.peer_lookup_per_s),
            r.lookup_per_s / r.peer_lookup_per_s,
            r.lookup_many_per_s / r.peer_lookup_per_s,
            rate(r.range_keys_per_s),
            rate(r.count_sum_per_s),
            r.bytes_per_key,
        );
    }
    outln!("peers: btree vs std::collections::BTreeMap, art vs congee; peer scan/count+sum/B-per-key in --json");
    outln!("get/s: a get per key; get_many/s: one get_many per transaction (the peers have no batched form); ratio, many: each against the peer's get/s");
}

/// `DIR/index.svg`: a panel per index with its peer, operation by operation (a bar per key
/// order and contender), and a panel of bytes per key.
fn plot(dir: &std::path::Path, rows: &[Row]) -> CliResult {
    use super::svg_plot::{write_bars_grid, Bars};
    std::fs::create_dir_all(dir).at(dir)?;
    let operations = ["insert", "bulk load", "lookup", "range keys", "count+sum"];
    let ours = |r: &Row| [r.insert_per_s, r.bulk_load_per_s.unwrap_or(f64::NAN), r.lookup_per_s, r.range_keys_per_s, r.count_sum_per_s];
    let theirs = |r: &Row| {
        [r.peer_insert_per_s, r.peer_bulk_load_per_s.unwrap_or(f64::NAN), r.peer_lookup_per_s, r.peer_range_keys_per_s, r.peer_count_sum_per_s]
    };
    let mut indexes: Vec<&str> = rows.iter().map(|r| r.index).collect();
    indexes.dedup();
    let mut charts = Vec::new();
    let mut space = Bars { title: "memory".into(), y_label: "bytes per key".into(), log_y: false, ..Bars::default() };
    for index in indexes {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.index == index).collect();
        let first = mine[0];
        let mut chart = Bars {
            title: format!("{index} vs {} ({} keys, {} threads)", first.peer, first.keys, first.threads),
            y_label: "operations/s (log)".into(),
            log_y: true,
            categories: operations.iter().map(|o| o.to_string()).collect(),
            series: Vec::new(),
        };
        for r in &mine {
            chart.series.push((format!("{index} {}", r.order), ours(r).to_vec()));
            chart.series.push((format!("{} {}", r.peer, r.order), theirs(r).to_vec()));
            space.categories.push(format!("{index} {}", r.order));
        }
        charts.push(chart);
    }
    space.series = vec![
        ("tusk".into(), rows.iter().map(|r| r.bytes_per_key).collect()),
        ("peer".into(), rows.iter().map(|r| r.peer_bytes_per_key).collect()),
    ];
    charts.push(space);
    write_bars_grid(&charts, 2, &dir.join("index.svg"))?;
    Ok(())
}
