//! The `tusk` command: the demo, benchmarks and their peers, inspect / recover, and crash
//! runs. Everything the user sees is printed here, nowhere below (the library `tusk` and its
//! crates print nothing).
//!
//! [`crashtest`] is the crash-run harness (child, fault models, verifier, scratch file
//! systems) behind `tusk crashtest`, public for this package's tests.

/// `println!` for the command's output. Rust's `println!` panics when stdout is closed
/// (`tusk inspect DIR | head`); this ends the command quietly instead (see [`stdout_failed`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::stdout_failed(e);
        }
    }};
}

mod bench_batch;
mod bench_gpu;
mod bench_index;
mod bench_peers;
mod bench_reopen;
mod bench_catchup;
mod bench_replicated;
mod bench_snapshot;
mod bench_store;
mod bench_txn;
mod crash_child;
pub mod crashtest;
mod crashtest_command;
mod crashtest_group;
mod demo;
mod demo_bank;
mod demo_gpu;
mod demo_index;
mod demo_replicated;
mod demo_snapshot;
mod group;
mod group_bank;
mod inspect;
mod key_orders;
mod page_dists;
mod report;
mod svg_plot;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use crashtest::scratch_fs::{self, FileSystem, Prepared};

#[derive(Parser)]
#[command(name = "tusk", version, about = "Embedded, durable, transactional in-memory index store")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load data, run a mixed transactional workload, reopen (recovering) and verify.
    Demo(demo::DemoArgs),
    /// Show what is on disk and what recovery would do, changing nothing.
    Inspect(inspect::InspectArgs),
    /// Run recovery on a store directory and report it.
    Recover(inspect::RecoverArgs),
    /// Benchmarks (print a table; one JSON object with --json).
    Bench {
        /// Run the benchmark on a fresh file system of this kind (`all`: on each in turn): an
        /// image in the bench's --dir (or the current directory), formatted, mounted through a
        /// loop device, with the stores inside it; unmounted and removed afterwards (needs root).
        /// With `all`, a file system this machine cannot make or mount is skipped with its
        /// reason; one named alone is then an error.
        #[arg(long, value_enum)]
        fs: Option<FsArg>,
        /// Size of the --fs image in MiB (sparse: only what the benchmark writes takes space).
        #[arg(long, default_value_t = 16384)]
        fs_image_mib: u64,
        #[command(subcommand)]
        bench: Bench,
    },
    /// Crash-recovery runs: crash a child under fault models, recover, verify, repeat.
    Crashtest(crashtest_command::CrashtestArgs),
    /// Child process of the kill tests: commits and reports acknowledgements on stdout.
    #[command(hide = true)]
    CrashChild(crash_child::ChildArgs),
    /// Child process of `tusk crashtest`.
    #[command(hide = true)]
    CrashtestChild(crashtest_command::CrashtestChildArgs),
    /// Child process of `tusk bench peers` (reopen-kill): writes to a store until killed.
    #[command(hide = true)]
    PeersChild(bench_peers::ChildArgs),
}

#[derive(Subcommand, Clone)]
enum Bench {
    /// Transaction throughput and commit latency (the Hathi workload).
    Txn(bench_txn::TxnArgs),
    /// Recovery time of a checkpointed heap plus log.
    Recovery(bench_store::RecoveryArgs),
    /// Checkpoint write rate, its cost to transactions, and log space under skew.
    Checkpoint(bench_store::CheckpointArgs),
    /// The B-link tree and the ART against BTreeMap and congee, over six key orders.
    Index(bench_index::IndexArgs),
    /// Snapshots for query readers: memcpy, incremental, fork and Auto over seven update
    /// distributions; snapshot time against size; queries on each kind.
    Snapshot(bench_snapshot::SnapshotArgs),
    /// The GPU mirror: batch lookups, ranges and syncs against the CPU engine.
    Gpu(bench_gpu::GpuArgs),
    /// tusk against SQLite, LMDB, redb and fjall on the same work, durability matched.
    Peers(bench_peers::PeersArgs),
    /// B-link `apply_batch` of random upserts into a loaded tree, a transaction per batch.
    Batch(bench_batch::BatchArgs),
    /// `Sync` commits on a replicated group on loopback against one store alone.
    Replicated(bench_replicated::ReplicatedArgs),
    /// A follower far behind a replicated group catches up by snapshot, against the disk's
    /// sequential write rate.
    Catchup(bench_catchup::CatchupArgs),
}

/// The file systems of `--fs` (`tusk crashtest`, `tusk bench`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FsArg {
    Ext4,
    Xfs,
    Btrfs,
    All,
}

impl FsArg {
    pub fn file_systems(self) -> Vec<FileSystem> {
        match self {
            FsArg::Ext4 => vec![FileSystem::Ext4],
            FsArg::Xfs => vec![FileSystem::Xfs],
            FsArg::Btrfs => vec![FileSystem::Btrfs],
            FsArg::All => FileSystem::ALL.to_vec(),
        }
    }

    /// Whether a file system this machine cannot make or mount is skipped, with its reason
    /// (`all`: the others still run), rather than an error (one named by the user).
    pub fn skips_unavailable(self) -> bool {
        matches!(self, FsArg::All)
    }
}

impl Bench {
    /// The benchmark's `--dir`: where its stores go.
    fn dir_mut(&mut self) -> &mut Option<PathBuf> {
        match self {
            Bench::Txn(a) => &mut a.out.dir,
            Bench::Recovery(a) => &mut a.out.dir,
            Bench::Checkpoint(a) => &mut a.out.dir,
            Bench::Index(a) => &mut a.out.dir,
            Bench::Snapshot(a) => &mut a.out.dir,
            Bench::Gpu(a) => &mut a.out.dir,
            Bench::Peers(a) => &mut a.out.dir,
            Bench::Batch(a) => &mut a.out.dir,
            Bench::Replicated(a) => &mut a.out.dir,
            Bench::Catchup(a) => &mut a.out.dir,
        }
    }

    /// Whether the benchmark prints JSON lines.
    fn json(&self) -> bool {
        match self {
            Bench::Recovery(a) => a.out.json,
            Bench::Checkpoint(a) => a.out.json,
            Bench::Txn(a) => a.out.json,
            Bench::Index(a) => a.out.json,
            Bench::Snapshot(a) => a.out.json,
            Bench::Gpu(a) => a.out.json,
            Bench::Peers(a) => a.out.json,
            Bench::Batch(a) => a.out.json,
            Bench::Replicated(a) => a.out.json,
            Bench::Catchup(a) => a.out.json,
        }
    }

    fn run(self) -> CliResult {
        match self {
            Bench::Txn(args) => bench_txn::run(args),
            Bench::Recovery(args) => bench_store::recovery(args),
            Bench::Checkpoint(args) => bench_store::checkpoint(args),
            Bench::Index(args) => bench_index::run(args),
            Bench::Snapshot(args) => bench_snapshot::run(args),
            Bench::Gpu(args) => bench_gpu::run(args),
            Bench::Peers(args) => bench_peers::run(args),
            Bench::Batch(args) => bench_batch::run(args),
            Bench::Replicated(args) => bench_replicated::run(args),
            Bench::Catchup(args) => bench_catchup::run(args),
        }
    }
}

/// Runs `bench` with its stores on a fresh file system of each of `fs`, one after the other
/// (each prints its own figures): the image goes where the bench's `--dir` points (or the
/// current directory), the bench's `--dir` becomes the mount point. With `all`, a file system
/// this machine cannot make or mount is skipped with its one-line reason, as `tusk crashtest
/// --fs all` does; a file system named alone is an error then.
fn bench_on(fs: FsArg, image_mib: u64, bench: Bench) -> CliResult {
    if matches!(&bench, Bench::Recovery(a) if a.prepare_only) {
        return Err("--prepare-only keeps its store in --dir, which --fs unmounts and removes afterwards: use one or the other".into());
    }
    for file_system in fs.file_systems() {
        let mut run = bench.clone();
        let dir = run.dir_mut();
        let parent = dir.clone().unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&parent).at(&parent)?;
        let images = tempfile::Builder::new().prefix("tusk-bench-fs-").tempdir_in(&parent).at(&parent)?;
        let cannot = |why: &dyn std::fmt::Display| format!("cannot run the benchmark on {file_system}: {why}");
        let scratch = match scratch_fs::prepare(file_system, images.path(), image_mib).map_err(|e| cannot(&e))? {
            Prepared::Mounted(scratch) => scratch,
            Prepared::Unavailable(why) if fs.skips_unavailable() => {
                if bench.json() {
                    outln!("{}", serde_json::json!({ "fs": file_system.name(), "skipped": why }));
                } else {
                    outln!("file system: {file_system}: skipped: {why}");
                }
                continue;
            }
            Prepared::Unavailable(why) => return Err(cannot(&why).into()),
        };
        // What follows is on this file system: a line of the table, or of the JSON lines.
        if bench.json() {
            outln!("{}", serde_json::json!({ "fs": file_system.name() }));
        } else {
            outln!("file system: {file_system}");
        }
        *dir = Some(scratch.path().to_path_buf());
        let result = run.run();
        scratch.remove().map_err(|e| format!("{file_system}: cleaning up: {e}"))?;
        result?;
    }
    Ok(())
}

/// The I/O backend, as a command-line choice.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum IoChoice {
    Auto,
    Uring,
    Sync,
}

impl IoChoice {
    pub fn to_io(self) -> tusk::Io {
        match self {
            IoChoice::Auto => tusk::Io::Auto,
            IoChoice::Uring => tusk::Io::Uring,
            IoChoice::Sync => tusk::Io::Sync,
        }
    }
}

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// What a closed stdout unwinds with (see [`stdout_failed`]); `main` ends quietly on it.
pub struct StdoutClosed;

/// A write to stdout failed. A reader that went away (a broken pipe: `| head`) ends the
/// command quietly and successfully, as it does for `cat` or `rg`; anything else is an error.
/// The end is an unwind, not `exit`, so destructors still run on the way out: a run's
/// temporary directory is removed, a crash run's scratch file system unmounted.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // resume_unwind: no panic message, no hook.
        std::panic::resume_unwind(Box::new(StdoutClosed));
    }
    eprintln!("tusk: writing to standard output: {e}");
    std::process::exit(1);
}

/// Whether `e`, or an error it wraps, is a broken pipe: the reader of stdout went away
/// (the crash child's and peers child's acknowledgements, written with `writeln!` and `?`).
pub fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) {
            return true;
        }
        next = err.source();
    }
    false
}

pub fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Recover(args) => inspect::recover(args),
        Command::Bench { fs: None, bench, .. } => bench.run(),
        Command::Bench { fs: Some(fs), fs_image_mib, bench } => bench_on(fs, fs_image_mib, bench),
        Command::CrashChild(args) => crash_child::run(args),
        Command::Crashtest(args) => crashtest_command::run(args),
        Command::CrashtestChild(args) => crashtest_command::child(args),
        Command::PeersChild(args) => bench_peers::child(args),
    }
}

/// Adds the path an I/O error concerns to its message, keeping its kind: every I/O error the
/// command prints names its file or directory.
pub trait IoAt<T> {
    fn at(self, path: &std::path::Path) -> std::io::Result<T>;
}

impl<T> IoAt<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> std::io::Result<T> {
        self.map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }
}

/// Where a benchmark's stores go and how it reports: the options every store bench shares.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchOutput {
    /// Where the stores go (the disk to measure): each run gets a fresh directory inside it,
    /// removed afterwards (default: the current directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON (one object a line) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// [`BenchOutput`] and where the benches that chart their figures write the charts.
#[derive(clap::Args, Debug, Clone)]
pub struct ChartedOutput {
    #[command(flatten)]
    pub out: BenchOutput,
    /// Write the figures as SVG charts into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

impl std::ops::Deref for ChartedOutput {
    type Target = BenchOutput;
    fn deref(&self) -> &BenchOutput {
        &self.out
    }
}

impl std::ops::DerefMut for ChartedOutput {
    fn deref_mut(&mut self) -> &mut BenchOutput {
        &mut self.out
    }
}

/// An O_DIRECT-aligned buffer of `len` bytes holding a fixed non-zero pattern: what the
/// disk probes and streams of the benches write.
pub fn patterned_buf(len: usize) -> tusk_storage::io::AlignedBuf {
    let mut buf = tusk_storage::io::AlignedBuf::new();
    buf.extend_zeros(len);
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    buf
}

/// Every file of a store directory, recursively, in name order, but its `LOCK` (for tusk's
/// stores: the checkpoint segments, manifests and log segments recovery reads).
pub fn store_files(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir).at(dir)? {
            let entry = entry.at(dir)?;
            if entry.file_type().at(&entry.path())?.is_dir() {
                walk(&entry.path(), out)?;
            } else if entry.file_name() != "LOCK" {
                out.push(entry.path());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// A directory for one benchmark run: a fresh one inside the directory given with `--dir`
/// (the disk to measure) or the current one, removed afterwards. Every run starts from an
/// empty store, so a bench that runs several modes or rounds never reopens an earlier
/// run's store (whose heap already holds that run's data).
pub struct BenchDir(tempfile::TempDir);

impl BenchDir {
    pub fn new(parent: Option<PathBuf>) -> std::io::Result<BenchDir> {
        let parent = parent.unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&parent).at(&parent)?;
        Ok(BenchDir(tempfile::Builder::new().prefix("tusk-bench-").tempdir_in(&parent).at(&parent)?))
    }

    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}
