//! Model test: random transactions from two threads over one 512-byte region, checked
//! against a plain `Vec<u8>` model and a conflict graph.
//!
//! Every byte written gets a value that no other write of that byte position ever uses (a
//! per-position counter shared by the threads, 1..=255; 0 is the initial zero), so each byte
//! a transaction reads names the transaction that wrote it. From the recorded reads and
//! writes of every committed transaction (and the reads of every aborted attempt) the test
//! checks:
//! (a) replaying the committed writes in LSN order gives exactly the final region;
//! (b) the conflict graph (reads-from, write-write in LSN order, anti-dependencies) is
//!     acyclic: serializability, and with the aborted attempts' reads included, opacity;
//! (c) every reads-from edge between update transactions goes from a smaller LSN to a
//!     larger one, no read ever sees an aborted or intermediate value, and the LSNs of the
//!     committed update transactions are unique and gapless;
//! and that a close + reopen (or a crash + reopen) recovers the state the model predicts.
//! Thread-private allocations (alloc, fill, free) run in the same transactions; they must
//! come back zeroed, stay disjoint, and keep their contents.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Barrier, Mutex};

use proptest::prelude::*;
use tusk::{Commit, Error, HeapPtr, Lsn, Options, Store, Transaction};

const REGION: u16 = 512;

#[derive(Clone, Debug)]
enum Op {
    /// A u64 read at a byte offset (8-aligned or not).
    ReadWord(u16),
    WriteWord(u16),
    ReadBytes(u16, u8),
    WriteBytes(u16, u8),
    /// Allocate this many bytes (thread-private), check zeroed, tag it.
    Alloc(u16),
    /// Free one of the thread's blocks (index modulo their number).
    Free(u8),
    /// Spin a little inside the transaction, widening the window for conflicts.
    Pause(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `Store::transact` (retries inside).
    Transact,
    /// `Store::begin` + `commit`, retrying by hand on conflicts.
    Begin,
    /// `Store::begin`, the operations, then `abort`.
    Abort,
}

#[derive(Clone, Debug)]
struct TxnPlan {
    ops: Vec<Op>,
    mode: Commit,
    kind: Kind,
}

fn op() -> impl Strategy<Value = Op> {
    let word_off = prop_oneof![3 => (0..64u16).prop_map(|i| i * 8), 1 => 0..=(REGION - 8)];
    let word_off2 = prop_oneof![3 => (0..64u16).prop_map(|i| i * 8), 1 => 0..=(REGION - 8)];
    prop_oneof![
        4 => word_off.prop_map(Op::ReadWord),
        4 => word_off2.prop_map(Op::WriteWord),
        2 => (0..REGION, 1..=24u8).prop_map(|(s, l)| Op::ReadBytes(s, l)),
        2 => (0..REGION, 1..=24u8).prop_map(|(s, l)| Op::WriteBytes(s, l)),
        1 => (1..6000u16).prop_map(Op::Alloc),
        1 => any::<u8>().prop_map(Op::Free),
        2 => any::<u8>().prop_map(Op::Pause),
    ]
}

fn txn_plan() -> impl Strategy<Value = TxnPlan> {
    txn_plan_with(1, 2)
}

/// Commit modes weighted `sync : 5 (async) : partition`.
fn txn_plan_with(sync: u32, partition: u32) -> impl Strategy<Value = TxnPlan> {
    let mode = prop_oneof![sync => Just(Commit::Sync), 5 => Just(Commit::Async), partition => Just(Commit::Partition)];
    let kind = prop_oneof![6 => Just(Kind::Transact), 2 => Just(Kind::Begin), 1 => Just(Kind::Abort)];
    (prop::collection::vec(op(), 1..8), mode, kind).prop_map(|(mut ops, mode, kind)| {
        if mode == Commit::Partition {
            // Partition commits are for data no other thread's lost commits can touch; the
            // allocator's metadata is shared, so they do no allocation.
            ops.retain(|o| !matches!(o, Op::Alloc(_) | Op::Free(_)));
            if ops.is_empty() {
                ops.push(Op::WriteWord(0));
            }
        }
        TxnPlan { ops, mode, kind }
    })
}

fn plans() -> impl Strategy<Value = Vec<Vec<TxnPlan>>> {
    prop::collection::vec(prop::collection::vec(txn_plan(), 20..80), 2)
}

/// Fresh values per byte position.
struct Values(Vec<AtomicU32>);

impl Values {
    fn new() -> Values {
        Values((0..REGION).map(|_| AtomicU32::new(0)).collect())
    }

    /// The most values any position used.
    fn max_used(&self) -> u32 {
        self.0.iter().map(|c| c.load(Ordering::SeqCst)).max().unwrap_or(0)
    }

    /// One new value per position of `start..start+len`, or `None` if a position ran out.
    fn take(&self, start: u16, len: u16) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(len as usize);
        for pos in start..start + len {
            let c = &self.0[pos as usize];
            let v = c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < 255).then_some(n + 1)).ok()? + 1;
            out.push(v as u8);
        }
        Some(out)
    }
}

#[derive(Clone, Copy, Debug)]
struct Read {
    pos: u16,
    value: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    p: HeapPtr,
    len: u64,
    tag: u64,
}

/// What one attempt of a transaction did.
#[derive(Clone, Debug, Default)]
struct Attempt {
    thread: usize,
    /// Reads of bytes this attempt had not written itself.
    reads: Vec<Read>,
    /// Own last value per written position.
    own: HashMap<u16, u8>,
    /// Every write in program order.
    writes: Vec<(u16, u8)>,
    /// The thread's blocks as this attempt leaves them.
    blocks: Vec<Block>,
}

/// A committed transaction.
#[derive(Clone, Debug)]
struct Committed {
    lsn: Option<Lsn>,
    mode: Commit,
    attempt: Attempt,
}

struct Ctx<'a> {
    region: HeapPtr,
    values: &'a Values,
    thread: usize,
    tags: &'a AtomicU32,
}

fn fail_unexpected(e: Error) -> Error {
    match e {
        Error::Conflict => Error::Conflict,
        other => panic!("unexpected error in a model transaction: {other:?}"),
    }
}

/// Runs `ops` in `tx`, recording into `att` (which starts from the thread's blocks).
fn run_ops(tx: &mut Transaction<'_>, ops: &[Op], ctx: &Ctx<'_>, att: &mut Attempt) -> Result<(), Error> {
    let p = ctx.region;
    let record_read = |att: &mut Attempt, start: u16, bytes: &[u8]| {
        for (i, &value) in bytes.iter().enumerate() {
            let pos = start + i as u16;
            match att.own.get(&pos) {
                // Read-your-writes, checked on the spot.
                Some(&mine) => assert_eq!(value, mine, "a transaction read byte {pos} back as {value}, it wrote {mine}"),
                None => att.reads.push(Read { pos, value }),
            }
        }
    };
    let record_write = |att: &mut Attempt, start: u16, bytes: &[u8]| {
        for (i, &value) in bytes.iter().enumerate() {
            let pos = start + i as u16;
            att.own.insert(pos, value);
            att.writes.push((pos, value));
        }
    };
    for op in ops {
        match *op {
            Op::ReadWord(off) => {
                let v = tx.read_u64_at(p, off as u64).map_err(fail_unexpected)?;
                record_read(att, off, &v.to_le_bytes());
            }
            Op::WriteWord(off) => {
                if let Some(vals) = ctx.values.take(off, 8) {
                    let v = u64::from_le_bytes(vals.clone().try_into().unwrap());
                    tx.write_u64_at(p, off as u64, v).map_err(fail_unexpected)?;
                    record_write(att, off, &vals);
                }
            }
            Op::ReadBytes(start, len) => {
                let len = (len as u16).min(REGION - start);
                let mut buf = vec![0u8; len as usize];
                tx.read_at(p, start as u64, &mut buf).map_err(fail_unexpected)?;
                record_read(att, start, &buf);
            }
            Op::WriteBytes(start, len) => {
                let len = (len as u16).min(REGION - start);
                if let Some(vals) = ctx.values.take(start, len) {
                    tx.write_at(p, start as u64, &vals).map_err(fail_unexpected)?;
                    record_write(att, start, &vals);
                }
            }
            Op::Alloc(len) => {
                let len = len as u64;
                let q = tx.alloc(len).map_err(fail_unexpected)?;
                assert_eq!(tx.len(q).map_err(fail_unexpected)?, len);
                let mut buf = vec![0xEEu8; len as usize];
                tx.read(q, &mut buf).map_err(fail_unexpected)?;
                assert!(buf.iter().all(|&b| b == 0), "alloc({len}) returned memory that is not zeroed");
                let tag = ((ctx.thread as u64) << 56) | ctx.tags.fetch_add(1, Ordering::SeqCst) as u64 | 1 << 40;
                write_tag(tx, q, len, tag).map_err(fail_unexpected)?;
                att.blocks.push(Block { p: q, len, tag });
            }
            Op::Free(k) => {
                if !att.blocks.is_empty() {
                    let b = att.blocks.remove(k as usize % att.blocks.len());
                    tx.free(b.p).map_err(fail_unexpected)?;
                }
            }
            Op::Pause(n) => {
                for _ in 0..(n as u32) * 32 {
                    std::hint::spin_loop();
                }
            }
        }
    }
    Ok(())
}

/// A block's contents: the tag's bytes at the start, its low byte again at the end.
fn tag_image(len: u64, tag: u64) -> Vec<u8> {
    let mut img = vec![0u8; len as usize];
    let n = img.len().min(8);
    img[..n].copy_from_slice(&tag.to_le_bytes()[..n]);
    if len > 8 {
        img[len as usize - 1] = tag as u8 ^ 0x5A;
    }
    img
}

fn write_tag(tx: &mut Transaction<'_>, q: HeapPtr, len: u64, tag: u64) -> Result<(), Error> {
    let img = tag_image(len, tag);
    let n = img.len().min(8);
    tx.write(q, &img[..n])?;
    if len > 8 {
        tx.write_at(q, len - 1, &img[len as usize - 1..])?;
    }
    Ok(())
}

/// Everything the two threads did.
#[derive(Default)]
struct History {
    committed: Vec<Committed>,
    /// Attempts that did not commit (conflicts, explicit aborts): reads only matter.
    aborted: Vec<Attempt>,
    /// How many of them ended in a conflict.
    conflicts: usize,
    /// The most values one byte position used (255 = some writes were skipped).
    max_values: u32,
    /// Each thread's live blocks at the end.
    blocks: Vec<Vec<Block>>,
}

fn run_thread(store: &Store, plans: &[TxnPlan], ctx: &Ctx<'_>) -> (Vec<Committed>, Vec<Attempt>, Vec<Block>, usize) {
    let mut committed = Vec::new();
    let mut aborted = Vec::new();
    let mut explicit = 0;
    let mut blocks: Vec<Block> = Vec::new();
    let fresh = |blocks: &Vec<Block>| Attempt { thread: ctx.thread, blocks: blocks.clone(), ..Attempt::default() };
    for plan in plans {
        match plan.kind {
            Kind::Transact => {
                let mut current: Option<Attempt> = None;
                let (_, lsn) = store
                    .transact(plan.mode, |tx| {
                        if let Some(prev) = current.take() {
                            aborted.push(prev);
                        }
                        let mut att = fresh(&blocks);
                        let r = run_ops(tx, &plan.ops, ctx, &mut att);
                        match r {
                            Ok(()) => current = Some(att),
                            Err(e) => {
                                aborted.push(att);
                                return Err(e);
                            }
                        }
                        Ok(())
                    })
                    .unwrap_or_else(|e| panic!("transact failed: {e:?}"));
                let att = current.expect("the committed attempt");
                blocks = att.blocks.clone();
                committed.push(Committed { lsn, mode: plan.mode, attempt: att });
            }
            Kind::Begin => {
                let mut tx = store.begin();
                loop {
                    let mut att = fresh(&blocks);
                    let r = run_ops(&mut tx, &plan.ops, ctx, &mut att).and_then(|()| tx.commit(plan.mode));
                    match r {
                        Ok(lsn) => {
                            blocks = att.blocks.clone();
                            committed.push(Committed { lsn, mode: plan.mode, attempt: att });
                            break;
                        }
                        Err(Error::Conflict) => {
                            aborted.push(att);
                            tx.restart();
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("commit failed: {e:?}"),
                    }
                }
            }
            Kind::Abort => {
                let mut tx = store.begin();
                let mut att = fresh(&blocks);
                let _ = run_ops(&mut tx, &plan.ops, ctx, &mut att);
                tx.abort();
                aborted.push(att);
                explicit += 1;
            }
        }
    }
    let conflicts = aborted.len() - explicit;
    (committed, aborted, blocks, conflicts)
}

fn run_history(store: &Store, region: HeapPtr, plans: &[Vec<TxnPlan>]) -> History {
    let values = Values::new();
    let tags = AtomicU32::new(1);
    let barrier = Barrier::new(plans.len());
    let out = Mutex::new(History::default());
    std::thread::scope(|s| {
        for (thread, plan) in plans.iter().enumerate() {
            let (values, tags, barrier, out) = (&values, &tags, &barrier, &out);
            s.spawn(move || {
                let ctx = Ctx { region, values, thread, tags };
                barrier.wait();
                let (c, a, b, n) = run_thread(store, plan, &ctx);
                let mut h = out.lock().unwrap();
                h.conflicts += n;
                h.committed.extend(c);
                h.aborted.extend(a);
                h.blocks.push(b);
            });
        }
    });
    let mut h = out.into_inner().unwrap();
    h.max_values = values.max_used();
    h
}

/// Replays committed writes in LSN order (each transaction's writes in program order).
fn replay<'a>(txns: impl IntoIterator<Item = &'a Committed>) -> Vec<u8> {
    let mut sorted: Vec<&Committed> = txns.into_iter().filter(|t| t.lsn.is_some()).collect();
    sorted.sort_by_key(|t| t.lsn);
    let mut model = vec![0u8; REGION as usize];
    for t in sorted {
        for &(pos, v) in &t.attempt.writes {
            model[pos as usize] = v;
        }
    }
    model
}

fn read_region(store: &Store) -> (HeapPtr, Vec<u8>) {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root("region")?.expect("region root");
            let mut buf = vec![0u8; REGION as usize];
            tx.read(p, &mut buf)?;
            Ok((p, buf))
        })
        .unwrap()
        .0
}

fn check_blocks(store: &Store, region: HeapPtr, blocks: &[Block]) {
    let mut spans: Vec<(u64, u64)> = blocks.iter().map(|b| (b.p.offset(), b.p.offset() + b.len)).collect();
    spans.push((region.offset(), region.offset() + REGION as u64));
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "live allocations overlap: {:?} and {:?}", w[0], w[1]);
    }
    store
        .transact(Commit::Async, |tx| {
            for b in blocks {
                assert_eq!(tx.len(b.p)?, b.len, "length of block {b:?}");
                let mut buf = vec![0u8; b.len as usize];
                tx.read(b.p, &mut buf)?;
                assert!(buf == tag_image(b.len, b.tag), "contents of block {b:?} changed");
            }
            Ok(())
        })
        .unwrap();
}

/// Checks (a), (b), (c) on a history; returns the model region.
fn check_history(h: &History, final_region: &[u8], first_lsn: Lsn, last_lsn: Lsn) -> Vec<u8> {
    // (c) LSNs: unique, gapless, update transactions only.
    let mut lsns = Vec::new();
    for t in &h.committed {
        let has_writes = !t.attempt.writes.is_empty();
        match t.lsn {
            Some(l) => lsns.push(l),
            None => assert!(!has_writes, "a transaction with writes committed without an LSN"),
        }
    }
    lsns.sort_unstable();
    assert_eq!(lsns, (first_lsn + 1..=last_lsn).collect::<Vec<_>>(), "LSNs of committed update transactions are not unique and gapless");

    // (a) The model.
    let model = replay(&h.committed);
    assert!(model == final_region, "final region differs from the LSN-order replay of the committed writes\nmodel {model:?}\nstore {final_region:?}");

    // (b) The conflict graph. Node 0 is the initial state; then committed transactions;
    // then aborted attempts (reads only).
    let n_comm = h.committed.len();
    let nodes = 1 + n_comm + h.aborted.len();
    let lsn_of = |node: usize| -> Option<Lsn> {
        if node == 0 {
            Some(0)
        } else if node <= n_comm {
            h.committed[node - 1].lsn
        } else {
            None
        }
    };
    // Versions per position: (writer node, value) in LSN order, starting with the zero.
    let mut writers: Vec<(Lsn, usize)> =
        h.committed.iter().enumerate().filter_map(|(i, t)| t.lsn.map(|l| (l, i + 1))).collect();
    writers.sort_unstable();
    let mut versions: Vec<Vec<(usize, u8)>> = vec![vec![(0, 0)]; REGION as usize];
    for &(_, node) in &writers {
        for (&pos, &v) in &h.committed[node - 1].attempt.own {
            versions[pos as usize].push((node, v));
        }
    }
    let mut index: Vec<HashMap<u8, usize>> = vec![HashMap::new(); REGION as usize];
    for (pos, vs) in versions.iter().enumerate() {
        for (k, &(_, v)) in vs.iter().enumerate() {
            assert!(index[pos].insert(v, k).is_none(), "value {v} written twice at byte {pos}");
        }
    }
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    let mut add = |from: usize, to: usize| {
        if from != to {
            edges[from].push(to);
        }
    };
    for vs in &versions {
        for w in vs.windows(2) {
            add(w[0].0, w[1].0);
        }
    }
    let readers = h
        .committed
        .iter()
        .enumerate()
        .map(|(i, t)| (i + 1, &t.attempt))
        .chain(h.aborted.iter().enumerate().map(|(i, a)| (1 + n_comm + i, a)));
    for (node, att) in readers {
        for r in &att.reads {
            let vs = &versions[r.pos as usize];
            let Some(&k) = index[r.pos as usize].get(&r.value) else {
                panic!(
                    "thread {} read value {} at byte {} that no committed transaction left there (aborted or intermediate write)",
                    att.thread, r.value, r.pos
                );
            };
            let writer = vs[k].0;
            assert_ne!(writer, node, "a transaction read its own write as another's");
            add(writer, node);
            if let (Some(lw), Some(lr)) = (lsn_of(writer), lsn_of(node)) {
                assert!(lw < lr, "reads-from edge from LSN {lw} to LSN {lr} goes backwards (byte {})", r.pos);
            }
            if let Some(&(next, _)) = vs.get(k + 1) {
                add(node, next);
            }
        }
    }
    // Kahn's algorithm; any node left over lies on a cycle.
    let mut indeg = vec![0usize; nodes];
    for es in &edges {
        for &t in es {
            indeg[t] += 1;
        }
    }
    let mut ready: Vec<usize> = (0..nodes).filter(|&n| indeg[n] == 0).collect();
    let mut seen = 0;
    while let Some(n) = ready.pop() {
        seen += 1;
        for &t in &edges[n] {
            indeg[t] -= 1;
            if indeg[t] == 0 {
                ready.push(t);
            }
        }
    }
    if seen != nodes {
        let stuck: Vec<String> = (0..nodes)
            .filter(|&n| indeg[n] > 0)
            .take(12)
            .map(|n| format!("node {n} (lsn {:?})", lsn_of(n)))
            .collect();
        panic!("the conflict graph has a cycle: not serializable/opaque; nodes on or after it: {stuck:?}");
    }
    model
}

fn opts() -> Options {
    Options { log_partitions: 2, stripes_log2: 10, ..common::small_opts() }
}

fn setup(store: &Store) -> HeapPtr {
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(REGION as u64)?;
            tx.set_root("region", p)?;
            Ok(p)
        })
        .unwrap()
        .0
}

fn model_case(plans: &[Vec<TxnPlan>], crash: bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let region = setup(&store);
    let first = store.last_lsn();
    let h = run_history(&store, region, plans);
    let last = store.last_lsn();
    let (_, live) = read_region(&store);
    let model = check_history(&h, &live, first, last);
    if std::env::var_os("TUSK_MODEL_STATS").is_some() {
        let reads: usize = h.committed.iter().map(|t| t.attempt.reads.len()).sum();
        let writes: usize = h.committed.iter().map(|t| t.attempt.writes.len()).sum();
        eprintln!(
            "committed {} (LSNs {}..={last}), aborted attempts {} ({} conflicts), max values per byte {}, committed reads {reads}, writes {writes}, live blocks {}, nonzero bytes {}",
            h.committed.len(),
            first + 1,
            h.aborted.len(),
            h.conflicts,
            h.max_values,
            h.blocks.iter().map(|b| b.len()).sum::<usize>(),
            model.iter().filter(|&&b| b != 0).count()
        );
    }
    let blocks: Vec<Block> = h.blocks.concat();
    check_blocks(&store, region, &blocks);

    if !crash {
        store.close().unwrap();
        let store = Store::open(dir.path(), opts()).unwrap();
        let report = store.recovery_report().clone();
        // A close's checkpoint draws LSNs of its own (one empty record per chunk copied).
        assert!(report.recovered_lsn >= last && report.recovered_lsn == report.max_lsn, "{report:?}");
        assert_eq!(report.gap_at, None);
        assert!(report.torn_tails.is_empty(), "{report:?}");
        let (p, recovered) = read_region(&store);
        assert_eq!(p, region);
        assert!(recovered == model, "the reopened region differs from the model");
        check_blocks(&store, region, &blocks);
        store.close().unwrap();
        return;
    }

    store.crash();
    let store = Store::open(dir.path(), opts()).unwrap();
    let report = store.recovery_report().clone();
    let rec = report.recovered_lsn;
    let last_sync = h.committed.iter().filter(|t| t.mode == Commit::Sync).filter_map(|t| t.lsn).max().unwrap_or(first);
    assert!(rec >= last_sync.max(first), "recovered up to {rec}, but LSN {last_sync} was acknowledged by a Sync commit: {report:?}");
    // Everything up to the recovered LSN, plus the Partition commits beyond it (each was
    // durable in its partition when its commit returned).
    let expected = replay(h.committed.iter().filter(|t| t.lsn.is_some_and(|l| l <= rec) || t.mode == Commit::Partition));
    let (_, recovered) = read_region(&store);
    assert!(recovered == expected, "after a crash the region is not the model at LSN {rec}: {report:?}");
    store.close().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let (_, again) = read_region(&store);
    assert!(again == expected, "a second recovery disagrees with the first");
    store.close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn model_close_reopen(plans in plans()) {
        model_case(&plans, false);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, max_shrink_iters: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn model_crash_reopen(plans in plans()) {
        model_case(&plans, true);
    }
}

/// A fixed, heavier history (more transactions per thread than the property cases), so the
/// threads overlap for long enough to conflict often.
#[test]
fn model_long_history() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]));
    // Mostly Async, so that the threads do not wait on the disk and overlap all the time.
    let strategy = prop::collection::vec(prop::collection::vec(txn_plan_with(0, 0), 1000..1001), 2);
    for _ in 0..2 {
        let plans = strategy.new_tree(&mut runner).unwrap().current();
        model_case(&plans, false);
    }
    let strategy = prop::collection::vec(prop::collection::vec(txn_plan(), 400..401), 2);
    let plans = strategy.new_tree(&mut runner).unwrap().current();
    model_case(&plans, false);
}
