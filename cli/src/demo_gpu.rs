//! The demo's GPU phase: the mirror of both trees answers batched lookups, range counts and
//! sums, and prefix counts and sums — on the GPU when one is usable, else on the CPU engine —
//! and every answer is checked against the committed state (the model the trees must equal,
//! and a read-only transaction on the trees themselves); then a batch update, a sync that
//! ships only the dirty pages, and the same checks again. On a GPU, a second mirror that
//! holds only the indexes' pages answers the same checks, and the GPU memory of each is shown.

use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{BTreeOp, Commit, GpuOptions, MirrorContents, Store};

use super::demo_index::{region_prefix, Model, CUSTOMERS, ORDERS, REGIONS};
use super::report::{human_rate, table};

/// What the phase did, for the summary.
pub struct GpuSummary {
    pub line: String,
}

fn mismatch(what: &str) -> Box<dyn std::error::Error> {
    format!("GPU mirror: {what} differ from the committed trees").into()
}

pub fn run(store: &Store, mut model: Model) -> Result<(Model, GpuSummary), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut mirror = store.gpu_mirror(GpuOptions::default())?;
    let open_s = started.elapsed().as_secs_f64();
    let backend = mirror.backend().to_string();
    outln!("\nGPU mirror: {backend}");
    let mut rng = SmallRng::seed_from_u64(0x6B0);
    let mut rows: Vec<(&str, String)> = vec![("open + first sync", format!("{:.1} ms, at LSN {}", open_s * 1e3, mirror.lsn()))];

    let check = |mirror: &tusk::GpuMirror, model: &Model, rng: &mut SmallRng, rows: &mut Vec<(&'static str, String)>| -> Result<(), Box<dyn std::error::Error>> {
        let orders = mirror.btree(ORDERS)?;
        let mut keys: Vec<u64> = model.orders.keys().copied().collect();
        keys.extend((0..keys.len() / 4).map(|_| rng.random::<u64>()));
        let started = Instant::now();
        let found = orders.get_batch(&keys)?;
        let lookup_s = started.elapsed().as_secs_f64();
        if found.values.iter().zip(&keys).any(|(v, k)| *v != model.orders.get(k).copied()) {
            return Err(mismatch("B-link lookups"));
        }
        // The trees themselves, in a read-only transaction, on a sample (one batched lookup).
        let sample: Vec<usize> = (0..2000).map(|_| rng.random_range(0..keys.len())).collect();
        let sample_keys: Vec<u64> = sample.iter().map(|&i| keys[i]).collect();
        let (direct, _) = store.transact(Commit::Async, |tx| tx.btree(ORDERS)?.get_many(&sample_keys))?;
        if sample.iter().zip(&direct).any(|(&i, d)| found.values[i] != *d) {
            return Err(mismatch("B-link lookups (against a transaction)"));
        }
        let present: Vec<u64> = model.orders.keys().copied().collect();
        let ranges: Vec<(u64, u64)> = (0..20_000)
            .map(|_| {
                let i = rng.random_range(0..present.len());
                (present[i], present[(i + rng.random_range(0..500)).min(present.len() - 1)])
            })
            .collect();
        let started = Instant::now();
        let sums = orders.count_sum_batch(&ranges)?;
        let range_s = started.elapsed().as_secs_f64();
        for (&(lo, hi), &(count, sum)) in ranges.iter().zip(&sums.values) {
            let r = model.orders.range(lo..=hi);
            if (count, sum) != (r.clone().count() as u64, r.map(|(_, v)| *v as u128).sum()) {
                return Err(mismatch("B-link range counts and sums"));
            }
        }
        let customers = mirror.art(CUSTOMERS)?;
        let prefixes: Vec<Vec<u8>> = (0..REGIONS).map(region_prefix).collect();
        let refs: Vec<&[u8]> = prefixes.iter().map(Vec::as_slice).collect();
        let by_region = customers.count_prefix_batch(&refs)?;
        for (p, &(count, sum)) in prefixes.iter().zip(&by_region.values) {
            let m = model.customers.iter().filter(|(k, _)| k.starts_with(p));
            if (count, sum) != (m.clone().count() as u64, m.map(|(_, v)| *v as u128).sum()) {
                return Err(mismatch("ART prefix counts and sums"));
            }
        }
        let names: Vec<&[u8]> = model.customers.keys().map(Vec::as_slice).collect();
        let got = customers.get_batch(&names)?;
        if got.values.iter().zip(model.customers.values()).any(|(g, v)| *g != Some(*v)) {
            return Err(mismatch("ART lookups"));
        }
        rows.push(("B-link lookups", format!("{} keys in {:.1} ms ({}/s), equal", keys.len(), lookup_s * 1e3, human_rate(keys.len() as f64 / lookup_s))));
        rows.push(("range count+sum", format!("{} ranges in {:.1} ms ({}/s), equal", ranges.len(), range_s * 1e3, human_rate(ranges.len() as f64 / range_s))));
        rows.push(("ART lookups + prefixes", format!("{} keys, {} region prefixes, equal", names.len(), prefixes.len())));
        Ok(())
    };
    check(&mirror, &model, &mut rng, &mut rows)?;

    // A batch update, then a sync that ships only what changed.
    let present: Vec<u64> = model.orders.keys().copied().collect();
    let ops: Vec<BTreeOp> = (0..5000)
        .map(|i| {
            if i % 3 == 0 {
                BTreeOp::Remove { key: present[rng.random_range(0..present.len())] }
            } else {
                BTreeOp::Upsert { key: rng.random(), value: i }
            }
        })
        .collect();
    store.transact(Commit::Async, |tx| tx.btree(ORDERS)?.apply_batch(&ops).map(|_| ()))?;
    for op in &ops {
        match *op {
            BTreeOp::Upsert { key, value } => model.orders.insert(key, value),
            BTreeOp::Remove { key } => model.orders.remove(&key),
        };
    }
    let report = mirror.sync()?;
    rows.push((
        "sync after 5,000 updates",
        format!("{:.2} ms: {} pages (host {:.2} ms, upload {:.2} ms), LSN {}", (report.host + report.upload).as_secs_f64() * 1e3, report.pages, report.host.as_secs_f64() * 1e3, report.upload.as_secs_f64() * 1e3, report.lsn),
    ));
    check(&mirror, &model, &mut rng, &mut rows)?;
    if mirror.on_gpu() {
        // The same trees from a mirror of their pages only.
        let row = match store.gpu_mirror(GpuOptions { contents: MirrorContents::Indexes, ..GpuOptions::default() }) {
            Ok(indexes) => {
                check(&indexes, &model, &mut rng, &mut Vec::new())?;
                let mib = |m: &tusk::GpuMirror| m.inner().device_bytes() as f64 / (1 << 20) as f64;
                format!("{:.1} MiB of GPU memory against {:.1} MiB for the whole heap; lookups, ranges and prefixes equal", mib(&indexes), mib(&mirror))
            }
            Err(e) => format!("not run: {e}"),
        };
        rows.push(("mirror of the indexes only", row));
    }
    table("GPU mirror: batched queries checked against the trees", &rows);
    outln!();
    let line = format!("{} — lookups, ranges and prefixes equal the trees, before and after a sync of {} pages", backend, report.pages);
    Ok((model, GpuSummary { line }))
}
