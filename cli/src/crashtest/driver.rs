//! The cycle loop: start a child, let it run, crash it under the cycle's fault, recover,
//! verify, go on from the recovered state. Stops at the first cycle that loses an
//! acknowledged commit or breaks a rule, so that the state it leaves can be inspected.
//!
//! Files of a run under `Config::dir`: `store/` (the store), `journal` (the power fault's
//! write journal), `child.stdout` and `child.stderr`, `damaged/` (a bit-flipped copy of the store, while used).

use std::collections::BTreeMap;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::child::{store_options, ChildConfig};
use super::faults::{apply_power_cut, checkpointed_lsn, copy_store, flip_bit, tear_tail};
use super::protocol::parse_output;
use super::verify::{bank_total, check, CycleLog, Strictness, Verdict};
use super::workload::{self, read_all};
use super::{CommitChoice, Config, CrashtestError, Fault, Workload};
use tusk::{Commit, Error, RecoveryReport, Store};

/// Threads committing in each child.
const CHILD_THREADS: u32 = 2;
/// Longest wait for a child to open its store, or to close it.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// What one cycle did.
#[derive(Clone, Debug)]
pub struct CycleOutcome {
    /// The cycle's number, from 0.
    pub cycle: u64,
    /// The fault model drawn for the cycle.
    pub fault: Fault,
    /// Commits the child acknowledged.
    pub acknowledged: u64,
    /// Commits refused after an injected I/O error.
    pub refused: u64,
    /// The LSN recovery reached: every LSN up to it is in the recovered state (0 when
    /// recovery failed).
    pub recovered_lsn: u64,
    /// Time the crashed store took to open (recover), in milliseconds (0 when recovery
    /// failed; for a bit flip, the undamaged original's).
    pub recovery_ms: f64,
    /// Torn log tails recovery reports having cut.
    pub torn_tails_cut: u64,
    /// The fault's damage was found by recovery (reported as an error naming the file, or
    /// repaired by the rules).
    pub corruption_detected: bool,
    /// A bit flip recovery had no need to notice (a byte it never reads, or an image of a
    /// checkpoint it did not load), with the state still right.
    pub harmless_flip: bool,
    /// Sectors a power cut lost.
    pub sectors_lost: u64,
    /// Bank: Partition records applied beyond an LSN gap changed the total (allowed by the
    /// rules: their after-images may rest on transfers the gap dropped).
    pub partition_skew: bool,
    /// Acknowledged commits lost and rules broken in the cycle (the child's misbehaviour
    /// and a failed recovery included); the run stops after a cycle whose verdict is not ok.
    pub verdict: Verdict,
    /// What the fault did, in words.
    pub detail: String,
}

/// The result of a run.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// The run's seed: the same seed replays the same choices.
    pub seed: u64,
    /// Cycles run (fewer than asked for when one failed).
    pub cycles: u64,
    /// Cycles whose recovery opened the store (the run went on from the recovered state).
    pub recovered: u64,
    /// Commits the children acknowledged, over all cycles.
    pub acknowledged: u64,
    /// Acknowledged commits that recovery lost, over all cycles (0 in a passed run).
    pub lost_acknowledged: u64,
    /// Broken rules found, over all cycles: the gap rule, the model, the bank total, a
    /// failed recovery, the child's misbehaviour (0 in a passed run).
    pub invariant_violations: u64,
    /// Torn log tails recovery cut, over all cycles.
    pub torn_tails_cut: u64,
    /// Cycles whose torn tail or bit flip recovery detected: cut, fell back from, or
    /// refused with an error naming the file.
    pub corruptions_detected: u64,
    /// Bit flips recovery had no need to notice, with the state still right.
    pub harmless_flips: u64,
    /// Commits refused after an injected I/O error, over all cycles.
    pub commits_refused: u64,
    /// Sectors of unsynced writes the power cuts lost, over all cycles.
    pub power_sectors_lost: u64,
    /// Cycles in which Partition records beyond a gap changed the bank total.
    pub partition_skews: u64,
    /// Cycles run under each fault model.
    pub per_fault: BTreeMap<Fault, u64>,
    /// Recovery time of every recovered cycle, in milliseconds, in cycle order.
    pub recovery_ms: Vec<f64>,
    /// Wall time of the whole run.
    pub duration: Duration,
    /// The first failing cycle, its fault, and what went wrong.
    pub failure: Option<(u64, Fault, Vec<String>)>,
}

impl Summary {
    /// Whether the run lost no acknowledged commit and broke no rule.
    pub fn passed(&self) -> bool {
        self.lost_acknowledged == 0 && self.invariant_violations == 0
    }

    fn percentile(&self, q: f64) -> f64 {
        let mut v = self.recovery_ms.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n => v[((n - 1) as f64 * q).round() as usize],
        }
    }

    /// Median recovery time, in milliseconds (0 with no recovered cycle).
    pub fn recovery_p50_ms(&self) -> f64 {
        self.percentile(0.5)
    }

    /// Longest recovery time, in milliseconds (0 with no recovered cycle).
    pub fn recovery_max_ms(&self) -> f64 {
        self.recovery_ms.iter().copied().fold(0.0, f64::max)
    }

    /// The summary as one JSON object (what `tusk crashtest --json` prints), with the
    /// recovery times' median and maximum, whether it passed, and the failure if any.
    pub fn to_json(&self) -> serde_json::Value {
        let per_fault: serde_json::Map<String, serde_json::Value> = self.per_fault.iter().map(|(f, n)| (f.name().to_string(), json!(n))).collect();
        json!({
            "seed": self.seed,
            "cycles": self.cycles,
            "recovered": self.recovered,
            "acknowledged": self.acknowledged,
            "lost_acknowledged": self.lost_acknowledged,
            "invariant_violations": self.invariant_violations,
            "torn_tails_cut": self.torn_tails_cut,
            "corruptions_detected": self.corruptions_detected,
            "harmless_flips": self.harmless_flips,
            "commits_refused": self.commits_refused,
            "power_sectors_lost": self.power_sectors_lost,
            "partition_skews": self.partition_skews,
            "faults": per_fault,
            "recovery_p50_ms": self.recovery_p50_ms(),
            "recovery_max_ms": self.recovery_max_ms(),
            "duration_s": self.duration.as_secs_f64(),
            "passed": self.passed(),
            "failure": self.failure.as_ref().map(|(cycle, fault, why)| json!({"cycle": cycle, "fault": fault.name(), "problems": why})),
        })
    }
}

/// Seeds of cycle `k`: one stream per cycle, so that cycles do not shift each other.
fn cycle_rng(seed: u64, k: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed.wrapping_mul(0xA076_1D64_78BD_642F) ^ k.wrapping_mul(0xE703_7ED1_A0B4_28DB).rotate_left(17))
}

fn store_dir(config: &Config) -> PathBuf {
    config.dir.join("store")
}

/// Opens the store, turning a panic into an error message: recovery must never panic.
fn open_store(dir: &Path) -> Result<Result<Store, Error>, String> {
    catch_unwind(AssertUnwindSafe(|| Store::open(dir, store_options()))).map_err(|panic| {
        let what = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        format!("recovery of {} panicked: {}", dir.display(), what.unwrap_or_default())
    })
}

/// The workload's words of an open store.
fn words(store: &Store, w: Workload) -> Result<Vec<u64>, Error> {
    Ok(store
        .transact(Commit::Async, |tx| {
            let p = tx.root(workload::ROOT)?.ok_or_else(|| Error::LogFailed("the crash-run store lost its workload root".into()))?;
            read_all(tx, p, w)
        })?
        .0)
}

/// Creates the store and the workload (or takes the one a previous run left).
fn prepare(config: &Config) -> Result<Vec<u64>, CrashtestError> {
    let dir = store_dir(config);
    let store = Store::open(&dir, store_options())?;
    let has_root = store.transact(Commit::Async, |tx| tx.root(workload::ROOT))?.0;
    match has_root {
        Some(p) => {
            let len = store.transact(Commit::Async, |tx| tx.len(p))?.0;
            if len != 8 * workload::alloc_words(config.workload) {
                return Err(CrashtestError::Config(format!("{} holds a crash run of another workload; use a new --dir", dir.display())));
            }
        }
        None => {
            store.transact(Commit::Sync, |tx| workload::setup(tx, config.workload))?;
        }
    }
    let w = words(&store, config.workload)?;
    store.close()?;
    Ok(w)
}

/// Runs `config.cycles` cycles; `on_cycle` sees each as it ends.
pub fn run(config: &Config, mut on_cycle: impl FnMut(&CycleOutcome)) -> Result<Summary, CrashtestError> {
    if config.workload == Workload::Index && config.commit == CommitChoice::Partition {
        return Err(CrashtestError::Config(
            "the index workload does not use Partition commits: a Partition record applied beyond an LSN gap can leave a tree inconsistent (README, Guarantees)".into(),
        ));
    }
    if config.faults.is_empty() {
        return Err(CrashtestError::Config("no fault model to draw from".into()));
    }
    let started = Instant::now();
    std::fs::create_dir_all(&config.dir).map_err(|e| CrashtestError::io(&config.dir, e))?;
    let mut baseline = prepare(config)?;
    let mut summary = Summary { seed: config.seed, ..Summary::default() };
    for k in 0..config.cycles {
        let (outcome, next) =
            cycle(config, k, &baseline).map_err(|e| CrashtestError::Cycle { seed: config.seed, cycle: k, source: Box::new(e) })?;
        summary.cycles += 1;
        *summary.per_fault.entry(outcome.fault).or_default() += 1;
        summary.acknowledged += outcome.acknowledged;
        summary.commits_refused += outcome.refused;
        summary.torn_tails_cut += outcome.torn_tails_cut;
        summary.corruptions_detected += u64::from(outcome.corruption_detected);
        summary.harmless_flips += u64::from(outcome.harmless_flip);
        summary.power_sectors_lost += outcome.sectors_lost;
        summary.partition_skews += u64::from(outcome.partition_skew);
        summary.lost_acknowledged += outcome.verdict.lost.len() as u64;
        summary.invariant_violations += outcome.verdict.violations.len() as u64;
        if let Some(words) = next {
            summary.recovered += 1;
            summary.recovery_ms.push(outcome.recovery_ms);
            baseline = words;
        }
        on_cycle(&outcome);
        if !outcome.verdict.ok() {
            let mut why = outcome.verdict.lost.clone();
            why.extend(outcome.verdict.violations.iter().cloned());
            summary.failure = Some((k, outcome.fault, why));
            break;
        }
    }
    summary.duration = started.elapsed();
    Ok(summary)
}

/// One cycle. Returns its outcome and, when recovery succeeded, the recovered words.
fn cycle(config: &Config, k: u64, baseline: &[u64]) -> Result<(CycleOutcome, Option<Vec<u64>>), CrashtestError> {
    let mut rng = cycle_rng(config.seed, k);
    let fault = config.faults[rng.random_range(0..config.faults.len())];
    let journal = config.dir.join("journal");
    let _ = std::fs::remove_file(&journal);
    let child = ChildConfig {
        dir: store_dir(config),
        workload: config.workload,
        commit: config.commit,
        seed: rng.random(),
        threads: CHILD_THREADS,
        checkpoint_ms: rng.random_range(10..=150),
        group_commit_us: rng.random_range(200..=3000),
        eio_after: (fault == Fault::Eio).then(|| rng.random_range(0..40)),
        journal: (fault == Fault::Power).then(|| journal.clone()),
        window_us: rng.random_range(0..=2000),
        txn_words: config.txn_words,
    };
    let run_ms = rng.random_range(20..=config.max_run_ms.max(20));
    let mut fault_rng = SmallRng::seed_from_u64(rng.random());

    let mut outcome = CycleOutcome {
        cycle: k,
        fault,
        acknowledged: 0,
        refused: 0,
        recovered_lsn: 0,
        recovery_ms: 0.0,
        torn_tails_cut: 0,
        corruption_detected: false,
        harmless_flip: false,
        sectors_lost: 0,
        partition_skew: false,
        verdict: Verdict::default(),
        detail: String::new(),
    };
    let (bytes, child_problem) = run_child(config, &child, fault, Duration::from_millis(run_ms))?;
    // Kept until the next cycle: what the child said, for a failure's post-mortem.
    let said = config.dir.join("child.stdout");
    std::fs::write(&said, &bytes).map_err(|e| CrashtestError::io(&said, e))?;
    if let Some(p) = child_problem {
        outcome.verdict.violations.push(p);
    }
    let log = match parse_output(&bytes) {
        Ok(events) => CycleLog::from_events(&events),
        Err(e) => {
            outcome.verdict.violations.push(e);
            CycleLog::default()
        }
    };
    outcome.acknowledged = log.acked.len() as u64;
    outcome.refused = log.refused;
    if fault != Fault::Eio && log.refused > 0 {
        outcome.verdict.violations.push(format!("{} commits refused with no I/O fault injected", log.refused));
    }

    let dir = store_dir(config);
    let mut torn_plan = None;
    match fault {
        Fault::Power => {
            let cut = apply_power_cut(&journal, &mut fault_rng)?;
            outcome.sectors_lost = cut.sectors_lost;
            outcome.detail = format!("{} unsynced of {} writes, {} sectors lost", cut.unsynced, cut.writes, cut.sectors_lost);
        }
        Fault::Torn => {
            let required = log.required_lsn().max(checkpointed_lsn(&dir));
            torn_plan = tear_tail(&dir, &mut fault_rng, log.first_lsn(), required, &log.partition_acked())?;
            outcome.detail = torn_plan.as_ref().map_or("no segment to tear".into(), |p| format!("{}: {}", p.path.display(), p.how));
        }
        Fault::Bitflip => bitflip(config, &dir, &log, baseline, &mut fault_rng, &mut outcome)?,
        Fault::None | Fault::Kill | Fault::Eio => {}
    }

    // Recovery of the store itself (for bitflip: the undamaged original).
    let t0 = Instant::now();
    let store = match open_store(&dir) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            outcome.verdict.violations.push(format!("recovery after {} failed: {e}", fault.name()));
            return Ok((outcome, None));
        }
        Err(panic) => {
            outcome.verdict.violations.push(panic);
            return Ok((outcome, None));
        }
    };
    outcome.recovery_ms = t0.elapsed().as_secs_f64() * 1e3;
    let report: RecoveryReport = store.recovery_report().clone();
    outcome.recovered_lsn = report.recovered_lsn;
    outcome.torn_tails_cut = report.torn_tails.len() as u64;
    if let Some(plan) = &torn_plan {
        match plan.expect_offset {
            Some(offset) if report.torn_tails.iter().any(|t| t.path == plan.path && t.offset == offset) => {
                outcome.corruption_detected = true;
            }
            Some(offset) => outcome.verdict.violations.push(format!(
                "{} ({}) should be cut as a torn tail at offset {offset}, recovery reported {:?}",
                plan.path.display(),
                plan.how,
                report.torn_tails
            )),
            None if report.torn_tails.iter().any(|t| t.path == plan.path) => outcome.verdict.violations.push(format!(
                "{} ({}) holds only zeros after its last flush, yet recovery reported a torn tail: {:?}",
                plan.path.display(),
                plan.how,
                report.torn_tails
            )),
            None => {}
        }
    }
    let recovered = words(&store, config.workload)?;
    let strictness = if fault == Fault::None { Strictness::Clean } else { Strictness::Crash };
    let verdict = check(&log, baseline, &recovered, &report, config.workload, strictness);
    outcome.partition_skew = config.workload == Workload::Bank && bank_total(&recovered) != bank_total(baseline);
    outcome.verdict.lost.extend(verdict.lost);
    outcome.verdict.violations.extend(verdict.violations);
    if let Err(e) = store.close() {
        outcome.verdict.violations.push(format!("closing the recovered store failed: {e}"));
    }
    Ok((outcome, Some(recovered)))
}

/// Starts the child, lets it run `run_for` after it is ready, then crashes it (or, with no
/// fault, tells it to close). Returns its stdout and, if it misbehaved, what it did.
fn run_child(config: &Config, child_config: &ChildConfig, fault: Fault, run_for: Duration) -> Result<(Vec<u8>, Option<String>), CrashtestError> {
    let stderr_path = config.dir.join("child.stderr");
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| CrashtestError::io(&stderr_path, e))?;
    let mut child = Command::new(&config.exe)
        .arg("crashtest-child")
        .arg("--config")
        .arg(child_config.to_json())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .map_err(|e| CrashtestError::io(&config.exe, e))?;
    let mut stdout = child.stdout.take().ok_or_else(|| CrashtestError::Child("no stdout pipe".into()))?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut bytes = Vec::new();
    let child_stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default().trim().to_string();
    // Wait for the first line: the store is open.
    let deadline = Instant::now() + CHILD_TIMEOUT;
    while !bytes.contains(&b'\n') {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(CrashtestError::Child(format!("the child never opened the store: {}", child_stderr())));
            }
        }
    }
    let crash_at = Instant::now() + run_for;
    while let Ok(chunk) = rx.recv_timeout(crash_at.saturating_duration_since(Instant::now())) {
        bytes.extend_from_slice(&chunk);
        if Instant::now() >= crash_at {
            break;
        }
    }
    let mut problem = None;
    if let Ok(Some(status)) = child.try_wait() {
        if !status.success() {
            problem = Some(format!("the child died before the crash ({status}): {}", child_stderr()));
        }
    }
    if fault == Fault::None {
        drop(child.stdin.take());
    } else {
        // SIGKILL.
        let _ = child.kill();
    }
    let close_deadline = Instant::now() + CHILD_TIMEOUT;
    loop {
        match rx.recv_timeout(close_deadline.saturating_duration_since(Instant::now())) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                problem.get_or_insert_with(|| "the child did not close the store in time".into());
            }
        }
    }
    let _ = reader.join();
    let status = child.wait().map_err(|e| CrashtestError::io(&config.exe, e))?;
    if fault == Fault::None && !status.success() && problem.is_none() {
        problem = Some(format!("the child failed to close the store cleanly ({status}): {}", child_stderr()));
    }
    Ok((bytes, problem))
}

/// The bit-flip fault: a copy of the crashed store gets one flipped bit and is recovered;
/// recovery must refuse with an error naming the file, repair by the rules (a torn tail, a
/// fallback to the previous checkpoint), or produce the right state (the bit was in bytes
/// it has no need to read). The run then goes on from the undamaged original.
fn bitflip(config: &Config, dir: &Path, log: &CycleLog, baseline: &[u64], rng: &mut SmallRng, outcome: &mut CycleOutcome) -> Result<(), CrashtestError> {
    let copy = config.dir.join("damaged");
    let _ = std::fs::remove_dir_all(&copy);
    copy_store(dir, &copy)?;
    let Some(flip) = flip_bit(&copy, rng)? else {
        outcome.detail = "no file to flip a bit in".into();
        return Ok(());
    };
    let name = flip.path.strip_prefix(&copy).unwrap_or(&flip.path).display().to_string();
    outcome.detail = format!("bit {} of byte {} of {name}", flip.bit, flip.offset);
    match open_store(&copy) {
        Err(panic) => outcome.verdict.violations.push(format!("after a bit flip in {name}: {panic}")),
        Ok(Err(e)) => {
            if e.to_string().contains(&flip.path.to_string_lossy().into_owned()) {
                outcome.corruption_detected = true;
                outcome.detail.push_str(": refused, naming the file");
            } else {
                outcome.verdict.violations.push(format!("a bit flip in {name} (byte {}) gave an error that does not name it: {e}", flip.offset));
            }
        }
        Ok(Ok(store)) => {
            let report = store.recovery_report().clone();
            let cut = report.torn_tails.iter().any(|t| t.path == flip.path && t.offset <= flip.offset);
            let fell_back = report.checkpoint.as_ref().and_then(|c| c.fallback.as_ref()).is_some_and(|f| f.path == flip.path);
            let recovered = match words(&store, config.workload) {
                Ok(words) => words,
                // Opened on demand, a damaged image is found when its chunk is first read:
                // that read must fail naming the file (and the store stays open).
                Err(e @ Error::Corrupt { .. }) if report.heap_load == tusk::HeapLoad::OnDemand => {
                    if e.to_string().contains(&flip.path.to_string_lossy().into_owned()) {
                        outcome.corruption_detected = true;
                        outcome.detail.push_str(": found when its chunk was first read, naming the file");
                    } else {
                        outcome.verdict.violations.push(format!("a bit flip in {name} (byte {}) gave an error that does not name it: {e}", flip.offset));
                    }
                    drop(store);
                    let _ = std::fs::remove_dir_all(&copy);
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            let strictness = if cut { Strictness::Damaged } else { Strictness::Crash };
            let verdict = check(log, baseline, &recovered, &report, config.workload, strictness);
            if cut || fell_back {
                outcome.corruption_detected = true;
                outcome.detail.push_str(if cut { ": cut as a torn tail" } else { ": fell back to the previous checkpoint" });
            } else if verdict.ok() {
                outcome.harmless_flip = true;
                outcome.detail.push_str(": harmless");
            }
            for m in verdict.lost.into_iter().chain(verdict.violations) {
                outcome.verdict.violations.push(format!("after a bit flip in {name} (byte {}), undetected: {m}", flip.offset));
            }
            drop(store);
        }
    }
    let _ = std::fs::remove_dir_all(&copy);
    Ok(())
}

impl CommitChoice {
    /// The name `--commit` takes.
    pub fn name(self) -> &'static str {
        match self {
            CommitChoice::Sync => "sync",
            CommitChoice::Async => "async",
            CommitChoice::Partition => "partition",
            CommitChoice::Mixed => "mixed",
        }
    }
}
