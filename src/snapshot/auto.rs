//! Auto: picks memcpy, incremental or fork for each snapshot and refresh from measured costs.
//!
//! The rule, with costs measured on this machine once per process ([`snapshot_costs`], on
//! the first Auto snapshot, about 50 ms: measuring at every `Store::open` would slow every
//! open for a feature most stores never use):
//! - memcpy   = extent / copy bandwidth (with the snapshot's copier threads);
//! - incremental = (pages dirtied since the image's last copy + growth) × 4 KiB / bandwidth,
//!   plus the scan of the dirty epochs; only when an image exists (else it is a memcpy); the
//!   dirty pages are counted on a sample of one page in 16 (a full scan of a 1 GiB heap's
//!   epochs costs ~0.4 ms, as much as a small refresh);
//! - fork     = fork time (proportional to the process's resident memory, whose page tables
//!   the kernel copies) + expected copy-on-write faults × cost per fault, where the expected
//!   faults are the distinct pages written between the last two refreshes (the write rate
//!   and the page skew in one number: the next interval is predicted to look like the last).
//!   The faults are paid by writers, not by the snapshot call, but they are part of what a
//!   snapshot costs the store, which is what Auto minimises (snapshot plus update time per
//!   cycle, the paper's measure).
//!
//! The cheapest estimate wins. A fork is refused when free memory could not absorb the worst
//! case, every page of the extent copied on write (what takes Redis hosts down), and a memcpy
//! when free memory cannot hold the copy; the reason says so. The first Auto snapshot has no
//! history: it takes a full copy, which later refreshes build on.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tusk_storage::process::{available_memory, fork_child};
use tusk_storage::{Heap, PAGE_SIZE};

use super::{Snapshot, SnapshotMode};
use crate::Error;

/// Costs of the three ways to snapshot, measured on this machine.
#[derive(Clone, Debug)]
pub struct SnapshotCosts {
    /// memcpy bandwidth of one thread, bytes per second.
    pub copy_bytes_per_s_1: f64,
    /// memcpy bandwidth of `threads` threads.
    pub copy_bytes_per_s_n: f64,
    /// The thread count of `copy_bytes_per_s_n` (the available cores).
    pub threads: usize,
    /// fork time per byte of this process's resident memory.
    pub fork_s_per_resident_byte: f64,
    /// fork time measured.
    pub fork_time: Duration,
    /// The process's resident memory when `fork_time` was measured.
    pub fork_resident_bytes: u64,
    /// One copy-on-write fault on a heap page written after a fork.
    pub cow_per_page: Duration,
}

impl SnapshotCosts {
    /// Bandwidth of `threads` copier threads (linear between the two measured points).
    pub fn copy_bytes_per_s(&self, threads: usize) -> f64 {
        if self.threads <= 1 || threads <= 1 {
            return self.copy_bytes_per_s_1;
        }
        let t = (threads.min(self.threads) - 1) as f64 / (self.threads - 1) as f64;
        self.copy_bytes_per_s_1 + t * (self.copy_bytes_per_s_n - self.copy_bytes_per_s_1)
    }
}

/// The costs, measured on first use in this process.
pub fn snapshot_costs() -> &'static SnapshotCosts {
    static COSTS: OnceLock<SnapshotCosts> = OnceLock::new();
    COSTS.get_or_init(measure)
}

const PROBE_BYTES: usize = 32 << 20;
const COW_PROBE_PAGES: u64 = 2048;

fn measure() -> SnapshotCosts {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let src = vec![0x5Au8; PROBE_BYTES];
    let mut dst = vec![0u8; PROBE_BYTES];
    let copy_bytes_per_s_1 = best_rate(|| dst.copy_from_slice(&src));
    let copy_bytes_per_s_n = best_rate(|| {
        let per = PROBE_BYTES.div_ceil(threads);
        std::thread::scope(|s| {
            for (d, from) in dst.chunks_mut(per).zip(src.chunks(per)) {
                s.spawn(move || d.copy_from_slice(from));
            }
        })
    });
    drop((src, dst));

    // Copy-on-write: write one word per page of a heap after forking a child that holds it.
    let heap = Heap::new(COW_PROBE_PAGES * PAGE_SIZE).expect("a small probe heap");
    for p in 0..COW_PROBE_PAGES {
        heap.store_word(p * PAGE_SIZE, p);
    }
    let resident = resident_bytes().max(1);
    let started = Instant::now();
    let child = tusk_storage::process::ForkServer::spawn(4096, |_, _| 0);
    let fork_time = started.elapsed();
    let cow_per_page = match child {
        Ok(child) => {
            let started = Instant::now();
            for p in 0..COW_PROBE_PAGES {
                heap.store_word(p * PAGE_SIZE + 8, p);
            }
            let per_page = started.elapsed() / COW_PROBE_PAGES as u32;
            drop(child);
            per_page
        }
        Err(_) => Duration::from_micros(2),
    };
    // A bare fork of a process that exits at once, to check the measurement above was not
    // dominated by the server's set-up.
    let _ = fork_child(&[], || 0).map(|mut c| c.finish(Duration::from_secs(1)));
    SnapshotCosts {
        copy_bytes_per_s_1,
        copy_bytes_per_s_n,
        threads,
        fork_s_per_resident_byte: fork_time.as_secs_f64() / resident as f64,
        fork_time,
        fork_resident_bytes: resident,
        cow_per_page,
    }
}

/// Bytes per second of the best of three runs of `copy` (each copies PROBE_BYTES).
fn best_rate(mut copy: impl FnMut()) -> f64 {
    copy(); // first touch
    (0..3)
        .map(|_| {
            let started = Instant::now();
            copy();
            PROBE_BYTES as f64 / started.elapsed().as_secs_f64().max(1e-9)
        })
        .fold(0.0, f64::max)
}

/// This process's resident memory (statm), in bytes.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * PAGE_SIZE)
}

/// Memory a snapshot may add: what the kernel reports available, capped by `limit`.
pub(super) fn memory_available(limit: Option<u64>) -> Option<u64> {
    match (available_memory(), limit) {
        (Some(a), Some(l)) => Some(a.min(l)),
        (a, l) => a.or(l),
    }
}

/// Auto samples one page's dirty epoch in this many.
const SAMPLE_STRIDE: u64 = 16;

pub(super) struct Choice {
    pub mode: SnapshotMode,
    pub reason: String,
}

pub(super) fn choose(snap: &Snapshot) -> Result<Choice, Error> {
    let engine = &snap.engine;
    let extent = engine.used_extent();
    let available = memory_available(snap.options.memory_limit);
    let Some((_, state)) = snap.image.as_ref() else {
        if available.is_some_and(|a| a < extent) {
            return Ok(Choice {
                mode: SnapshotMode::Fork,
                reason: format!("first snapshot: a copy of {} MiB does not fit in {} MiB free; fork", mib(extent), mib(available.unwrap_or(0))),
            });
        }
        return Ok(Choice { mode: SnapshotMode::Memcpy, reason: "first snapshot: a full copy, the base of later incremental refreshes".into() });
    };
    let costs = snapshot_costs();
    let bandwidth = costs.copy_bytes_per_s(snap.threads());
    let pages = extent / PAGE_SIZE;
    let scan = pages as f64 * 1e-9;
    let growth = extent.saturating_sub(state.extent) / PAGE_SIZE;
    // Estimates from a sample of the dirty epochs (every SAMPLE_STRIDE-th page): the choice
    // needs the order of magnitude, and a full scan would cost as much as a small refresh.
    let dirty = engine.dirty_pages_sampled(state.epoch, state.extent.min(extent), SAMPLE_STRIDE);
    let lacking = dirty + growth;
    // Pages written since the last refresh: the same count when that refresh was this image's.
    let written = if snap.epoch_at_refresh == state.epoch { lacking } else { engine.dirty_pages_sampled(snap.epoch_at_refresh, extent, SAMPLE_STRIDE) };
    let memcpy = extent as f64 / bandwidth;
    let incremental = (lacking * PAGE_SIZE) as f64 / bandwidth + scan;
    let faults = written as f64 * costs.cow_per_page.as_secs_f64();
    // The fork itself needs the resident size (a read of /proc): only when it could still win.
    let fork = if faults < memcpy.min(incremental) { costs.fork_s_per_resident_byte * resident_bytes() as f64 + faults } else { faults };
    let fork_refused = available.is_some_and(|a| a < extent);
    let mut options = vec![(SnapshotMode::Memcpy, memcpy), (SnapshotMode::Incremental, incremental)];
    if !fork_refused {
        options.push((SnapshotMode::Fork, fork));
    }
    let (mode, _) = options.iter().copied().fold((SnapshotMode::Incremental, f64::INFINITY), |best, o| if o.1 < best.1 { o } else { best });
    let mut reason = format!(
        "estimates: incremental {:.3} ms (~{lacking} of {pages} pages dirty), memcpy {:.3} ms, fork ≥ {:.3} ms ({written} pages written last interval × {:.2} µs copy-on-write)",
        incremental * 1e3,
        memcpy * 1e3,
        fork * 1e3,
        costs.cow_per_page.as_secs_f64() * 1e6
    );
    if fork_refused {
        reason += &format!("; fork refused: {} MiB free cannot absorb copy-on-write of all {} MiB", mib(available.unwrap_or(0)), mib(extent));
    }
    Ok(Choice { mode, reason })
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}
