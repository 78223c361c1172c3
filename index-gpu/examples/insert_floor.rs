//! Probe for issue 29 (target 1): the floor of a shuffled insert. The same trees take the same
//! distinct random keys on a plain heap (a byte vector with a bump allocator: no STM, no
//! write set, no locks, no log), beside the same inserts in transactions of 1 key and of
//! `big` keys on an engine without a log. A transaction cannot insert faster than the plain
//! heap does, so plain / 1-key bounds what any transaction size can gain over 1 key.
//!
//! `cargo run --release -p tusk-index --example insert_floor -- [btree|art] [keys] [big] [rounds]`

use std::time::Instant;

use common::mix;
use tusk_index::heap::{HeapRead, HeapWrite};
use tusk_index::{Art, ArtOp, BTree, Op};
use tusk_txn::TxnError;

mod common;

struct PlainHeap {
    bytes: Vec<u8>,
    top: u64,
}

impl PlainHeap {
    /// `len` bytes, every page touched before the clock starts (the store's heap is
    /// prefaulted by a thread of its own).
    fn prefaulted(len: usize) -> PlainHeap {
        let mut bytes = vec![0u8; len];
        for page in bytes.chunks_mut(4096) {
            // SAFETY: a valid, aligned pointer into the vector.
            unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 0) };
        }
        PlainHeap { bytes, top: 4096 }
    }
}

impl HeapRead for PlainHeap {
    #[inline]
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        let at = off as usize;
        Ok(u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes")))
    }
}

impl HeapWrite for PlainHeap {
    #[inline]
    fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError> {
        let at = off as usize;
        self.bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        Ok(())
    }

    fn alloc(&mut self, len: u64) -> Result<u64, TxnError> {
        let at = self.top.next_multiple_of(64);
        self.top = at + len;
        assert!(self.top as usize <= self.bytes.len(), "plain heap full");
        Ok(at)
    }
}

fn plain_rate(art: bool, keys: &[u64]) -> f64 {
    let mut heap = PlainHeap::prefaulted(keys.len() * 200 + (64 << 20));
    let t = Instant::now();
    if art {
        let a = Art::create(&mut heap).unwrap();
        for &k in keys {
            a.insert(&mut heap, &k.to_be_bytes(), k).unwrap();
        }
    } else {
        let b = BTree::create(&mut heap).unwrap();
        for &k in keys {
            b.insert(&mut heap, k, k).unwrap();
        }
    }
    keys.len() as f64 / t.elapsed().as_secs_f64()
}

fn txn_rate(art: bool, keys: &[u64], per_txn: usize) -> f64 {
    let stripes_log2 = std::env::var("STRIPES_LOG2").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
    let (engine, meta) = common::engine_with_tree(keys.len() as u64 * 300 + (256 << 20), stripes_log2, art);
    let t = Instant::now();
    common::insert_in_txns(&engine, meta, art, keys, per_txn);
    keys.len() as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The plain floor of `tusk bench batch`: a tree of `n` keys (B-link: bulk loaded; ART: one
/// batch), then batches of `ops` upserts, half to loaded keys and half to new random ones,
/// each timed alone. Returns the batches' median ops/s.
fn plain_batch_rate(art: bool, n: u64, ops: usize, rounds: usize) -> f64 {
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555;
    let mut heap = PlainHeap::prefaulted((n as usize + ops * rounds) * 200 + (64 << 20));
    let mut sorted: Vec<u64> = (0..n).map(key).collect();
    sorted.sort_unstable();
    let b = BTree::create(&mut heap).unwrap();
    let a = Art::create(&mut heap).unwrap();
    if art {
        let bytes: Vec<[u8; 8]> = sorted.iter().map(|k| k.to_be_bytes()).collect();
        let load: Vec<ArtOp> = bytes.iter().map(|k| ArtOp::Upsert { key: k, value: 1 }).collect();
        a.apply_batch(&mut heap, &load).unwrap();
    } else {
        b.bulk_load(&mut heap, sorted.iter().map(|&k| (k, 1)), 1.0).unwrap();
    }
    drop(sorted);
    let mut rates = Vec::new();
    for r in 0..rounds as u64 {
        let keys: Vec<u64> = (0..ops as u64).map(|i| if i % 2 == 0 { key(mix(i ^ (r << 40)) % n) } else { mix(i ^ (r << 40) ^ 0xFEED) }).collect();
        let t = Instant::now();
        if art {
            let bytes: Vec<[u8; 8]> = keys.iter().map(|k| k.to_be_bytes()).collect();
            let batch: Vec<ArtOp> = bytes.iter().map(|k| ArtOp::Upsert { key: k, value: 2 }).collect();
            let t = Instant::now();
            a.apply_batch(&mut heap, &batch).unwrap();
            rates.push(ops as f64 / t.elapsed().as_secs_f64());
        } else {
            let batch: Vec<Op> = keys.iter().map(|&k| Op::Upsert { key: k, value: 2 }).collect();
            b.apply_batch(&mut heap, &batch).unwrap();
            rates.push(ops as f64 / t.elapsed().as_secs_f64());
        }
    }
    median(rates)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|s| s == "batch") {
        let art = args.get(2).is_some_and(|s| s == "art");
        let n: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(16_000_000);
        let ops: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
        let rate = plain_batch_rate(art, n, ops, 3);
        println!("{} plain batch: {ops} upserts into {n} keys, {rate:.0} ops/s (median of 3)", if art { "art" } else { "btree" });
        return;
    }
    let art = args.get(1).is_some_and(|s| s == "art");
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let big: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    let keys: Vec<u64> = (0..n).map(mix).collect();
    let (mut plain, mut one, mut large) = (Vec::new(), Vec::new(), Vec::new());
    // A fifth argument (`plain`, `one` or `large`) runs that mode alone (for a profile).
    let only = args.get(5).cloned().unwrap_or_default();
    let runs = |mode: &str| only.is_empty() || only == mode;
    for _ in 0..rounds {
        plain.push(if runs("plain") { plain_rate(art, &keys) } else { f64::NAN });
        one.push(if runs("one") { txn_rate(art, &keys, 1) } else { f64::NAN });
        large.push(if runs("large") { txn_rate(art, &keys, big) } else { f64::NAN });
    }
    let (p, o, l) = (median(plain), median(one), median(large));
    println!("{} {n} keys: plain {p:.0}/s, 1-key txns {o:.0}/s, {big}-key txns {l:.0}/s", if art { "art" } else { "btree" });
    println!("plain / 1-key = {:.2}x (no transaction size can beat this), {big}-key / 1-key = {:.2}x", p / o, l / o);
}
