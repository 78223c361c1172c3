//! The worker threads that bulk work over the heap runs on: dirty-epoch scans
//! ([`crate::Heap::dirty_runs`]) and image copies (snapshots, the GPU mirror's syncs).
//!
//! One pool for the process, started at first use, one thread per core: starting threads for
//! each copy cost more than the copy itself (16 spawns and joins measured 0.67 ms on the
//! 16-core device host, where a scan of a 4 GiB heap's epochs takes 0.9 ms and the copy of 1%
//! of its pages 0.4 ms). Separate from rayon's global pool, so that an application's own rayon
//! work neither waits behind nor starves tusk's.

use std::sync::OnceLock;

/// Most threads of the pool.
pub const MAX_WORKERS: usize = 64;

/// The pool (started at first use).
pub fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS);
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tusk-worker-{i}"))
            .build()
            .expect("the worker pool's threads start")
    })
}

/// Threads the pool runs.
pub fn threads() -> usize {
    pool().current_num_threads()
}
