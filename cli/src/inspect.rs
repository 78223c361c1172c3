//! `tusk inspect DIR`: what is on disk and what recovery would do, changing nothing; and the
//! indexes behind the named roots of the state recovery reaches (recovered in memory).
//! `tusk recover DIR`: run recovery and report it.

use std::path::PathBuf;

use clap::Args;
use tusk::{Options, Store};
use tusk_recovery::checkpoint::read_manifest;
use tusk_storage::checkpoint_format::{list_image_segments, list_manifests};

use super::report::table;
use super::CliResult;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Store directory.
    dir: PathBuf,
    /// Heap capacity to recover into for the index report, in MiB (default: the library's).
    #[arg(long)]
    heap_mib: Option<u64>,
    /// Skip recovering the state in memory (no index report).
    #[arg(long)]
    no_indexes: bool,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    /// Store directory.
    dir: PathBuf,
    /// Heap capacity to recover into, in MiB (default: the library's default).
    #[arg(long)]
    heap_mib: Option<u64>,
    /// Read the whole checkpoint before the store opens (`HeapLoad::Whole`) instead of each
    /// chunk when first used.
    #[arg(long)]
    whole: bool,
    #[arg(long)]
    json: bool,
}

fn check_dir(dir: &std::path::Path) -> CliResult {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{}: not a directory", dir.display()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!("{}: no such store directory", dir.display()).into()),
        Err(e) => Err(format!("{}: {e}", dir.display()).into()),
    }
}

pub fn inspect(args: InspectArgs) -> CliResult {
    check_dir(&args.dir)?;
    let manifests: Vec<serde_json::Value> = list_manifests(&args.dir)
        .map_err(|e| format!("{}: {e}", args.dir.display()))?
        .into_iter()
        .map(|(epoch, path)| match read_manifest(&path) {
            Ok(m) => serde_json::json!({
                "epoch": epoch, "path": path, "valid": true, "chunks": m.chunks.len(), "chunk_size": m.chunk_size,
                "covered_bytes": m.covered, "min_chunk_lsn": m.min_lsn(), "max_chunk_lsn": m.max_lsn(),
                "image_segments": m.segments(),
            }),
            Err(e) => serde_json::json!({ "epoch": epoch, "path": path, "valid": false, "error": e.to_string() }),
        })
        .collect();
    // Each checkpoint writes one segment of chunk images; later ones still use the images of
    // clean chunks in older segments.
    let image_segments: Vec<(u64, PathBuf, u64)> = list_image_segments(&args.dir)
        .map_err(|e| format!("{}: {e}", args.dir.display()))?
        .into_iter()
        .map(|(epoch, path)| {
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            (epoch, path, bytes)
        })
        .collect();
    let plan = tusk_recovery::plan(&args.dir, None)?;
    let r = &plan.report;
    let indexes = if args.no_indexes { Ok(Vec::new()) } else { recovered_indexes(&args) };
    let segments: Vec<serde_json::Value> = r
        .segment_files
        .iter()
        .map(|s| {
            serde_json::json!({
                "partition": s.partition, "seq": s.seq, "path": s.path, "bytes": s.bytes,
                "min_lsn": s.min_lsn, "max_lsn": s.max_lsn,
                "read": !plan.scan.below_checkpoint.contains(&s.path),
            })
        })
        .collect();
    let checkpoint = plan.checkpoint.as_ref().map(|c| {
        serde_json::json!({
            "epoch": c.manifest.epoch,
            "chunks": c.manifest.chunks.len(),
            "min_chunk_lsn": c.manifest.min_lsn(),
            "max_chunk_lsn": c.manifest.max_lsn(),
            "fallback_from": c.fallback.as_ref().map(|f| {
                serde_json::json!({"kind": f.kind.to_string(), "path": f.path, "reason": f.reason, "message": f.describe(c.manifest.epoch)})
            }),
        })
    });
    let base = plan.checkpoint.as_ref().map_or(0, |c| c.manifest.min_lsn());
    let (reopen, reopen_whole_because) = tusk_recovery::reopen_load(&args.dir)?;
    let torn: Vec<serde_json::Value> = r
        .torn_tails
        .iter()
        .map(|t| serde_json::json!({"path": t.path, "offset": t.offset, "bytes": t.bytes, "reason": t.reason}))
        .collect();
    let value = serde_json::json!({
        "dir": args.dir,
        "manifests": manifests,
        "checkpoint": checkpoint,
        "image_segments": image_segments.iter().map(|(epoch, path, bytes)| serde_json::json!({"epoch": epoch, "path": path, "bytes": bytes})).collect::<Vec<_>>(),
        "segments": segments,
        "log_bytes": r.log_bytes,
        "segments_below_checkpoint": r.segments_below_checkpoint,
        "log_bytes_below_checkpoint": r.log_bytes_below_checkpoint,
        "durable_lsn": r.recovered_lsn,
        "max_lsn": r.max_lsn,
        "replay_from_lsn": base + 1,
        "replay_to_lsn": r.recovered_lsn,
        "records_to_replay": r.records_replayed,
        "gap_at": r.gap_at,
        "partition_records_after_gap": r.partition_records_after_gap,
        "lost_after_gap": r.lost_after_gap,
        "torn_tails": torn,
        "reopen": if reopen == tusk::HeapLoad::OnDemand { "on-demand" } else { "whole" },
        "reopen_whole_because": reopen_whole_because,
        "indexes": indexes.as_ref().map(|list| list.iter().map(|i| match &i.summary {
            Ok(s) => serde_json::json!({"root": i.root, "kind": s.kind, "keys": s.keys, "nodes": s.nodes, "leaves": s.leaves, "bytes": s.bytes, "depth": s.depth}),
            Err(e) => serde_json::json!({"root": i.root, "error": e}),
        }).collect::<Vec<_>>()).unwrap_or_else(|e| vec![serde_json::json!({"error": e.to_string()})]),
    });
    if args.json {
        outln!("{value}");
        return Ok(());
    }
    let ckpt_line = match &plan.checkpoint {
        Some(c) if c.manifest.epoch > 0 => format!(
            "epoch {}, {} chunks of {} KiB, chunk LSNs {}..={}{}",
            c.manifest.epoch,
            c.manifest.chunks.len(),
            c.manifest.chunk_size / 1024,
            c.manifest.min_lsn(),
            c.manifest.max_lsn(),
            c.fallback.as_ref().map_or(String::new(), |f| format!(" ({})", f.describe(c.manifest.epoch)))
        ),
        Some(c) => format!("none usable: {}", c.fallback.as_ref().map_or(String::new(), |f| f.describe(0))),
        None => "none".into(),
    };
    table(
        &format!("tusk inspect {}", args.dir.display()),
        &[
            ("checkpoint", ckpt_line),
            ("manifests on disk", manifests.len().to_string()),
            (
                "checkpoint image segments",
                format!(
                    "{} ({:.1} MiB)",
                    image_segments.iter().map(|(e, _, _)| e.to_string()).collect::<Vec<_>>().join(", "),
                    image_segments.iter().map(|(_, _, b)| *b).sum::<u64>() as f64 / (1 << 20) as f64
                ),
            ),
            ("log", format!("{} segments, {} read ({:.1} MiB)", r.segment_files.len(), r.segments, r.log_bytes as f64 / (1 << 20) as f64)),
            ("log below the checkpoint", below_checkpoint(r)),
            ("durable LSN", r.recovered_lsn.to_string()),
            ("largest LSN", r.max_lsn.to_string()),
            ("replay", format!("LSNs {}..={}: {} records", base + 1, r.recovered_lsn, r.records_replayed)),
            ("gap", r.gap_at.map_or("none".into(), |g| format!("LSN {g} missing"))),
            ("partition records after gap", r.partition_records_after_gap.to_string()),
            ("lost after gap", r.lost_after_gap.to_string()),
            ("torn tails (would be cut)", r.torn_tails.len().to_string()),
            (
                "reopen (default options)",
                match (&reopen, &reopen_whole_because) {
                    (_, Some(why)) => format!("whole: {why}"),
                    _ => "on demand: no image read at open; each chunk read when first used or by the background loaders".into(),
                },
            ),
        ],
    );
    outln!();
    outln!("{:<5} {:>6} {:>12} {:>12} {:>12}  path", "part", "seq", "bytes", "min LSN", "max LSN");
    for s in &r.segment_files {
        // An unread segment's range is bounded by the next one's first LSN.
        let (max, note) = if plan.scan.below_checkpoint.contains(&s.path) { (format!("≤ {}", s.max_lsn), " (not read)") } else { (s.max_lsn.to_string(), "") };
        outln!("{:<5} {:>6} {:>12} {:>12} {:>12}  {}{note}", s.partition, s.seq, s.bytes, s.min_lsn, max, s.path.display());
    }
    for t in &r.torn_tails {
        outln!("{}", t.describe(false));
    }
    match indexes {
        Ok(list) if list.is_empty() => {}
        Ok(list) => {
            outln!();
            outln!("{:<24} {:<6} {:>12} {:>10} {:>10} {:>12} {:>6}  check", "root", "kind", "keys", "nodes", "leaves", "bytes", "depth");
            for i in list {
                match i.summary {
                    Ok(s) => outln!("{:<24} {:<6} {:>12} {:>10} {:>10} {:>12} {:>6}  ok", i.root, s.kind, s.keys, s.nodes, s.leaves, s.bytes, s.depth),
                    Err(e) => outln!("{:<24} {e}", i.root),
                }
            }
        }
        Err(e) => outln!("indexes: not reported: {e}"),
    }
    Ok(())
}

/// An index found behind a named root.
struct FoundIndex {
    root: String,
    /// Its summary, or why its validator failed.
    summary: Result<tusk_index::catalog::IndexSummary, String>,
}

/// Recovers the store in memory (the directory is not touched) and describes the index behind
/// every named root that holds one.
fn recovered_indexes(args: &InspectArgs) -> Result<Vec<FoundIndex>, Box<dyn std::error::Error>> {
    let capacity = args.heap_mib.map_or(Options::default().heap_capacity, |m| m << 20);
    let heap = tusk_storage::Heap::new(capacity)?;
    tusk_recovery::recover(&args.dir, &heap, false, tusk::HeapLoad::Whole)?;
    let mut found = Vec::new();
    for (root, ptr) in tusk_txn::roots::list(&heap) {
        if let Some(summary) = tusk_index::catalog::describe(&mut &heap, ptr) {
            found.push(FoundIndex { root, summary: summary.map_err(|e| e.to_string()) });
        }
    }
    Ok(found)
}

/// `on-demand` or `whole`: how recovery brought the checkpoint into the heap.
pub fn heap_load_name(r: &tusk::RecoveryReport) -> &'static str {
    match r.heap_load {
        tusk::HeapLoad::OnDemand => "on-demand",
        tusk::HeapLoad::Whole => "whole",
    }
}

/// How recovery brought the checkpoint into the heap, for a table.
pub fn describe_heap_load(r: &tusk::RecoveryReport) -> String {
    let chunks = r.checkpoint.as_ref().map_or(0, |c| c.manifest.chunks.len());
    match (&r.heap_load, &r.loaded_whole_because) {
        (tusk::HeapLoad::OnDemand, _) => format!("on demand: {} of {chunks} chunks not yet read when the store opened", r.chunks_absent),
        (tusk::HeapLoad::Whole, None) => format!("whole: {chunks} chunks read before the store opened"),
        (tusk::HeapLoad::Whole, Some(why)) => format!("whole, because opening on demand met damage: {why}"),
    }
}

/// The log segments recovery leaves unread, every record in them being in the checkpoint.
fn below_checkpoint(r: &tusk::RecoveryReport) -> String {
    format!("{} segments, {:.1} MiB, not read (every record in them is in the checkpoint)", r.segments_below_checkpoint, r.log_bytes_below_checkpoint as f64 / (1 << 20) as f64)
}

pub fn recover(args: RecoverArgs) -> CliResult {
    check_dir(&args.dir)?;
    let heap_load = if args.whole { tusk::HeapLoad::Whole } else { tusk::HeapLoad::OnDemand };
    let mut options = Options { checkpoint_interval: None, heap_load, ..Options::default() };
    if let Some(mib) = args.heap_mib {
        options.heap_capacity = mib << 20;
    }
    let store = Store::open(&args.dir, options)?;
    let r = store.recovery_report().clone();
    store.close()?;
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "dir": args.dir,
                "recovery_s": r.elapsed.as_secs_f64(),
                "checkpoint_load_s": r.checkpoint_load.as_secs_f64(),
                "log_pass_s": r.log_pass.as_secs_f64(),
                "first_pass_beside_load": r.first_pass_beside_load,
                "replay_s": r.replay.as_secs_f64(),
                "heap_load": heap_load_name(&r),
                "chunks_absent": r.chunks_absent,
                "loaded_whole_because": r.loaded_whole_because,
                "checkpoint_epoch": r.checkpoint.as_ref().map(|c| c.manifest.epoch),
                "records_replayed": r.records_replayed,
                "log_bytes": r.log_bytes,
                "segments_below_checkpoint": r.segments_below_checkpoint,
                "log_bytes_below_checkpoint": r.log_bytes_below_checkpoint,
                "recovered_lsn": r.recovered_lsn,
                "gap_at": r.gap_at,
                "lost_after_gap": r.lost_after_gap,
                "partition_records_after_gap": r.partition_records_after_gap,
                "torn_tails_cut": r.torn_tails.len(),
            })
        );
        return Ok(());
    }
    table(
        &format!("tusk recover {}", args.dir.display()),
        &[
            (
                "time",
                format!(
                    "{:.3} s (checkpoint load {:.3} s, beside it the log scan{} {:.3} s; replay after the load {:.3} s)",
                    r.elapsed.as_secs_f64(),
                    r.checkpoint_load.as_secs_f64(),
                    if r.first_pass_beside_load { " and the replay's first pass" } else { "" },
                    r.log_pass.as_secs_f64(),
                    r.replay.as_secs_f64()
                ),
            ),
            ("checkpoint", r.checkpoint.as_ref().map_or("none".into(), |c| format!("epoch {}", c.manifest.epoch))),
            ("heap load", describe_heap_load(&r)),
            ("records replayed", format!("{} from {:.1} MiB of log", r.records_replayed, r.log_bytes as f64 / (1 << 20) as f64)),
            ("log below the checkpoint", below_checkpoint(&r)),
            ("LSN reached", r.recovered_lsn.to_string()),
            ("lost async commits after the gap", r.lost_after_gap.to_string()),
            ("partition records applied after the gap", r.partition_records_after_gap.to_string()),
            ("torn tails cut", r.torn_tails.len().to_string()),
        ],
    );
    for t in &r.torn_tails {
        outln!("{}", t.describe(true));
    }
    Ok(())
}
