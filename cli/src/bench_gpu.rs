//! `tusk bench gpu`: the GPU mirror's batch queries against the CPU engine, in one run.
//!
//! Per index (B-link tree of u64 keys; ART of the same keys as 8-byte big-endian strings):
//! the distinct keys of `--order` are loaded (the B-link tree bulk-loaded full, the ART by
//! inserts of 8,192 keys a transaction), the heap is padded to `--heap-mib` (the sync target
//! names a 4 GiB heap), and a mirror is opened. Then:
//! - `lookups_per_s`: a batch of `--batch` present keys drawn in the order's own sequence
//!   (shuffled: random; ascending: sorted; gaussian: the normal sample; mesh: triangle order),
//!   already on the device; kernel time by CUDA events, median of `--rounds` after a warm-up;
//! - `lookups_per_s_end_to_end`: the same batch from host keys to host values, copies
//!   overlapped with the kernels;
//! - `count_sum_ranges_per_s`: count+sum over ranges spanning about `--range-keys` keys;
//! - `sync_ms_1pct`: `apply_batch` of one upsert per 1% of the heap's pages (random present
//!   keys, so each dirties a leaf), then `sync` (host copy plus upload);
//! - `cpu_lookups_per_s`: the same batch on the CPU engine over the mirror's host image, all
//!   cores.
//!
//! Every GPU answer of the batch is checked against the CPU engine before anything is timed.
//! Without a GPU the mirror's backend is the CPU engine and the device figures are null.
//! `--plot DIR` writes `DIR/gpu.svg` (bars per index: GPU against the CPU engine, sync time).

use std::time::Instant;

use clap::{Args, ValueEnum};
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tusk::{BTreeOp, Commit, Durability, GpuOptions, Options, Store};

use super::key_orders::KeyOrder;
use super::report::{median, rate, table};
use super::svg_plot::{write_bars_grid, Bars};
use super::{BenchDir, ChartedOutput, CliResult, IoAt};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuIndex {
    Btree,
    Art,
}

#[derive(Args, Debug, Clone)]
pub struct GpuArgs {
    #[arg(long, value_enum, value_delimiter = ',', default_value = "btree,art")]
    index: Vec<GpuIndex>,
    /// Keys loaded (distinct keys of the order).
    #[arg(long, default_value_t = 16_000_000)]
    keys: usize,
    /// Queries per batch.
    #[arg(long, default_value_t = 16_000_000)]
    batch: usize,
    #[arg(long, value_enum, default_value = "shuffled")]
    order: KeyOrder,
    /// Keys spanned by each count+sum range.
    #[arg(long, default_value_t = 1000)]
    range_keys: usize,
    /// Ranges per count+sum batch.
    #[arg(long, default_value_t = 1_000_000)]
    ranges: usize,
    /// The heap is padded to this size (MiB) before the mirror opens (0: no padding).
    #[arg(long, default_value_t = 4096)]
    heap_mib: u64,
    /// Timed rounds (medians reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    pub(super) out: ChartedOutput,
}

pub fn run(args: GpuArgs) -> CliResult {
    let mut rows = Vec::new();
    for &index in &args.index {
        let row = measure(&args, index)?;
        rows.push(row.clone());
        if args.out.json {
            outln!("{row}");
        } else {
            let f = |k: &str| row[k].as_f64().map_or("-".to_string(), rate);
            table(
                &format!("bench gpu: {} ({})", row["index"].as_str().unwrap_or(""), row["backend"].as_str().unwrap_or("")),
                &[
                    ("keys / batch", format!("{} / {} ({})", row["keys"], row["batch"], row["order"].as_str().unwrap_or(""))),
                    ("lookups/s, device-resident", f("lookups_per_s")),
                    ("lookups/s, end to end", f("lookups_per_s_end_to_end")),
                    ("lookups/s, CPU engine", f("cpu_lookups_per_s")),
                    ("count+sum ranges/s", f("count_sum_ranges_per_s")),
                    ("count+sum ranges/s, CPU engine", f("cpu_count_sum_ranges_per_s")),
                    (
                        "sync, 1% of pages dirty",
                        format!(
                            "{:.2} ms ({} pages of {}; host copy {:.2} ms, upload {:.2} ms)",
                            row["sync_ms_1pct"].as_f64().unwrap_or(f64::NAN),
                            row["sync_pages"],
                            row["heap_pages"],
                            row["sync_host_ms"].as_f64().unwrap_or(f64::NAN),
                            row["sync_upload_ms"].as_f64().unwrap_or(f64::NAN)
                        ),
                    ),
                    ("load", format!("{:.1} s", row["load_s"].as_f64().unwrap_or(f64::NAN))),
                ],
            );
            outln!();
        }
    }
    if let Some(dir) = &args.out.plot {
        plot(dir, &rows)?;
    }
    Ok(())
}

/// `DIR/gpu.svg`: lookups and count+sum ranges per second on the device (resident and end to
/// end) against the CPU engine, per index, and the sync time of 1% dirty pages. Figures a run
/// has no value for (no GPU, or no range queries on the ART) get no bar.
fn plot(dir: &std::path::Path, rows: &[serde_json::Value]) -> CliResult {
    std::fs::create_dir_all(dir).at(dir)?;
    let categories: Vec<String> = rows.iter().map(|r| r["index"].as_str().unwrap_or("").to_string()).collect();
    let series = |pairs: &[(&str, &str)]| -> Vec<(String, Vec<f64>)> {
        pairs
            .iter()
            .map(|(label, key)| (label.to_string(), rows.iter().map(|r| r[*key].as_f64().unwrap_or(f64::NAN)).collect()))
            .collect()
    };
    let charts = [
        Bars {
            title: "point lookups".into(),
            y_label: "lookups/s".into(),
            log_y: true,
            categories: categories.clone(),
            series: series(&[("GPU, device-resident", "lookups_per_s"), ("GPU, end to end", "lookups_per_s_end_to_end"), ("CPU engine", "cpu_lookups_per_s")]),
        },
        Bars {
            title: "count+sum ranges".into(),
            y_label: "ranges/s".into(),
            log_y: true,
            categories: categories.clone(),
            series: series(&[("GPU", "count_sum_ranges_per_s"), ("CPU engine", "cpu_count_sum_ranges_per_s")]),
        },
        Bars {
            title: "mirror sync, 1% of pages dirty".into(),
            y_label: "ms".into(),
            log_y: false,
            categories,
            series: series(&[("sync", "sync_ms_1pct")]),
        },
    ];
    let path = dir.join("gpu.svg");
    write_bars_grid(&charts, 3, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

/// Reports a phase's end on stderr (the tables and JSON go to stdout).
fn phase(started: Instant, what: &str) {
    eprintln!("[{:7.1} s] {what}", started.elapsed().as_secs_f64());
}

fn be(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

fn measure(args: &GpuArgs, index: GpuIndex) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let dir = BenchDir::new(args.out.dir.clone())?;
    let sequence: Vec<u64> = args.order.generate(args.keys, args.seed).into_iter().map(|(k, _)| k).collect();
    let mut distinct = sequence.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let node_bytes = distinct.len() as u64 * if index == GpuIndex::Btree { 24 } else { 80 };
    let capacity = (node_bytes + (args.heap_mib << 20) + (1 << 30)).next_power_of_two();
    let store = Store::open(dir.path(), Options { heap_capacity: capacity, durability: Durability::Off, checkpoint_interval: None, ..Options::default() })?;
    let started = Instant::now();
    match index {
        GpuIndex::Btree => {
            store.transact(Commit::Async, |tx| tx.btree("t")?.bulk_load(distinct.iter().map(|&k| (k, k ^ 0xABCD)), 1.0))?;
        }
        GpuIndex::Art => {
            for chunk in distinct.chunks(8192) {
                store.transact(Commit::Async, |tx| {
                    let mut t = tx.art("t")?;
                    for &k in chunk {
                        t.insert(&be(k), k ^ 0xABCD)?;
                    }
                    Ok(())
                })?;
            }
        }
    }
    let load_s = started.elapsed().as_secs_f64();
    phase(t0, "keys generated and loaded");
    // Pad the heap's used extent to --heap-mib with data the mirror must carry too.
    let used = store.heap_used();
    if (args.heap_mib << 20) > used {
        let pad = (args.heap_mib << 20) - used;
        store.transact(Commit::Async, |tx| tx.alloc(pad).map(|_| ()))?;
    }
    store.prefault();
    let heap_pages = store.heap_used().div_ceil(4096);

    phase(t0, "heap padded and populated");
    let mut mirror = store.gpu_mirror(GpuOptions::default())?;
    phase(t0, "mirror opened and synced");
    let backend = mirror.backend().to_string();
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x5EED);
    // The batch: present keys in the order's own sequence.
    let batch: Vec<u64> = (0..args.batch).map(|i| sequence[i % sequence.len()]).collect();
    let ranges: Vec<(u64, u64)> = (0..args.ranges)
        .map(|_| {
            let i = rng.random_range(0..distinct.len());
            (distinct[i], distinct[(i + args.range_keys - 1).min(distinct.len() - 1)])
        })
        .collect();
    let art_batch: Vec<[u8; 8]> = batch.iter().map(|&k| be(k)).collect();
    let art_refs: Vec<&[u8]> = art_batch.iter().map(|k| k.as_slice()).collect();

    // Correctness first: the mirror's answers equal the CPU engine's.
    let meta = match index {
        GpuIndex::Btree => mirror.btree("t")?.ptr().offset(),
        GpuIndex::Art => mirror.art("t")?.ptr().offset(),
    };
    let inner = mirror.inner();
    let check = batch.len().min(1 << 20);
    match index {
        GpuIndex::Btree => {
            let got = inner.btree_get(meta, &batch[..check])?;
            if got != inner.cpu().btree_get(meta, &batch[..check])? || got.iter().any(Option::is_none) {
                return Err("B-link lookups differ from the CPU engine".into());
            }
            let r = &ranges[..ranges.len().min(1 << 16)];
            if inner.btree_count_sum(meta, r)? != inner.cpu().btree_count_sum(meta, r)? {
                return Err("B-link count/sum differs from the CPU engine".into());
            }
        }
        GpuIndex::Art => {
            let got = inner.art_get(meta, &art_refs[..check])?;
            if got != inner.cpu().art_get(meta, &art_refs[..check])? || got.iter().any(Option::is_none) {
                return Err("ART lookups differ from the CPU engine".into());
            }
        }
    }

    phase(t0, "answers checked against the CPU engine");
    // CPU engine, all cores.
    let (mut cpu_lookups, mut cpu_ranges) = (vec![], vec![]);
    for _ in 0..args.rounds.clamp(1, 3) {
        let started = Instant::now();
        match index {
            GpuIndex::Btree => drop(inner.cpu().btree_get(meta, &batch)?),
            GpuIndex::Art => drop(inner.cpu().art_get(meta, &art_refs)?),
        }
        cpu_lookups.push(batch.len() as f64 / started.elapsed().as_secs_f64());
        if index == GpuIndex::Btree {
            let r = &ranges[..ranges.len().min(100_000)];
            let started = Instant::now();
            drop(inner.cpu().btree_count_sum(meta, r)?);
            cpu_ranges.push(r.len() as f64 / started.elapsed().as_secs_f64());
        }
    }

    phase(t0, "CPU engine timed");
    // Device figures.
    let (mut lookups, mut e2e, mut range_rate) = (None, None, None);
    if let Some(device) = inner.device() {
        let t = match index {
            GpuIndex::Btree => device.time_btree_get(meta, &batch, args.rounds)?,
            GpuIndex::Art => device.time_art_get(meta, &art_refs, args.rounds)?,
        };
        lookups = Some(batch.len() as f64 / (t.kernel_ms / 1e3));
        e2e = Some(batch.len() as f64 / (t.end_to_end_ms / 1e3));
        if index == GpuIndex::Btree {
            let t = device.time_btree_count_sum(meta, &ranges, args.rounds)?;
            range_rate = Some(ranges.len() as f64 / (t.kernel_ms / 1e3));
        }
    }

    phase(t0, "device timed");
    // Sync after 1% of the heap's pages were dirtied by apply_batch.
    let updates = (heap_pages / 100) as usize;
    let mut picks: Vec<u64> = distinct.choose_multiple(&mut rng, updates.min(distinct.len())).copied().collect();
    picks.sort_unstable();
    store.transact(Commit::Async, |tx| match index {
        GpuIndex::Btree => {
            let ops: Vec<BTreeOp> = picks.iter().map(|&k| BTreeOp::Upsert { key: k, value: k }).collect();
            tx.btree("t")?.apply_batch(&ops).map(|_| ())
        }
        GpuIndex::Art => {
            let mut t = tx.art("t")?;
            for &k in &picks {
                t.insert(&be(k), k)?;
            }
            Ok(())
        }
    })?;
    let started = Instant::now();
    let report = mirror.sync()?;
    let sync_ms = started.elapsed().as_secs_f64() * 1e3;
    let probe: Vec<u64> = picks.iter().copied().take(1000).collect();
    let after = match index {
        GpuIndex::Btree => mirror.btree("t")?.get_batch(&probe)?.values,
        GpuIndex::Art => {
            let keys: Vec<[u8; 8]> = probe.iter().map(|&k| be(k)).collect();
            let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
            mirror.art("t")?.get_batch(&refs)?.values
        }
    };
    if after.iter().zip(&probe).any(|(v, k)| *v != Some(*k)) {
        return Err("after the sync the mirror does not show the updates".into());
    }

    phase(t0, "sync timed");
    Ok(json!({
        "bench": "gpu",
        "backend": backend,
        "index": match index { GpuIndex::Btree => "btree", GpuIndex::Art => "art" },
        "order": args.order.name(),
        "keys": distinct.len(),
        "batch": batch.len(),
        "lookups_per_s": lookups,
        "lookups_per_s_end_to_end": e2e,
        "count_sum_ranges_per_s": range_rate,
        "range_keys": args.range_keys,
        "sync_ms_1pct": sync_ms,
        "sync_pages": report.pages,
        "sync_uploaded_bytes": report.uploaded,
        "sync_host_ms": report.host.as_secs_f64() * 1e3,
        "sync_upload_ms": report.upload.as_secs_f64() * 1e3,
        "heap_pages": heap_pages,
        "cpu_lookups_per_s": median(&cpu_lookups),
        "cpu_count_sum_ranges_per_s": (index == GpuIndex::Btree).then(|| median(&cpu_ranges)),
        "load_s": load_s,
    }))
}
