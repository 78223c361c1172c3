//! A crash at any point of a checkpoint leaves a directory that recovers to the state the
//! store would have had without the checkpoint (issue 3, "Bad input and faults").
//!
//! For every N, the checkpointer's fault plan lets N I/O steps succeed (the segment's
//! creation and directory sync, its image writes, the manifest's temp write, fsync, rename
//! and the final directory sync) and fails the next one; then the store crashes and is reopened. N grows
//! until a checkpoint runs through unfaulted, so every step, the window between the
//! manifest's rename and its directory sync included, is the crash point once.

mod common;

use std::path::Path;
use std::sync::Arc;

use tusk::{Commit, FaultPlan, HeapPtr, Lsn, Options, Store};
use tusk_storage::checkpoint_format::{list_manifests, manifest_path};

const CHUNK: u64 = 16 << 10;
/// The data spans ten chunks, written into one segment.
const WORDS: u64 = 10 * CHUNK / 8;

fn options() -> Options {
    common::checkpoint_opts(8 << 20, CHUNK)
}

/// The store under test and the words it should hold (what every Sync commit acknowledged).
struct Subject {
    store: Store,
    data: HeapPtr,
    model: Vec<u64>,
    last_acked: Lsn,
}

impl Subject {
    fn create(dir: &Path, faults: Arc<FaultPlan>) -> Subject {
        let store = Store::open(dir, Options { checkpoint_faults: Some(faults), ..options() }).unwrap();
        let model: Vec<u64> = (0..WORDS).map(|i| i * 7 + 1).collect();
        let (data, lsn) = store
            .transact(Commit::Sync, |tx| {
                let p = tx.alloc(WORDS * 8)?;
                tx.set_root("data", p)?;
                for (i, w) in model.iter().enumerate() {
                    tx.write_u64_at(p, i as u64 * 8, *w)?;
                }
                Ok(p)
            })
            .unwrap();
        Subject { store, data, model, last_acked: lsn.unwrap() }
    }

    fn write(&mut self, word: u64, value: u64) {
        let (_, lsn) = self.store.transact(Commit::Sync, |tx| tx.write_u64_at(self.data, word * 8, value)).unwrap();
        self.model[word as usize] = value;
        self.last_acked = lsn.unwrap();
    }
}

/// Opens `dir` without faults and checks that every acknowledged write is there, byte for byte.
fn reopen_and_check(dir: &Path, model: &[u64], last_acked: Lsn, context: &str) -> Store {
    let store = Store::open(dir, options()).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
    let report = store.recovery_report();
    assert!(report.recovered_lsn >= last_acked, "{context}: recovered LSN {} < acknowledged {last_acked}", report.recovered_lsn);
    let (found, _) = store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("the data root survives");
            (0..WORDS).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap();
    if let Some(i) = (0..model.len()).find(|&i| found[i] != model[i]) {
        panic!("{context}: word {i} is {:#x}, expected {:#x}", found[i], model[i]);
    }
    store
}

fn newest_manifest(dir: &Path) -> Option<u64> {
    list_manifests(dir).unwrap().first().map(|(e, _)| *e)
}

/// Runs the crash at every step of one checkpoint. `with_previous`: an earlier checkpoint
/// exists (the faulted one is incremental and must not harm it). `retry`: after the fault,
/// the same store takes the checkpoint again before crashing (files of the failed attempt
/// are still there).
fn crash_at_every_step(with_previous: bool, retry: bool) {
    let mut saw_rename_window = false;
    for n in 0.. {
        let context = format!("crash after {n} checkpoint I/O steps (previous: {with_previous}, retry: {retry})");
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let mut s = Subject::create(dir.path(), plan.clone());
        if with_previous {
            s.store.checkpoint().unwrap();
        }
        // Dirty two of the ten chunks (an incremental checkpoint rewrites only them and chunk 0).
        s.write(CHUNK / 8 + 3, 0xAAAA);
        s.write(4 * CHUNK / 8 + 9, 0xBBBB);
        let before = newest_manifest(dir.path());
        let epoch = before.unwrap_or(0) + 1;

        plan.fail_after(n, libc::EIO);
        let result = s.store.checkpoint();
        let faulted = plan.failures() > 0;
        plan.fail_after(u64::MAX, libc::EIO);
        assert_eq!(result.is_err(), faulted, "{context}: {result:?}");
        if faulted {
            let renamed = manifest_path(dir.path(), epoch).exists();
            saw_rename_window |= renamed;
            if !renamed {
                assert_eq!(newest_manifest(dir.path()), before, "{context}: the old manifest is still the newest");
            }
        }
        // A failed checkpoint fails neither the log nor later commits.
        s.write(2 * CHUNK / 8, 0xCCCC);
        if retry {
            s.store.checkpoint().unwrap_or_else(|e| panic!("{context}: retry failed: {e}"));
            s.write(5 * CHUNK / 8 + 1, 0xDDDD);
        }
        let (model, last_acked) = (s.model.clone(), s.last_acked);
        s.store.crash();

        let store = reopen_and_check(dir.path(), &model, last_acked, &context);
        let loaded = store.recovery_report().checkpoint.as_ref().map(|c| c.manifest.epoch);
        assert_eq!(loaded, newest_manifest(dir.path()), "{context}: recovery uses the newest manifest");
        // The next checkpoint (possibly reusing the failed attempt's epoch) and a clean
        // restart still give the same state.
        store.checkpoint().unwrap_or_else(|e| panic!("{context}: checkpoint after recovery failed: {e}"));
        store.close().unwrap();
        reopen_and_check(dir.path(), &model, last_acked, &format!("{context}, after a further checkpoint")).close().unwrap();

        if !faulted {
            // Segment creation, its directory sync, one image write, four manifest steps.
            assert!(n >= 7, "a checkpoint takes more than {n} I/O steps");
            break;
        }
    }
    assert!(saw_rename_window, "no crash point fell between the manifest's rename and the directory sync");
}

#[test]
fn crash_at_every_step_of_the_first_checkpoint() {
    crash_at_every_step(false, false);
}

#[test]
fn crash_at_every_step_of_an_incremental_checkpoint() {
    crash_at_every_step(true, false);
}

#[test]
fn failed_checkpoint_retried_by_the_same_store_then_crash() {
    crash_at_every_step(true, true);
}
