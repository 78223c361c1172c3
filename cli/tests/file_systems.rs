//! Stores on the file systems users pick (ext4, XFS, btrfs), each a fresh loop-mounted image
//! (`tusk_cli::crashtest::scratch_fs`), through the library and through `tusk crashtest --fs`
//! and `tusk bench --fs`. Where this machine cannot make or mount one, it is skipped, and only
//! with the reason `scratch_fs::unavailable` gives in this same environment: `.ci/run` runs
//! these tests again with `TUSK_FS_PROGRAM_PATH` hiding xfsprogs and btrfs-progs, as on a
//! fresh machine, and then every skip is checked against that reason.

use std::path::Path;
use std::process::Command;

use tusk::{Commit, Options, Store};
use tusk_cli::crashtest::scratch_fs::{self, unavailable, FileSystem, Prepared, ScratchFs, MIN_IMAGE_MIB, PROGRAM_PATH_VAR};

/// Mounts `fs` in a fresh folder, or says why it cannot.
fn scratch(fs: FileSystem, parent: &Path) -> Option<ScratchFs> {
    match scratch_fs::prepare(fs, parent, MIN_IMAGE_MIB).unwrap_or_else(|e| panic!("{fs}: {e}")) {
        Prepared::Mounted(scratch) => Some(scratch),
        Prepared::Unavailable(why) => {
            assert_skip_reason(fs, &why);
            eprintln!("{fs}: skipped: {why}");
            None
        }
    }
}

/// A skip's reason is one line, and it is the reason [`unavailable`] gives in this
/// environment; where that gives none, only a refused `mkfs` or `mount` may skip.
fn assert_skip_reason(fs: FileSystem, why: &str) {
    assert!(!why.is_empty() && !why.contains('\n'), "{fs}: one line: {why:?}");
    match unavailable(fs) {
        Some(expected) => assert_eq!(why, expected, "{fs}"),
        None => assert!(why.starts_with("cannot mount an image here: "), "{fs} is available here, yet skipped: {why}"),
    }
}

fn tusk(args: &[&str], env: &[(&str, &Path)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tusk"));
    command.args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("run tusk");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Whether `lsattr -d` shows the no-copy-on-write attribute (`C`) on `path`.
fn is_nocow(path: &std::path::Path) -> bool {
    let out = Command::new("lsattr").arg("-d").arg(path).output().expect("lsattr (e2fsprogs) runs");
    assert!(out.status.success(), "lsattr {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().is_some_and(|flags| flags.contains('C'))
}

/// On btrfs the log is written in place: its folder, partitions and segments carry the
/// no-copy-on-write attribute (a Sync commit's fdatasync then allocates no new extent; found
/// by `tusk crashtest --fs all`, where btrfs acknowledged a sixth of XFS's commits). Every
/// file system recovers what was committed.
#[test]
fn logs_are_written_in_place_on_btrfs_and_every_file_system_recovers() {
    let parent = tempfile::tempdir().unwrap();
    for fs in FileSystem::ALL {
        let Some(scratch) = scratch(fs, parent.path()) else { continue };
        let dir = scratch.path().join("store");
        let options = Options { heap_capacity: 16 << 20, ..Options::default() };
        let store = Store::open(&dir, options.clone()).unwrap();
        let (p, _) = store
            .transact(Commit::Sync, |tx| {
                let p = tx.alloc(8 * 100)?;
                tx.set_root("words", p)?;
                Ok(p)
            })
            .unwrap();
        for i in 0..100u64 {
            store.transact(Commit::Sync, |tx| tx.write_u64_at(p, i * 8, i * 3)).unwrap();
        }
        store.close().unwrap();
        let log = dir.join("log");
        let segment = std::fs::read_dir(log.join("p0000")).ok().and_then(|mut d| d.next()).map(|e| e.unwrap().path());
        let in_place = is_nocow(&log) && segment.as_deref().is_none_or(is_nocow);
        assert_eq!(in_place, fs == FileSystem::Btrfs, "{fs}: log folder and segments no-copy-on-write only on btrfs");
        let store = Store::open(&dir, options).unwrap();
        let (words, _) = store.transact(Commit::Async, |tx| (0..100u64).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<_>, _>>()).unwrap();
        assert_eq!(words, (0..100u64).map(|i| i * 3).collect::<Vec<_>>(), "{fs}");
        store.close().unwrap();
        scratch.remove().unwrap();
    }
}

/// `crashtest --fs all`: a summary for every file system this machine can mount (with no
/// image or mount point left behind), and a one-line reason for every one it cannot.
#[test]
fn crashtest_on_every_file_system_runs_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&[
        "crashtest", "--fs", "all", "--cycles", "2", "--faults", "all", "--seed", "11", "--max-run-ms", "60", "--json", "--dir",
        dir.path().to_str().unwrap(),
    ], &[]);
    assert!(ok, "{out}\n{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    assert_eq!(lines.len(), 3, "one object a file system: {out}");
    for (line, fs) in lines.iter().zip(FileSystem::ALL) {
        assert_eq!(line["fs"], fs.name(), "{line}");
        match line["skipped"].as_str() {
            Some(why) => assert_skip_reason(fs, why),
            None => {
                assert!(unavailable(fs).is_none(), "{fs} ran where it is unavailable: {line}");
                assert_eq!(line["cycles"], 2, "{line}");
                assert_eq!(line["lost_acknowledged"], 0, "{line}");
                assert_eq!(line["invariant_violations"], 0, "{line}");
            }
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "images and mount points are removed");
}

/// `tusk bench --fs all txn ...` runs the benchmark with its stores on a fresh ext4, XFS and
/// btrfs in turn, each one's JSON lines after a line naming it; a file system this machine
/// cannot make or mount gets a line with its reason instead, and the others still run. Nothing
/// is left behind in --dir.
#[test]
fn bench_on_scratch_file_systems_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&bench_args("all", dir.path()), &[]);
    assert!(ok, "{out}\n{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    let named: Vec<&str> = lines.iter().filter_map(|l| l["fs"].as_str()).collect();
    assert_eq!(named, ["ext4", "xfs", "btrfs"], "{out}");
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| l["fs"].is_string()) {
        let fs = FileSystem::ALL.into_iter().find(|fs| line["fs"] == fs.name()).unwrap();
        if let Some(why) = line["skipped"].as_str() {
            assert_skip_reason(fs, why);
            continue;
        }
        assert!(unavailable(fs).is_none(), "{fs} ran where it is unavailable: {line}");
        let run = &lines[i + 1];
        assert!(run["txn_per_s"].as_f64().is_some_and(|r| r > 0.0), "after {line}: {run}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "image and mount point are removed");
}

fn bench_args<'a>(fs: &'a str, dir: &'a Path) -> Vec<&'a str> {
    vec![
        "bench", "--fs", fs, "txn", "--commit", "sync", "--threads", "1", "--duration", "0.3", "--rounds", "1", "--heap-mib", "32", "--json", "--dir",
        dir.to_str().unwrap(),
    ]
}

/// On a machine without any formatting program (here: `TUSK_FS_PROGRAM_PATH` names an empty
/// folder), `--fs all` skips every file system with its reason and succeeds, for the
/// benchmark and the crash run alike; a file system named alone fails, saying why. Nothing is
/// left behind.
#[test]
fn without_the_programs_all_skips_with_reasons_and_one_named_fails() {
    let hidden = tempfile::tempdir().unwrap();
    let env = [(PROGRAM_PATH_VAR, hidden.path())];
    let dir = tempfile::tempdir().unwrap();
    let crash = |fs: &str| {
        tusk(&["crashtest", "--fs", fs, "--cycles", "1", "--seed", "3", "--max-run-ms", "60", "--json", "--dir", dir.path().to_str().unwrap()], &env)
    };
    for (ok, out, err) in [tusk(&bench_args("all", dir.path()), &env), crash("all")] {
        assert!(ok, "{out}\n{err}");
        let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
        assert_eq!(lines.len(), 3, "one line a file system: {out}");
        for (line, fs) in lines.iter().zip(FileSystem::ALL) {
            assert_eq!(line["fs"], fs.name(), "{line}");
            let why = line["skipped"].as_str().unwrap_or_else(|| panic!("{fs} not skipped: {line}"));
            assert!(!why.is_empty() && !why.contains('\n'), "{line}");
            // Where the programs are all that is missing, the reason names the one for `fs`.
            if unavailable(fs).is_none() {
                assert!(why.contains(&format!("mkfs.{fs} is not installed")), "{line}");
            }
        }
    }
    for fs in FileSystem::ALL {
        let (ok, out, err) = tusk(&bench_args(fs.name(), dir.path()), &env);
        assert!(!ok, "--fs {fs} ran without its programs: {out}");
        assert!(err.starts_with(&format!("tusk: cannot run the benchmark on {fs}: ")) && err.lines().count() == 1, "{err}");
        let (ok, out, err) = crash(fs.name());
        assert!(!ok, "crashtest --fs {fs} ran without its programs: {out}");
        assert!(err.starts_with(&format!("tusk: crash run on {fs}: ")) && err.lines().count() == 1, "{err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing is left behind");
}
