//! `tusk demo --nodes N`: the bank on a replicated group of N nodes on loopback. Loads the
//! accounts through the leader with `Sync` commits (each acknowledged once a majority holds
//! it), runs transfers from every worker thread, kills the leader halfway, goes on under the
//! leader the others elect, opens the killed node again (it rebuilds from the group's log),
//! and verifies on every node: money conserved, every acknowledged transfer there (each
//! counts itself in its worker's slot in the heap), and all nodes alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, HeapPtr, Options};
use tusk_replica::{Position, ReplicaError, ReplicatedNode};

use super::demo_bank::{ACCOUNTS_ROOT, INITIAL_BALANCE, STATS_ROOT};
use super::group::LocalGroup;
use super::report::{human_rate, table};
use super::CliResult;

const LOAD_BATCH: u64 = 8_192;
/// How long the demo waits for an election or a node to catch up before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// What one worker saw: transfers acknowledged, and those whose outcome it cannot know
/// (the leader failed before acknowledging them).
#[derive(Default, Clone, Copy)]
struct Tally {
    acked: u64,
    uncertain: u64,
}

pub struct Plan {
    pub nodes: usize,
    pub accounts: u64,
    pub threads: usize,
    pub seconds: f64,
}

fn on_leader<T>(group: &LocalGroup, f: impl FnOnce(&ReplicatedNode) -> T) -> Result<T, String> {
    let i = group.leader(PATIENCE).ok_or("no leader elected")?;
    let slot = group.node(i).ok_or("the leader went down")?;
    Ok(f(slot.as_ref().expect("up")))
}

fn balances(node: &ReplicatedNode, accounts: u64, threads: usize) -> Result<(Vec<u64>, Vec<u64>), tusk::Error> {
    let (both, _) = node.store().transact(Commit::Async, |tx| {
        let bank = tx.root(ACCOUNTS_ROOT)?.expect("the bank is replicated");
        let stats = tx.root(STATS_ROOT)?.expect("the counts are replicated");
        let b = (0..accounts).map(|a| tx.read_u64_at(bank, 8 * a)).collect::<Result<Vec<_>, _>>()?;
        let s = (0..threads as u64).map(|t| tx.read_u64_at(stats, 8 * t)).collect::<Result<Vec<_>, _>>()?;
        Ok((b, s))
    })?;
    Ok(both)
}

pub fn run(dir: &std::path::Path, plan: Plan) -> CliResult {
    let Plan { nodes, accounts, threads, seconds } = plan;
    let options = Options {
        heap_capacity: (accounts * 8 + (256 << 20)).next_power_of_two(),
        checkpoint_interval: Some(Duration::from_secs(1)),
        ..Options::default()
    };
    let group = LocalGroup::start(dir, nodes, options)?;
    let first = group.leader(PATIENCE).ok_or("no leader elected")?;
    outln!("tusk demo: {nodes} nodes on loopback, {accounts} accounts, {threads} threads, stores in {} (node {} leads)", dir.display(), first + 1);

    let load_started = Instant::now();
    let (bank, stats) = on_leader(&group, |leader| {
        let ((bank, stats), _) = leader.transact(Commit::Sync, |tx| {
            let bank = tx.alloc(accounts * 8)?;
            let stats = tx.alloc(8 * threads as u64)?;
            tx.set_root(ACCOUNTS_ROOT, bank)?;
            tx.set_root(STATS_ROOT, stats)?;
            Ok((bank, stats))
        })?;
        let mut loaded = 0;
        while loaded < accounts {
            let end = (loaded + LOAD_BATCH).min(accounts);
            leader.transact(Commit::Sync, |tx| (loaded..end).try_for_each(|i| tx.write_u64_at(bank, i * 8, INITIAL_BALANCE)))?;
            loaded = end;
        }
        Ok::<_, ReplicaError>((bank, stats))
    })??;
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
                s.spawn(move || transfer(group, t, Bank { bank, stats, accounts }, stop, clock))
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
    let rebuilt = group.restart(killed)?;
    let last = Position { index: last_index.load(Ordering::SeqCst) };
    let mut reference: Option<Vec<u64>> = None;
    for i in 0..group.len() {
        let slot = group.node(i).ok_or("a node is down")?;
        let node = slot.as_ref().expect("up");
        if !node.wait_applied(last, PATIENCE) {
            return Err(format!("node {} did not apply the group's log up to {} within {PATIENCE:?}", i + 1, last.index).into());
        }
        let (b, counts) = balances(node, accounts, threads)?;
        let total: u64 = b.iter().sum();
        if total != accounts * INITIAL_BALANCE {
            return Err(format!("node {}: money not conserved: {total} != {}", i + 1, accounts * INITIAL_BALANCE).into());
        }
        for (t, (&n, tally)) in counts.iter().zip(&tallies).enumerate() {
            if n < tally.acked || n > tally.acked + tally.uncertain {
                return Err(format!("node {}: worker {t} counted {n} transfers, acknowledged {} (+{} unknown)", i + 1, tally.acked, tally.uncertain).into());
            }
        }
        match &reference {
            None => reference = Some(b),
            Some(r) if *r != b => return Err(format!("node {} differs from node 1 at position {}", i + 1, last.index).into()),
            Some(_) => {}
        }
    }
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

/// Where the bank lives in every node's heap.
#[derive(Clone, Copy)]
struct Bank {
    bank: HeapPtr,
    stats: HeapPtr,
    accounts: u64,
}

/// What the workers report as they go.
#[derive(Clone, Copy)]
struct Clock<'a> {
    started: Instant,
    kill_ns: &'a AtomicU64,
    resumed_ns: &'a AtomicU64,
    last_index: &'a AtomicU64,
}

/// One worker: `Sync` transfers on whichever node leads, each counting itself in the
/// worker's slot, until `stop`.
fn transfer(group: &LocalGroup, t: usize, at: Bank, stop: &AtomicBool, clock: Clock<'_>) -> Tally {
    let Bank { bank, stats, accounts } = at;
    let mut rng = SmallRng::seed_from_u64(t as u64 + 1);
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let Some(i) = group.leader(Duration::from_millis(200)) else { continue };
        let Some(slot) = group.node(i) else { continue };
        let leader = slot.as_ref().expect("up");
        let (from, to, amount) = (rng.random_range(0..accounts), rng.random_range(0..accounts), rng.random_range(1..=50));
        let done = leader.transact(Commit::Sync, |tx| {
            let a = tx.read_u64_at(bank, from * 8)?;
            if a >= amount && from != to {
                tx.write_u64_at(bank, from * 8, a - amount)?;
                let b = tx.read_u64_at(bank, to * 8)?;
                tx.write_u64_at(bank, to * 8, b + amount)?;
            }
            let n = tx.read_u64_at(stats, t as u64 * 8)?;
            tx.write_u64_at(stats, t as u64 * 8, n + 1)
        });
        match done {
            Ok((_, position)) => {
                tally.acked += 1;
                let now = clock.started.elapsed().as_nanos() as u64;
                if now > clock.kill_ns.load(Ordering::SeqCst) {
                    clock.resumed_ns.fetch_min(now, Ordering::SeqCst);
                }
                clock.last_index.fetch_max(position.map_or(0, |p| p.index), Ordering::SeqCst);
            }
            Err(ReplicaError::NotCommitted { .. } | ReplicaError::CommitTimedOut { .. }) => tally.uncertain += 1,
            // It stopped leading before the transaction ran: nothing was written.
            Err(ReplicaError::NotLeader { .. }) => {}
            Err(e) => panic!("worker {t}: {e}"),
        }
    }
    tally
}
