//! The B-link tree against `std::collections::BTreeMap`: random batches of operations, each
//! batch one transaction, `check()` after every batch. Operations include removals, batched
//! updates (`apply_batch`, with duplicate keys), removing everything (then the next batches
//! reinsert), and a bulk-loaded start. The same test runs over a tiny key domain, where
//! merges, redistributions and root shrinks happen all the time.
//!
//! A transaction's descents peek at the internal nodes (`btree/search.rs`): what they see may
//! be stale or torn, and only the leaf they land on must prove itself. So batches take turns:
//! one runs on the transaction itself, the next with every peek answered from an image of the
//! heap as it was a batch earlier (old roots, split nodes, nodes freed and reused since), the
//! third from such an image with one word in eight scrambled (offsets outside the heap, cycles,
//! nonsense levels), the fourth from one whose internal nodes' children are shuffled (real
//! nodes, of the wrong range or level). The answers and the tree must be the same in all.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use tusk_index::btree::posts::PendingPosts;
use tusk_index::heap::{HeapRead, HeapWrite};
use tusk_index::{BTree, BatchOutcome, Op as BatchOp};
use tusk_txn::{Engine, Transaction, TxnError};

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u64),
    /// A read-modify-write in one descent: the new value is the old one (0 when absent)
    /// times 3 plus the operand.
    Update(u64, u64),
    Remove(u64),
    Get(u64),
    /// Lookups of several keys (duplicates and absent ones included) with one `get_many`,
    /// more than one lookup group of them at times.
    GetMany(Vec<u64>),
    Range(u64, u64),
    Count(u64, u64),
    Sum(u64, u64),
    Batch(Vec<BatchOp>),
    /// Removes every key, one by one or (true) as one batch; later batches reinsert.
    RemoveAll(bool),
}

/// Keys from a small domain (many duplicates, dense ranges) or anywhere in u64 (edges included).
fn wide_key() -> BoxedStrategy<u64> {
    prop_oneof![4 => 0u64..2_000, 1 => any::<u64>(), 1 => Just(u64::MAX), 1 => Just(0)].boxed()
}

/// Keys from 0..64: a tree of a few leaves that keeps splitting and merging.
fn tiny_key() -> BoxedStrategy<u64> {
    (0u64..64).boxed()
}

fn batch_op(key: BoxedStrategy<u64>) -> impl Strategy<Value = BatchOp> {
    prop_oneof![
        3 => (key.clone(), any::<u64>()).prop_map(|(key, value)| BatchOp::Upsert { key, value }),
        2 => key.prop_map(|key| BatchOp::Remove { key }),
    ]
}

fn op(key: BoxedStrategy<u64>) -> impl Strategy<Value = Op> {
    let k = key.clone();
    prop_oneof![
        6 => (k.clone(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (k.clone(), any::<u64>()).prop_map(|(k, v)| Op::Update(k, v)),
        5 => k.clone().prop_map(Op::Remove),
        2 => k.clone().prop_map(Op::Get),
        1 => prop::collection::vec(k.clone(), 0..40).prop_map(Op::GetMany),
        1 => (k.clone(), k.clone()).prop_map(|(a, b)| Op::Range(a.min(b), a.max(b))),
        1 => (k.clone(), k.clone()).prop_map(|(a, b)| Op::Count(a.min(b), a.max(b))),
        1 => (k.clone(), k).prop_map(|(a, b)| Op::Sum(a.min(b), a.max(b))),
        1 => prop::collection::vec(batch_op(key), 0..200).prop_map(Op::Batch),
        1 => any::<bool>().prop_map(Op::RemoveAll),
    ]
}

/// An optional bulk-loaded start: ascending keys (a set) and a fill fraction.
fn start(key: BoxedStrategy<u64>) -> impl Strategy<Value = Option<(Vec<u64>, f64)>> {
    prop::option::of((prop::collection::btree_set(key, 0..600), 0.0f64..1.2)
        .prop_map(|(keys, fill)| (keys.into_iter().collect(), fill)))
}

/// The model's answer to a batch: ops one by one in batch order.
fn model_batch(model: &mut BTreeMap<u64, u64>, ops: &[BatchOp]) -> BatchOutcome {
    let mut out = BatchOutcome::default();
    for op in ops {
        match *op {
            BatchOp::Upsert { key, value } => match model.insert(key, value) {
                Some(_) => out.updated += 1,
                None => out.inserted += 1,
            },
            BatchOp::Remove { key } => match model.remove(&key) {
                Some(_) => out.removed += 1,
                None => out.absent += 1,
            },
        }
    }
    out
}

/// A transaction whose peeks read an old image of the heap instead of the heap.
struct StalePeeks<'a, 't> {
    tx: &'a mut Transaction<'t>,
    old: &'a [u8],
}

impl HeapRead for StalePeeks<'_, '_> {
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        self.tx.load(off)
    }

    fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        self.tx.load_words(off, out)
    }

    fn contains(&self, off: u64, len: u64) -> bool {
        HeapRead::contains(&*self.tx, off, len)
    }

    fn tracks_reads(&self) -> bool {
        true
    }

    fn peek_words(&mut self, off: u64, out: &mut [u64]) -> Result<bool, TxnError> {
        let Some(bytes) = off.checked_add(8 * out.len() as u64).and_then(|end| self.old.get(off as usize..end as usize)) else {
            return Ok(false);
        };
        for (w, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap());
        }
        Ok(true)
    }

    fn pending_posts(&self, meta: u64) -> Option<&PendingPosts> {
        HeapRead::pending_posts(&*self.tx, meta)
    }
}

impl HeapWrite for StalePeeks<'_, '_> {
    fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError> {
        self.tx.store(off, value)
    }

    fn alloc(&mut self, len: u64) -> Result<u64, TxnError> {
        HeapWrite::alloc(self.tx, len)
    }

    fn defer_post(&mut self, meta: u64, level: u32, separator: u64, node: u64) -> bool {
        HeapWrite::defer_post(self.tx, meta, level, separator, node)
    }

    fn finish_posts(&mut self, meta: u64) -> Result<(), TxnError> {
        HeapWrite::finish_posts(self.tx, meta)
    }
}

/// The heap's bytes up to its break.
fn image(engine: &Engine) -> Vec<u8> {
    let brk = engine.heap().load_word(tusk_storage::layout::BRK_OFF);
    let mut bytes = vec![0u8; brk as usize];
    engine.heap().copy_out(0, &mut bytes);
    bytes
}

/// Every eighth word of `image` replaced by a pseudo-random one.
fn scrambled(mut image: Vec<u8>, seed: u64) -> Vec<u8> {
    let mut rng = common::Rng(seed);
    for w in image.chunks_exact_mut(64) {
        let at = 8 * rng.below(8) as usize;
        let word = match rng.below(4) {
            0 => rng.next(),
            1 => rng.below(1 << 22) & !63,
            2 => rng.below(64),
            _ => u64::MAX - rng.below(4),
        };
        w[at..at + 8].copy_from_slice(&word.to_le_bytes());
    }
    image
}

/// `image` with the children of its tree's internal nodes (the tree at `meta`) shuffled
/// among all of them: every peeked child is a real node, mostly of another range.
fn misdirected(mut image: Vec<u8>, meta: u64, seed: u64) -> Vec<u8> {
    use tusk_index::btree::layout;
    let mut rng = common::Rng(seed);
    let mut heap = tusk_index::image::HeapImage::new(&image);
    let mut first = heap.load(meta + 8).unwrap();
    let mut slots = Vec::new();
    loop {
        let h = layout::read_header(&mut heap, first).unwrap();
        if h.is_leaf() {
            break;
        }
        let mut node = first;
        while node != 0 {
            let h = layout::read_header(&mut heap, node).unwrap();
            slots.extend((0..h.count).map(|i| layout::value_off(node, i)));
            node = h.right;
        }
        first = layout::value(&mut heap, first, 0).unwrap();
    }
    let mut children: Vec<u64> = slots.iter().map(|&s| heap.load(s).unwrap()).collect();
    rng.shuffle(&mut children);
    for (s, c) in slots.into_iter().zip(children) {
        image[s as usize..s as usize + 8].copy_from_slice(&c.to_le_bytes());
    }
    image
}

fn apply<H: HeapWrite>(tree: BTree, tx: &mut H, model: &mut BTreeMap<u64, u64>, op: &Op) {
    match op {
        &Op::Insert(k, v) => assert_eq!(tree.insert(tx, k, v).unwrap(), model.insert(k, v)),
        &Op::Update(k, v) => {
            let new = |old: Option<u64>| old.unwrap_or(0).wrapping_mul(3).wrapping_add(v);
            let old = model.get(&k).copied();
            model.insert(k, new(old));
            assert_eq!(tree.update(tx, k, new).unwrap(), old);
        }
        &Op::Remove(k) => assert_eq!(tree.remove(tx, k).unwrap(), model.remove(&k)),
        &Op::Get(k) => assert_eq!(tree.get(tx, k).unwrap(), model.get(&k).copied()),
        Op::GetMany(keys) => {
            let expected: Vec<Option<u64>> = keys.iter().map(|k| model.get(k).copied()).collect();
            assert_eq!(tree.get_many(tx, keys).unwrap(), expected);
        }
        &Op::Range(lo, hi) => {
            let got: Vec<_> = tree.range(tx, lo..hi).unwrap().map(Result::unwrap).collect();
            let want: Vec<_> = model.range(lo..hi).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(got, want);
            let got: Vec<_> = tree.range(tx, lo..=hi).unwrap().map(Result::unwrap).collect();
            let want: Vec<_> = model.range(lo..=hi).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(got, want);
        }
        &Op::Count(lo, hi) => {
            assert_eq!(tree.count(tx, lo..hi).unwrap(), model.range(lo..hi).count() as u64);
            assert_eq!(tree.count(tx, lo..).unwrap(), model.range(lo..).count() as u64);
        }
        &Op::Sum(lo, hi) => {
            let want: u128 = model.range(lo..=hi).map(|(_, &v)| v as u128).sum();
            assert_eq!(tree.sum(tx, lo..=hi).unwrap(), want);
        }
        Op::Batch(ops) => {
            let want = model_batch(model, ops);
            assert_eq!(tree.apply_batch(tx, ops).unwrap(), want);
        }
        &Op::RemoveAll(batched) => {
            let keys: Vec<u64> = model.keys().copied().collect();
            if batched {
                let ops: Vec<BatchOp> = keys.iter().rev().map(|&key| BatchOp::Remove { key }).collect();
                let out = tree.apply_batch(tx, &ops).unwrap();
                assert_eq!(out.removed, keys.len() as u64);
                model.clear();
            } else {
                for k in keys {
                    assert_eq!(tree.remove(tx, k).unwrap(), model.remove(&k));
                }
            }
            let stats = tree.check(tx).unwrap();
            assert_eq!((stats.levels, stats.nodes, stats.keys), (1, 1, 0));
        }
    }
}

fn run(start: Option<(Vec<u64>, f64)>, batches: Vec<Vec<Op>>) -> Result<(), TestCaseError> {
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
    let mut model = BTreeMap::new();
    if let Some((keys, fill)) = start {
        common::transact(&engine, |tx| {
            let n = tree.bulk_load(tx, keys.iter().map(|&k| (k, !k)), fill).unwrap();
            assert_eq!(n, keys.len() as u64);
        });
        model.extend(keys.iter().map(|&k| (k, !k)));
    }
    let mut before = image(&engine);
    for (b, batch) in batches.iter().enumerate() {
        let now = image(&engine);
        let old = match b % 4 {
            0 => None,
            1 => Some(std::mem::replace(&mut before, now)),
            2 => Some(scrambled(std::mem::replace(&mut before, now), b as u64)),
            _ => Some(misdirected(std::mem::replace(&mut before, now), tree.ptr().offset(), b as u64)),
        };
        // Separators of internal splits wait for the commit (`btree/posts.rs`): the tree is
        // checked before it too, with the transaction's pending nodes on their levels.
        common::transact(&engine, |tx| match &old {
            None => {
                batch.iter().for_each(|op| apply(tree, tx, &mut model, op));
                assert_eq!(tree.check(tx).unwrap().keys, model.len() as u64);
            }
            Some(old) => {
                let mut stale = StalePeeks { tx, old };
                batch.iter().for_each(|op| apply(tree, &mut stale, &mut model, op));
                assert_eq!(tree.check(&mut stale).unwrap().keys, model.len() as u64);
            }
        });
        // A fresh transaction sees the committed tree: reopen by name, then validate.
        common::transact(&engine, |tx| {
            let reopened = BTree::named(tx, "t").unwrap();
            prop_assert_eq!(reopened, tree);
            let stats = tree.check(tx).unwrap();
            prop_assert_eq!(stats.keys, model.len() as u64);
            prop_assert_eq!(tree.len(tx).unwrap(), model.len() as u64);
            let all: Vec<_> = tree.range(tx, ..).unwrap().map(Result::unwrap).collect();
            let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
            prop_assert_eq!(all, want);
            Ok(())
        })?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_btreemap(
        start in start(wide_key()),
        batches in prop::collection::vec(prop::collection::vec(op(wide_key()), 1..300), 1..8),
    ) {
        run(start, batches)?;
    }

    #[test]
    fn matches_btreemap_tiny_domain(
        start in start(tiny_key()),
        batches in prop::collection::vec(prop::collection::vec(op(tiny_key()), 1..300), 1..8),
    ) {
        run(start, batches)?;
    }
}

/// A split whose peeked path names, one level up, a node to the right of the real parent (a
/// stale child pointer of the root, whose own stale child still leads to the right leaf): the
/// separator must go to the real parent, found by a tracked descent, not into that node.
#[test]
fn a_separator_skips_a_peeked_parent_right_of_it() {
    use tusk_index::btree::layout;
    let engine = common::engine(64 << 20);
    let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
    // Full nodes, three levels: the root, two or more nodes on level 1, leaves.
    let n = (layout::CAPACITY * layout::CAPACITY * 2) as u64;
    common::transact(&engine, |tx| tree.bulk_load(tx, (0..n).map(|k| (2 * k, k)), 1.0).unwrap());
    let mut old = image(&engine);
    let meta = tree.ptr().offset();
    let (root, p_right, leaf) = {
        let mut heap = tusk_index::image::HeapImage::new(&old);
        let root = heap.load(meta + 8).unwrap();
        assert_eq!(layout::read_header(&mut heap, root).unwrap().level, 2);
        let p = layout::value(&mut heap, root, 0).unwrap();
        let p_right = layout::value(&mut heap, root, 1).unwrap();
        (root, p_right, layout::value(&mut heap, p, 0).unwrap())
    };
    // The peeks: the root sends key 1 to the second level-1 node, which sends it to its leaf.
    for (slot, to) in [(layout::value_off(root, 0), p_right), (layout::value_off(p_right, 0), leaf)] {
        old[slot as usize..slot as usize + 8].copy_from_slice(&to.to_le_bytes());
    }
    common::transact(&engine, |tx| {
        let mut stale = StalePeeks { tx, old: &old };
        // The leaf is full: the insert splits it, and its separator goes one level up.
        assert_eq!(tree.insert(&mut stale, 1, 7).unwrap(), None);
    });
    common::transact(&engine, |tx| {
        let stats = tree.check(tx).unwrap();
        assert_eq!(stats.keys, n + 1);
        assert_eq!(tree.get(tx, 1).unwrap(), Some(7));
    });
}
