//! The store's `tusk-load` threads: after a reopen on demand (see tusk-storage's
//! `on_demand`) they read the chunks nobody has used yet, in the large sequential reads of a
//! whole load, so that the heap is all in memory about as soon as a whole load would have had
//! it, while transactions run from the first moment. Chunks that a transaction reaches first
//! are read by that transaction's thread; the loaders skip them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tusk_txn::Engine;

use crate::Error;

/// Most loader threads: a few reads in flight keep a disk busy, and the loaders share the
/// cores with the store's users.
const MAX_LOADERS: usize = 4;

/// Images per background read (4 MiB with the default chunk): long enough to stream, short
/// enough that a read an access waits for does not queue behind much.
const RUN_CHUNKS: usize = 4;

/// While an access waits for a block's load, loaders hold their next read back, polling this
/// often, for at most `MAX_HOLD`. Without it, an access's read could wait for the loaders'
/// whole sweep: an elevator (mq-deadline) serves requests in disk order, and loaders that
/// stream ahead of an access's block keep putting requests before it, until its 500 ms
/// deadline (reopens measured 0.25 s to the first read on this 2-core machine, 5 ms without
/// loaders). The cap keeps loaders going while accesses load one block after another: a
/// block's read takes a fraction of a millisecond, and with a 20 ms cap a workload missing
/// blocks all the time held the loaders back for good (a 64 MiB heap came in 2x later).
const HOLD_POLL: Duration = Duration::from_micros(100);
const MAX_HOLD: Duration = Duration::from_millis(2);

/// Once `RUN_OUTS_TO_STOP_HOLDING` holds in a row run out (accesses loaded blocks for all of
/// `MAX_HOLD` each time: a workload that misses all the time), a loader reads this many runs
/// (64 MiB) without holding. Such a workload reaches full speed only once the loaders have
/// brought nearly every block in, and a hold before each 4 MiB run took its share of their
/// rate: on the 16-core device host, Hathi over a 4 GiB heap reached full speed at 1.06x and
/// 1.30x a sequential read with holds before every run, 0.89x and 1.02x without any, in one
/// call. One hold running out is not enough: a single query reading block after block for
/// more than 2 ms would otherwise turn holds off for the reads after it.
const RUNS_WITHOUT_HOLD: usize = 16;
const RUN_OUTS_TO_STOP_HOLDING: usize = 2;

/// Loaders start reading this long after the open, so that the reads right after it (a
/// program's first queries) do not queue behind theirs: on the 16-core device host the first
/// read after a reopen took 7–15 ms behind four 4 MiB loader reads in flight. A few
/// milliseconds of the seconds that bringing a heap in takes.
const START_GRACE: Duration = Duration::from_millis(10);

/// Sleeps while `busy` says so, for at most `most`, or until the loaders stop. Returns
/// whether it slept all of `most`.
fn hold(stop: &AtomicBool, most: Duration, busy: impl Fn() -> bool) -> bool {
    let since = Instant::now();
    while busy() && !stop.load(Ordering::Relaxed) {
        if since.elapsed() >= most {
            return true;
        }
        std::thread::sleep(HOLD_POLL);
    }
    false
}

/// Threads joined when dropped.
struct JoinAll(Vec<JoinHandle<()>>);

impl Drop for JoinAll {
    fn drop(&mut self) {
        for thread in self.0.drain(..) {
            let _ = thread.join();
        }
    }
}

pub(crate) struct HeapLoader {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl HeapLoader {
    /// Starts the loaders where the heap has absent chunks (none otherwise, or when not
    /// `enabled`: chunks then come in only as they are used).
    pub fn start(engine: &Arc<Engine>, enabled: bool) -> Result<HeapLoader, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let runs: Vec<Vec<u64>> = if enabled { engine.heap().absent_runs() } else { Vec::new() };
        let runs = Arc::new(runs.iter().flat_map(|run| run.chunks(RUN_CHUNKS).map(<[u64]>::to_vec)).collect::<Vec<_>>());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let count = cores.clamp(1, MAX_LOADERS).min(runs.len());
        if count == 0 {
            return Ok(HeapLoader { stop, threads: Vec::new() });
        }
        let next = Arc::new(AtomicUsize::new(0));
        // At the users' priority, pausing only while an access's own load is under way: a
        // workload spread over the heap runs at full speed only once every chunk is in (on 2
        // cores, loaders at nice 10 or holding back whenever users read took 1.5x as long to
        // bring a 4 GiB heap in beside the Hathi workload).
        let load = {
            let (engine, stop) = (engine.clone(), stop.clone());
            move || {
                let heap = engine.heap();
                let (mut unheld, mut run_outs) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let Some(run) = runs.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                    if unheld > 0 {
                        unheld -= 1;
                    } else if hold(&stop, MAX_HOLD, || heap.access_loads() > 0) {
                        run_outs += 1;
                        if run_outs == RUN_OUTS_TO_STOP_HOLDING {
                            (unheld, run_outs) = (RUNS_WITHOUT_HOLD, 0);
                        }
                    } else {
                        run_outs = 0;
                    }
                    heap.load_run(run);
                }
            }
        };
        // One thread starts at the open; it starts the others once the grace is over, so
        // that the open pays for one thread's start, not four.
        let first_stop = stop.clone();
        let first = std::thread::Builder::new()
            .name("tusk-load-0".into())
            .spawn(move || {
                hold(&first_stop, START_GRACE, || true);
                if first_stop.load(Ordering::Relaxed) {
                    return;
                }
                // Joined however this thread's own loading ends, a panic included: `stop`
                // returns only once no loader runs.
                let _others = JoinAll(
                    (1..count).filter_map(|i| std::thread::Builder::new().name(format!("tusk-load-{i}")).spawn(load.clone()).ok()).collect(),
                );
                load();
            })
            .map_err(|source| Error::Io { path: "tusk-load thread".into(), source })?;
        Ok(HeapLoader { stop, threads: vec![first] })
    }

    /// Stops the loaders (each after its current run) and waits for them.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for HeapLoader {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold says whether it ran out, which is what turns a loader's holds off for a while.
    #[test]
    fn a_hold_reports_whether_it_ran_out() {
        let stop = AtomicBool::new(false);
        let most = Duration::from_millis(3);
        let since = Instant::now();
        assert!(hold(&stop, most, || true), "busy all along: ran out");
        assert!(since.elapsed() >= most);
        assert!(!hold(&stop, Duration::from_secs(60), || false), "not busy: no wait");
        let polls = std::sync::atomic::AtomicUsize::new(0);
        assert!(!hold(&stop, Duration::from_secs(60), || polls.fetch_add(1, Ordering::Relaxed) < 3), "busy no more before the cap");
        stop.store(true, Ordering::Relaxed);
        let since = Instant::now();
        assert!(!hold(&stop, Duration::from_secs(60), || true), "stopped: returns at once");
        assert!(since.elapsed() < Duration::from_secs(1));
    }
}
