//! The index part of `tusk demo`: loads a B-link tree of orders (u64 order id → amount) and
//! an ART of customers (`cust/<region>/<id>` → balance), runs updates and queries (lookups,
//! range counts and sums, prefix counts) on all threads, and after the reopen verifies both
//! trees key for key against in-memory models, with their validators.
//!
//! Thread t updates only the keys of its residue class (id % threads == t), so each thread's
//! model is exact without coordination; queries read everything.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{BTreeOp, Commit, Store};

use super::report::{self, human_rate};

pub const ORDERS: &str = "demo.orders";
pub const CUSTOMERS: &str = "demo.customers";
pub const REGIONS: u64 = 24;
const LOAD_BATCH: usize = 4_096;
const OPS_PER_TXN: usize = 8;

/// What both trees must hold.
#[derive(Default)]
pub struct Model {
    pub orders: BTreeMap<u64, u64>,
    pub customers: BTreeMap<Vec<u8>, u64>,
}

impl Model {
    fn merge(&mut self, other: Model) {
        self.orders.extend(other.orders);
        self.customers.extend(other.customers);
    }
}

pub fn customer_key(id: u64) -> Vec<u8> {
    format!("cust/{:02}/{id:08x}", id % REGIONS).into_bytes()
}

pub fn region_prefix(region: u64) -> Vec<u8> {
    format!("cust/{region:02}/").into_bytes()
}

/// An id of thread `t`'s residue class.
fn id_of(rng: &mut SmallRng, t: usize, threads: usize, span: u64) -> u64 {
    rng.random_range(0..span / threads as u64) * threads as u64 + t as u64
}

fn bar(len: u64, what: &str) -> Result<ProgressBar, Box<dyn std::error::Error>> {
    let bar = ProgressBar::new(len);
    bar.set_style(ProgressStyle::with_template(&format!("{what} [{{bar:40}}] {{pos}}/{{len}} keys {{rate}}"))?.with_key("rate", report::rate_key).progress_chars("=> "));
    Ok(bar)
}

/// Loads `keys` orders (half by bulk load, half by batches) and `keys` customers.
pub fn load(store: &Store, keys: u64, threads: usize) -> Result<(Model, f64), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(0xD3E0);
    let mut model = Model::default();
    while (model.orders.len() as u64) < keys {
        let t = rng.random_range(0..threads);
        let id = id_of(&mut rng, t, threads, u64::MAX);
        model.orders.insert(id, rng.random_range(1..10_000));
    }
    let pairs: Vec<(u64, u64)> = model.orders.iter().map(|(&k, &v)| (k, v)).collect();
    let (bulk, rest) = pairs.split_at(pairs.len() / 2);
    let bar = bar(2 * keys, "load  ")?;
    // The first half, sorted, built bottom-up in one transaction; the rest as batches.
    store.transact(Commit::Async, |tx| tx.btree(ORDERS)?.bulk_load(bulk.iter().copied(), 0.7))?;
    bar.set_position(bulk.len() as u64);
    let mut shuffled = rest.to_vec();
    shuffled.sort_by_key(|&(k, _)| k.rotate_left(29) ^ 0x5555);
    for chunk in shuffled.chunks(LOAD_BATCH) {
        let ops: Vec<BTreeOp> = chunk.iter().map(|&(key, value)| BTreeOp::Upsert { key, value }).collect();
        store.transact(Commit::Async, |tx| tx.btree(ORDERS)?.apply_batch(&ops))?;
        bar.inc(chunk.len() as u64);
    }
    while (model.customers.len() as u64) < keys {
        let t = rng.random_range(0..threads);
        let id = id_of(&mut rng, t, threads, 1 << 32);
        model.customers.insert(customer_key(id), rng.random_range(0..1_000_000));
    }
    let customers: Vec<(Vec<u8>, u64)> = model.customers.iter().map(|(k, &v)| (k.clone(), v)).collect();
    for chunk in customers.chunks(LOAD_BATCH) {
        store.transact(Commit::Async, |tx| {
            let mut art = tx.art(CUSTOMERS)?;
            for (k, v) in chunk {
                art.insert(k, *v)?;
            }
            Ok(())
        })?;
        bar.inc(chunk.len() as u64);
    }
    let (_, lsn) = store.transact(Commit::Sync, |tx| tx.btree(ORDERS)?.len())?;
    store.is_stable(lsn.unwrap_or(0), true);
    bar.finish();
    Ok((model, started.elapsed().as_secs_f64()))
}

/// What the mixed phase did.
pub struct Mixed {
    pub updates: u64,
    pub queries: u64,
    pub seconds: f64,
}

/// Updates and queries on `threads` threads for `seconds`; returns the models after it.
pub fn mixed(store: &Store, model: Model, threads: usize, seconds: f64) -> Result<(Model, Mixed), Box<dyn std::error::Error>> {
    let shares = split(model, threads);
    let (updates, queries, stop) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    let started = Instant::now();
    let results: Vec<Result<Model, tusk::Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .into_iter()
            .enumerate()
            .map(|(t, share)| {
                let (updates, queries, stop) = (&updates, &queries, &stop);
                s.spawn(move || worker(store, share, t, threads, 0x1DE0 + t as u64, updates, queries, stop))
            })
            .collect();
        let spinner = ProgressBar::new_spinner();
        spinner.set_style(ProgressStyle::with_template("index {spinner} {msg}").expect("valid template"));
        let mut last = (Instant::now(), 0u64, 0u64);
        while started.elapsed().as_secs_f64() < seconds {
            std::thread::sleep(Duration::from_millis(250));
            let now = (Instant::now(), updates.load(Ordering::Relaxed), queries.load(Ordering::Relaxed));
            let dt = (now.0 - last.0).as_secs_f64();
            spinner.set_message(format!(
                "{} update txn/s, {} query txn/s ({} updates, {} queries)",
                human_rate((now.1 - last.1) as f64 / dt),
                human_rate((now.2 - last.2) as f64 / dt),
                now.1,
                now.2
            ));
            spinner.tick();
            last = now;
        }
        stop.store(true, Ordering::Relaxed);
        spinner.finish_and_clear();
        handles.into_iter().map(|h| h.join().expect("index worker panicked")).collect()
    });
    let merged = merge(results.into_iter().collect::<Result<Vec<Model>, _>>()?);
    let mixed = Mixed {
        updates: updates.load(Ordering::Relaxed),
        queries: queries.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok((merged, mixed))
}

/// Splits `model` by residue class into the shares of `threads` update threads (thread t
/// owns the ids ≡ t mod threads, as [`worker`] expects).
pub fn split(model: Model, threads: usize) -> Vec<Model> {
    let mut shares: Vec<Model> = (0..threads).map(|_| Model::default()).collect();
    for (k, v) in model.orders {
        shares[(k % threads as u64) as usize].orders.insert(k, v);
    }
    for (k, v) in model.customers {
        let id = u64::from_str_radix(std::str::from_utf8(&k[8..]).expect("ascii key"), 16).expect("hex id");
        shares[(id % threads as u64) as usize].customers.insert(k, v);
    }
    shares
}

/// The whole model from the shares of [`split`].
pub fn merge(shares: Vec<Model>) -> Model {
    let mut merged = Model::default();
    for share in shares {
        merged.merge(share);
    }
    merged
}

enum Update {
    Order(u64, Option<u64>),
    Customer(Vec<u8>, Option<u64>),
}

/// One thread: 3 of 4 transactions update (8 upserts/removes over both trees, own keys
/// only); the 4th queries: a lookup, a range count and sum, a prefix count and sum. `own` is
/// thread t's share of [`split`] into `threads`; returns it updated once `stop` is set.
#[allow(clippy::too_many_arguments)]
pub fn worker(
    store: &Store,
    mut own: Model,
    t: usize,
    threads: usize,
    seed: u64,
    updates: &AtomicU64,
    queries: &AtomicU64,
    stop: &AtomicBool,
) -> Result<Model, tusk::Error> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut order_ids: Vec<u64> = own.orders.keys().copied().collect();
    let mut customer_ids: Vec<Vec<u8>> = own.customers.keys().cloned().collect();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        if i.is_multiple_of(4) {
            let probe = order_ids.get(rng.random_range(0..order_ids.len().max(1))).copied().unwrap_or(0);
            let lo: u64 = rng.random();
            // One region's customers whose id starts with a given hex digit: about 1/400 of all.
            let mut prefix = region_prefix(rng.random_range(0..REGIONS));
            prefix.push(b"0123456789abcdef"[rng.random_range(0..16)]);
            store.transact(Commit::Async, |tx| {
                let mut orders = tx.btree(ORDERS)?;
                orders.get(probe)?;
                orders.count(lo..lo.saturating_add(1 << 52))?;
                orders.sum(lo..lo.saturating_add(1 << 52))?;
                let mut customers = tx.art(CUSTOMERS)?;
                customers.count_prefix(&prefix)?;
                customers.sum_prefix(&prefix)?;
                Ok(())
            })?;
            queries.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut batch = Vec::with_capacity(OPS_PER_TXN);
        for _ in 0..OPS_PER_TXN {
            let remove = rng.random_bool(0.3);
            batch.push(if rng.random_bool(0.5) {
                match remove && !order_ids.is_empty() {
                    true => Update::Order(order_ids.swap_remove(rng.random_range(0..order_ids.len())), None),
                    false => Update::Order(id_of(&mut rng, t, threads, u64::MAX), Some(rng.random_range(1..10_000))),
                }
            } else {
                match remove && !customer_ids.is_empty() {
                    true => Update::Customer(customer_ids.swap_remove(rng.random_range(0..customer_ids.len())), None),
                    false => Update::Customer(customer_key(id_of(&mut rng, t, threads, 1 << 32)), Some(rng.random_range(0..1_000_000))),
                }
            });
        }
        store.transact(Commit::Async, |tx| {
            for u in &batch {
                match u {
                    Update::Order(k, Some(v)) => drop(tx.btree(ORDERS)?.insert(*k, *v)?),
                    Update::Order(k, None) => drop(tx.btree(ORDERS)?.remove(*k)?),
                    Update::Customer(k, Some(v)) => drop(tx.art(CUSTOMERS)?.insert(k, *v)?),
                    Update::Customer(k, None) => drop(tx.art(CUSTOMERS)?.remove(k)?),
                }
            }
            Ok(())
        })?;
        for u in batch {
            match u {
                Update::Order(k, Some(v)) => {
                    if own.orders.insert(k, v).is_none() {
                        order_ids.push(k);
                    }
                }
                Update::Order(k, None) => drop(own.orders.remove(&k)),
                Update::Customer(k, Some(v)) => {
                    if own.customers.insert(k.clone(), v).is_none() {
                        customer_ids.push(k);
                    }
                }
                Update::Customer(k, None) => drop(own.customers.remove(&k)),
            }
        }
        updates.fetch_add(1, Ordering::Relaxed);
    }
    Ok(own)
}

/// What the verification after the reopen found (every field must be true).
pub struct Verified {
    pub orders: u64,
    pub customers: u64,
    pub trees_valid: bool,
    pub contents_equal: bool,
    pub queries_equal: bool,
}

/// Compares both trees with the model: validators, every key, and sampled range and prefix
/// queries.
pub fn verify(store: &Store, model: &Model) -> Result<Verified, tusk::Error> {
    let mut rng = SmallRng::seed_from_u64(0xC0FFEE);
    let ranges: Vec<(u64, u64)> = (0..200).map(|_| {
        let lo: u64 = rng.random();
        (lo, lo.saturating_add(rng.random_range(0..1u64 << 56)))
    }).collect();
    let (v, _) = store.transact(Commit::Async, |tx| {
        let mut orders = tx.btree(ORDERS)?;
        let ostats = orders.check()?;
        let got: Vec<(u64, u64)> = orders.range(..)?.collect::<Result<_, _>>()?;
        let orders_equal = got.len() == model.orders.len() && got.iter().zip(&model.orders).all(|(a, (k, v))| a == &(*k, *v));
        let mut queries_equal = true;
        for &(lo, hi) in &ranges {
            let want = model.orders.range(lo..hi).fold((0u64, 0u128), |(n, s), (_, &v)| (n + 1, s + v as u128));
            queries_equal &= (orders.count(lo..hi)?, orders.sum(lo..hi)?) == want;
        }
        let mut customers = tx.art(CUSTOMERS)?;
        let cstats = customers.check()?;
        let got: Vec<(Vec<u8>, u64)> = customers.range::<&[u8]>(..)?.collect::<Result<_, _>>()?;
        let customers_equal = got.len() == model.customers.len() && got.iter().zip(&model.customers).all(|(a, (k, v))| &a.0 == k && a.1 == *v);
        for region in 0..REGIONS {
            let p = region_prefix(region);
            let want = model.customers.range(p.clone()..).take_while(|(k, _)| k.starts_with(&p)).fold((0u64, 0u128), |(n, s), (_, &v)| (n + 1, s + v as u128));
            queries_equal &= (customers.count_prefix(&p)?, customers.sum_prefix(&p)?) == want;
        }
        Ok(Verified {
            orders: ostats.keys,
            customers: cstats.keys,
            trees_valid: ostats.keys == model.orders.len() as u64 && cstats.keys == model.customers.len() as u64,
            contents_equal: orders_equal && customers_equal,
            queries_equal,
        })
    })?;
    Ok(v)
}
