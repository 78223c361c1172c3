//! The demo's bank, shared by its transfer phase (`demo.rs`) and its snapshot phase
//! (`demo_snapshot.rs`): where the accounts live and the transfer worker both run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, HeapPtr, Store, Transaction};

pub const INITIAL_BALANCE: u64 = 1_000;
/// The root of the accounts (one u64 balance each) and of the per-thread transfer counts.
pub const ACCOUNTS_ROOT: &str = "demo.accounts";
pub const STATS_ROOT: &str = "demo.stats";

/// Allocates the accounts (zeroed) and `threads` transfer counts, under their roots.
pub fn alloc_bank(tx: &mut Transaction<'_>, accounts: u64, threads: usize) -> Result<(HeapPtr, HeapPtr), tusk::Error> {
    let bank = tx.alloc(accounts * 8)?;
    let stats = tx.alloc(8 * threads as u64)?;
    tx.set_root(ACCOUNTS_ROOT, bank)?;
    tx.set_root(STATS_ROOT, stats)?;
    Ok((bank, stats))
}

/// Moves `amount` from account `from` to `to` if `from` holds it, and counts the transfer in
/// slot `thread` of `stats`.
pub fn transfer_in(tx: &mut Transaction<'_>, bank: HeapPtr, stats: HeapPtr, thread: usize, (from, to, amount): (u64, u64, u64)) -> Result<(), tusk::Error> {
    let a = tx.read_u64_at(bank, from * 8)?;
    if a >= amount && from != to {
        tx.write_u64_at(bank, from * 8, a - amount)?;
        let b = tx.read_u64_at(bank, to * 8)?;
        tx.write_u64_at(bank, to * 8, b + amount)?;
    }
    let n = tx.read_u64_at(stats, thread as u64 * 8)?;
    tx.write_u64_at(stats, thread as u64 * 8, n + 1)
}

/// The bank: `accounts` balances at `ptr`, per-thread transfer counts at `stats`.
#[derive(Clone, Copy)]
pub struct Bank {
    pub ptr: HeapPtr,
    pub stats: HeapPtr,
    pub accounts: u64,
}

impl Bank {
    /// One worker: transfers (every 4096th with Sync commit), counting its own transfers in the
    /// heap in the same transaction (slot `thread` of `stats`); every 64th iteration a read-only
    /// audit of 256 accounts. Returns the transfers it committed once `stop` is set.
    pub fn work(
        &self,
        store: &Store,
        thread: usize,
        seed: u64,
        committed: &AtomicU64,
        audits: &AtomicU64,
        stop: &AtomicBool,
    ) -> Result<u64, tusk::Error> {
        let Bank { ptr: bank, stats, accounts } = *self;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut mine = 0u64;
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            if i.is_multiple_of(64) {
                let start = rng.random_range(0..accounts.saturating_sub(256).max(1));
                store.transact(Commit::Async, |tx| {
                    let mut sum = 0u64;
                    for a in start..(start + 256).min(accounts) {
                        sum += tx.read_u64_at(bank, a * 8)?;
                    }
                    Ok(sum)
                })?;
                audits.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let (from, to) = (rng.random_range(0..accounts), rng.random_range(0..accounts));
            let amount = rng.random_range(1..=50);
            // Offset from the audits' iterations (every 64th), which `continue` above: a Sync
            // commit on those would never happen.
            let mode = if (i + 2048).is_multiple_of(4096) { Commit::Sync } else { Commit::Async };
            store.transact(mode, |tx| transfer_in(tx, bank, stats, thread, (from, to, amount)))?;
            mine += 1;
            committed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(mine)
    }
}
