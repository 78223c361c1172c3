//! What the probes in `examples/` share: keys, and a tree built on an engine without a log.

use tusk_index::{Art, BTree};
use tusk_storage::{Heap, HeapPtr};
use tusk_txn::{Commit, Engine, EngineConfig};

/// A bijection of u64 (splitmix64's finalizer): distinct keys from a counter.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// An engine with no log over a formatted heap of `capacity` bytes, `2^stripes_log2` stripes,
/// and an empty tree (the ART if `art`, else a B-link tree) on it.
pub fn engine_with_tree(capacity: u64, stripes_log2: u32, art: bool) -> (Engine, HeapPtr) {
    let config = EngineConfig { stripes_log2, log: None, existing_segments: Vec::new() };
    let engine = Engine::start(config, Heap::new(capacity.next_multiple_of(1 << 21)).unwrap(), 0).unwrap();
    let meta = {
        let mut tx = engine.begin();
        tx.format_heap().unwrap();
        let meta = if art { Art::create(&mut tx).unwrap().ptr() } else { BTree::create(&mut tx).unwrap().ptr() };
        tx.commit(Commit::Async).unwrap();
        meta
    };
    (engine, meta)
}

/// Inserts `keys` (each its own value) into the tree at `meta`, `per_txn` keys per Async
/// transaction.
pub fn insert_in_txns(engine: &Engine, meta: HeapPtr, art: bool, keys: &[u64], per_txn: usize) {
    for chunk in keys.chunks(per_txn) {
        let mut tx = engine.begin();
        if art {
            let a = Art::open(&mut tx, meta).unwrap();
            for &k in chunk {
                a.insert(&mut tx, &k.to_be_bytes(), k).unwrap();
            }
        } else {
            let b = BTree::open(&mut tx, meta).unwrap();
            for &k in chunk {
                b.insert(&mut tx, k, k).unwrap();
            }
        }
        tx.commit(Commit::Async).unwrap();
    }
}
