//! `tusk crashtest`: crash-recovery runs under fault models, and the hidden child command.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tusk::crashtest::child::ChildConfig;
use tusk::crashtest::{self, CommitChoice, Config, Fault, Workload};

use super::{CliResult, IoAt};

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
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
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

pub fn run(args: CrashtestArgs) -> CliResult {
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
    let (dir, temp) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new().prefix("tusk-crashtest-").tempdir_in(".").at(Path::new("."))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let exe = std::env::current_exe()?;
    let config = Config { cycles: args.cycles, seed: args.seed, workload, commit, faults, max_run_ms: args.max_run_ms, ..Config::new(exe, dir.clone()) };

    let bar = if args.json { ProgressBar::hidden() } else { ProgressBar::new(args.cycles) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} cycle {pos}/{len} [{bar:30}] {elapsed} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let summary = crashtest::run(&config, |c| {
        bar.inc(1);
        bar.set_message(format!("{} acks, {}: LSN {} in {:.0} ms", c.acknowledged, c.fault.name(), c.recovered_lsn, c.recovery_ms));
    })?;
    bar.finish_and_clear();

    if args.json {
        outln!("{}", summary.to_json());
    } else {
        let faults: Vec<String> = summary.per_fault.iter().map(|(f, n)| format!("{} {n}", f.name())).collect();
        outln!("crash run: workload {:?}, commit {}, seed {}", workload, commit.name(), args.seed);
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
    if let Some((cycle, fault, why)) = &summary.failure {
        for w in why {
            eprintln!("tusk crashtest: cycle {cycle} ({}): {w}", fault.name());
        }
        // Keep the directory for inspection.
        let kept = temp.map(|t| t.keep()).unwrap_or(dir);
        eprintln!(
            "tusk crashtest: FAILED at seed {} cycle {cycle}; replay with `tusk crashtest --seed {} --cycles {} --workload {} --commit {} --faults {}`; the store is left in {}",
            args.seed,
            args.seed,
            cycle + 1,
            format!("{:?}", args.workload).to_lowercase(),
            commit.name(),
            format!("{:?}", args.faults).to_lowercase(),
            kept.join("store").display()
        );
        std::process::exit(2);
    }
    Ok(())
}
