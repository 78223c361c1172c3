//! `tusk crashtest --nodes N`: the bank on a replicated group on loopback while faults strike
//! it, cycle after cycle: the leader killed (and opened again: it rebuilds), a follower
//! killed (and opened again), a node cut off from the others for longer than an election
//! takes (a partition, healed: a leader cut off is deposed and rebuilds in place), a node
//! killed with its disk's power cut (its store's and its copy of the group's log's unsynced
//! writes rolled back by sector, the crash runs' power model), a bit flipped in one of a
//! killed node's store files, a node's disk failing its writes and syncs (EIO, ENOSPC) until
//! replaced, and every message dropped, delayed or sent twice with some probability. Worker
//! threads run
//! `Sync` transfers throughout, on whichever node leads. At the end every node must hold
//! the group's log up to the last acknowledged commit, with money conserved, every
//! acknowledged transfer present, and all balances alike. Every wait is bounded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::Options;
use tusk_replica::network::MessageFaults;
use tusk_replica::{Position, Rebuilt, ReplicatedNode};

use super::crashtest::faults::flip_bit_in;
use super::group::{LocalGroup, Settings};
use super::group_bank::{self, BlobTally, Clock, Tally, PATIENCE};
use super::report::table;
use super::CliResult;

/// The faults of a group's crash cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupFault {
    KillLeader,
    KillFollower,
    /// A node (the leader or not) killed with its disk's power cut: of its store's writes
    /// not yet synced, none, all or each sector with probability ½ reach the disk.
    PowerCut,
    Partition,
    Messages,
    /// A node (the leader or not) killed and a bit of one of its store's files flipped
    /// (log segments, checkpoint images, manifests; not an image file it shares with its
    /// snapshot, which would damage the copy it heals from too).
    Bitflip,
    /// A node's disk (the leader's or not) fails every write and sync with EIO or ENOSPC
    /// after a few more succeed, its store's and its copy of the group's log alike; the node
    /// gives up what it can no longer do (the lead, its Raft) and the others go on. Then
    /// the disk is replaced: the node killed and opened again on it.
    DiskErrors,
}

impl GroupFault {
    const ALL: [GroupFault; 7] =
        [GroupFault::KillLeader, GroupFault::KillFollower, GroupFault::PowerCut, GroupFault::Partition, GroupFault::Messages, GroupFault::Bitflip, GroupFault::DiskErrors];

    fn name(self) -> &'static str {
        match self {
            GroupFault::KillLeader => "kill-leader",
            GroupFault::KillFollower => "kill-follower",
            GroupFault::PowerCut => "power-cut",
            GroupFault::Partition => "partition",
            GroupFault::Messages => "messages",
            GroupFault::Bitflip => "bitflip",
            GroupFault::DiskErrors => "disk-errors",
        }
    }
}

pub struct GroupRun {
    pub nodes: usize,
    pub cycles: u64,
    pub seed: u64,
    pub threads: usize,
    /// How long a fault lasts, and the group then runs without one.
    pub dwell: Duration,
    /// MiB of the region a large writer rewrites beside the transfers (0: none).
    pub large_mib: u64,
}

/// The index of a node that is up and does not lead, if any.
fn follower(group: &LocalGroup, rng: &mut SmallRng) -> Option<usize> {
    let up: Vec<usize> = (0..group.len()).filter(|&i| group.node(i).is_some_and(|n| n.as_ref().is_some_and(|n| !n.is_leader()))).collect();
    (!up.is_empty()).then(|| up[rng.random_range(0..up.len())])
}

/// Each node's rebuilds in place so far (0 for a node that is down).
fn rebuilds(group: &LocalGroup) -> Vec<u64> {
    per_node(group, ReplicatedNode::rebuilds)
}

/// Snapshots each node installed since it was opened (0 for one that is down).
fn installs(group: &LocalGroup) -> Vec<u64> {
    per_node(group, ReplicatedNode::snapshots_installed)
}

fn per_node(group: &LocalGroup, count: fn(&ReplicatedNode) -> u64) -> Vec<u64> {
    (0..group.len()).map(|i| group.node(i).and_then(|n| n.as_ref().map(count)).unwrap_or(0)).collect()
}

/// How much `now` grew over `before`, node by node (a node killed and opened again counts
/// from 0).
fn grown(now: &[u64], before: &[u64]) -> u64 {
    now.iter().zip(before).map(|(now, was)| now.saturating_sub(*was)).sum()
}

/// Strikes the group with `fault` for `dwell`, then heals it; returns why a node killed and
/// opened again made its store anew, if it did (it had led, or its store was damaged).
fn strike(group: &LocalGroup, fault: GroupFault, dwell: Duration, rng: &mut SmallRng) -> Result<Option<Rebuilt>, Box<dyn std::error::Error>> {
    let mut rebuilt = None;
    match fault {
        GroupFault::Bitflip => {
            let i = rng.random_range(0..group.len());
            if group.node(i).is_some_and(|n| n.is_some()) {
                group.kill(i);
                let store = tusk_replica::stores::current(&group.node_dir(i))?;
                flip_bit_in(&store, rng, |p| std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::MetadataExt::nlink(&m) == 1))?;
                std::thread::sleep(dwell);
                rebuilt = group.restart(i)?;
            }
        }
        GroupFault::DiskErrors => {
            let i = rng.random_range(0..group.len());
            if group.node(i).is_some_and(|n| n.is_some()) {
                let errno = if rng.random_bool(0.5) { libc::EIO } else { libc::ENOSPC };
                group.fail_disk(i, rng.random_range(0..200), errno)?;
                std::thread::sleep(dwell);
                group.kill(i);
                group.mend_disk(i);
                rebuilt = group.restart(i)?;
            }
        }
        GroupFault::KillLeader | GroupFault::KillFollower => {
            let victim = if fault == GroupFault::KillLeader { group.leader(PATIENCE) } else { follower(group, rng) };
            if let Some(i) = victim {
                group.kill(i);
                std::thread::sleep(dwell);
                rebuilt = group.restart(i)?;
            }
        }
        GroupFault::PowerCut => {
            let i = rng.random_range(0..group.len());
            if group.node(i).is_some() {
                let policy = rng.random_range(0..3u8);
                let mut sectors = SmallRng::seed_from_u64(rng.random());
                group.power_cut(i, &mut |_, _| match policy {
                    0 => false,
                    1 => true,
                    _ => sectors.random_bool(0.5),
                })?;
                std::thread::sleep(dwell);
                rebuilt = group.restart(i)?;
            }
        }
        GroupFault::Partition => {
            let cut = rng.random_range(0..group.len());
            let others: Vec<usize> = (0..group.len()).filter(|&j| j != cut).collect();
            for &j in &others {
                if let Some(n) = group.node(j) {
                    n.as_ref().expect("up").links().cut(cut as u64 + 1);
                }
                if let Some(n) = group.node(cut) {
                    n.as_ref().expect("up").links().cut(j as u64 + 1);
                }
            }
            // Longer than the election timeout (at most 600 ms): a leader cut off is deposed.
            std::thread::sleep(dwell + Duration::from_millis(700));
            for i in 0..group.len() {
                if let Some(n) = group.node(i) {
                    n.as_ref().expect("up").links().heal_all();
                }
            }
        }
        GroupFault::Messages => {
            for i in 0..group.len() {
                if let Some(n) = group.node(i) {
                    let faults = MessageFaults { drop: 0.1, duplicate: 0.1, delay: Some((Duration::ZERO, Duration::from_millis(3))), seed: rng.random() };
                    n.as_ref().expect("up").links().set_faults(Some(faults));
                }
            }
            std::thread::sleep(dwell);
            for i in 0..group.len() {
                if let Some(n) = group.node(i) {
                    n.as_ref().expect("up").links().set_faults(None);
                }
            }
        }
    }
    Ok(rebuilt)
}

pub fn run(dir: &std::path::Path, plan: GroupRun, json: bool) -> CliResult {
    let GroupRun { nodes, cycles, seed, threads, dwell, large_mib } = plan;
    if nodes < 3 {
        return Err("a group that survives the loss of a node needs --nodes 3 or more".into());
    }
    let accounts = 1_000;
    // A run's group is made afresh (an earlier run's in the same --dir is removed).
    if dir.join("n1").join("raft.redb").exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let options = Options { heap_capacity: 256 << 20, checkpoint_interval: Some(Duration::from_millis(500)), ..Options::default() };
    // A commit whose leader was cut off gives up after this (its outcome then unknown).
    // Snapshots every 256 KiB of the group's log, 20 entries kept below them: a node killed
    // or cut off for a cycle is often behind what the others' logs reach, and catches up by
    // a snapshot; a node that led rebuilds from its own.
    let settings = Settings {
        commit_timeout: Duration::from_secs(2),
        journaled: Some(Duration::from_micros(200)),
        snapshot_after_log_bytes: Some(256 << 10),
        log_kept_after_snapshot: 20,
        ..Settings::default()
    };
    let group = LocalGroup::start(dir, nodes, options, settings)?;
    let bank = group_bank::load(&group, accounts, threads)?;
    let blob = if large_mib > 0 { Some(group_bank::load_blob(&group, large_mib)?) } else { None };
    let mut rng = SmallRng::seed_from_u64(seed);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (never, resumed, last_index) = (AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX), AtomicU64::new(0));
    let mut struck = [0u64; GroupFault::ALL.len()];
    let (mut reopened, mut healed, mut in_place, mut installed) = (0u64, 0u64, 0u64, 0u64);
    let mut stalled = 0;
    let outcome: Result<(Vec<Tally>, BlobTally), Box<dyn std::error::Error>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let clock = Clock { started, kill_ns: &never, resumed_ns: &resumed, last_index: &last_index };
                let (group, stop) = (&group, &stop);
                s.spawn(move || group_bank::transfer(group, t, bank, stop, clock))
            })
            .collect();
        let large = blob.map(|blob| {
            let (group, stop) = (&group, &stop);
            s.spawn(move || group_bank::write_blobs(group, blob, dwell / 2, stop))
        });
        let mut run = || -> Result<(), Box<dyn std::error::Error>> {
            for _ in 0..cycles {
                let k = rng.random_range(0..GroupFault::ALL.len());
                let (before, installs_before) = (rebuilds(&group), installs(&group));
                match strike(&group, GroupFault::ALL[k], dwell, &mut rng)? {
                    Some(Rebuilt::Damaged(_)) => healed += 1,
                    Some(_) => reopened += 1,
                    None => {}
                }
                struck[k] += 1;
                // Healed: the group must commit again within the patience.
                let committed = last_index.load(Ordering::SeqCst);
                let deadline = Instant::now() + PATIENCE;
                while last_index.load(Ordering::SeqCst) == committed {
                    if Instant::now() > deadline {
                        stalled += 1;
                        return Err(format!("no commit within {PATIENCE:?} after a {} fault", GroupFault::ALL[k].name()).into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::thread::sleep(dwell);
                in_place += grown(&rebuilds(&group), &before);
                installed += grown(&installs(&group), &installs_before);
            }
            Ok(())
        };
        let ran = run();
        stop.store(true, Ordering::SeqCst);
        let tallies = workers.into_iter().map(|w| w.join().expect("worker")).collect();
        let large = large.map(|w| w.join().expect("large writer")).unwrap_or_default();
        ran.map(|()| (tallies, large))
    });
    let (tallies, large) = outcome?;
    // Nodes deposed in the last cycle finish their rebuild before the check.
    let deadline = Instant::now() + PATIENCE;
    while (0..group.len()).any(|i| group.node(i).is_some_and(|n| n.as_ref().is_some_and(|n| n.needs_rebuild()))) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let last = Position { index: last_index.load(Ordering::SeqCst) };
    let verified = group_bank::verify(&group, bank, &tallies, last).and_then(|()| blob.map_or(Ok(()), |blob| group_bank::verify_blob(&group, blob, &large, last)));
    let acked: u64 = tallies.iter().map(|t| t.acked).sum();
    let uncertain: u64 = tallies.iter().map(|t| t.uncertain).sum();
    let counts: Vec<String> = GroupFault::ALL.iter().zip(struck).map(|(f, n)| format!("{} {n}", f.name())).collect();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "crashtest": "group", "nodes": nodes, "cycles": cycles, "seed": seed,
                "faults": GroupFault::ALL.iter().zip(struck).map(|(f, n)| (f.name().to_string(), n)).collect::<std::collections::BTreeMap<_, _>>(),
                "acknowledged": acked, "unknown": uncertain, "rebuilt_when_reopened": reopened, "rebuilt_from_damage": healed, "rebuilt_in_place": in_place, "snapshots_installed": installed,
                "disk_requests_failed": group.disk_failures(),
                "large_mib": large_mib, "large_acknowledged": large.acked, "large_unknown": large.uncertain.len(),
                "stalled": stalled, "lost": if verified.is_ok() { 0 } else { 1 }, "seconds": started.elapsed().as_secs_f64(),
                "failure": verified.as_ref().err(),
            })
        );
    } else {
        table(
            &format!("tusk crashtest --nodes {nodes}: {cycles} cycles, seed {seed}"),
            &[
                ("faults", counts.join(", ")),
                ("transfers acknowledged", format!("{acked} (outcome unknown: {uncertain})")),
                ("stores rebuilt from the group's log", format!("{reopened} when opened after leading, {healed} found damaged when opened, {in_place} in place (lead lost, or Raft failed)")),
                ("snapshots installed by members behind the log", installed.to_string()),
                ("disk requests failed", group.disk_failures().to_string()),
                ("large transactions", if large_mib > 0 { format!("{large_mib} MiB each: {} acknowledged, {} of unknown outcome", large.acked, large.uncertain.len()) } else { "none (--large-mib)".into() }),
                ("verified on every node", verified.as_ref().map_or_else(|e| format!("FAILED: {e}"), |()| "money conserved, every acknowledged transfer present, all nodes alike".into())),
                ("seconds", format!("{:.1}", started.elapsed().as_secs_f64())),
            ],
        );
    }
    group.close()?;
    Ok(verified?)
}
