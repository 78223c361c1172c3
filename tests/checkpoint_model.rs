//! Model test of checkpoints and recovery (issue 3, "Tests"): random transactions over a
//! few allocations, interleaved with checkpoints, crashes (`Store::crash`, then reopen) and
//! clean restarts, checked against a plain `Vec<u8>` per allocation.
//!
//! Commits are Sync, Async or Partition, some from a second thread (so that both log
//! partitions hold records; a long group-commit interval keeps Async records unwritten for
//! a while, so crashes lose some). Each committed change is kept with its LSN since the
//! last reopen, so after a crash the expected state is the one at the recovered LSN: the
//! state at the reopen plus every change with an LSN at or below it, plus every Partition
//! commit beyond it should a crash leave a gap (docs/ARCHITECTURE.md, Recovery). The test checks that
//! the recovered LSN covers everything acknowledged as durable, and that every allocation
//! equals the model byte for byte, its length included. A crash may also damage an image of
//! the newest checkpoint: recovery must then fall back to the previous one and still match.
//! A checkpoint may also fail at a random I/O step (fault injection); that changes nothing
//! the model sees.
//!
//! The model is physical: each allocation is kept with its heap offset and each committed
//! write as the heap bytes it changed. A Partition commit beyond a gap is replayed even
//! when an earlier commit it built on is lost (say, the one that reallocated the region it
//! writes): its bytes land where the transaction wrote them, which may be a block that the
//! recovered roots no longer reach, or part of the old block. Recomputing such a write
//! against the recovered region (as an earlier version of this model did) expected bytes
//! recovery rightly did not write.

use proptest::prelude::*;
use std::sync::Arc;

use tusk::{Commit, FaultPlan, HeapLoad, HeapPtr, Lsn, Options, Store};
use tusk_storage::checkpoint_format::{image_segment_path, list_manifests, Manifest, CHUNK_HEADER_SIZE};

const REGIONS: usize = 3;
/// Small chunks and a small log bound: allocations span several chunks, checkpoints are
/// incremental, and clean chunks get rewritten because their images pin too much log.
const CHUNK: u64 = 8 << 10;

fn options(faults: &Arc<FaultPlan>) -> Options {
    Options {
        checkpoint_faults: Some(faults.clone()),
        heap_capacity: 8 << 20,
        stripes_log2: 12,
        log_partitions: 2,
        log_buffer_bytes: 16 << 10,
        group_commit_interval: std::time::Duration::from_millis(20),
        chunk_size: CHUNK,
        segment_bytes: 1 << 16,
        max_log_bytes: 192 << 10,
        checkpoint_interval: None,
        ..Options::default()
    }
}

#[derive(Clone, Debug)]
struct Write {
    region: usize,
    /// Where in the region (modulo its length).
    at: u32,
    bytes: Vec<u8>,
}

#[derive(Clone, Debug)]
enum Op {
    /// One transaction of writes; `other_thread`: committed from a fresh thread.
    Txn { writes: Vec<Write>, mode: Commit, other_thread: bool },
    /// Frees a region and allocates it anew (zeroed) with another length.
    Realloc { region: usize, len: u32, mode: Commit },
    Checkpoint,
    /// A checkpoint whose I/O fails after this many steps (it may also finish first).
    FaultedCheckpoint(u64),
    /// Waits until everything committed so far is durable.
    WaitDurable,
    Crash,
    /// Crashes, then flips a byte of an image the newest checkpoint wrote (the number picks
    /// which image and byte), when an older checkpoint is there to fall back to.
    CrashAndDamageImage(u64),
    CloseAndReopen,
}

/// One allocation as the model holds it: where it lies in the heap and its bytes.
#[derive(Clone, Debug, PartialEq)]
struct Region {
    at: u64,
    bytes: Vec<u8>,
}

/// A committed change, as the model applies it: heap bytes written, or a region's new block.
#[derive(Clone, Debug)]
enum Change {
    Writes(Vec<(u64, Vec<u8>)>),
    Realloc { region: usize, at: u64, len: usize },
}

fn apply(state: &mut [Region], change: &Change) {
    match change {
        Change::Writes(writes) => {
            for (at, bytes) in writes {
                // Every region the bytes overlap sees them (after a gap, a write may land in
                // a block other than the one its region's root names).
                for region in state.iter_mut() {
                    let from = region.at.max(*at);
                    let to = (region.at + region.bytes.len() as u64).min(at + bytes.len() as u64);
                    if from < to {
                        let (r, w) = ((from - region.at) as usize, (from - at) as usize);
                        let n = (to - from) as usize;
                        region.bytes[r..r + n].copy_from_slice(&bytes[w..w + n]);
                    }
                }
            }
        }
        Change::Realloc { region, at, len } => state[*region] = Region { at: *at, bytes: vec![0; *len] },
    }
}

/// Where a write lands in a region of the model's length, cut to fit.
fn placed<'a>(region: &[u8], w: &'a Write) -> (usize, &'a [u8]) {
    let at = w.at as usize % region.len();
    let n = w.bytes.len().min(region.len() - at);
    (at, &w.bytes[..n])
}

fn write_strategy() -> impl Strategy<Value = Write> {
    // Mostly short writes, some of a few KiB (they fill log segments, so that trimming runs).
    let len = prop_oneof![6 => 1..64usize, 1 => 1024..4096usize];
    (0..REGIONS, any::<u32>(), len, any::<u8>())
        .prop_flat_map(|(region, at, len, seed)| {
            (Just(region), Just(at), prop::collection::vec(any::<u8>(), len).prop_map(move |mut b| {
                // Never all zero: a lost write must show.
                b[0] |= seed | 1;
                b
            }))
        })
        .prop_map(|(region, at, bytes)| Write { region, at, bytes })
}

fn mode_strategy() -> impl Strategy<Value = Commit> {
    prop_oneof![2 => Just(Commit::Sync), 4 => Just(Commit::Async), 1 => Just(Commit::Partition)]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (prop::collection::vec(write_strategy(), 1..6), mode_strategy(), prop::bool::weighted(0.3))
            .prop_map(|(writes, mode, other_thread)| Op::Txn { writes, mode, other_thread }),
        // Not Partition: the allocator is shared by every thread, like an index, and a
        // Partition realloc replayed beyond a gap may rest on a lost allocation (found:
        // a lost Async realloc had moved brk, the Partition one freed that block and carved
        // the region's new block from it, so the recovered root named a block beyond brk,
        // which the next checkpoint does not keep). README, Guarantees: allocate and free
        // with Sync or Async, not Partition.
        1 => (0..REGIONS, 1..24_000u32, prop_oneof![1 => Just(Commit::Sync), 2 => Just(Commit::Async)])
            .prop_map(|(region, len, mode)| Op::Realloc { region, len, mode }),
        3 => Just(Op::Checkpoint),
        1 => (0..24u64).prop_map(Op::FaultedCheckpoint),
        1 => Just(Op::WaitDurable),
        2 => Just(Op::Crash),
        1 => any::<u64>().prop_map(Op::CrashAndDamageImage),
        1 => Just(Op::CloseAndReopen),
    ]
}

/// Flips one byte of a chunk image that the newest manifest's own checkpoint wrote, if an
/// older manifest exists; returns its segment's path.
fn damage_newest_image(dir: &std::path::Path, pick: u64) -> Option<std::path::PathBuf> {
    let manifests = list_manifests(dir).unwrap();
    if manifests.len() < 2 {
        return None;
    }
    let newest = Manifest::decode(&std::fs::read(&manifests[0].1).unwrap()).ok()?;
    let own: Vec<usize> = (0..newest.chunks.len()).filter(|&i| newest.chunks[i].image_epoch == newest.epoch).collect();
    let index = own[(pick % own.len() as u64) as usize];
    let path = image_segment_path(dir, newest.epoch);
    let mut bytes = std::fs::read(&path).ok()?;
    let at = (newest.chunks[index].offset as usize) + CHUNK_HEADER_SIZE + ((pick >> 16) % newest.chunk_size) as usize;
    bytes[at] ^= 0x5A;
    std::fs::write(&path, bytes).unwrap();
    Some(path)
}

fn root_name(region: usize) -> String {
    format!("r{region}")
}

struct Harness {
    dir: tempfile::TempDir,
    faults: Arc<FaultPlan>,
    store: Option<Store>,
    /// The model at the last reopen, and every change committed since, with its LSN and
    /// whether it was a Partition commit.
    base: Vec<Region>,
    history: Vec<(Lsn, bool, Change)>,
    /// The model with every committed change applied.
    current: Vec<Region>,
    /// The largest LSN acknowledged durable (a Sync commit, a wait, a checkpoint).
    durable: Lsn,
    /// Images damaged so far.
    damaged: Vec<std::path::PathBuf>,
    /// The reopen under way follows a damage.
    damaging: bool,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let faults = FaultPlan::new();
        let store = Store::open(dir.path(), options(&faults)).unwrap();
        let lens = [5000usize, 9000, 20000];
        let (blocks, lsn) = store
            .transact(Commit::Sync, |tx| {
                let mut blocks = Vec::new();
                for (r, &len) in lens.iter().enumerate() {
                    let p = tx.alloc(len as u64)?;
                    tx.set_root(&root_name(r), p)?;
                    blocks.push(p.offset());
                }
                Ok(blocks)
            })
            .unwrap();
        let current: Vec<Region> = lens.iter().zip(blocks).map(|(&n, at)| Region { at, bytes: vec![0; n] }).collect();
        Harness { dir, faults, store: Some(store), base: current.clone(), history: Vec::new(), current, durable: lsn.unwrap(), damaged: Vec::new(), damaging: false }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    fn commit(&mut self, lsn: Lsn, mode: Commit, change: Change) {
        apply(&mut self.current, &change);
        self.history.push((lsn, mode == Commit::Partition, change));
        if mode == Commit::Sync {
            self.durable = self.durable.max(lsn);
        }
    }

    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Txn { writes, mode, other_thread } => {
                let mode = *mode;
                let model = &self.current;
                let txn = |store: &Store| {
                    let (written, lsn) = store
                        .transact(mode, |tx| {
                            let mut written = Vec::new();
                            for w in writes {
                                let p = tx.root(&root_name(w.region))?.expect("root");
                                let region = &model[w.region];
                                assert_eq!(p.offset(), region.at, "region {} moved behind the model's back", w.region);
                                let (at, bytes) = placed(&region.bytes, w);
                                tx.write_at(p, at as u64, bytes)?;
                                written.push((p.offset() + at as u64, bytes.to_vec()));
                            }
                            Ok(written)
                        })
                        .unwrap();
                    (written, lsn.expect("an update transaction has an LSN"))
                };
                let (written, lsn) = if *other_thread {
                    let store = self.store();
                    std::thread::scope(|s| s.spawn(|| txn(store)).join().unwrap())
                } else {
                    txn(self.store())
                };
                self.commit(lsn, mode, Change::Writes(written));
            }
            Op::Realloc { region, len, mode } => {
                let mode = *mode;
                let name = root_name(*region);
                let (at, lsn) = self
                    .store()
                    .transact(mode, |tx| {
                        let old = tx.root(&name)?.expect("root");
                        tx.free(old)?;
                        let p = tx.alloc(*len as u64)?;
                        tx.set_root(&name, p)?;
                        Ok(p.offset())
                    })
                    .unwrap();
                self.commit(lsn.unwrap(), mode, Change::Realloc { region: *region, at, len: *len as usize });
            }
            Op::Checkpoint => {
                let report = self.store().checkpoint().unwrap();
                prop_assert!(report.written >= 1, "chunk 0 is always written: {report:?}");
                prop_assert_eq!(report.written + report.reused, report.chunks);
                // The checkpoint became valid once its newest chunk LSN was durable.
                self.durable = self.durable.max(report.max_lsn);
            }
            Op::FaultedCheckpoint(steps) => {
                let failures = self.faults.failures();
                self.faults.fail_after(*steps, libc::EIO);
                let result = self.store().checkpoint();
                self.faults.fail_after(u64::MAX, libc::EIO);
                let faulted = self.faults.failures() > failures;
                prop_assert_eq!(result.is_err(), faulted, "{:?}", result);
                if let Ok(report) = result {
                    self.durable = self.durable.max(report.max_lsn);
                }
            }
            Op::WaitDurable => {
                let last = self.store().last_lsn();
                prop_assert!(self.store().is_stable(last, true));
                self.durable = self.durable.max(last);
            }
            Op::Crash => {
                let durable = self.store().durable_lsn().max(self.durable);
                self.store.take().unwrap().crash();
                self.reopen(durable, false)?;
            }
            Op::CrashAndDamageImage(pick) => {
                let durable = self.store().durable_lsn().max(self.durable);
                self.store.take().unwrap().crash();
                let damaged = damage_newest_image(self.dir.path(), *pick);
                self.damaging = damaged.is_some();
                self.reopen(durable, false)?;
                self.damaging = false;
                if let Some(victim) = damaged {
                    self.damaged.push(victim);
                    let loaded = self.store().recovery_report().checkpoint.as_ref();
                    // The newest checkpoint may hold an image damaged earlier too: either is named.
                    let named = loaded.and_then(|c| c.fallback.as_ref()).map(|f| f.path.clone());
                    prop_assert!(
                        named.as_ref().is_some_and(|p| self.damaged.contains(p)),
                        "recovery fell back naming {:?}, damaged: {:?}", named, self.damaged
                    );
                }
            }
            Op::CloseAndReopen => {
                let last = self.store().last_lsn();
                self.store.take().unwrap().close().unwrap();
                self.reopen(last, true)?;
            }
        }
        Ok(())
    }

    /// Reopens and checks the recovered state against the model at the recovered LSN.
    /// `at_least`: the LSN recovery must reach; `clean`: nothing may be lost.
    fn reopen(&mut self, at_least: Lsn, clean: bool) -> Result<(), TestCaseError> {
        // On demand until an image is damaged: from then on a whole load, whose fallback the
        // case checks (on demand, damage in a chunk the open does not read is found when the
        // chunk is, as an error: tests/on_demand.rs).
        let heap_load = if self.damaged.is_empty() && !self.damaging { HeapLoad::OnDemand } else { HeapLoad::Whole };
        let store = Store::open(self.dir.path(), Options { heap_load, ..options(&self.faults) }).unwrap();
        prop_assert_eq!(store.recovery_report().heap_load, heap_load);
        let recovered = store.recovery_report().recovered_lsn;
        prop_assert!(recovered >= at_least, "recovered LSN {} < {} acknowledged durable", recovered, at_least);
        let mut expected = std::mem::take(&mut self.base);
        for (lsn, partition, change) in &self.history {
            // A Partition commit was durable on its own: it survives a gap before it.
            if *lsn <= recovered || *partition {
                apply(&mut expected, change);
            }
        }
        if clean {
            prop_assert!(expected == self.current, "a clean close lost committed changes");
        }
        let (found, _) = store
            .transact(Commit::Async, |tx| {
                let mut found = Vec::new();
                for r in 0..REGIONS {
                    let p: HeapPtr = tx.root(&root_name(r))?.expect("root");
                    let mut buf = vec![0u8; tx.len(p)? as usize];
                    tx.read(p, &mut buf)?;
                    found.push(Region { at: p.offset(), bytes: buf });
                }
                Ok(found)
            })
            .unwrap();
        for r in 0..REGIONS {
            let (found, expected) = (&found[r], &expected[r]);
            prop_assert_eq!(found.at, expected.at, "heap offset of region {}", r);
            prop_assert_eq!(found.bytes.len(), expected.bytes.len(), "length of region {}", r);
            if let Some(i) = (0..found.bytes.len()).find(|&i| found.bytes[i] != expected.bytes[i]) {
                return Err(TestCaseError::fail(format!(
                    "region {r} byte {i}: {} recovered, {} expected (recovered LSN {recovered})",
                    found.bytes[i], expected.bytes[i]
                )));
            }
        }
        self.base = expected.clone();
        self.current = expected;
        self.history.clear();
        self.durable = recovered;
        self.store = Some(store);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn recovered_heap_equals_the_model_at_the_recovered_lsn(ops in prop::collection::vec(op_strategy(), 1..60)) {
        let mut h = Harness::new();
        for op in &ops {
            h.run(op)?;
        }
        // Whatever happened, a final crash and a final clean restart recover the model too.
        h.run(&Op::Crash)?;
        h.run(&Op::CloseAndReopen)?;
        h.store.take().unwrap().close().unwrap();
    }
}
