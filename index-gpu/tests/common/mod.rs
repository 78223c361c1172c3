//! A store without a log, for index tests: transactions, no durability.

use tusk_storage::Heap;
use tusk_txn::{Commit, Engine, EngineConfig, Transaction};

pub fn engine(capacity: u64) -> Engine {
    engine_with_stripes(capacity, 12)
}

/// An engine with `2^stripes_log2` stripe locks.
#[allow(dead_code)]
pub fn engine_with_stripes(capacity: u64, stripes_log2: u32) -> Engine {
    let config = EngineConfig { stripes_log2, log: None, existing_segments: Vec::new() };
    let engine = Engine::start(config, Heap::new(capacity).unwrap(), 0).unwrap();
    {
        let mut tx = engine.begin();
        tx.format_heap().unwrap();
        tx.commit(Commit::Async).unwrap();
    }
    engine
}

/// Runs `f` in one transaction and commits it (single-threaded tests see no conflicts).
pub fn transact<T>(engine: &Engine, f: impl FnOnce(&mut Transaction<'_>) -> T) -> T {
    let mut tx = engine.begin();
    let out = f(&mut tx);
    tx.commit(Commit::Async).unwrap();
    out
}

/// splitmix64: deterministic pseudo-random words without a random-number crate.
#[allow(dead_code)]
pub struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    /// Seeded from `TUSK_SEED`, or from the clock (printed, so that a failure can be replayed).
    pub fn new(test: &str) -> Rng {
        let seed = std::env::var("TUSK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64)
        });
        eprintln!("{test}: seed {seed} (TUSK_SEED={seed} replays it)");
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A word below `n` (0 for n = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }

    /// Roughly normal around `mean` (sum of four uniforms), for dense clustered keys.
    pub fn gaussian(&mut self, mean: u64, spread: u64) -> u64 {
        let s: u64 = (0..4).map(|_| self.below(spread)).sum();
        mean.wrapping_add(s).wrapping_sub(2 * spread)
    }
}
