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
