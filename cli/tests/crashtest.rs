//! Crash runs through the library API: a few cycles of every fault model, for every
//! workload, with zero losses and zero violations; and the power-cut model applied to a
//! store written through the recording backend.

use std::time::Duration;

use tusk_cli::crashtest::{self, CommitChoice, Config, Fault, Workload};
use tusk::{Commit, Io, Options, RecordConfig, Store};

fn config(dir: &std::path::Path, seed: u64, workload: Workload, faults: Vec<Fault>, cycles: u64) -> Config {
    Config {
        cycles,
        seed,
        workload,
        commit: CommitChoice::Mixed,
        faults,
        max_run_ms: 120,
        ..Config::new(env!("CARGO_BIN_EXE_tusk").into(), dir.to_path_buf())
    }
}

fn run_clean(c: &Config) -> crashtest::Summary {
    let summary = crashtest::run(c, |_| {}).unwrap_or_else(|e| panic!("crash run failed: {e}"));
    assert!(summary.passed(), "seed {}: {:?}", c.seed, summary.failure);
    assert_eq!(summary.lost_acknowledged, 0);
    assert_eq!(summary.invariant_violations, 0);
    assert_eq!(summary.cycles, c.cycles);
    assert_eq!(summary.recovered, c.cycles, "every cycle's store recovers");
    summary
}

#[test]
fn every_fault_model_loses_nothing_acknowledged() {
    for (i, fault) in Fault::ALL.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        // A torn tail is cut only when the tear lands in records (not zeros after the end,
        // not a tail a power cut left): 4 cycles of it once cut nothing (CI, a busy machine).
        let cycles = if fault == Fault::Torn { 16 } else { 4 };
        let c = config(dir.path(), 100 + i as u64, Workload::Bank, vec![fault], cycles);
        let s = run_clean(&c);
        assert!(s.acknowledged > 0, "{fault:?}: the children committed nothing");
        match fault {
            Fault::Eio => assert!(s.commits_refused > 0, "eio: no commit was refused after the injected error"),
            Fault::Torn => assert!(s.torn_tails_cut >= 1, "torn: recovery cut nothing"),
            Fault::Bitflip => assert_eq!(s.corruptions_detected + s.harmless_flips, 4, "bitflip: every flip is detected or harmless"),
            _ => {}
        }
    }
}

#[test]
fn hathi_workload_under_all_faults() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), 7, Workload::Hathi, Fault::ALL.to_vec(), 8);
    run_clean(&c);
}

#[test]
fn a_run_continues_a_previous_one_in_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    run_clean(&config(dir.path(), 11, Workload::Bank, vec![Fault::Kill], 2));
    run_clean(&config(dir.path(), 12, Workload::Bank, vec![Fault::Power], 2));
    // Another workload's run in the same directory is refused, not mixed in.
    let err = crashtest::run(&config(dir.path(), 13, Workload::Hathi, vec![Fault::Kill], 1), |_| {}).unwrap_err();
    assert!(err.to_string().contains("another workload"), "{err}");
}

/// Both trees against the model after every crash: keys, values, and their validators.
#[test]
fn index_workload_under_all_faults() {
    let dir = tempfile::tempdir().unwrap();
    let s = run_clean(&config(dir.path(), 5, Workload::Index, Fault::ALL.to_vec(), 12));
    assert!(s.acknowledged > 0, "the children committed nothing");
    // Partition records beyond a gap could leave a tree inconsistent: refused for this workload.
    let c = Config { commit: CommitChoice::Partition, ..config(dir.path(), 6, Workload::Index, vec![Fault::Kill], 1) };
    let err = crashtest::run(&c, |_| {}).unwrap_err();
    assert!(err.to_string().contains("Partition"), "{err}");
}

/// The recording backend under a real store: after a crash and a power cut that keeps no
/// unsynced sector, every Sync-acknowledged commit is there.
#[test]
fn power_cut_keeps_every_sync_commit() {
    for keep_some in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store_dir = dir.path().join("store");
        let journal = dir.path().join("journal");
        let opts = Options {
            heap_capacity: 16 << 20,
            log_partitions: 2,
            io: Io::Recording(RecordConfig { journal: journal.clone(), window: Duration::ZERO, faults: None }),
            checkpoint_interval: None,
            ..Options::default()
        };
        let store = Store::open(&store_dir, opts.clone()).unwrap();
        let p = store
            .transact(Commit::Sync, |tx| {
                let p = tx.alloc(8 * 64)?;
                tx.set_root("slots", p)?;
                Ok(p)
            })
            .unwrap()
            .0;
        let mut last_sync = 0;
        for i in 0..200u64 {
            let mode = if i % 3 == 0 { Commit::Sync } else { Commit::Async };
            let lsn = store.transact(mode, |tx| tx.write_u64_at(p, 8 * (i % 64), i + 1)).unwrap().1.unwrap();
            if mode == Commit::Sync {
                last_sync = lsn;
            }
        }
        store.crash();
        let mut n = 0u64;
        let cut = tusk_cli::crashtest::faults::apply_power_cut(&journal, &mut <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(keep_some as u64)).unwrap();
        assert!(cut.writes > 0, "the journal recorded the log's writes");
        n += cut.writes;
        let store = Store::open(&store_dir, Options { io: Io::Auto, ..opts }).unwrap();
        let rec = store.recovery_report().recovered_lsn;
        assert!(rec >= last_sync, "recovered {rec} < last Sync LSN {last_sync} after a power cut of {n} writes");
        store.close().unwrap();
    }
}

/// Large transactions (hathi with 8000 words each: they run in place, logging their lines at
/// commit) under every fault model: nothing acknowledged is lost, no rule is broken.
#[test]
fn large_in_place_transactions_lose_nothing_under_every_fault_model() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config { txn_words: 8000, ..config(dir.path(), 77, Workload::Hathi, Fault::ALL.to_vec(), 12) };
    let s = run_clean(&c);
    assert!(s.acknowledged > 0, "the children committed nothing");
}
