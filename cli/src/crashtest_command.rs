//! `tusk crashtest`: crash-recovery runs under fault models, and the hidden child command.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use crate::crashtest::child::ChildConfig;
use crate::crashtest::scratch_fs::{self, FileSystem, Prepared};
use crate::crashtest::{self, CommitChoice, Config, Fault, Summary, Workload};

use super::{CliResult, FsArg, IoAt};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum WorkloadArg {
    Bank,
    Hathi,
    Index,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CommitArg {
    Sync,
    Async,
    Partition,
    Mixed,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FaultArg {
    None,
    Kill,
    Power,
    Torn,
    Bitflip,
    Eio,
    All,
}

#[derive(Args, Debug)]
pub struct CrashtestArgs {
    /// Crash cycles to run.
    #[arg(long, default_value_t = 100)]
    cycles: u64,
    /// Seed of every choice of the run; the same seed replays the same faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = WorkloadArg::Bank)]
    workload: WorkloadArg,
    #[arg(long, value_enum, default_value_t = CommitArg::Mixed)]
    commit: CommitArg,
    /// Fault model of every cycle (`all`: one drawn per cycle).
    #[arg(long, value_enum, default_value_t = FaultArg::All)]
    faults: FaultArg,
    /// Directory of the run (default: a fresh temporary one, kept when the run fails).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Longest time a child runs before it is crashed, in milliseconds.
    #[arg(long, default_value_t = 250)]
    max_run_ms: u64,
    /// Hathi: words each transaction reads and rewrites (8000 of the array's 65,536 touch
    /// about 5,000 lines: large transactions, which run in place).
    #[arg(long, default_value_t = crate::crashtest::workload::HATHI_TOUCH)]
    txn_words: usize,
    /// Print one JSON object instead of the table (with --fs: one a file system).
    #[arg(long)]
    json: bool,
    /// Run on a fresh file system of this kind: an image file in --dir (or a temporary folder
    /// of the current one), formatted, mounted through a loop device, unmounted and removed
    /// after the run (needs root). With `all`, a file system this machine cannot make or mount
    /// is skipped with its reason; one named alone is then an error.
    #[arg(long, value_enum)]
    fs: Option<FsArg>,
    /// Size of the --fs image in MiB (sparse; at least 512).
    #[arg(long, default_value_t = 1024)]
    fs_image_mib: u64,
    /// Run the bank on a replicated group of this many nodes on loopback instead, under the
    /// group's faults (leader or follower killed, a node cut off, messages dropped, delayed
    /// or duplicated), one per cycle.
    #[arg(long)]
    nodes: Option<usize>,
    /// With --nodes: how long each fault lasts, in milliseconds (and the group then runs
    /// without one as long).
    #[arg(long, default_value_t = 300)]
    dwell_ms: u64,
    /// With --nodes: a writer beside the transfers rewrites a region of this many MiB in one
    /// `Sync` transaction at a time (records larger than an entry of the group's log travel
    /// in pieces); every node must hold one such transaction whole at the end. 0: none.
    #[arg(long, default_value_t = 0)]
    large_mib: u64,
}

#[derive(Args, Debug)]
pub struct CrashtestChildArgs {
    /// The child's configuration, as JSON (written by the parent).
    #[arg(long)]
    config: String,
}

pub fn child(args: CrashtestChildArgs) -> CliResult {
    let config = ChildConfig::from_json(&args.config)?;
    crashtest::child::run(&config)?;
    Ok(())
}

/// A run that found a lost commit or a broken invariant: what to print after clean-up.
struct Failed {
    cycle: u64,
    fault: Fault,
    why: Vec<String>,
    /// Where the store was left for inspection.
    kept: PathBuf,
}

pub fn run(args: CrashtestArgs) -> CliResult {
    let (dir, temp) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new().prefix("tusk-crashtest-").tempdir_in(".").at(Path::new("."))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    if let Some(nodes) = args.nodes {
        let plan = crate::crashtest_group::GroupRun { nodes, cycles: args.cycles, seed: args.seed, threads: 4, dwell: std::time::Duration::from_millis(args.dwell_ms), large_mib: args.large_mib };
        let ran = crate::crashtest_group::run(&dir.join("group"), plan, args.json);
        if let Some(t) = temp.filter(|_| ran.is_err()) {
            let _kept = t.keep();
        }
        return ran;
    }
    let Some(fs) = args.fs else {
        let (summary, failed) = run_in(&args, &dir, None, |store| Ok(store.to_path_buf()))?;
        print_summary(&args, None, &summary);
        // Keep the temporary directory of a failed run for inspection.
        if let Some(t) = temp.filter(|_| failed.is_some()) {
            let _kept = t.keep();
        }
        return report_failure(&args, None, failed);
    };
    let mut any_failed = false;
    for file_system in fs.file_systems() {
        let skip = |why: String| {
            if args.json {
                outln!("{}", serde_json::json!({ "fs": file_system.name(), "skipped": why }));
            } else {
                outln!("crash run on {file_system}: skipped: {why}");
            }
        };
        let scratch = match scratch_fs::prepare(file_system, &dir, args.fs_image_mib).map_err(|e| format!("crash run on {file_system}: {e}"))? {
            Prepared::Mounted(scratch) => scratch,
            Prepared::Unavailable(why) if fs.skips_unavailable() => {
                skip(why);
                continue;
            }
            Prepared::Unavailable(why) => return Err(format!("crash run on {file_system}: {why}").into()),
        };
        // A failed run's store goes back to the disk the images are on before the image goes.
        let keep = |store: &Path| -> Result<PathBuf, Box<dyn std::error::Error>> {
            let kept = dir.join(format!("{file_system}-failed-store"));
            copy_dir(store, &kept)?;
            Ok(kept)
        };
        let ran = run_in(&args, &scratch.path().join("run"), Some(file_system), keep);
        scratch.remove().map_err(|e| format!("crash run on {file_system}: cleaning up: {e}"))?;
        let (summary, failed) = ran?;
        print_summary(&args, Some(file_system), &summary);
        any_failed |= failed.is_some();
        if failed.is_some() {
            report_failure(&args, Some(file_system), failed).ok();
        }
    }
    if any_failed {
        if let Some(t) = temp {
            let _kept = t.keep();
        }
        std::process::exit(2);
    }
    Ok(())
}

/// Copies the files of `from` (a store directory: files and folders only) to `to`.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to).at(to)?;
    for entry in std::fs::read_dir(from).at(from)? {
        let entry = entry.at(from)?;
        let target = to.join(entry.file_name());
        if entry.file_type().at(&entry.path())?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).at(&entry.path())?;
        }
    }
    Ok(())
}

/// One crash run in `dir`, its summary printed; the failure, if any, with the store kept by
/// `keep` (given the store directory, it returns where the store can be inspected).
fn run_in(
    args: &CrashtestArgs,
    dir: &Path,
    fs: Option<FileSystem>,
    keep: impl Fn(&Path) -> Result<PathBuf, Box<dyn std::error::Error>>,
) -> Result<(Summary, Option<Failed>), Box<dyn std::error::Error>> {
    let workload = match args.workload {
        WorkloadArg::Bank => Workload::Bank,
        WorkloadArg::Hathi => Workload::Hathi,
        WorkloadArg::Index => Workload::Index,
    };
    let commit = match args.commit {
        CommitArg::Sync => CommitChoice::Sync,
        CommitArg::Async => CommitChoice::Async,
        CommitArg::Partition => CommitChoice::Partition,
        CommitArg::Mixed => CommitChoice::Mixed,
    };
    let faults = match args.faults {
        FaultArg::None => vec![Fault::None],
        FaultArg::Kill => vec![Fault::Kill],
        FaultArg::Power => vec![Fault::Power],
        FaultArg::Torn => vec![Fault::Torn],
        FaultArg::Bitflip => vec![Fault::Bitflip],
        FaultArg::Eio => vec![Fault::Eio],
        FaultArg::All => Fault::ALL.to_vec(),
    };
    if args.txn_words != crate::crashtest::workload::HATHI_TOUCH && workload != Workload::Hathi {
        return Err("--txn-words is for the hathi workload".into());
    }
    if args.txn_words == 0 {
        return Err("--txn-words must be ≥ 1".into());
    }
    let exe = std::env::current_exe()?;
    let config = Config {
        cycles: args.cycles,
        seed: args.seed,
        workload,
        commit,
        faults,
        max_run_ms: args.max_run_ms,
        txn_words: args.txn_words,
        ..Config::new(exe, dir.to_path_buf())
    };

    let bar = if args.json { ProgressBar::hidden() } else { ProgressBar::new(args.cycles) };
    let on = fs.map_or(String::new(), |fs| format!("{fs} "));
    bar.set_style(
        ProgressStyle::with_template(&format!("{{spinner}} {on}cycle {{pos}}/{{len}} [{{bar:30}}] {{elapsed}} {{msg}}"))
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let summary = crashtest::run(&config, |c| {
        bar.inc(1);
        bar.set_message(format!("{} acks, {}: LSN {} in {:.0} ms", c.acknowledged, c.fault.name(), c.recovered_lsn, c.recovery_ms));
    })?;
    bar.finish_and_clear();
    let failed = match &summary.failure {
        Some((cycle, fault, why)) => Some(Failed { cycle: *cycle, fault: *fault, why: why.clone(), kept: keep(&dir.join("store"))? }),
        None => None,
    };
    Ok((summary, failed))
}

/// Prints a run's summary: a table, or one JSON object. Called once the run's file system is
/// unmounted, so that a reader closing stdout (which ends the command) cannot leave it mounted.
fn print_summary(args: &CrashtestArgs, fs: Option<FileSystem>, summary: &Summary) {
    if args.json {
        let mut json = summary.to_json();
        json["fs"] = fs.map_or(serde_json::Value::Null, |fs| fs.name().into());
        outln!("{json}");
    } else {
        let faults: Vec<String> = summary.per_fault.iter().map(|(f, n)| format!("{} {n}", f.name())).collect();
        outln!(
            "crash run: workload {}, commit {}, seed {}",
            format!("{:?}", args.workload).to_lowercase(),
            format!("{:?}", args.commit).to_lowercase(),
            args.seed
        );
        if let Some(fs) = fs {
            outln!("  file system             {fs} ({} MiB image on a loop device)", args.fs_image_mib.max(scratch_fs::MIN_IMAGE_MIB));
        }
        outln!("  cycles                  {}", summary.cycles);
        outln!("  faults                  {}", faults.join(", "));
        outln!("  recovered               {}", summary.recovered);
        outln!("  acknowledged commits    {}", summary.acknowledged);
        outln!("  lost acknowledged       {}", summary.lost_acknowledged);
        outln!("  invariant violations    {}", summary.invariant_violations);
        outln!("  torn tails cut          {}", summary.torn_tails_cut);
        outln!("  corruptions detected    {}", summary.corruptions_detected);
        outln!("  harmless bit flips      {}", summary.harmless_flips);
        outln!("  commits refused (eio)   {}", summary.commits_refused);
        outln!("  power-cut sectors lost  {}", summary.power_sectors_lost);
        outln!("  partition skews (bank)  {}", summary.partition_skews);
        outln!("  recovery p50 / max      {:.1} / {:.1} ms", summary.recovery_p50_ms(), summary.recovery_max_ms());
        outln!("  duration                {:.1} s", summary.duration.as_secs_f64());
    }
}

/// Prints how a failed run ends and how to replay it, and exits with status 2.
fn report_failure(args: &CrashtestArgs, fs: Option<FileSystem>, failed: Option<Failed>) -> CliResult {
    let Some(Failed { cycle, fault, why, kept }) = failed else { return Ok(()) };
    for w in &why {
        eprintln!("tusk crashtest: cycle {cycle} ({}): {w}", fault.name());
    }
    let on = fs.map_or(String::new(), |fs| format!(" --fs {fs}"));
    eprintln!(
        "tusk crashtest: FAILED at seed {} cycle {cycle}; replay with `tusk crashtest{on} --seed {} --cycles {} --workload {} --commit {} --faults {}`; the store is left in {}",
        args.seed,
        args.seed,
        cycle + 1,
        format!("{:?}", args.workload).to_lowercase(),
        format!("{:?}", args.commit).to_lowercase(),
        format!("{:?}", args.faults).to_lowercase(),
        kept.display()
    );
    if fs.is_none() {
        std::process::exit(2);
    }
    Ok(())
}
