//! `tusk demo --nodes N`: the bank on a replicated group of N nodes on loopback. Loads the
//! accounts through the leader with `Sync` commits (each acknowledged once a majority holds
//! it), runs transfers from every worker thread, kills the leader halfway, goes on under the
//! leader the others elect, opens the killed node again (it rebuilds from the group's log),
//! and verifies on every node: money conserved, every acknowledged transfer there (each
//! counts itself in its worker's slot in the heap), and all nodes alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tusk::Options;
use tusk_replica::Position;

use super::group::{LocalGroup, Settings};
use super::group_bank::{self, Clock, Tally, PATIENCE};
use super::report::{human_rate, table};
use super::CliResult;

pub struct Plan {
    pub nodes: usize,
    pub accounts: u64,
    pub threads: usize,
    pub seconds: f64,
}

pub fn run(dir: &std::path::Path, plan: Plan) -> CliResult {
    let Plan { nodes, accounts, threads, seconds } = plan;
    let options = Options {
        heap_capacity: (accounts * 8 + (256 << 20)).next_power_of_two(),
        checkpoint_interval: Some(Duration::from_secs(1)),
        ..Options::default()
    };
    let group = LocalGroup::start(dir, nodes, options, Settings::default())?;
    let first = group.leader(PATIENCE).ok_or("no leader elected")?;
    outln!("tusk demo: {nodes} nodes on loopback, {accounts} accounts, {threads} threads, stores in {} (node {} leads)", dir.display(), first + 1);

    let load_started = Instant::now();
    let bank = group_bank::load(&group, accounts, threads)?;
    outln!("load   {accounts} accounts in {:.2} s, every batch acknowledged by a majority", load_started.elapsed().as_secs_f64());

    let stop = AtomicBool::new(false);
    let started = Instant::now();
    // Nanoseconds since `started`: when the leader was killed, and the first commit after.
    let kill_ns = AtomicU64::new(u64::MAX);
    let resumed_ns = AtomicU64::new(u64::MAX);
    let last_index = AtomicU64::new(0);
    let mut killed = None;
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let clock = Clock { started, kill_ns: &kill_ns, resumed_ns: &resumed_ns, last_index: &last_index };
                let (group, stop) = (&group, &stop);
                s.spawn(move || group_bank::transfer(group, t, bank, stop, clock))
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
        if let Some(l) = group.leader(PATIENCE) {
            group.kill(l);
            let at = started.elapsed();
            kill_ns.store(at.as_nanos() as u64, Ordering::SeqCst);
            killed = Some((l, at));
        }
        std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
        stop.store(true, Ordering::SeqCst);
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let (killed, killed_at) = killed.ok_or("no leader to kill")?;
    let ran = started.elapsed().as_secs_f64();
    let acked: u64 = tallies.iter().map(|t| t.acked).sum();
    let uncertain: u64 = tallies.iter().map(|t| t.uncertain).sum();
    let resumed = match resumed_ns.load(Ordering::SeqCst) {
        u64::MAX => return Err("no transfer committed after the leader was killed".into()),
        ns => Duration::from_nanos(ns).saturating_sub(killed_at),
    };
    let new_leader = group.leader(PATIENCE).ok_or("no leader after the kill")?;

    let back_started = Instant::now();
    let rebuilt = group.restart(killed)?.is_some();
    let last = Position { index: last_index.load(Ordering::SeqCst) };
    group_bank::verify(&group, bank, &tallies, last)?;
    let caught_up = back_started.elapsed();
    table(
        "replicated run",
        &[
            ("nodes", format!("{nodes} (node {} led, killed at {:.2} s; node {} leads now)", killed + 1, killed_at.as_secs_f64(), new_leader + 1)),
            ("transfers acknowledged", format!("{acked} ({}/s, each held by a majority)", human_rate(acked as f64 / ran))),
            ("unknown at the kill", uncertain.to_string()),
            ("commits resumed after the kill", format!("{:.0} ms", resumed.as_secs_f64() * 1e3)),
            ("killed node back", format!("{} and caught up in {:.2} s", if rebuilt { "rebuilt from the group's log" } else { "reopened" }, caught_up.as_secs_f64())),
            ("verified on every node", format!("money conserved, every acknowledged transfer present, all {nodes} alike at entry {}", last.index)),
        ],
    );
    group.close()?;
    Ok(())
}
