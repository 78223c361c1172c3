//! ART read paths: they run unchanged over a plain image of the heap (as a snapshot reader or
//! the GPU fallback will), and range reads touch only the part of the tree in range.

mod common;

use tusk_index::heap::HeapRead;
use tusk_index::Art;
use tusk_txn::{Transaction, TxnError};

/// A heap image: a copy of the words, no STM.
struct Image(Vec<u64>);

impl HeapRead for Image {
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        self.0.get((off / 8) as usize).copied().ok_or(TxnError::InvalidPointer(off))
    }
}

/// Counts the words a read path loads.
struct Counting<'a, 'e> {
    tx: &'a mut Transaction<'e>,
    loads: u64,
}

impl HeapRead for Counting<'_, '_> {
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        self.loads += 1;
        self.tx.load(off)
    }
}

fn keys(n: u64) -> Vec<[u8; 8]> {
    (0..n).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17).to_be_bytes()).collect()
}

#[test]
fn read_paths_run_on_a_heap_image() {
    let engine = common::engine(16 << 20);
    let ks = keys(20_000);
    let tree = common::transact(&engine, |tx| {
        let tree = Art::named(tx, "a").unwrap();
        for (i, k) in ks.iter().enumerate() {
            tree.insert(tx, k, i as u64).unwrap();
        }
        for n in 0..50usize {
            tree.insert(tx, &vec![b'z'; n * 3], n as u64).unwrap();
        }
        tree
    });
    let (want_stats, want_all) = common::transact(&engine, |tx| {
        (tree.check(tx).unwrap(), tree.range::<_, &[u8]>(tx, ..).unwrap().map(Result::unwrap).collect::<Vec<_>>())
    });
    let mut bytes = vec![0u8; engine.heap().capacity() as usize];
    engine.copy_consistent(0, &mut bytes).unwrap();
    let mut image = Image(bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap())).collect());
    let tree = Art::open(&mut image, tree.ptr()).unwrap();
    assert_eq!(tree.check(&mut image).unwrap(), want_stats);
    assert_eq!(tree.len(&mut image).unwrap(), 20_050);
    for (i, k) in ks.iter().enumerate().step_by(7) {
        assert_eq!(tree.get(&mut image, k).unwrap(), Some(i as u64));
    }
    let all: Vec<_> = tree.range::<_, &[u8]>(&mut image, ..).unwrap().map(Result::unwrap).collect();
    assert_eq!(all, want_all);
    assert_eq!(tree.count_prefix(&mut image, b"zzz").unwrap(), 49);
    assert_eq!(tree.sum_prefix(&mut image, b"zzzzzz").unwrap(), (2..50).sum::<u128>());
}

#[test]
fn range_reads_skip_subtrees_outside_the_range() {
    let engine = common::engine(64 << 20);
    let mut ks = keys(100_000);
    let tree = common::transact(&engine, |tx| {
        let tree = Art::create(tx).unwrap();
        for (i, k) in ks.iter().enumerate() {
            tree.insert(tx, k, i as u64).unwrap();
        }
        tree
    });
    ks.sort();
    common::transact(&engine, |tx| {
        let mut heap = Counting { tx, loads: 0 };
        let (lo, hi) = (ks[50_000], ks[50_010]);
        let got: Vec<_> = tree.range(&mut heap, lo..hi).unwrap().map(|r| r.unwrap().0).collect();
        assert_eq!(got.len(), 10);
        assert!(heap.loads < 1_000, "a 10-key range loaded {} words", heap.loads);
        heap.loads = 0;
        assert_eq!(tree.count(&mut heap, lo..hi).unwrap(), 10);
        assert!(heap.loads < 1_000, "a 10-key count loaded {} words", heap.loads);
        heap.loads = 0;
        let p = [ks[70_000][0], ks[70_000][1]];
        let n = ks.iter().filter(|k| k[..2] == p).count() as u64;
        assert_eq!(tree.count_prefix(&mut heap, &p).unwrap(), n);
        assert!(heap.loads < 200, "a prefix count of {n} keys loaded {} words", heap.loads);
        heap.loads = 0;
        assert!(tree.get(&mut heap, &ks[123]).unwrap().is_some());
        // An N4 step reads its whole line (8 words: header to children) in one validated
        // read, three words more than header, keys and child read one by one.
        assert!(heap.loads <= 28, "a lookup loaded {} words", heap.loads);
    });
}
