//! Kill test: a child process commits with `Commit::Sync` and reports each acknowledged
//! transaction; the parent SIGKILLs it at a random moment, reopens the store, and finds every
//! acknowledged transaction. Several cycles, each continuing from the recovered state.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use tusk::{Commit, Options, Store};

/// Must match the child's ring size (cli/src/crash_child.rs).
const SLOTS: u64 = 1 << 16;

fn child_acks_then_kill(dir: &std::path::Path, kill_after: usize) -> Vec<(u64, u64)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tusk"))
        .args(["crash-child", "--dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tusk crash-child");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acks = Vec::new();
    let parse = |line: String| -> (u64, u64) {
        let mut it = line.split_whitespace();
        assert_eq!(it.next(), Some("ack"), "unexpected child output {line:?}");
        (it.next().unwrap().parse().unwrap(), it.next().unwrap().parse().unwrap())
    };
    while acks.len() < kill_after {
        match lines.next() {
            Some(line) => acks.push(parse(line.unwrap())),
            None => panic!("child exited before {kill_after} acknowledgements"),
        }
    }
    child.kill().expect("SIGKILL the child");
    // Acknowledgements already in the pipe were given before the kill: they count too.
    for line in lines {
        acks.push(parse(line.unwrap()));
    }
    child.wait().unwrap();
    acks
}

#[test]
fn every_sync_acknowledged_transaction_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected_floor = 0;
    for (cycle, kill_after) in [37usize, 211, 5, 120].into_iter().enumerate() {
        let acks = child_acks_then_kill(dir.path(), kill_after);
        assert!(acks.len() >= kill_after);
        let store = Store::open(dir.path(), Options { heap_capacity: 256 << 20, ..Options::default() }).unwrap();
        let report = store.recovery_report().clone();
        let max_ack = acks.iter().map(|&(_, n)| n).max().unwrap();
        let max_lsn = acks.iter().map(|&(lsn, _)| lsn).max().unwrap();
        assert!(report.recovered_lsn >= max_lsn, "cycle {cycle}: recovered LSN {} < acknowledged {max_lsn}", report.recovered_lsn);
        let (counter, _) = store
            .transact(Commit::Async, |tx| {
                let ring = tx.root("crash-ring")?.expect("ring root");
                let counter = tx.read_u64_at(ring, 0)?;
                for &(_, n) in &acks {
                    let slot = tx.read_u64_at(ring, 8 * (1 + n % SLOTS))?;
                    assert_eq!(slot, n, "cycle {cycle}: acknowledged transaction {n} missing");
                }
                Ok(counter)
            })
            .unwrap();
        assert!(counter >= max_ack, "cycle {cycle}: counter {counter} < acknowledged {max_ack}");
        assert!(counter >= expected_floor, "the counter never goes back");
        expected_floor = counter;
        store.close().unwrap();
    }
}
