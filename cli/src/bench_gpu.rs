//! `tusk bench gpu`: the GPU mirror's batch queries against the CPU engine, in one run.
//!
//! Per index (B-link tree of u64 keys; ART of the same keys as 8-byte big-endian strings):
//! the distinct keys of `--order` are loaded (the B-link tree bulk-loaded full, the ART by
//! inserts of 8,192 keys a transaction), the heap is padded to `--heap-mib` (the sync target
//! names a 4 GiB heap), and a mirror is opened. Then:
//! - `lookups_per_s`: a batch of `--batch` present keys drawn in the order's own sequence
//!   (shuffled: random; ascending: sorted; gaussian: the normal sample; mesh: triangle order),
//!   already on the device; kernel time by CUDA events, median of `--rounds` after a warm-up;
//! - `lookups_per_s_end_to_end`: the same batch through `get_batch` (host keys in, a
//!   `Vec<Option<u64>>` out), median of `--rounds`;
//! - `lookups_per_s_into_buffers` and `into_buffers_stages`: the same batch into caller
//!   buffers made once (`lookup_buffers`, `art_lookup_buffers`): each stage alone (copies in,
//!   kernels, copies out), then the whole call, medians of `--rounds` after a warm-up;
//! - `count_sum_ranges_per_s` (device-resident), `…_end_to_end` and `…_into_buffers`:
//!   count+sum over `--ranges` ranges spanning about `--range-keys` keys;
//! - `sync_ms_1pct`: `apply_batch` of one upsert per 1% of the heap's pages (random present
//!   keys, so each dirties a leaf), then `sync`, with its scan and copy times: the median of
//!   `--rounds` such rounds (and `sync_ms_1pct_min_max`);
//! - `update_path_ops_per_s`: `apply_batch` of `--update-ops` upserts to present keys, a
//!   `sync` (its bytes and GB/s), and a lookup batch into caller buffers that must see every
//!   upsert, all timed;
//! - `cpu_lookups_per_s`: the same batch on the CPU engine over the mirror's host image, all
//!   cores;
//! - `bus_gb_per_s`: the bus alone with page-locked memory, 128 MB host to device, device to
//!   host, and both at once (`CudaMirror::bus_rates`): the ceiling of every end-to-end figure;
//!   with several GPUs also `bus_gb_per_s_every_gpu`, every GPU's probe at once, summed.
//!
//! `--devices` puts the mirror on several GPUs (`all`, or ordinals); `devices` says how many.
//! Given more than once (`--devices 0 --devices all`), every index is measured on each, in
//! that order, and the plot sets one GPU against several.
//! `--contents` says what device memory holds: `heap` (the whole used extent) or `indexes`
//! (only the trees' pages, with a page table; `--device-limit-mib` caps it). Given both
//! (`heap,indexes`), everything above is measured on the first, and `contents_compare` times
//! both mirrors' kernels on the same store in interleaved rounds: lookups and count+sum ranges
//! per second each, the median of the per-round ratios (second / first), and each mirror's
//! device bytes.
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
use tusk::{ArtOp, BTreeOp, Commit, Durability, GpuDevices, GpuOptions, MirrorContents, Options, Store};

use super::key_orders::KeyOrder;
use super::report::{median, rate, table};
use super::svg_plot::{write_bars_grid, Bars};
use super::{BenchDir, ChartedOutput, CliResult, IoAt};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuIndex {
    Btree,
    Art,
}

/// What a mirror's device memory holds (`GpuOptions::contents`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Contents {
    Heap,
    Indexes,
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
    /// GPUs of the mirror: an ordinal, a comma-separated list, or `all`; repeat the option to
    /// measure each (`--devices 0 --devices all`).
    #[arg(long, default_value = "0", action = clap::ArgAction::Append)]
    devices: Vec<String>,
    /// What device memory holds: `heap`, `indexes`, or both (`heap,indexes`: the first is
    /// measured, then both compared).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "heap")]
    contents: Vec<Contents>,
    /// Device-memory limit of an index-only mirror, MiB (0: none).
    #[arg(long, default_value_t = 0)]
    device_limit_mib: u64,
    /// Upserts of the update path (`apply_batch`, `sync`, a lookup batch that sees them).
    #[arg(long, default_value_t = 1_000_000)]
    update_ops: usize,
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
    let runs: Vec<(GpuIndex, &str)> = args.index.iter().flat_map(|&i| args.devices.iter().map(move |d| (i, d.as_str()))).collect();
    for (index, devices) in runs {
        let row = measure(&args, index, devices)?;
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
                    ("lookups/s, end to end (get_batch)", f("lookups_per_s_end_to_end")),
                    ("lookups/s, into caller buffers", f("lookups_per_s_into_buffers")),
                    ("  its stages alone: in / kernels / out, ms", stage_line(&row["into_buffers_stages"])),
                    ("lookups/s, CPU engine", f("cpu_lookups_per_s")),
                    ("bus alone, GB/s: to device / to host / both at once", bus_line(&row["bus_gb_per_s"])),
                    ("device memory", format!("{} MiB ({})", row["device_bytes"].as_u64().unwrap_or(0) >> 20, row["contents"].as_str().unwrap_or(""))),
                    ("contents compared (kernels, second / first)", compare_line(&row["contents_compare"])),
                    ("count+sum ranges/s, device-resident", f("count_sum_ranges_per_s")),
                    ("count+sum ranges/s, end to end", f("count_sum_ranges_per_s_end_to_end")),
                    ("count+sum ranges/s, into caller buffers", f("count_sum_ranges_per_s_into_buffers")),
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
                    (
                        "update path: apply_batch + sync + lookups",
                        format!(
                            "{} ops/s ({} upserts: {:.0} + {:.1} + {:.1} ms)",
                            f("update_path_ops_per_s"),
                            row["update_ops"],
                            row["update_apply_ms"].as_f64().unwrap_or(f64::NAN),
                            row["update_sync_ms"].as_f64().unwrap_or(f64::NAN),
                            row["update_lookup_ms"].as_f64().unwrap_or(f64::NAN)
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

/// "indexes / heap: lookups 0.97x, ranges 0.99x; 300 / 4400 MiB" of a comparison, or "-".
fn compare_line(v: &serde_json::Value) -> String {
    let ratio = |k: &str| v[k].as_f64().map_or("-".to_string(), |r| format!("{r:.3}x"));
    let mib = |i: usize| v["device_bytes"][i].as_u64().map_or("-".to_string(), |b| (b >> 20).to_string());
    match (v["first"].as_str(), v["second"].as_str()) {
        (Some(a), Some(b)) => format!("{b} / {a}: lookups {}, ranges {}; device {} / {} MiB", ratio("lookups_ratio"), ratio("count_sum_ranges_ratio"), mib(1), mib(0)),
        _ => "-".into(),
    }
}

/// "in / kernels / out (call)" of a stages object, or "-".
fn stage_line(v: &serde_json::Value) -> String {
    let ms = |k: &str| v[k].as_f64();
    match (ms("copy_in_ms"), ms("kernels_ms"), ms("copy_out_ms"), ms("call_ms")) {
        (Some(i), Some(k), Some(o), Some(c)) => format!("{i:.2} / {k:.2} / {o:.2} (call {c:.2})"),
        _ => "-".into(),
    }
}

/// `DIR/gpu.svg`: lookups and count+sum ranges per second on the device (resident and end to
/// end) against the CPU engine, per index, and the sync time of 1% dirty pages. Figures a run
/// has no value for (no GPU, or no range queries on the ART) get no bar.
fn plot(dir: &std::path::Path, rows: &[serde_json::Value]) -> CliResult {
    std::fs::create_dir_all(dir).at(dir)?;
    let several = rows.iter().any(|r| r["devices"].as_u64().unwrap_or(0) > 1);
    let categories: Vec<String> = rows
        .iter()
        .map(|r| {
            let index = r["index"].as_str().unwrap_or("").to_string();
            match r["devices"].as_u64() {
                Some(n) if several => format!("{index}, {n} GPU{}", if n == 1 { "" } else { "s" }),
                _ => index,
            }
        })
        .collect();
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
            series: series(&[
                ("GPU, device-resident", "lookups_per_s"),
                ("GPU, into caller buffers", "lookups_per_s_into_buffers"),
                ("GPU, get_batch", "lookups_per_s_end_to_end"),
                ("CPU engine", "cpu_lookups_per_s"),
            ]),
        },
        Bars {
            title: "count+sum ranges".into(),
            y_label: "ranges/s".into(),
            log_y: true,
            categories: categories.clone(),
            series: series(&[
                ("GPU, device-resident", "count_sum_ranges_per_s"),
                ("GPU, into caller buffers", "count_sum_ranges_per_s_into_buffers"),
                ("CPU engine", "cpu_count_sum_ranges_per_s"),
            ]),
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

/// With several GPUs, every GPU's bus probed at once (one thread each, in step at every copy),
/// summed: where host memory, not the links, bounds what the GPUs can move together. Null
/// with one GPU; `{"error": …}` where a probe failed (the rest of the row stands).
fn every_gpu_bus(mirror: &tusk_index::mirror::Mirror, rounds: usize) -> serde_json::Value {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some(devices) = mirror.devices().filter(|d| d.len() > 1) else { return serde_json::Value::Null };
    // A barrier that gives up after a while: a probe that fails stops stepping, and the others
    // must not wait for it for ever. A step that gave up marks the figures as not in step.
    let (arrived, apart) = (AtomicUsize::new(0), AtomicBool::new(false));
    let step = |k: usize| {
        arrived.fetch_add(1, Ordering::SeqCst);
        let since = Instant::now();
        while arrived.load(Ordering::SeqCst) < (k + 1) * devices.len() {
            if since.elapsed() > STEP_WAIT {
                apart.store(true, Ordering::Relaxed);
                return;
            }
            std::hint::spin_loop();
        }
    };
    let rates = std::thread::scope(|s| {
        let probes: Vec<_> = devices.all().iter().map(|d| s.spawn(|| d.bus_rates_in_step(BUS_PROBE_BYTES, rounds, &step))).collect();
        probes.into_iter().map(|p| p.join().expect("a probe thread panicked")).collect::<Result<Vec<_>, _>>()
    });
    match rates {
        Ok(rates) => {
            let sum = |f: fn(&tusk_index::mirror::BusRates) -> f64| rates.iter().map(f).sum::<f64>();
            json!({"to_device": sum(|b| b.to_device_gb_per_s), "to_host": sum(|b| b.to_host_gb_per_s), "both": sum(|b| b.both_gb_per_s), "gpus": rates.len(), "in_step": !apart.load(Ordering::Relaxed)})
        }
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// Longest wait of one GPU's bus probe for the others at a step.
const STEP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn bus_line(bus: &serde_json::Value) -> String {
    match ["to_device", "to_host", "both"].map(|k| bus[k].as_f64()) {
        [Some(a), Some(b), Some(c)] => format!("{a:.1} / {b:.1} / {c:.1}"),
        _ => "-".to_string(),
    }
}

/// Bytes each way of the bus probe (`bus_gb_per_s`): large enough that a copy's fixed costs
/// vanish, as a 16 M-query batch's 128 MB of keys does.
const BUS_PROBE_BYTES: usize = 128 << 20;

/// Reports a phase's end on stderr (the tables and JSON go to stdout).
fn phase(started: Instant, what: &str) {
    eprintln!("[{:7.1} s] {what}", started.elapsed().as_secs_f64());
}

fn contents_name(c: Contents) -> &'static str {
    match c {
        Contents::Heap => "heap",
        Contents::Indexes => "indexes",
    }
}

/// The mirror options of `devices` (one `--devices`), and of `contents` (with
/// `--device-limit-mib` for an index-only mirror).
fn gpu_options(args: &GpuArgs, devices: &str, contents: Contents) -> Result<GpuOptions, String> {
    let (contents, device_memory_limit) = match contents {
        Contents::Heap => (MirrorContents::WholeHeap, None),
        Contents::Indexes => (MirrorContents::Indexes, (args.device_limit_mib > 0).then_some(args.device_limit_mib << 20)),
    };
    Ok(GpuOptions { devices: parse_devices(devices)?, contents, device_memory_limit, ..GpuOptions::default() })
}

/// Kernel rates of two mirrors of one store (`--contents A,B`), in interleaved rounds: their
/// answers first checked equal, then per round each mirror's lookups (and, for the B-link
/// tree, count+sum ranges) timed on device-resident queries (median of 3 launches), and the
/// medians of the rates and of the per-round ratios B / A.
#[allow(clippy::too_many_arguments)]
fn compare_contents(
    args: &GpuArgs,
    devices: &str,
    store: &Store,
    a: &tusk::GpuMirror,
    (first, second): (Contents, Contents),
    index: GpuIndex,
    meta: u64,
    batch: &[u64],
    art_refs: &[&[u8]],
    ranges: &[(u64, u64)],
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let b = store.gpu_mirror(gpu_options(args, devices, second)?)?;
    let (Some(da), Some(db)) = (a.inner().device_for(meta), b.inner().device_for(meta)) else {
        return Ok(json!({"second": contents_name(second), "skipped": "no GPU"}));
    };
    let check = batch.len().min(1 << 20);
    let same = match index {
        GpuIndex::Btree => a.inner().btree_get(meta, &batch[..check])? == b.inner().btree_get(meta, &batch[..check])?,
        GpuIndex::Art => a.inner().art_get(meta, &art_refs[..check])? == b.inner().art_get(meta, &art_refs[..check])?,
    };
    if !same {
        return Err(format!("the {} and {} mirrors answer differently", contents_name(first), contents_name(second)).into());
    }
    let lookups = |d: &tusk_index::mirror::CudaMirror| -> Result<f64, Box<dyn std::error::Error>> {
        let ms = match index {
            GpuIndex::Btree => d.time_btree_get_kernel(meta, batch, 3)?,
            GpuIndex::Art => d.time_art_get_kernel(meta, art_refs, 3)?,
        };
        Ok(batch.len() as f64 / (ms / 1e3))
    };
    let range_rate = |d: &tusk_index::mirror::CudaMirror| -> Result<Option<f64>, Box<dyn std::error::Error>> {
        Ok(match index {
            GpuIndex::Btree => Some(ranges.len() as f64 / (d.time_btree_count_sum(meta, ranges, 3)?.kernel_ms / 1e3)),
            GpuIndex::Art => None,
        })
    };
    let (mut la, mut lb, mut lr, mut ra, mut rb, mut rr) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..args.rounds.max(1) {
        let (x, y) = (lookups(da)?, lookups(db)?);
        la.push(x);
        lb.push(y);
        lr.push(y / x);
        if let (Some(x), Some(y)) = (range_rate(da)?, range_rate(db)?) {
            ra.push(x);
            rb.push(y);
            rr.push(y / x);
        }
    }
    let med = |v: &[f64]| (!v.is_empty()).then(|| median(v));
    Ok(json!({
        "first": contents_name(first),
        "second": contents_name(second),
        "lookups_per_s": [median(&la), median(&lb)],
        "lookups_ratio": median(&lr),
        "count_sum_ranges_per_s": [med(&ra), med(&rb)],
        "count_sum_ranges_ratio": med(&rr),
        "device_bytes": [a.inner().device_bytes(), b.inner().device_bytes()],
        "heap_bytes": store.heap_used(),
        "rounds": args.rounds.max(1),
    }))
}

/// `--devices`: "all", or ordinals separated by commas.
fn parse_devices(text: &str) -> Result<GpuDevices, String> {
    if text == "all" {
        return Ok(GpuDevices::All);
    }
    let list = text.split(',').map(|d| d.trim().parse::<usize>().map_err(|_| format!("--devices takes `all` or ordinals like 0,1, not {text:?}"))).collect::<Result<Vec<_>, _>>()?;
    Ok(match list.as_slice() {
        [one] => GpuDevices::One(*one),
        _ => GpuDevices::List(list),
    })
}

fn be(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

fn measure(args: &GpuArgs, index: GpuIndex, devices: &str) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
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
    let first = *args.contents.first().ok_or("--contents names nothing")?;
    let mut mirror = store.gpu_mirror(gpu_options(args, devices, first)?)?;
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
    // Device figures: device-resident kernels, `get_batch` end to end, and batches into
    // caller buffers (per stage, then the call).
    let (mut lookups, mut e2e, mut range_rate, mut range_e2e) = (None, None, None, None);
    let (mut into, mut ranges_into, mut bus, mut every_bus) = (None, None, None, serde_json::Value::Null);
    if let Some(device) = inner.device_for(meta) {
        // The bus with nothing else on it: what end-to-end batches can reach at most.
        bus = device.bus_rates(BUS_PROBE_BYTES, args.rounds).map_err(|e| eprintln!("bus probe: {e}")).ok();
        every_bus = every_gpu_bus(inner, args.rounds);
        let t = match index {
            GpuIndex::Btree => device.time_btree_get(meta, &batch, args.rounds)?,
            GpuIndex::Art => device.time_art_get(meta, &art_refs, args.rounds)?,
        };
        lookups = Some(batch.len() as f64 / (t.kernel_ms / 1e3));
        e2e = Some(batch.len() as f64 / (t.end_to_end_ms / 1e3));
        if index == GpuIndex::Btree {
            // What `get_batch` gives a user (the mirror's path, scratch buffers and all).
            let mut ms = Vec::with_capacity(args.rounds);
            drop(inner.btree_get(meta, &batch)?);
            for _ in 0..args.rounds.max(1) {
                let started = Instant::now();
                drop(inner.btree_get(meta, &batch)?);
                ms.push(started.elapsed().as_secs_f64() * 1e3);
            }
            e2e = Some(batch.len() as f64 / (median(&ms) / 1e3));
        }
        let expected = &inner.cpu();
        into = Some(match index {
            GpuIndex::Btree => {
                let mut b = inner.lookup_buffers(batch.len())?;
                b.load_keys(&batch);
                let t = inner.time_btree_get_into(meta, &mut b, args.rounds)?.ok_or("no GPU timing")?;
                if !b.answers().take(check).eq(expected.btree_get(meta, &batch[..check])?) {
                    return Err("B-link lookups into caller buffers differ from the CPU engine".into());
                }
                t
            }
            GpuIndex::Art => {
                let mut b = inner.art_lookup_buffers(batch.len(), 8)?;
                b.load_keys(&art_batch);
                let t = inner.time_art_get_into(meta, &mut b, args.rounds)?.ok_or("no GPU timing")?;
                if !b.answers().take(check).eq(expected.art_get(meta, &art_refs[..check])?) {
                    return Err("ART lookups into caller buffers differ from the CPU engine".into());
                }
                t
            }
        });
        if index == GpuIndex::Btree {
            let t = device.time_btree_count_sum(meta, &ranges, args.rounds)?;
            range_rate = Some(ranges.len() as f64 / (t.kernel_ms / 1e3));
            range_e2e = Some(ranges.len() as f64 / (t.end_to_end_ms / 1e3));
            let mut r = inner.range_buffers(ranges.len())?;
            r.load_ranges(&ranges);
            ranges_into = inner.time_btree_count_sum_into(meta, &mut r, args.rounds)?;
            let few = ranges.len().min(1 << 16);
            if !r.answers().take(few).eq(expected.btree_count_sum(meta, &ranges[..few])?) {
                return Err("B-link count/sum into caller buffers differs from the CPU engine".into());
            }
        }
    }
    let per_s = |n: usize, ms: f64| n as f64 / (ms / 1e3);
    let stages = |t: &Option<tusk::StageTiming>| {
        t.map(|t| json!({"copy_in_ms": t.copy_in_ms, "kernels_ms": t.kernels_ms, "copy_out_ms": t.copy_out_ms, "call_ms": t.call_ms}))
    };

    phase(t0, "device timed");
    let contents_compare = match args.contents.get(1) {
        Some(&second) => Some(compare_contents(args, devices, &store, &mirror, (first, second), index, meta, &batch, &art_refs, &ranges)?),
        None => None,
    };
    // Syncs after 1% of the heap's pages were dirtied by apply_batch, `--rounds` times (fresh
    // picks each round); the round of the median time is reported.
    let updates = (heap_pages / 100) as usize;
    let mut syncs = Vec::with_capacity(args.rounds.max(1));
    for _ in 0..args.rounds.max(1) {
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
        syncs.push((sync_ms, report));
    }
    syncs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let sync_spread = (syncs[0].0, syncs[syncs.len() - 1].0);
    let (sync_ms, report) = syncs.swap_remove(syncs.len() / 2);

    phase(t0, "sync timed");
    // The whole update path a user runs: a batch of upserts committed, a sync, and a lookup
    // batch (into caller buffers) that sees every one of them.
    let update_ops = args.update_ops.min(distinct.len());
    let mut upd: Vec<u64> = distinct.choose_multiple(&mut rng, update_ops).copied().collect();
    upd.sort_unstable();
    let new_value = |k: u64| k.rotate_left(17) ^ 0x5555;
    let started = Instant::now();
    store.transact(Commit::Async, |tx| match index {
        GpuIndex::Btree => {
            let ops: Vec<BTreeOp> = upd.iter().map(|&k| BTreeOp::Upsert { key: k, value: new_value(k) }).collect();
            tx.btree("t")?.apply_batch(&ops).map(|_| ())
        }
        GpuIndex::Art => {
            let keys: Vec<[u8; 8]> = upd.iter().map(|&k| be(k)).collect();
            let ops: Vec<ArtOp<'_>> = keys.iter().zip(&upd).map(|(key, &k)| ArtOp::Upsert { key, value: new_value(k) }).collect();
            tx.art("t")?.apply_batch(&ops).map(|_| ())
        }
    })?;
    let apply_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let upd_sync = mirror.sync()?;
    let update_sync_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let seen = match index {
        GpuIndex::Btree => {
            let mut b = mirror.lookup_buffers(upd.len())?;
            let alloc_ms = started.elapsed().as_secs_f64() * 1e3;
            let started = Instant::now();
            b.load_keys(&upd);
            mirror.btree("t")?.get_into(&mut b)?;
            let ok = b.answers().zip(&upd).all(|(v, &k)| v == Some(new_value(k)));
            (ok, alloc_ms, started.elapsed().as_secs_f64() * 1e3)
        }
        GpuIndex::Art => {
            let mut b = mirror.art_lookup_buffers(upd.len(), 8)?;
            let alloc_ms = started.elapsed().as_secs_f64() * 1e3;
            let started = Instant::now();
            for (i, &k) in upd.iter().enumerate() {
                b.set_len(i + 1);
                b.set_key(i, &be(k));
            }
            mirror.art("t")?.get_into(&mut b)?;
            let ok = b.answers().zip(&upd).all(|(v, &k)| v == Some(new_value(k)));
            (ok, alloc_ms, started.elapsed().as_secs_f64() * 1e3)
        }
    };
    let (seen_all, buffers_ms, update_lookup_ms) = seen;
    if !seen_all {
        return Err("after apply_batch and sync, a lookup batch does not see every update".into());
    }
    let update_path_ms = apply_ms + update_sync_ms + update_lookup_ms;

    let mut row = json!({
        "bench": "gpu",
        "backend": backend,
        "contents": contents_name(first),
        "device_bytes": mirror.inner().device_bytes(),
        "contents_compare": contents_compare,
        "devices": mirror.inner().devices().map_or(0, |d| d.len()),
        "index": match index { GpuIndex::Btree => "btree", GpuIndex::Art => "art" },
        "order": args.order.name(),
        "keys": distinct.len(),
        "batch": batch.len(),
        "lookups_per_s": lookups,
        "lookups_per_s_end_to_end": e2e,
        "lookups_per_s_into_buffers": into.map(|t| per_s(batch.len(), t.call_ms)),
        "into_buffers_stages": stages(&into),
        "count_sum_ranges_per_s": range_rate,
        "count_sum_ranges_per_s_end_to_end": range_e2e,
        "count_sum_ranges_per_s_into_buffers": ranges_into.map(|t| per_s(ranges.len(), t.call_ms)),
        "ranges_into_buffers_stages": stages(&ranges_into),
        "update_ops": upd.len(),
        "update_path_ops_per_s": per_s(upd.len(), update_path_ms),
        "update_apply_ms": apply_ms,
        "update_sync_ms": update_sync_ms,
        "update_sync_uploaded_bytes": upd_sync.uploaded,
        "update_sync_gb_per_s": upd_sync.uploaded as f64 / (update_sync_ms / 1e3) / 1e9,
        "update_lookup_ms": update_lookup_ms,
        "update_buffers_setup_ms": buffers_ms,
        "range_keys": args.range_keys,
        "sync_ms_1pct": sync_ms,
        "sync_ms_1pct_min_max": [sync_spread.0, sync_spread.1],
        "sync_pages": report.pages,
        "sync_uploaded_bytes": report.uploaded,
        "sync_host_ms": report.host.as_secs_f64() * 1e3,
        "sync_upload_ms": report.upload.as_secs_f64() * 1e3,
        "sync_scan_ms": report.scan.as_secs_f64() * 1e3,
        "sync_copy_ms": report.copy.as_secs_f64() * 1e3,
        "update_sync_scan_ms": upd_sync.scan.as_secs_f64() * 1e3,
        "update_sync_copy_ms": upd_sync.copy.as_secs_f64() * 1e3,
        "heap_pages": heap_pages,
        "cpu_lookups_per_s": median(&cpu_lookups),
        "cpu_count_sum_ranges_per_s": (index == GpuIndex::Btree).then(|| median(&cpu_ranges)),
        "load_s": load_s,
    });
    row["bus_gb_per_s"] = json!(bus.map(|b| json!({"to_device": b.to_device_gb_per_s, "to_host": b.to_host_gb_per_s, "both": b.both_gb_per_s})));
    row["bus_gb_per_s_every_gpu"] = every_bus;
    Ok(row)
}
