//! Profiling aid for issue 13 (target 5): point lookups of a B-link tree and an ART in
//! read-only transactions (16 per transaction, as `tusk bench index` does), a `get` per key
//! and one `get_many` per transaction, beside the same lookups with plain loads of the heap
//! (no STM) and `BTreeMap`.
//!
//! `cargo run --release -p tusk-index --example lookup_probe -- [btree|art] [keys] [lookups]`

use std::collections::BTreeMap;
use std::time::Instant;

use common::mix;
use tusk_index::{Art, BTree};
use tusk_txn::{Commit, Engine, Transaction};

mod common;

/// Lookups per second of `probes` in read-only transactions of 16 keys; `lookup` answers one
/// transaction's keys with the number found (all of them must be).
fn txn_rate(engine: &Engine, probes: &[u64], lookup: impl Fn(&mut Transaction<'_>, &[u64]) -> u64) -> f64 {
    let t = Instant::now();
    let mut hits = 0;
    for batch in probes.chunks(16) {
        let mut tx = engine.begin();
        hits += lookup(&mut tx, batch);
        tx.commit(Commit::Async).unwrap();
    }
    assert_eq!(hits, probes.len() as u64);
    probes.len() as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("btree", String::as_str).to_string();
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let lookups: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4_000_000);
    let art = which == "art";
    let (engine, meta) = common::engine_with_tree(n * 160 + (256 << 20), 20, art);
    let keys: Vec<u64> = (0..n).map(|i| mix(i) | 1).collect();
    let probes: Vec<u64> = (0..lookups).map(|i| keys[(mix(i ^ 0xABCD) % n) as usize]).collect();
    let t0 = Instant::now();
    common::insert_in_txns(&engine, meta, art, &keys, 256);
    eprintln!("built {which} of {n} keys in {:.1} s", t0.elapsed().as_secs_f64());
    let reps = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    for _ in 0..reps {
        let txn = txn_rate(&engine, &probes, |tx, batch| {
            if which == "art" {
                let a = Art::open(tx, meta).unwrap();
                batch.iter().map(|&k| a.get(tx, &k.to_be_bytes()).unwrap().is_some() as u64).sum()
            } else {
                let b = BTree::open(tx, meta).unwrap();
                batch.iter().map(|&k| b.get(tx, k).unwrap().is_some() as u64).sum()
            }
        });
        let many = txn_rate(&engine, &probes, |tx, batch| {
            let found = if which == "art" {
                let keys: Vec<[u8; 8]> = batch.iter().map(|k| k.to_be_bytes()).collect();
                let keys: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                Art::open(tx, meta).unwrap().get_many(tx, &keys).unwrap()
            } else {
                BTree::open(tx, meta).unwrap().get_many(tx, batch).unwrap()
            };
            found.iter().filter(|v| v.is_some()).count() as u64
        });
        // Plain loads of the heap.
        let t = Instant::now();
        let mut h = engine.heap();
        let mut hits = 0u64;
        for &k in &probes {
            if which == "art" {
                let a = Art::open(&mut h, meta).unwrap();
                hits += a.get(&mut h, &k.to_be_bytes()).unwrap().is_some() as u64;
            } else {
                let b = BTree::open(&mut h, meta).unwrap();
                hits += b.get(&mut h, k).unwrap().is_some() as u64;
            }
        }
        let plain = lookups as f64 / t.elapsed().as_secs_f64();
        assert_eq!(hits, lookups);
        println!("{which} {n} keys: txn {txn:.0}/s  txn get_many {many:.0}/s  plain {plain:.0}/s  txn/plain {:.2}  many/txn {:.2}", txn / plain, many / txn);
    }
    if std::env::var("PEER").is_ok() {
        let map: BTreeMap<u64, u64> = keys.iter().map(|&k| (k, k)).collect();
        for _ in 0..reps {
            let t = Instant::now();
            let hits = probes.iter().filter(|k| map.contains_key(k)).count() as u64;
            assert_eq!(hits, lookups);
            println!("BTreeMap {:.0}/s", lookups as f64 / t.elapsed().as_secs_f64());
        }
    }
}
