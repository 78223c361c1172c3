//! The `tusk` command: the demo, benchmarks, and helpers for crash tests.

use clap::Parser;
use tusk_cli as cli;

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
