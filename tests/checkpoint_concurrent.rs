//! Checkpoints taken while transactions run (Hathi's chunk copy: no pause of writers).
//!
//! Two threads move money between accounts that lie in different chunks, so a transfer
//! often spans a chunk already copied and one not yet copied; the main thread takes
//! checkpoints back to back meanwhile, then the store crashes. Recovery from those images
//! plus the log must give exactly the transfers up to the recovered LSN (every Sync one
//! among them), and so keep the total.

use std::sync::atomic::{AtomicBool, Ordering};

use tusk::{Commit, HeapPtr, Lsn, Options, Store};

const ACCOUNTS: u64 = 48;
/// One account per 4 KiB page, two pages per chunk: 24 chunks of accounts.
const STRIDE: u64 = 4096;
const CHUNK: u64 = 8 << 10;
const INITIAL: u64 = 1_000_000;

fn options() -> Options {
    Options {
        heap_capacity: 8 << 20,
        stripes_log2: 12,
        log_partitions: 2,
        chunk_size: CHUNK,
        segment_bytes: 1 << 16,
        checkpoint_interval: None,
        ..Options::default()
    }
}

#[derive(Clone, Copy, Debug)]
struct Transfer {
    lsn: Lsn,
    sync: bool,
    from: u64,
    to: u64,
    amount: u64,
}

fn balances(store: &Store) -> Vec<u64> {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root("accounts")?.expect("accounts root");
            (0..ACCOUNTS).map(|a| tx.read_u64_at(p, a * STRIDE)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap()
        .0
}

/// Runs transfers on two threads while the main thread takes `checkpoints` checkpoints.
fn transfers_during_checkpoints(store: &Store, p: HeapPtr, checkpoints: usize, seed: u64) -> Vec<Transfer> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let mut x = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let mut done = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let (from, to) = (x % ACCOUNTS, (x >> 8) % ACCOUNTS);
                        if from == to {
                            continue;
                        }
                        let amount = 1 + (x >> 16) % 100;
                        let sync = (x >> 32).is_multiple_of(8);
                        let mode = if sync { Commit::Sync } else { Commit::Async };
                        let (_, lsn) = store
                            .transact(mode, |tx| {
                                let a = tx.read_u64_at(p, from * STRIDE)?;
                                let b = tx.read_u64_at(p, to * STRIDE)?;
                                tx.write_u64_at(p, from * STRIDE, a - amount)?;
                                tx.write_u64_at(p, to * STRIDE, b + amount)
                            })
                            .unwrap();
                        done.push(Transfer { lsn: lsn.unwrap(), sync, from, to, amount });
                    }
                    done
                })
            })
            .collect();
        for _ in 0..checkpoints {
            let report = store.checkpoint().unwrap();
            assert!(report.written > 0, "{report:?}");
        }
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    })
}

/// The balances after `start` and every transfer with an LSN ≤ `upto`.
fn replay(start: &[u64], transfers: &[Transfer], upto: Lsn) -> Vec<u64> {
    let mut sorted: Vec<&Transfer> = transfers.iter().filter(|t| t.lsn <= upto).collect();
    sorted.sort_by_key(|t| t.lsn);
    let mut b = start.to_vec();
    for t in sorted {
        b[t.from as usize] -= t.amount;
        b[t.to as usize] += t.amount;
    }
    b
}

#[test]
fn checkpoints_during_transfers_then_crash_recover_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    let (p, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(ACCOUNTS * STRIDE)?;
            tx.set_root("accounts", p)?;
            (0..ACCOUNTS).try_for_each(|a| tx.write_u64_at(p, a * STRIDE, INITIAL))?;
            Ok(p)
        })
        .unwrap();
    let mut start = vec![INITIAL; ACCOUNTS as usize];
    let mut store = Some(store);
    for round in 0..4u64 {
        let s = store.take().unwrap();
        let transfers = transfers_during_checkpoints(&s, p, 6, round);
        assert!(transfers.len() > 100, "round {round}: only {} transfers ran beside the checkpoints", transfers.len());
        let last_sync = transfers.iter().filter(|t| t.sync).map(|t| t.lsn).max().unwrap_or(0);
        s.crash();

        let s = Store::open(dir.path(), options()).unwrap();
        let report = s.recovery_report();
        assert!(report.checkpoint.is_some(), "round {round}: recovered from a checkpoint");
        let recovered = report.recovered_lsn;
        assert!(recovered >= last_sync, "round {round}: recovered LSN {recovered} < Sync commit {last_sync}");
        let expected = replay(&start, &transfers, recovered);
        let found = balances(&s);
        assert_eq!(found.iter().sum::<u64>(), ACCOUNTS * INITIAL, "round {round}: money created or destroyed");
        assert_eq!(found, expected, "round {round}: balances differ from the transfers up to LSN {recovered}");
        start = found;
        store = Some(s);
    }
    store.take().unwrap().close().unwrap();
}
