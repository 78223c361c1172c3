//! The heap the workloads share, and their transactions.
//!
//! One allocation under the root [`ROOT`], as little-endian u64 words:
//! - word 0, the sequence word: every transaction increments it. All transactions conflict
//!   on it, so their LSN order is its order (a transaction that read another's writes has a
//!   larger LSN). The LSNs themselves are not seq plus a constant: checkpoint chunk copies
//!   take LSNs too.
//! - words 1..=[`MARKS`], the marks: transaction `seq` writes `seq` into mark `seq % MARKS`.
//!   After recovery a mark tells whether that transaction is in the recovered state.
//! - the data words: bank accounts, or the hathi array.

use rand::rngs::SmallRng;
use rand::Rng;

use super::Workload;
use crate::{Error, HeapPtr, Transaction};

/// The root naming the workload's words.
pub const ROOT: &str = "crashtest";
/// Ring of presence marks; a child stops committing before it wraps.
pub const MARKS: u64 = 1 << 17;
/// Word index of the first data word.
pub const DATA: u64 = 1 + MARKS;
/// Bank accounts and their opening balance.
pub const ACCOUNTS: u64 = 64;
pub const INITIAL: u64 = 1_000;
pub const TOTAL: u64 = ACCOUNTS * INITIAL;
/// Words of the hathi array, and how many each transaction reads and rewrites.
pub const HATHI_WORDS: u64 = 1 << 16;
pub const HATHI_TOUCH: usize = 6;

/// Data words of a workload.
pub fn data_words(w: Workload) -> u64 {
    match w {
        Workload::Bank => ACCOUNTS,
        Workload::Hathi | Workload::Index => HATHI_WORDS,
    }
}

/// All words of a workload's allocation.
pub fn total_words(w: Workload) -> u64 {
    DATA + data_words(w)
}

/// The mark word of transaction `seq`.
pub fn mark_index(seq: u64) -> u64 {
    1 + seq % MARKS
}

/// Creates the workload's words (bank: opening balances). Run once, by the parent.
pub fn setup(tx: &mut Transaction<'_>, w: Workload) -> Result<HeapPtr, Error> {
    let p = tx.alloc(8 * total_words(w))?;
    if w == Workload::Bank {
        for i in 0..ACCOUNTS {
            tx.write_u64_at(p, 8 * (DATA + i), INITIAL)?;
        }
    }
    tx.set_root(ROOT, p)?;
    Ok(p)
}

/// Every word of the allocation, read in one transaction.
pub fn read_all(tx: &mut Transaction<'_>, p: HeapPtr, w: Workload) -> Result<Vec<u64>, Error> {
    let mut bytes = vec![0u8; 8 * total_words(w) as usize];
    tx.read(p, &mut bytes)?;
    Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// The data words one transaction writes: (word index, value).
pub type Writes = Vec<(u64, u64)>;

/// What one transaction will do, drawn before it runs (the same across retries).
pub enum Draw {
    Transfer { from: u64, to: u64, want: u64 },
    Touch { words: [u64; HATHI_TOUCH], salt: u64 },
}

pub fn draw(w: Workload, rng: &mut SmallRng) -> Draw {
    match w {
        Workload::Bank => {
            let from = rng.random_range(0..ACCOUNTS);
            let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
            Draw::Transfer { from, to, want: rng.random_range(1..=300) }
        }
        Workload::Hathi | Workload::Index => {
            let mut words = [0; HATHI_TOUCH];
            for word in &mut words {
                *word = rng.random_range(0..HATHI_WORDS);
            }
            Draw::Touch { words, salt: rng.random::<u64>() | 1 }
        }
    }
}

/// Runs one attempt of a drawn transaction: bumps the sequence word, writes the mark and
/// the data words. Returns the sequence number and the data writes (absolute word indexes).
pub fn attempt(tx: &mut Transaction<'_>, p: HeapPtr, d: &Draw) -> Result<(u64, Writes), Error> {
    let seq = tx.read_u64_at(p, 0)? + 1;
    tx.write_u64_at(p, 0, seq)?;
    tx.write_u64_at(p, 8 * mark_index(seq), seq)?;
    let mut writes = Writes::new();
    match *d {
        Draw::Transfer { from, to, want } => {
            let (fi, ti) = (DATA + from, DATA + to);
            let a = tx.read_u64_at(p, 8 * fi)?;
            let b = tx.read_u64_at(p, 8 * ti)?;
            let amount = want.min(a);
            writes.push((fi, a - amount));
            writes.push((ti, b + amount));
        }
        Draw::Touch { words, salt } => {
            for (k, &word) in words.iter().enumerate() {
                let i = DATA + word;
                // The new value depends on the old one: replaying in another order than the
                // commit order gives other values.
                let old = match writes.iter().rev().find(|&&(j, _)| j == i) {
                    Some(&(_, v)) => v,
                    None => tx.read_u64_at(p, 8 * i)?,
                };
                let new = old.rotate_left(7) ^ salt.wrapping_mul(k as u64 + 1);
                writes.push((i, new));
            }
        }
    }
    for &(i, v) in &writes {
        tx.write_u64_at(p, 8 * i, v)?;
    }
    Ok((seq, writes))
}

/// Applies a transaction to a model of the words, as its redo record would.
pub fn apply(words: &mut [u64], seq: u64, writes: &[(u64, u64)]) {
    words[0] = seq;
    words[mark_index(seq) as usize] = seq;
    for &(i, v) in writes {
        words[i as usize] = v;
    }
}
