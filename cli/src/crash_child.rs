//! The child process of kill tests: commits numbered transactions and prints each
//! acknowledgement (`ack <lsn> <n>`) as soon as its commit returns, until killed.
//! Transaction n writes n into slot n of a ring and sets the counter word to n.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use tusk::{Commit, Options, Store};

use super::CliResult;

/// Slots in the ring of written values.
pub const SLOTS: u64 = 1 << 16;

#[derive(Args, Debug)]
pub struct ChildArgs {
    #[arg(long)]
    dir: PathBuf,
    /// Stop after this many commits (default: run until killed).
    #[arg(long)]
    count: Option<u64>,
}

pub fn run(args: ChildArgs) -> CliResult {
    let store = Store::open(&args.dir, Options { heap_capacity: 256 << 20, ..Options::default() })?;
    let (ring, _) = store.transact(Commit::Sync, |tx| match tx.root("crash-ring")? {
        Some(p) => Ok(p),
        None => {
            let p = tx.alloc(8 * (SLOTS + 1))?;
            tx.set_root("crash-ring", p)?;
            Ok(p)
        }
    })?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut done = 0u64;
    while args.count.is_none_or(|c| done < c) {
        let (n, lsn) = store.transact(Commit::Sync, |tx| {
            let n = tx.read_u64_at(ring, 0)? + 1;
            tx.write_u64_at(ring, 0, n)?;
            tx.write_u64_at(ring, 8 * (1 + n % SLOTS), n)?;
            Ok(n)
        })?;
        writeln!(out, "ack {} {n}", lsn.expect("update transaction"))?;
        out.flush()?;
        done += 1;
    }
    store.close()?;
    Ok(())
}
