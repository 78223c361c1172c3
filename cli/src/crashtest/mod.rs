//! Crash-recovery test runs: a child process runs a workload on a store and reports every
//! acknowledgement through a pipe; it is crashed after a random time under a fault model;
//! the parent recovers the store, checks it against what was acknowledged, and goes on from
//! the recovered state. `tusk crashtest` is the command-line face of [`run`].
//!
//! - [`workload`]: the heap layout the workloads share, and the bank and hathi transactions;
//! - [`protocol`]: the lines a child writes and how the parent reads them;
//! - [`child`]: the child process;
//! - [`faults`]: the fault models applied after the crash (power cut, torn tail, bit flip);
//! - [`verify`]: the model of what recovery must produce, and the checks;
//! - [`driver`]: the cycle loop;
//! - [`scratch_fs`]: ext4, XFS and btrfs images mounted through a loop device, for runs on
//!   each file system.
//!
//! Every choice of a run (faults, when to crash, the child's workload seeds, which sectors a
//! power cut keeps, where a bit flips) comes from the seed, so a run can be replayed; what
//! the child had committed when the kill landed depends on timing.

// The parts are public for the tests and the CLI.
pub mod child;
pub mod driver;
pub mod faults;
pub mod protocol;
pub mod verify;
pub mod workload;
pub mod scratch_fs;

use std::path::PathBuf;

pub use driver::{run, CycleOutcome, Summary};

/// Which workload the child runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Transfers between 64 accounts: the total balance is conserved.
    Bank,
    /// Each transaction reads and rewrites 6 random words of a 512 KiB array (the Hathi workload).
    Hathi,
    /// Upserts and removes in a B-link tree and an ART over a 2048-key domain each, checked
    /// key for key against the model and validated with `check()` after every recovery.
    Index,
}

/// How the child commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitChoice {
    /// Every commit `Sync`.
    Sync,
    /// Every commit `Async` (nothing must survive a crash but what recovery claims).
    Async,
    /// Every commit `Partition`.
    Partition,
    /// Sync, Async, Partition and split-phase (Async, then `is_stable(lsn, true)`), mixed.
    Mixed,
}

/// Which fault ends a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// No crash: the child closes the store; everything acknowledged must survive.
    None,
    /// SIGKILL: the OS keeps what was written.
    Kill,
    /// SIGKILL, then a power cut: only what was fsynced, plus some sectors of later writes.
    Power,
    /// SIGKILL, then the tail of a log segment damaged past what was acknowledged.
    Torn,
    /// SIGKILL, then one bit flipped anywhere in a log segment, chunk image or manifest.
    Bitflip,
    /// The I/O backend fails a write or fsync; later commits must be refused.
    Eio,
}

impl Fault {
    /// Every fault model, in the order `--faults all` draws from.
    pub const ALL: [Fault; 6] = [Fault::None, Fault::Kill, Fault::Power, Fault::Torn, Fault::Bitflip, Fault::Eio];

    /// The name `--faults` takes.
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Kill => "kill",
            Fault::Power => "power",
            Fault::Torn => "torn",
            Fault::Bitflip => "bitflip",
            Fault::Eio => "eio",
        }
    }
}

/// A crash run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `tusk` executable, re-run as the child (`tusk crashtest-child`).
    pub exe: PathBuf,
    /// The store directory (created; a store already there is used as it is only if it
    /// was made by a crash run with the same workload).
    pub dir: PathBuf,
    /// Crash cycles to run.
    pub cycles: u64,
    /// Seed of every choice of the run.
    pub seed: u64,
    /// The workload the child runs.
    pub workload: Workload,
    /// How the child commits.
    pub commit: CommitChoice,
    /// The faults cycles draw from (one per cycle).
    pub faults: Vec<Fault>,
    /// Longest time a child runs before its crash, in milliseconds (at least 20).
    pub max_run_ms: u64,
    /// Hathi: words each transaction reads and rewrites (thousands: large transactions,
    /// which run in place).
    pub txn_words: usize,
}

impl Config {
    /// A run with the defaults of `tusk crashtest`.
    pub fn new(exe: PathBuf, dir: PathBuf) -> Config {
        Config {
            exe,
            dir,
            cycles: 100,
            seed: 1,
            workload: Workload::Bank,
            commit: CommitChoice::Mixed,
            faults: Fault::ALL.to_vec(),
            max_run_ms: 250,
            txn_words: workload::HATHI_TOUCH,
        }
    }
}

/// What can stop a crash run (a loss or violation is not an error: it is in the summary).
#[derive(Debug, thiserror::Error)]
pub enum CrashtestError {
    /// An I/O error on a file or directory of the run (the store, the journal, the child's
    /// output, a copy of the store), or in starting or waiting for the child.
    #[error("{path}: {source}")]
    Io {
        /// The file, directory or executable the operation was on.
        path: PathBuf,
        /// The error the operation returned.
        source: std::io::Error,
    },
    /// A store error outside the recovery under test: preparing the workload, reading the
    /// recovered words, or the child opening, using or closing its store (a failed
    /// recovery is a violation in the cycle's verdict, not this).
    #[error(transparent)]
    Store(#[from] tusk::Error),
    /// A storage error while applying a fault: listing log partitions or segments, or
    /// replaying the power cut's journal.
    #[error("{0}")]
    Storage(#[from] tusk_storage::StorageError),
    /// The child could not be driven: no stdout pipe, or it never opened its store within
    /// the time allowed.
    #[error("child process: {0}")]
    Child(String),
    /// A configuration that cannot run: a child's JSON that does not read, the index
    /// workload with Partition commits, no fault model to draw from, or a store directory
    /// holding a crash run of another workload.
    #[error("bad child configuration: {0}")]
    Config(String),
    /// An error that stopped a cycle, with what replays it.
    #[error("seed {seed} cycle {cycle}: {source}")]
    Cycle {
        /// The run's seed.
        seed: u64,
        /// The cycle's number, from 0.
        cycle: u64,
        /// The error.
        source: Box<CrashtestError>,
    },
}

impl CrashtestError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> CrashtestError {
        CrashtestError::Io { path: path.into(), source }
    }
}
