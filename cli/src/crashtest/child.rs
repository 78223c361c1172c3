//! The child process of a crash run (`tusk crashtest-child --config JSON`): opens the store,
//! commits the workload from several threads and reports every step on stdout, until it is
//! killed, its stdin closes (then it closes the store cleanly), or it has committed as much
//! as the mark ring holds.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::protocol::{Event, Mode};
use super::workload::{self, MARKS};
use super::{CommitChoice, CrashtestError, Workload};
use tusk::{Error, FaultPlan, Io, Options, RecordConfig, Store};

/// Heap of a crash-run store (the parent opens it with the same).
pub const HEAP_CAPACITY: u64 = 64 << 20;
/// Log partitions: two, so that LSN gaps between partitions happen.
pub const PARTITIONS: usize = 2;

/// Options both the child and the parent open the store with. Small segments, chunks and a
/// small log bound, so that segments roll and checkpoints trim within a cycle.
pub fn store_options() -> Options {
    Options {
        heap_capacity: HEAP_CAPACITY,
        log_partitions: PARTITIONS,
        stripes_log2: 16,
        log_buffer_bytes: 64 << 10,
        segment_bytes: 64 << 10,
        chunk_size: 64 << 10,
        max_log_bytes: 8 << 20,
        checkpoint_interval: None,
        // Every large transaction (`--txn-words`) streams its record, so that crashes land
        // in the middle of streamed records too.
        stream_records_from: 64 << 10,
        ..Options::default()
    }
}

/// What one child does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildConfig {
    /// The store directory (the parent has created the workload in it).
    pub dir: PathBuf,
    /// The workload to commit.
    pub workload: Workload,
    /// How to commit (`Mixed`: each transaction draws its mode).
    pub commit: CommitChoice,
    /// Seed of the workers' random streams (each thread mixes in its number).
    pub seed: u64,
    /// Committing threads.
    pub threads: u32,
    /// The store's checkpoint interval, in milliseconds (at least 1).
    pub checkpoint_ms: u64,
    /// The store's group-commit interval, in microseconds (at least 100).
    pub group_commit_us: u64,
    /// Eio: I/O requests that succeed before every later one fails with EIO.
    pub eio_after: Option<u64>,
    /// Power: the journal of the recording backend, and its write-to-sync window.
    pub journal: Option<PathBuf>,
    /// Power: the recording backend's pause between writing a batch and syncing it, in
    /// microseconds (it widens the window in which the kill finds writes not yet durable).
    pub window_us: u64,
    /// Hathi: words each transaction reads and rewrites.
    pub txn_words: usize,
}

fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::Bank => "bank",
        Workload::Hathi => "hathi",
        Workload::Index => "index",
    }
}

fn commit_name(c: CommitChoice) -> &'static str {
    match c {
        CommitChoice::Sync => "sync",
        CommitChoice::Async => "async",
        CommitChoice::Partition => "partition",
        CommitChoice::Mixed => "mixed",
    }
}

impl ChildConfig {
    /// The configuration as JSON, the form `tusk crashtest-child --config` takes.
    pub fn to_json(&self) -> String {
        json!({
            "dir": self.dir.to_string_lossy(),
            "workload": workload_name(self.workload),
            "commit": commit_name(self.commit),
            "seed": self.seed,
            "threads": self.threads,
            "checkpoint_ms": self.checkpoint_ms,
            "group_commit_us": self.group_commit_us,
            "eio_after": self.eio_after,
            "journal": self.journal.as_ref().map(|j| j.to_string_lossy().into_owned()),
            "window_us": self.window_us,
            "txn_words": self.txn_words,
        })
        .to_string()
    }

    /// Reads a configuration `to_json` wrote; a field missing or unreadable is a
    /// `CrashtestError::Config`.
    pub fn from_json(text: &str) -> Result<ChildConfig, CrashtestError> {
        let bad = |what: &str| CrashtestError::Config(format!("{what} in {text}"));
        let v: Value = serde_json::from_str(text).map_err(|e| CrashtestError::Config(e.to_string()))?;
        let num = |k: &str| v[k].as_u64().ok_or_else(|| bad(k));
        let workload = match v["workload"].as_str() {
            Some("bank") => Workload::Bank,
            Some("hathi") => Workload::Hathi,
            Some("index") => Workload::Index,
            _ => return Err(bad("workload")),
        };
        let commit = match v["commit"].as_str() {
            Some("sync") => CommitChoice::Sync,
            Some("async") => CommitChoice::Async,
            Some("partition") => CommitChoice::Partition,
            Some("mixed") => CommitChoice::Mixed,
            _ => return Err(bad("commit")),
        };
        Ok(ChildConfig {
            dir: PathBuf::from(v["dir"].as_str().ok_or_else(|| bad("dir"))?),
            workload,
            commit,
            seed: num("seed")?,
            threads: num("threads")? as u32,
            checkpoint_ms: num("checkpoint_ms")?,
            group_commit_us: num("group_commit_us")?,
            eio_after: v["eio_after"].as_u64(),
            journal: v["journal"].as_str().map(PathBuf::from),
            window_us: num("window_us")?,
            txn_words: num("txn_words")? as usize,
        })
    }
}

/// Draws a commit mode.
/// The commit mode of the next transaction. The index workload never draws `Partition`: a
/// Partition record applied beyond an LSN gap carries after-images of tree nodes computed on
/// a state that included the lost commits, which can leave a tree structurally inconsistent
/// (README, Guarantees); the driver refuses `--commit partition` for it.
fn mode(choice: CommitChoice, workload: Workload, rng: &mut SmallRng) -> Mode {
    match choice {
        CommitChoice::Sync => Mode::Sync,
        CommitChoice::Async => Mode::Async,
        CommitChoice::Partition => Mode::Partition,
        CommitChoice::Mixed => match rng.random_range(0..20) {
            0..5 => Mode::Sync,
            5..13 => Mode::Async,
            13..17 if workload != Workload::Index => Mode::Partition,
            13..17 => Mode::Async,
            _ => Mode::Split,
        },
    }
}

/// Writes events to the parent, one write(2) per line, lines never interleaved.
struct Reporter {
    out: Mutex<std::io::Stdout>,
}

impl Reporter {
    fn send(&self, e: &Event) {
        let mut out = match self.out.lock() {
            Ok(o) => o,
            Err(poisoned) => poisoned.into_inner(),
        };
        // The parent gone means the run is over: nothing to report to.
        let _ = out.write_all(e.line().as_bytes());
        let _ = out.flush();
    }
}

/// Runs the child until killed or told to stop (stdin closed).
pub fn run(config: &ChildConfig) -> Result<(), CrashtestError> {
    let plan = FaultPlan::new();
    let io = match (&config.journal, config.eio_after) {
        (Some(journal), _) => Io::Recording(RecordConfig { journal: journal.clone(), window: Duration::from_micros(config.window_us), faults: None }),
        (None, Some(_)) => Io::Faulty(plan.clone()),
        (None, None) => Io::Auto,
    };
    let options = Options {
        io,
        checkpoint_interval: Some(Duration::from_millis(config.checkpoint_ms.max(1))),
        group_commit_interval: Duration::from_micros(config.group_commit_us.max(100)),
        ..store_options()
    };
    let store = open_when_released(&config.dir, options)?;
    let ((p, seq0), _) = store.transact(tusk::Commit::Async, |tx| {
        let p = tx.root(workload::ROOT)?.ok_or_else(|| Error::LogFailed("the crash-run store has no workload root".into()))?;
        Ok((p, tx.read_u64_at(p, 0)?))
    })?;
    if let Some(n) = config.eio_after {
        plan.fail_after(n, libc::EIO);
    }
    let reporter = Reporter { out: Mutex::new(std::io::stdout()) };
    reporter.send(&Event::Ready { start_lsn: store.last_lsn(), first_seq: seq0 + 1 });
    let stop = AtomicBool::new(false);
    // Stop before the mark ring wraps: marks must stay unambiguous within a cycle.
    let last_seq = seq0 + MARKS - 64;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut sink = [0u8; 64];
            while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
            stop.store(true, Ordering::SeqCst);
        });
        let workers: Vec<_> = (0..config.threads)
            .map(|t| {
                let (store, reporter, stop) = (&store, &reporter, &stop);
                s.spawn(move || worker(store, p, config, t, last_seq, reporter, stop))
            })
            .collect();
        for w in workers {
            if w.join().is_err() {
                reporter.send(&Event::Error("a worker thread panicked".into()));
            }
        }
        // Done committing (ring full, or the log failed): wait for the kill or the stop.
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    if config.eio_after.is_some() {
        // After a failed log the close reports that failure; nothing to check here.
        let _ = store.close();
    } else {
        store.close()?;
    }
    Ok(())
}

/// One committing thread.
fn worker(store: &Store, p: tusk::HeapPtr, config: &ChildConfig, t: u32, last_seq: u64, reporter: &Reporter, stop: &AtomicBool) {
    let mut rng = SmallRng::seed_from_u64(config.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(t));
    let mut refusals = 0;
    while !stop.load(Ordering::SeqCst) {
        let draw = workload::draw(config.workload, config.txn_words, &mut rng);
        let mode = mode(config.commit, config.workload, &mut rng);
        let mut tx = store.begin();
        let outcome = loop {
            let (seq, writes) = match workload::attempt(&mut tx, p, &draw) {
                Ok(x) => x,
                Err(Error::Conflict) => {
                    tx.restart();
                    continue;
                }
                Err(e) => break Err((0, e)),
            };
            if seq > last_seq {
                return;
            }
            // Announced before the commit can take its LSN: if the kill lands after the
            // record is durable and before the ack, the parent still knows what it wrote.
            reporter.send(&Event::Intent { thread: t, seq, mode, writes });
            match tx.commit(mode.commit()) {
                Ok(Some(lsn)) => break Ok((seq, lsn)),
                Ok(None) => break Err((seq, Error::LogFailed("an update transaction committed without an LSN".into()))),
                Err(Error::Conflict) => tx.restart(),
                Err(e) => break Err((seq, e)),
            }
        };
        match outcome {
            Ok((seq, lsn)) => {
                reporter.send(&Event::Ack { thread: t, seq, lsn });
                if mode == Mode::Split && store.is_stable(lsn, true) {
                    reporter.send(&Event::Stable { thread: t, seq });
                }
            }
            Err((seq, e @ Error::LogFailed(_))) => {
                reporter.send(&Event::Refused { thread: t, seq, why: e.to_string() });
                // Try a few more: each must be refused too (the parent checks).
                refusals += 1;
                if refusals >= 3 {
                    return;
                }
            }
            Err((_, e)) => {
                reporter.send(&Event::Error(e.to_string()));
                return;
            }
        }
    }
}

/// Opens the store the driver just closed. Its lock can outlive the driver's close for a
/// moment: a process forked by another thread of the driver's program (parallel tests spawn
/// children) holds a copy of the lock file's descriptor until it execs. So a `Locked` store is
/// tried again for up to two seconds before the error stands.
fn open_when_released(dir: &std::path::Path, options: Options) -> Result<Store, Error> {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match Store::open(dir, options.clone()) {
            Err(Error::Locked(_)) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            other => return other,
        }
    }
}
