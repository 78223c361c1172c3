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
//!
//! The index workload keeps its data in a B-link tree and an ART under their own roots, over
//! a fixed domain of [`INDEX_KEYS`] keys each. The model sees them as virtual data words, one
//! per key (the value, 0 for absent), so the checks of `verify.rs` apply to the trees word for
//! word: [`read_all`] fills those words by walking both trees (after their `check()`).

use rand::rngs::SmallRng;
use rand::Rng;

use super::Workload;
use tusk::{Error, HeapPtr, Transaction};

/// The root naming the workload's words.
pub const ROOT: &str = "crashtest";
/// Ring of presence marks; a child stops committing before it wraps.
pub const MARKS: u64 = 1 << 17;
/// Word index of the first data word.
pub const DATA: u64 = 1 + MARKS;
/// Bank accounts and their opening balance.
pub const ACCOUNTS: u64 = 64;
/// Opening balance of every bank account.
pub const INITIAL: u64 = 1_000;
/// The bank's opening total, which transfers conserve (unless Partition records applied
/// beyond an LSN gap skew it).
pub const TOTAL: u64 = ACCOUNTS * INITIAL;
/// Words of the hathi array, and how many each transaction reads and rewrites.
pub const HATHI_WORDS: u64 = 1 << 16;
/// Words of the hathi array each transaction reads and rewrites, unless the run says otherwise
/// (`--txn-words`: thousands make transactions large enough to run in place).
pub const HATHI_TOUCH: usize = 6;
/// Keys per tree of the index workload, and the index operations per transaction.
pub const INDEX_KEYS: u64 = 2048;
/// Index operations (an upsert or a remove each) per transaction of the index workload.
pub const INDEX_OPS: usize = 4;
/// Roots of the index workload's trees.
pub const BTREE_ROOT: &str = "crashtest-btree";
/// Root of the index workload's ART.
pub const ART_ROOT: &str = "crashtest-art";

/// Data words of a workload.
pub fn data_words(w: Workload) -> u64 {
    match w {
        Workload::Bank => ACCOUNTS,
        Workload::Hathi => HATHI_WORDS,
        Workload::Index => 2 * INDEX_KEYS,
    }
}

/// All words of a workload's model.
pub fn total_words(w: Workload) -> u64 {
    DATA + data_words(w)
}

/// Words of the workload's allocation (the index workload's data words live in its trees).
pub fn alloc_words(w: Workload) -> u64 {
    match w {
        Workload::Index => DATA,
        Workload::Bank | Workload::Hathi => total_words(w),
    }
}

/// The ART key of domain key `k`: the empty key for 0, else 8 to 48 bytes with shared
/// prefixes, so every leaf size class and long common prefixes are exercised.
pub fn art_key(k: u64) -> Vec<u8> {
    if k == 0 {
        return Vec::new();
    }
    let mut key = format!("k{:02x}/{:03x}", k % 64, k).into_bytes();
    key.resize(key.len() + (k % 41) as usize, b'x');
    key
}

/// The domain key of an ART key, if it is one.
fn art_key_index(key: &[u8]) -> Option<u64> {
    if key.is_empty() {
        return Some(0);
    }
    let k = u64::from_str_radix(std::str::from_utf8(key.get(4..7)?).ok()?, 16).ok()?;
    (k < INDEX_KEYS && art_key(k) == key).then_some(k)
}

/// The mark word of transaction `seq`.
pub fn mark_index(seq: u64) -> u64 {
    1 + seq % MARKS
}

/// Creates the workload's words (bank: opening balances). Run once, by the parent.
pub fn setup(tx: &mut Transaction<'_>, w: Workload) -> Result<HeapPtr, Error> {
    let p = tx.alloc(8 * alloc_words(w))?;
    if w == Workload::Index {
        tx.btree(BTREE_ROOT)?;
        tx.art(ART_ROOT)?;
    }
    if w == Workload::Bank {
        for i in 0..ACCOUNTS {
            tx.write_u64_at(p, 8 * (DATA + i), INITIAL)?;
        }
    }
    tx.set_root(ROOT, p)?;
    Ok(p)
}

/// Every word of the model, read in one transaction (for the index workload: both trees
/// validated and walked).
pub fn read_all(tx: &mut Transaction<'_>, p: HeapPtr, w: Workload) -> Result<Vec<u64>, Error> {
    let mut bytes = vec![0u8; 8 * alloc_words(w) as usize];
    tx.read(p, &mut bytes)?;
    let mut words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    if w == Workload::Index {
        words.extend(index_words(tx)?);
    }
    Ok(words)
}

/// The virtual data words of the index workload: B-link tree keys, then ART keys.
fn index_words(tx: &mut Transaction<'_>) -> Result<Vec<u64>, Error> {
    let damaged = |what: String| Error::IndexDamaged { node: 0, what };
    let mut words = vec![0u64; 2 * INDEX_KEYS as usize];
    let mut tree = tx.btree(BTREE_ROOT)?;
    tree.check()?;
    for item in tree.range(..)? {
        let (k, v) = item?;
        if k >= INDEX_KEYS || v == 0 {
            return Err(damaged(format!("B-link tree holds ({k}, {v}), outside the workload's domain")));
        }
        words[k as usize] = v;
    }
    let mut art = tx.art(ART_ROOT)?;
    art.check()?;
    for item in art.range::<&[u8]>(..)? {
        let (key, v) = item?;
        match art_key_index(&key) {
            Some(k) if v != 0 => words[(INDEX_KEYS + k) as usize] = v,
            _ => return Err(damaged(format!("ART holds key {key:?} with value {v}, outside the workload's domain"))),
        }
    }
    Ok(words)
}

/// The data words one transaction writes: (word index, value).
pub type Writes = Vec<(u64, u64)>;

/// What one transaction will do, drawn before it runs (the same across retries).
pub enum Draw {
    /// Bank: a transfer from one account to another.
    Transfer {
        /// The account debited, from 0.
        from: u64,
        /// The account credited, never `from`.
        to: u64,
        /// The amount asked for, 1 to 300; what moves is at most the balance of `from`.
        want: u64,
    },
    /// Hathi: words of the array read and rewritten, each new value from the old one.
    Touch {
        /// Indexes into the array (from 0) of the words touched, in order; one may repeat.
        words: Vec<u64>,
        /// Odd value mixed into every new value.
        salt: u64,
    },
    /// Index: upserts and removes in the B-link tree and the ART.
    Index {
        /// (tree: 0 B-link, 1 ART; key; value, 0 to remove).
        ops: [(u64, u64, u64); INDEX_OPS],
    },
}

/// Draws what the next transaction of workload `w` does (hathi: touching `txn_words` words).
pub fn draw(w: Workload, txn_words: usize, rng: &mut SmallRng) -> Draw {
    match w {
        Workload::Bank => {
            let from = rng.random_range(0..ACCOUNTS);
            let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
            Draw::Transfer { from, to, want: rng.random_range(1..=300) }
        }
        Workload::Index => {
            let mut ops = [(0, 0, 0); INDEX_OPS];
            for op in &mut ops {
                let value = if rng.random_bool(0.3) { 0 } else { rng.random::<u64>() | 1 };
                *op = (rng.random_range(0..2), rng.random_range(0..INDEX_KEYS), value);
            }
            Draw::Index { ops }
        }
        Workload::Hathi => {
            let words = (0..txn_words).map(|_| rng.random_range(0..HATHI_WORDS)).collect();
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
        Draw::Touch { ref words, salt } => {
            // Each word's latest value in this transaction, where a word repeats.
            let mut latest: std::collections::HashMap<u64, u64> = std::collections::HashMap::with_capacity(words.len());
            for (k, &word) in words.iter().enumerate() {
                let i = DATA + word;
                // The new value depends on the old one: replaying in another order than the
                // commit order gives other values.
                let old = match latest.get(&i) {
                    Some(&v) => v,
                    None => tx.read_u64_at(p, 8 * i)?,
                };
                let new = old.rotate_left(7) ^ salt.wrapping_mul(k as u64 + 1);
                latest.insert(i, new);
                writes.push((i, new));
            }
        }
        Draw::Index { ops } => {
            for (tree, key, value) in ops {
                match (tree, value) {
                    (0, 0) => drop(tx.btree(BTREE_ROOT)?.remove(key)?),
                    (0, v) => drop(tx.btree(BTREE_ROOT)?.insert(key, v)?),
                    (_, 0) => drop(tx.art(ART_ROOT)?.remove(&art_key(key))?),
                    (_, v) => drop(tx.art(ART_ROOT)?.insert(&art_key(key), v)?),
                }
                writes.push((DATA + tree * INDEX_KEYS + key, value));
            }
            // Virtual words: the trees hold them.
            return Ok((seq, writes));
        }
    }
    for &(i, v) in &writes {
        tx.write_u64_at(p, 8 * i, v)?;
    }
    Ok((seq, writes))
}

/// Applies a transaction to a model of the words, as its redo record would (for the index
/// workload: as its tree operations would).
pub fn apply(words: &mut [u64], seq: u64, writes: &[(u64, u64)]) {
    words[0] = seq;
    words[mark_index(seq) as usize] = seq;
    for &(i, v) in writes {
        words[i as usize] = v;
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// `--txn-words 8000` makes hathi transactions large enough to run in place, so the crash
    /// runs that use it test the in-place commit's durability.
    #[test]
    fn eight_thousand_hathi_words_run_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let store = tusk::Store::open(dir.path(), tusk::Options { heap_capacity: 64 << 20, ..tusk::Options::default() }).unwrap();
        let (p, _) = store.transact(tusk::Commit::Sync, |tx| setup(tx, Workload::Hathi)).unwrap();
        let mut rng = SmallRng::seed_from_u64(3);
        for (words, in_place) in [(HATHI_TOUCH, false), (8000, true)] {
            let draw = draw(Workload::Hathi, words, &mut rng);
            let mut tx = store.begin();
            let (_, writes) = attempt(&mut tx, p, &draw).unwrap();
            assert_eq!(writes.len(), words);
            assert_eq!(tx.is_in_place(), in_place, "{words} words");
            tx.commit(tusk::Commit::Async).unwrap();
        }
        store.close().unwrap();
    }

    #[test]
    fn art_keys_are_distinct_and_parse_back() {
        let keys: std::collections::BTreeSet<Vec<u8>> = (0..INDEX_KEYS).map(art_key).collect();
        assert_eq!(keys.len() as u64, INDEX_KEYS);
        for k in 0..INDEX_KEYS {
            assert_eq!(art_key_index(&art_key(k)), Some(k));
        }
        assert!(keys.iter().any(|k| k.len() > 32), "some keys need overflow leaves");
        assert_eq!(art_key_index(b"k00/fff"), None);
        assert_eq!(art_key_index(b"zz"), None);
    }
}
