//! The `tusk` command: the demo, benchmarks, and helpers for crash tests.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    if let Err(e) = cli::run(args) {
        eprintln!("tusk: {e}");
        std::process::exit(1);
    }
}
