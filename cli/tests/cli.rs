//! The command line: demo end to end, and inspect / recover on a store with a checkpoint,
//! a log after it and a torn tail.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

use tusk::{Commit, Options, Store};

fn tusk(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tusk")).args(args).output().expect("run tusk");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `tusk bench txn ARGS --dir DIR --json`, which must succeed; its JSON.
fn bench_txn_json(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "txn"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--dir", dir.to_str().unwrap(), "--json"]);
    let (ok, out, err) = tusk(&all);
    assert!(ok, "{err}");
    json(&out)
}

#[test]
fn demo_runs_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("demo");
    let (ok, out, err) = tusk(&["demo", "--dir", store_dir.to_str().unwrap(), "--seconds", "1", "--accounts", "20000"]);
    assert!(ok, "demo failed: {out}\n{err}");
    assert!(out.contains("money conserved         yes"), "{out}");
    assert!(out.contains("every transfer present  yes"), "{out}");
    for mode in ["memcpy", "incremental", "fork", "auto"] {
        assert!(out.lines().any(|l| l.starts_with(mode) && l.contains("pass (")), "no checked {mode} snapshot row: {out}");
    }
    assert!(out.contains("snapshots checked (money, validators, counts: pass)"), "{out}");
    // A second run replaces the previous demo store.
    let (ok, out, err) = tusk(&["demo", "--dir", store_dir.to_str().unwrap(), "--seconds", "0.5", "--accounts", "5000"]);
    assert!(ok, "second demo failed: {out}\n{err}");
}

#[test]
fn demo_refuses_a_directory_that_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("precious.txt"), b"keep me").unwrap();
    let (ok, _, err) = tusk(&["demo", "--dir", dir.path().to_str().unwrap(), "--seconds", "0.2", "--accounts", "100"]);
    assert!(!ok);
    assert!(err.contains("not a tusk store"), "{err}");
    assert!(dir.path().join("precious.txt").exists());
}

#[test]
fn inspect_and_recover_report_checkpoint_log_and_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options { heap_capacity: 64 << 20, chunk_size: 64 << 10, checkpoint_interval: None, ..Options::default() };
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let (p, _) = store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(1 << 20)?;
            tx.set_root("x", p)?;
            Ok(p)
        })
        .unwrap();
    for i in 0..100u64 {
        store.transact(Commit::Sync, |tx| tx.write_u64_at(p, i * 8, i)).unwrap();
    }
    let ckpt = store.checkpoint().unwrap();
    let mut last = 0;
    for i in 0..50u64 {
        last = store.transact(Commit::Sync, |tx| tx.write_u64_at(p, i * 8, i + 1000)).unwrap().1.unwrap();
    }
    store.close().unwrap();
    // A torn tail: garbage after the last flush of the last segment of the partition that
    // holds the last commit (which partition this thread writes depends on how many stores
    // the other tests of this process opened before: it was hard-wired to p0000 and failed
    // when the thread's slot fell on p0001).
    let partitions = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let partition = common::partition_of_lsn(dir.path(), partitions, last).expect("the last commit is in some partition's log");
    let victim = common::segments(dir.path(), partition).last().unwrap().clone();
    // (over the zeros the writer may have written ahead of its flushes)
    let end = common::flush_end(&victim);
    let f = std::fs::OpenOptions::new().write(true).open(&victim).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x5A; 100], end).unwrap();
    drop(f);
    let len = std::fs::metadata(&victim).unwrap().len();

    let (ok, out, err) = tusk(&["inspect", dir.path().to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["checkpoint"]["epoch"], ckpt.epoch);
    assert_eq!(v["durable_lsn"], last);
    assert_eq!(v["gap_at"], serde_json::Value::Null);
    assert_eq!(v["torn_tails"].as_array().unwrap().len(), 1);
    assert_eq!(v["torn_tails"][0]["offset"], end);
    assert_eq!(v["torn_tails"][0]["bytes"], len - end);
    assert!(v["records_to_replay"].as_u64().unwrap() >= 50);
    assert!(!v["segments"].as_array().unwrap().is_empty());
    assert_eq!(std::fs::metadata(&victim).unwrap().len(), len, "inspect changes nothing");

    let (ok, out, _) = tusk(&["inspect", dir.path().to_str().unwrap()]);
    assert!(ok && out.contains("torn tail"), "{out}");

    let (ok, out, err) = tusk(&["recover", dir.path().to_str().unwrap(), "--json", "--heap-mib", "64"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["recovered_lsn"], last);
    assert_eq!(v["torn_tails_cut"], 1);
    assert_eq!(v["checkpoint_epoch"], ckpt.epoch);
    assert_eq!(std::fs::metadata(&victim).unwrap().len(), end, "recover cut the tail");

    let store = Store::open(dir.path(), options).unwrap();
    let (words, _) = store.transact(Commit::Async, |tx| (0..100u64).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<_>, _>>()).unwrap();
    assert_eq!(words, (0..100u64).map(|i| if i < 50 { i + 1000 } else { i }).collect::<Vec<_>>());
}

/// Found running `bench txn --dir D --commit partition,sync`: the second mode reopened the
/// first mode's store in D, whose heap already held the word array ("heap exhausted").
#[test]
fn bench_txn_runs_every_mode_on_a_fresh_store_inside_the_given_dir() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_txn_json(dir.path(), &["--commit", "async,off", "--rounds", "2", "--duration", "0.2", "--heap-mib", "64"]);
    assert!(v.to_string().contains("async") && v.to_string().contains("off"), "{v}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the runs' stores are removed");
}

/// `--max-log-mib` bounds the run's log: a bound far under what the run writes makes the
/// store checkpoint during the run to trim it, where the default bound (1 GiB) and its
/// 10-second interval take none in a second.
#[test]
fn bench_txn_max_log_mib_sets_the_logs_space_bound() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["--commit", "async", "--duration", "1", "--heap-mib", "16"];
        args.extend_from_slice(extra);
        let v = bench_txn_json(dir.path(), &args);
        let row = v.as_array().map_or(v.clone(), |rows| rows[0].clone());
        (row["checkpoints"].as_u64().unwrap_or_else(|| panic!("no checkpoint count: {row}")), row["commits"].as_u64().unwrap(), row)
    };
    let (bounded, commits, row) = run(&["--max-log-mib", "2"]);
    assert!(commits > 0, "{row}");
    assert!(bounded >= 1, "a 2 MiB bound took no checkpoint in {commits} commits: {row}");
    assert_eq!(row["max_log_mib"], 2, "{row}");
    let (unbounded, _, row) = run(&[]);
    assert_eq!(unbounded, 0, "the default bound took a checkpoint: {row}");
}

/// `floor` runs the words on a bare heap, no store: it commits every "transaction" at its first
/// attempt, writes no directory, and is the denominator of `off/floor`.
#[test]
fn bench_txn_floor_runs_without_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_txn_json(dir.path(), &["--commit", "floor,off", "--threads", "1,2", "--duration", "0.2", "--heap-mib", "16"]);
    let modes = v["modes"].as_array().expect("modes");
    let floors: Vec<_> = modes.iter().filter(|m| m["commit"] == "floor").collect();
    assert_eq!(floors.len(), 2, "a floor row per thread count: {v}");
    for m in floors {
        assert!(m["txn_per_s"].as_f64().unwrap() > 0.0 && m["abort_rate"].as_f64() == Some(0.0), "{m}");
    }
    let ratio = v["ratios"]["off/floor@1"].as_f64().expect("off/floor@1");
    assert!(ratio > 0.0 && ratio.is_finite(), "{v}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left in the directory");
}

/// `off-io` replays the round's `async` log I/O beside a logless run: it reports the flushes
/// it made and both ratios, and refuses to run without an `async` run before it.
#[test]
fn bench_txn_off_io_replays_the_async_runs_log_io() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_txn_json(dir.path(), &["--commit", "async,off,off-io", "--duration", "0.3", "--heap-mib", "16"]);
    let replayed = v["modes"].as_array().unwrap().iter().find(|m| m["commit"] == "off-io").expect("an off-io run").clone();
    assert_eq!(replayed["io"], "replayed", "{v}");
    assert!(replayed["flushes"].as_u64().unwrap() > 0, "the replay flushed: {v}");
    for ratio in ["off-io/off", "async/off-io"] {
        assert!(v["ratios"][ratio].as_f64().unwrap() > 0.0, "{ratio}: {v}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the runs' stores and replay files are removed");
    let (ok, _, err) = tusk(&["bench", "txn", "--commit", "off-io", "--duration", "0.1", "--heap-mib", "16"]);
    assert!(!ok);
    assert!(err.contains("list async before it"), "{err}");
}

/// `bench checkpoint` compares the checkpoints' cost to transactions with that of a plain
/// stream of their bytes at their rate, measured in the same round.
#[test]
fn bench_checkpoint_reports_the_plain_stream_beside_the_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&[
        "bench", "checkpoint", "--heap-mib", "16", "--duration", "0.3", "--log-seconds", "0.2", "--rounds", "1", "--dir",
        dir.path().to_str().unwrap(), "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert!(v["checkpoints_during"].as_u64().unwrap() >= 1, "{v}");
    for field in ["stream_mb_per_s", "txn_per_s_during_stream", "txn_ratio_during_stream", "checkpoint_vs_stream_txn"] {
        assert!(v[field].as_f64().unwrap() > 0.0, "{field}: {v}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the stores and the stream's file are removed");
}

/// `bench recovery --prepare-only` keeps the store it built in --dir itself (every other
/// bench run's store is a temporary directory inside --dir), ready for `tusk recover`.
#[test]
fn bench_recovery_prepare_only_leaves_a_recoverable_store_in_the_dir() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (ok, _, err) = tusk(&["bench", "recovery", "--heap-mib", "8", "--log-mib", "1", "--prepare-only", "--dir", store.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, err) = tusk(&["recover", store.to_str().unwrap(), "--json", "--heap-mib", "64"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert!(v["recovered_lsn"].as_u64().unwrap() > 0 && v["checkpoint_epoch"].as_u64().is_some(), "{v}");
    // Its newest checkpoint loaded: the replay's first pass ran beside the load, timed there.
    assert_eq!(v["first_pass_beside_load"], true, "{v}");
    assert!(v["log_pass_s"].as_f64().is_some_and(|s| s > 0.0), "{v}");
    // Opened on demand (its log is short): chunks were left to be read; `--whole` reads all.
    assert_eq!(v["heap_load"], "on-demand", "{v}");
    assert!(v["chunks_absent"].as_u64().is_some_and(|n| n > 0), "{v}");
    let (ok, out, err) = tusk(&["recover", store.to_str().unwrap(), "--json", "--heap-mib", "64", "--whole"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!((v["heap_load"].as_str(), v["chunks_absent"].as_u64()), (Some("whole"), Some(0)), "{v}");
    let (ok, out, err) = tusk(&["inspect", store.to_str().unwrap(), "--json", "--no-indexes"]);
    assert!(ok, "{err}");
    assert_eq!(json(&out)["reopen"], "on-demand");
}

/// `bench recovery`'s reopen rows: per size, every (load, cache) pair timed to the first read
/// and to all chunks in, and the Hathi workload's speed after a cold reopen on demand.
#[test]
fn bench_recovery_reports_reopens_against_heap_size() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "recovery", "--heap-mib", "8", "--log-mib", "1", "--rounds", "1", "--reopen-mib", "8,16", "--reopen-log-mib", "1"];
    let (ok, out, err) = tusk(&[&args[..], &["--reopen-seconds", "0.3", "--json", "--dir", dir.path().to_str().unwrap()]].concat());
    assert!(ok, "{err}");
    let v = json(&out);
    let reopens = v["reopens"].as_array().unwrap();
    assert_eq!(reopens.len(), 2 * 4, "{v}");
    for r in reopens {
        let (open, first, all) = (r["open_s"].as_f64().unwrap(), r["first_read_s"].as_f64().unwrap(), r["all_in_s"].as_f64().unwrap());
        assert!(0.0 < open && open <= first && first <= all, "{r}");
        assert!(r["rss_all_in_mib"].as_f64().unwrap() > 0.0, "{r}");
    }
    let speeds = v["speed_after_reopen"].as_array().unwrap();
    assert_eq!(speeds.len(), 2, "{v}");
    assert!(speeds.iter().all(|s| s["warm_txn_per_s"].as_f64().unwrap() > 0.0 && !s["samples"].as_array().unwrap().is_empty()), "{v}");
}

/// A mode that waits for the disk reports both floors: the append probe and the overwrite
/// probe (flushes into zero-ahead space are overwrites), each with its ratio to the p50.
#[test]
fn bench_txn_reports_append_and_overwrite_probes() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_txn_json(dir.path(), &["--commit", "partition", "--rounds", "1", "--duration", "0.2", "--heap-mib", "16"]);
    for key in ["write_sync_p50_us", "p50_over_write_sync", "overwrite_sync_p50_us", "p50_over_overwrite_sync"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key} missing: {v}");
    }
}

/// Every run with a log says how many commits a flush carried and how long a flush's write
/// took: what group commit is read by.
#[test]
fn bench_txn_reports_commits_per_flush_and_the_flush_time() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_txn_json(dir.path(), &["--commit", "sync,async", "--threads", "2", "--duration", "0.2", "--heap-mib", "16"]);
    for mode in v["modes"].as_array().unwrap() {
        let (commits, flushes) = (mode["commits"].as_u64().unwrap(), mode["flushes"].as_u64().unwrap());
        assert!(commits > 0 && flushes > 0, "{mode}");
        let per_flush = mode["commits_per_flush"].as_f64().unwrap_or_else(|| panic!("no commits_per_flush: {mode}"));
        assert!((per_flush - commits as f64 / flushes as f64).abs() < 1e-9, "{mode}");
        assert!(mode["flush_write_us"].as_f64().is_some_and(|us| us > 0.0), "no flush time: {mode}");
    }
    let sync = v["modes"].as_array().unwrap().iter().find(|m| m["commit"] == "sync").unwrap();
    assert!(sync["commits_per_flush"].as_f64().unwrap() <= 2.0 + 1e-9, "two Sync committers put more than two commits in a flush on average: {sync}");
}

/// `bench peers` runs every store in both durability classes on the same keys, every
/// workload (one-key loads, scans, count+sum ranges, reopening after a kill included), and
/// each JSON line carries the fields the comparison is read by.
#[test]
fn bench_peers_measures_every_store_and_class() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let (ok, out, err) = tusk(&[
        "bench", "peers", "--keys", "5000", "--duration", "0.2", "--lookups", "2000", "--threads", "1,2",
        "--load1-keys", "40", "--load1-keys-nosync", "500", "--scans", "300", "--ranges", "50",
        "--txn-keys", "10,100", "--txn-total", "400",
        "--dir", dir.path().to_str().unwrap(), "--json", "--plot", plots.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    let workloads = [("load", 1), ("load1", 1), ("txn10", 1), ("txn100", 1), ("hathi", 1), ("hathi", 2), ("lookup", 1), ("scan100", 1), ("range1000", 1)];
    for store in ["tusk", "sqlite", "lmdb", "redb", "fjall"] {
        for class in ["sync", "nosync"] {
            for (workload, threads) in workloads {
                let found = lines.iter().find(|v| v["store"] == store && v["durability"] == class && v["workload"] == workload && v["threads"] == threads);
                let v = found.unwrap_or_else(|| panic!("{store} {class} {workload} @{threads} missing: {out}"));
                assert!(v["ops_per_s"].as_f64().unwrap() > 0.0, "{v}");
                if workload != "load" {
                    assert!(v["p50_us"].as_f64().unwrap() > 0.0 && v["p99_us"].as_f64().unwrap() >= v["p50_us"].as_f64().unwrap(), "{v}");
                }
            }
            // Bytes per key, and seconds to reopen after a clean close and after a kill.
            for workload in ["bytes/key", "reopen", "reopen-kill"] {
                let found = lines.iter().find(|v| v["store"] == store && v["durability"] == class && v["workload"] == workload);
                let v = found.unwrap_or_else(|| panic!("{store} {class} {workload} missing: {out}"));
                assert!(v["value"].as_f64().unwrap() > 0.0, "{v}");
            }
        }
    }
    let svg = std::fs::read_to_string(plots.join("peers.svg")).unwrap();
    for label in ["sqlite", "hathi @2", "load1", "txn100", "scan100", "range1000", "reopen-kill"] {
        assert!(svg.lines().any(|l| l.trim() == label), "peers.svg lacks {label}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "the stores' directories are removed (plots stay)");
}

/// `--plot DIR` writes the figures of a run as SVG charts naming what they show.
#[test]
fn benches_write_their_figures_as_svg_charts() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let (ok, _, err) = tusk(&[
        "bench", "txn", "--commit", "async,off", "--threads", "1,2", "--duration", "0.2", "--heap-mib", "16",
        "--dir", dir.path().to_str().unwrap(), "--plot", plots.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = tusk(&[
        "bench", "index", "--keys", "20000", "--order", "shuffled", "--rounds", "1",
        "--dir", dir.path().to_str().unwrap(), "--plot", plots.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for (file, labels) in [
        ("txn.svg", &["async", "off", "1 thread", "2 threads", "p99, 2 threads"][..]),
        ("index.svg", &["lookup", "btree shuffled", "congee shuffled", "bytes per key"][..]),
    ] {
        let svg = std::fs::read_to_string(plots.join(file)).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{file}");
        for label in labels {
            assert!(svg.lines().any(|l| l.trim() == *label), "{file} lacks {label}");
        }
        assert!(svg.matches("<rect").count() > 4, "{file} has no bars");
    }
    let svg = std::fs::read_to_string(plots.join("txn_threads.svg")).unwrap();
    for label in ["Hathi workload: txn/s against threads", "threads", "async", "off", "linear from 1 thread"] {
        assert!(svg.lines().any(|l| l.trim() == label), "txn_threads.svg lacks {label}");
    }
    assert!(svg.matches("<polyline").count() >= 3, "txn_threads.svg has no lines");
}

#[test]
fn inspect_of_a_missing_directory_is_a_one_line_error() {
    let (ok, _, err) = tusk(&["inspect", "/nonexistent/tusk-store"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/tusk-store: no such store directory"), "{err}");
}

/// `bench gpu` on a machine without a GPU answers with the CPU engine (device figures null),
/// prints JSON per index and writes its chart with `--plot`.
#[test]
fn bench_gpu_without_a_gpu_reports_the_cpu_engine_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let (ok, out, err) = tusk(&[
        "bench", "gpu", "--keys", "20000", "--batch", "20000", "--ranges", "100", "--heap-mib", "32", "--rounds", "1",
        "--dir", dir.path().to_str().unwrap(), "--json", "--plot", plots.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(json).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in &rows {
        assert!(row["cpu_lookups_per_s"].as_f64().is_some_and(|x| x > 0.0), "{row}");
        assert!(row["sync_ms_1pct"].as_f64().is_some_and(|x| x >= 0.0), "{row}");
        if row["backend"].as_str().is_some_and(|b| b.starts_with("cpu")) {
            assert!(row["lookups_per_s"].is_null(), "no device figure without a GPU: {row}");
        }
    }
    let svg = std::fs::read_to_string(plots.join("gpu.svg")).expect("gpu.svg written");
    assert!(svg.contains("<svg") && svg.contains("point lookups"), "{svg}");
}

/// A closed stdout (`tusk inspect DIR | head -1`) ends the command quietly: no panic, no
/// message, a successful exit, in every subcommand that prints.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { heap_capacity: 16 << 20, ..Options::default() }).unwrap();
    store
        .transact(Commit::Sync, |tx| {
            let p = tx.alloc(64)?;
            tx.set_root("x", p)
        })
        .unwrap();
    store.close().unwrap();
    let store_dir = dir.path().to_str().unwrap();
    let bench_dir = dir.path().join("bench");
    let runs: [&[&str]; 3] = [
        &["inspect", store_dir],
        &["recover", store_dir],
        &["bench", "txn", "--commit", "off", "--duration", "0.1", "--heap-mib", "16", "--dir", bench_dir.to_str().unwrap()],
    ];
    for args in runs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tusk")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // The reader goes away before the command prints anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}\n{err}", out.status);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    }
    // The command ends by unwinding, so what it made on the way is cleaned up: a crash run
    // without --dir leaves no temporary directory behind.
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tusk"))
        .args(["crashtest", "--cycles", "2", "--max-run-ms", "40"])
        .current_dir(cwd.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0, "the run's temporary directory is removed");
}

/// Every subcommand that takes `--dir` creates it, and an I/O error names the path.
#[test]
fn bench_dirs_are_created_and_io_errors_name_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("not/yet/there");
    let (ok, out, err) = tusk(&[
        "bench", "checkpoint", "--heap-mib", "32", "--duration", "0.2", "--log-seconds", "0.2", "--rounds", "1", "--dir",
        nested.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(nested.is_dir());
    // A --dir that cannot be created: the message names it, on one line.
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let below = blocker.join("store");
    let (ok, _, err) = tusk(&["bench", "txn", "--commit", "off", "--duration", "0.1", "--dir", below.to_str().unwrap()]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(blocker.to_str().unwrap()), "{err}");
}

/// `bench index --txn-keys` takes a list: a row per transaction size, each naming its size,
/// and the table gives each row's rate against the smallest size's (1.00 for that one).
#[test]
fn bench_index_measures_a_row_per_transaction_size() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["bench", "index", "--index", "btree,art", "--order", "shuffled", "--inserts-only", "--keys", "20000", "--txn-keys", "1,100,20000", "--dir"];
    let mut args: Vec<&str> = base.to_vec();
    args.push(dir.path().to_str().unwrap());
    let (ok, table, err) = tusk(&args);
    assert!(ok, "{err}");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("btree") || l.starts_with("art")).collect();
    assert_eq!(rows.len(), 6, "{table}");
    for row in rows.iter().filter(|r| r.split_whitespace().nth(4) == Some("1")) {
        assert_eq!(row.split_whitespace().nth(7), Some("1.00"), "the smallest size is the base: {row}");
    }
    args.push("--json");
    let (ok, out, err) = tusk(&args);
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    let sizes: Vec<(String, u64)> = lines.iter().map(|l| (l["index"].as_str().unwrap().to_string(), l["txn_keys"].as_u64().unwrap())).collect();
    let expected: Vec<(String, u64)> = ["btree", "art"].iter().flat_map(|i| [1, 100, 20000].map(|n| (i.to_string(), n))).collect();
    assert_eq!(sizes, expected);
    assert!(lines.iter().all(|l| l["insert_per_s"].as_f64().is_some_and(|r| r > 0.0)), "{out}");
}

/// `bench batch` loads a tree (B-link or ART), applies its batches (checking that every new key landed) and
/// reports rates, log bytes per operation and memory, as a table or one JSON object.
#[test]
fn bench_batch_reports_rates_log_bytes_and_memory() {
    for index in ["btree", "art"] {
        let dir = tempfile::tempdir().unwrap();
        let (ok, out, err) = tusk(&["bench", "batch", "--index", index, "--keys", "50000", "--ops", "6000", "--rounds", "2", "--json", "--dir", dir.path().to_str().unwrap()]);
        assert!(ok, "{index}: {err}");
        let v = json(&out);
        assert_eq!((&v["bench"], &v["index"]), (&serde_json::json!("batch"), &serde_json::json!(index)));
        for field in ["bulk_load_per_s", "ops_per_s", "log_bytes_per_op", "tree_bytes", "peak_rss_bytes"] {
            assert!(v[field].as_f64().is_some_and(|x| x > 0.0), "{index} {field}: {v}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the store is removed");
    }
    // --beside: small transactions' rates beside the batches and alone; no log bytes per op.
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&["bench", "batch", "--keys", "50000", "--ops", "20000", "--rounds", "1", "--beside", "--json", "--dir", dir.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    let v = json(&out);
    // Beside a short batch the small thread may not get a commit in (it may start late).
    assert!(v["small_txn_per_s_beside"].as_f64().is_some_and(|x| x >= 0.0), "{v}");
    assert!(v["small_txn_per_s_alone"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(v["log_bytes_per_op"].is_null(), "{v}");
}

/// `tusk demo --nodes 3`: the bank on a replicated group; the leader killed halfway, the
/// others go on, the killed node rebuilds, and every node verifies. (8 s: the half after the
/// kill must outlast the election, about 1 s here, also on a loaded machine.)
#[test]
fn demo_on_three_nodes_survives_its_leaders_death() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("group");
    let (ok, out, err) = tusk(&["demo", "--nodes", "3", "--dir", store.to_str().unwrap(), "--seconds", "8", "--accounts", "2000", "--threads", "2"]);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("rebuilt from the group's log"), "{out}");
    assert!(out.contains("money conserved, every acknowledged transfer present, all 3 alike"), "{out}");
    let (ok, _, err) = tusk(&["demo", "--nodes", "2", "--dir", store.to_str().unwrap()]);
    assert!(!ok && err.contains("--nodes 3 or more"), "{err}");
}

/// `tusk bench replicated --json`: a line per thread count, the group against one store.
#[test]
fn bench_replicated_compares_the_group_with_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&["bench", "replicated", "--threads", "1,2", "--duration", "0.3", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    assert_eq!(lines.iter().map(|l| l["threads"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2]);
    for l in &lines {
        assert!(l["alone_per_s"].as_f64().unwrap() > 0.0 && l["group_per_s"].as_f64().unwrap() > 0.0, "{l}");
        let ratio = l["group_per_s"].as_f64().unwrap() / l["alone_per_s"].as_f64().unwrap();
        assert!((l["group_vs_alone"].as_f64().unwrap() - ratio).abs() < 1e-9, "{l}");
        assert!(l["group_p50_us"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the runs' stores are removed");
}

/// `tusk bench replicated --large-mib`: one transaction larger than an entry (in pieces),
/// alone and on the group, timed until it returns and until every node applied it.
#[test]
fn bench_replicated_times_a_transaction_larger_than_an_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&["bench", "replicated", "--large-mib", "20", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let l = json(&out);
    assert_eq!(l["large_mib"], 20);
    let (alone, group, applied) = (l["alone_s"].as_f64().unwrap(), l["group_s"].as_f64().unwrap(), l["all_applied_s"].as_f64().unwrap());
    assert!(alone > 0.0 && group > 0.0 && applied >= group, "{l}");
    assert!((l["group_vs_alone"].as_f64().unwrap() - alone / group).abs() < 1e-9, "{l}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the runs' stores are removed");
}

/// `tusk bench catchup --json`: the follower catches up by a snapshot (the bench fails if it
/// caught up from the log), and the rate is the snapshot's bytes over the catch-up time.
#[test]
fn bench_catchup_measures_a_snapshot_install_against_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&["bench", "catchup", "--mib", "16", "--rounds", "2", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let v = json(out.trim());
    let (bytes, seconds, rate, disk) = (v["snapshot_bytes"].as_f64().unwrap(), v["catchup_s"].as_f64().unwrap(), v["catchup_bytes_per_s"].as_f64().unwrap(), v["disk_bytes_per_s"].as_f64().unwrap());
    assert!(bytes >= (16 << 20) as f64, "the snapshot holds the 16 MiB the follower missed: {v}");
    assert!(seconds > 0.0 && rate > 0.0 && disk > 0.0, "{v}");
    assert!(v["loaded_s"].as_f64().unwrap() >= seconds, "{v}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the run's group is removed");
}

/// `tusk crashtest --nodes 3`: the group's faults, cycle after cycle, and nothing lost. Seed 3
/// failed every run while a leader restored in its old term took transactions before it had
/// applied the log (it wrote counts read from a heap without them). A writer of 9 MiB
/// transactions (records in two pieces) runs beside the transfers.
#[test]
fn crashtest_on_three_nodes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = tusk(&["crashtest", "--nodes", "3", "--cycles", "25", "--seed", "3", "--large-mib", "9", "--dir", dir.path().to_str().unwrap(), "--json"]);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let run = json(&out);
    assert_eq!(run["lost"], 0, "{run}");
    assert_eq!(run["cycles"], 25);
    let faults = run["faults"].as_object().unwrap();
    assert_eq!(faults.values().map(|n| n.as_u64().unwrap()).sum::<u64>(), 25, "{run}");
    assert!(faults.values().all(|n| n.as_u64().unwrap() > 0), "every fault struck: {run}");
    assert!(run["disk_requests_failed"].as_u64().unwrap() > 0, "a disk failed requests: {run}");
    assert!(run["acknowledged"].as_u64().unwrap() > 0);
    assert!(run["large_acknowledged"].as_u64().unwrap() > 0, "large transactions committed: {run}");
}
