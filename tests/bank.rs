//! Bank transfers: two threads move money between accounts (Sync and Async commits mixed)
//! while a third runs read-only transactions that sum every account and assert the total
//! inside the transaction, before it commits (opacity). Afterwards the balances must equal
//! the transfers replayed in LSN order, and survive a close (or a crash) and reopen.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, HeapPtr, Lsn, Options, Store};

const ACCOUNTS: u64 = 64;
const INITIAL: u64 = 1_000;
const TOTAL: u64 = ACCOUNTS * INITIAL;

/// A committed transfer.
#[derive(Clone, Copy, Debug)]
struct Transfer {
    lsn: Lsn,
    mode: Commit,
    from: u64,
    to: u64,
    amount: u64,
}

fn opts() -> Options {
    Options { log_partitions: 2, ..common::small_opts() }
}

fn setup(store: &Store) -> HeapPtr {
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(ACCOUNTS * 8)?;
            for i in 0..ACCOUNTS {
                tx.write_u64_at(p, 8 * i, INITIAL)?;
            }
            tx.set_root("accounts", p)?;
            Ok(p)
        })
        .unwrap()
        .0
}

fn balances(store: &Store) -> Vec<u64> {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root("accounts")?.expect("accounts root");
            (0..ACCOUNTS).map(|i| tx.read_u64_at(p, 8 * i)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap()
        .0
}

/// The balances after applying `transfers` with LSN ≤ `upto` in LSN order.
fn replay(transfers: &[Transfer], upto: Lsn) -> Vec<u64> {
    let mut sorted: Vec<&Transfer> = transfers.iter().filter(|t| t.lsn <= upto).collect();
    sorted.sort_by_key(|t| t.lsn);
    let mut b = vec![INITIAL; ACCOUNTS as usize];
    for t in sorted {
        assert!(b[t.from as usize] >= t.amount, "replay of LSN {} overdraws account {}", t.lsn, t.from);
        b[t.from as usize] -= t.amount;
        b[t.to as usize] += t.amount;
    }
    b
}

/// Runs the two transfer threads and the auditing reader; returns every committed transfer
/// and how many audits succeeded.
fn run_bank(store: &Store, p: HeapPtr, transfers_per_thread: usize, seed: u64) -> (Vec<Transfer>, u64) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(seed * 31 + t);
                    let mut log = Vec::new();
                    for i in 0..transfers_per_thread {
                        let from = rng.random_range(0..ACCOUNTS);
                        let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
                        let want = rng.random_range(1..=300u64);
                        let mode = if i % 16 == 0 { Commit::Sync } else { Commit::Async };
                        let (moved, lsn) = store
                            .transact(mode, |tx| {
                                let a = tx.read_u64_at(p, 8 * from)?;
                                let b = tx.read_u64_at(p, 8 * to)?;
                                assert!(a <= TOTAL && b <= TOTAL, "a transaction saw a balance above the total");
                                let amount = want.min(a);
                                if amount == 0 {
                                    return Ok(0);
                                }
                                tx.write_u64_at(p, 8 * from, a - amount)?;
                                tx.write_u64_at(p, 8 * to, b + amount)?;
                                Ok(amount)
                            })
                            .unwrap();
                        match lsn {
                            Some(lsn) => log.push(Transfer { lsn, mode, from, to, amount: moved }),
                            None => assert_eq!(moved, 0, "a transfer that moved money must have an LSN"),
                        }
                        if mode == Commit::Sync {
                            let lsn = lsn.unwrap_or(0);
                            assert!(store.durable_lsn() >= lsn, "Sync returned before LSN {lsn} was durable");
                        }
                    }
                    log
                })
            })
            .collect();
        let auditor = s.spawn(|| {
            let mut audits = 0u64;
            let mut attempts = 0u64;
            while !done.load(Ordering::Acquire) || audits < 20 {
                let (sum, lsn) = store
                    .transact(Commit::Sync, |tx| {
                        attempts += 1;
                        let mut sum = 0u64;
                        for i in 0..ACCOUNTS {
                            sum += tx.read_u64_at(p, 8 * i)?;
                            if i == ACCOUNTS / 2 && attempts.is_multiple_of(4) {
                                // Let the writers commit between the two halves.
                                std::thread::yield_now();
                            }
                        }
                        // Inside the transaction, before commit: opacity means no running
                        // transaction ever observes a half-applied transfer.
                        assert_eq!(sum, TOTAL, "a running transaction saw an inconsistent state");
                        Ok(sum)
                    })
                    .unwrap();
                assert_eq!(sum, TOTAL);
                assert_eq!(lsn, None, "read-only transactions take no LSN");
                audits += 1;
            }
            assert!(attempts >= audits);
            if std::env::var_os("TUSK_BANK_STATS").is_some() {
                eprintln!("audits {audits}, attempts {attempts}");
            }
            audits
        });
        let mut all = Vec::new();
        for w in writers {
            all.extend(w.join().unwrap());
        }
        done.store(true, Ordering::Release);
        let audits = auditor.join().unwrap();
        (all, audits)
    })
}

/// LSNs are unique, and the transfers' LSNs with the setup's fill a gapless range.
fn check_lsns(transfers: &[Transfer], first: Lsn, last: Lsn) {
    let mut lsns: Vec<Lsn> = transfers.iter().map(|t| t.lsn).collect();
    lsns.sort_unstable();
    lsns.dedup();
    assert_eq!(lsns.len(), transfers.len(), "two transfers share an LSN");
    assert_eq!(lsns, (first + 1..=last).collect::<Vec<_>>(), "the transfers' LSNs are not gapless");
}

#[test]
fn transfers_conserve_the_total_across_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let p = setup(&store);
    let start = store.last_lsn();
    let (transfers, audits) = run_bank(&store, p, 20_000, 1);
    eprintln!("{} transfers, {audits} audits", transfers.len());
    assert!(audits >= 20, "only {audits} audits");
    assert!(transfers.len() > 20_000, "only {} transfers moved money", transfers.len());
    check_lsns(&transfers, start, store.last_lsn());

    let before = balances(&store);
    assert_eq!(before.iter().sum::<u64>(), TOTAL);
    assert_eq!(before, replay(&transfers, Lsn::MAX), "balances differ from the transfers replayed in LSN order");
    let last = store.last_lsn();
    store.close().unwrap();

    let store = Store::open(dir.path(), opts()).unwrap();
    let report = store.recovery_report().clone();
    // A close's checkpoint draws LSNs of its own (one empty record per chunk copied).
    assert!(report.recovered_lsn >= last && report.recovered_lsn == report.max_lsn, "{report:?}");
    assert_eq!(report.gap_at, None);
    assert!(report.torn_tails.is_empty());
    let after = balances(&store);
    assert_eq!(after.iter().sum::<u64>(), TOTAL);
    assert_eq!(after, before, "balances changed across close and reopen");

    // The reopened store keeps going from where it was.
    let (more, _) = run_bank(&store, p, 500, 2);
    assert!(more.iter().all(|t| t.lsn > last), "new LSNs continue after the recovered ones");
    let b = balances(&store);
    assert_eq!(b.iter().sum::<u64>(), TOTAL);
    store.close().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(balances(&store), b);
    store.close().unwrap();
}

#[test]
fn transfers_survive_a_crash_as_an_lsn_prefix() {
    for seed in 10..13u64 {
        let dir = tempfile::tempdir().unwrap();
        // One of the runs writes its log with plain pwrite + fdatasync instead of io_uring.
        let io = if seed == 12 { tusk::Io::Sync } else { tusk::Io::Auto };
        let opts = Options { group_commit_interval: std::time::Duration::from_millis(3), io, ..opts() };
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        let p = setup(&store);
        let start = store.last_lsn();
        let (transfers, _) = run_bank(&store, p, 1_500, seed);
        check_lsns(&transfers, start, store.last_lsn());
        let last_sync = transfers.iter().filter(|t| t.mode == Commit::Sync).map(|t| t.lsn).max().unwrap();
        store.crash();

        let store = Store::open(dir.path(), opts.clone()).unwrap();
        let report = store.recovery_report().clone();
        eprintln!(
            "seed {seed}: last LSN {}, last Sync {last_sync}, recovered {}, gap {:?}, lost after gap {}",
            start + transfers.len() as u64,
            report.recovered_lsn,
            report.gap_at,
            report.lost_after_gap
        );
        assert!(report.recovered_lsn >= last_sync, "a Sync-acknowledged transfer was lost: {report:?}, last Sync LSN {last_sync}");
        let got = balances(&store);
        assert_eq!(got.iter().sum::<u64>(), TOTAL, "{report:?}");
        assert_eq!(got, replay(&transfers, report.recovered_lsn), "the recovered state is not the LSN prefix up to {}", report.recovered_lsn);
        store.close().unwrap();
        // A second recovery agrees with the first.
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        assert_eq!(balances(&store), got);
        store.close().unwrap();
    }
}

/// Split-phase commit: Async transfers, each later confirmed with `is_stable(lsn, true)`;
/// every confirmed transfer survives a crash.
#[test]
fn split_phase_commit_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let p = setup(&store);
    let mut rng = SmallRng::seed_from_u64(99);
    let mut transfers = Vec::new();
    let mut confirmed = 0;
    for i in 0..2_000u64 {
        let from = rng.random_range(0..ACCOUNTS);
        let to = (from + 1 + rng.random_range(0..ACCOUNTS - 1)) % ACCOUNTS;
        let (amount, lsn) = store
            .transact(Commit::Async, |tx| {
                let a = tx.read_u64_at(p, 8 * from)?;
                let b = tx.read_u64_at(p, 8 * to)?;
                let amount = a.min(7);
                tx.write_u64_at(p, 8 * from, a - amount)?;
                tx.write_u64_at(p, 8 * to, b + amount)?;
                Ok(amount)
            })
            .unwrap();
        let lsn = lsn.unwrap();
        transfers.push(Transfer { lsn, mode: Commit::Async, from, to, amount });
        if i % 100 == 99 {
            assert!(store.is_stable(lsn, true), "is_stable(wait) returns once durable");
            assert!(store.durable_lsn() >= lsn);
            assert!(store.is_stable(lsn - 50, false), "every lower LSN is stable too");
            confirmed = lsn;
        }
    }
    store.crash();
    let store = Store::open(dir.path(), opts()).unwrap();
    let rec = store.recovery_report().recovered_lsn;
    assert!(rec >= confirmed, "recovered {rec}, confirmed stable {confirmed}");
    assert_eq!(balances(&store), replay(&transfers, rec));
    store.close().unwrap();
}
