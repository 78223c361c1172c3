//! The `tusk` command: the demo, benchmarks, and helpers for crash tests.

mod cli;

use clap::Parser;

/// Counts live allocator bytes, so `tusk bench index` can report the peers' memory per key.
/// One relaxed atomic add per allocation; tusk's own hot paths reuse their buffers.
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

fn main() {
    let args = cli::Cli::parse();
    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cli::run(args))) {
        Ok(result) => result,
        Err(payload) if payload.is::<cli::StdoutClosed>() => return,
        Err(payload) => std::panic::resume_unwind(payload),
    };
    if let Err(e) = result {
        if cli::is_broken_pipe(e.as_ref()) {
            return;
        }
        eprintln!("tusk: {e}");
        std::process::exit(1);
    }
}
