//! Catch-up by snapshot: nodes make snapshots of their heaps as the group's log grows and
//! purge the log below them; a member the log no longer reaches, or a new one, installs a
//! snapshot (the heap image as its store's checkpoint) and then the log after it; a leader's
//! snapshot, taken while its transactions run, holds exactly what the group committed; a
//! node that led rebuilds from its own snapshot and the log left after it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tusk_replica::{NodeConfig, ReplicatedNode};

mod common;
use common::*;

/// Snapshots every 64 KiB of log, 5 entries kept below them.
fn snapshotting(id: u64) -> NodeConfig {
    let mut c = config(id);
    c.snapshot_after_log_bytes = Some(64 << 10);
    c.log_kept_after_snapshot = 5;
    c
}

fn open_snapshotting(dir: &Path, id: u64, listen: Option<SocketAddr>) -> ReplicatedNode {
    open_with(dir, snapshotting(id), listen)
}

/// Waits until `node` made a snapshot and purged its log past `index`.
fn purged_past(node: &ReplicatedNode, index: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let (Some(snapshot), Some(purged)) = node.snapshot_and_purged() {
            if purged > index {
                return (snapshot, purged);
            }
        }
        assert!(Instant::now() < deadline, "node {} purged no log past {index}: {:?}", node.id(), node.snapshot_and_purged());
        node.trigger_snapshot().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn members_the_log_no_longer_reaches_catch_up_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, members, l) = started(dir.path(), snapshotting);
    open_bank(nodes[l].as_ref().unwrap());
    transfer(nodes[l].as_ref().unwrap(), 50, 1).unwrap();

    // A follower goes down; the group goes on past what the log keeps.
    let f = (l + 1) % 3;
    let down = nodes[f].take().unwrap();
    let (down_id, down_addr, down_at) = (down.id(), down.addr(), down.applied());
    down.crash();
    let leader = nodes[l].as_ref().unwrap();
    // The follower's log may hold entries past what it applied; none past this commit, made
    // once it was down.
    let after_down = transfer(leader, 1, 9).unwrap();
    assert!(after_down.index > down_at.index);
    let at = transfer(leader, 600, 2).unwrap();
    // Every member up purges: whichever leads when the follower is back (a restart's
    // election can move the lead) can only send a snapshot.
    for n in nodes.iter().flatten() {
        let (snapshot, purged) = purged_past(n, after_down.index + 5);
        assert!(snapshot >= purged, "the log is purged only below a snapshot: {snapshot} {purged}");
    }

    // Back: the log no longer reaches its position, so the leader sends its snapshot.
    let back = open_snapshotting(dir.path(), down_id, Some(down_addr));
    assert!(!back.rebuilt(), "a follower keeps its store when opened");
    assert!(back.wait_applied(at, Duration::from_secs(30)), "the member catches up");
    assert!(back.snapshots_installed() >= 1, "by a snapshot");
    assert_eq!(balances(&back), balances(leader));
    let named = std::fs::read_to_string(dir.path().join(format!("n{down_id}/STORE"))).unwrap();
    assert!(named.starts_with("store."), "the installed store is the node's store: {named}");
    nodes[f] = Some(back);

    // A new member joins after the purge: it starts from a snapshot too.
    nodes.push(Some(open_snapshotting(dir.path(), 4, None)));
    let fourth = nodes[3].as_ref().unwrap().addr();
    nodes[l].as_ref().unwrap().add_member(4, fourth).unwrap();
    let at = transfer(nodes[l].as_ref().unwrap(), 100, 3).unwrap();
    let expected = balances(nodes[l].as_ref().unwrap());
    assert_eq!(expected.iter().sum::<u64>(), ACCOUNTS * START);
    converged(nodes.iter().flatten(), at, &expected, Duration::from_secs(30));
    assert!(nodes[3].as_ref().unwrap().snapshots_installed() >= 1, "the new member installed a snapshot");

    // Installed stores are durable: closed and opened again, the nodes hold the same.
    for n in nodes.iter_mut() {
        if let Some(node) = n.take() {
            node.close().unwrap();
        }
    }
    let again: Vec<ReplicatedNode> = [down_id, 4].into_iter().map(|id| open_snapshotting(dir.path(), id, Some(members.iter().find(|m| m.0 == id).map_or(fourth, |m| m.1)))).collect();
    for n in &again {
        assert!(n.applied() >= at, "node {} reopened at {:?}", n.id(), n.applied());
        assert_eq!(balances(n), expected, "node {} reopened", n.id());
    }
    for n in again {
        n.close().unwrap();
    }
}

/// The leader snapshots while writers commit: its image runs ahead of the group, and the
/// snapshot's tail must make it exact. Killed and opened again, it rebuilds from that
/// snapshot and what is left of the log, and converges with the others.
#[test]
fn a_leaders_snapshot_holds_what_the_group_committed_and_rebuilds_it() {
    let dir = tempfile::tempdir().unwrap();
    // One proposal in flight: the records committed meanwhile go together in the next
    // entry, so entries span the LSN a snapshot's image is copied at.
    let batching = |id| NodeConfig { proposals_in_flight: 1, ..snapshotting(id) };
    let (mut nodes, _, l) = started(dir.path(), batching);
    open_bank(nodes[l].as_ref().unwrap());
    let leader = nodes[l].as_ref().unwrap();
    let stop = AtomicBool::new(false);
    let first_snapshot = leader.snapshot_and_purged().0;
    let at = std::thread::scope(|s| {
        let writers: Vec<_> = (0..8u64)
            .map(|w| {
                let stop = &stop;
                s.spawn(move || {
                    let mut last = None;
                    let mut round = 0;
                    while !stop.load(Ordering::SeqCst) {
                        last = Some(transfer(leader, 20, w * 1000 + round).unwrap());
                        round += 1;
                    }
                    last.unwrap()
                })
            })
            .collect();
        // Snapshots made while the writers run.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut made = 0;
        let mut seen = first_snapshot;
        while made < 10 {
            assert!(Instant::now() < deadline, "the leader made {made} snapshots in 20 s");
            leader.trigger_snapshot().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let now = leader.snapshot_and_purged().0;
            if now > seen {
                made += 1;
                seen = now;
            }
        }
        stop.store(true, Ordering::SeqCst);
        writers.into_iter().map(|w| w.join().unwrap()).max().unwrap()
    });
    let expected = balances(leader);
    assert_eq!(expected.iter().sum::<u64>(), ACCOUNTS * START);
    let (snapshot, _) = purged_past(leader, 0);

    // The leader dies; opened again, it had led: its store is made from its snapshot.
    let old = nodes[l].take().unwrap();
    let (id, addr) = (old.id(), old.addr());
    old.crash();
    let back = open_snapshotting(dir.path(), id, Some(addr));
    assert!(back.rebuilt());
    assert!(back.wait_applied(at, Duration::from_secs(30)));
    assert!(back.applied().index >= snapshot);
    assert_eq!(balances(&back), expected, "the snapshot and the log after it make the committed state");
    nodes[l] = Some(back);
    let rest: Vec<&ReplicatedNode> = nodes.iter().flatten().collect();
    let l2 = leader_of(&rest);
    let at2 = transfer(rest[l2], 50, 9).unwrap();
    let expected = balances(rest[l2]);
    converged(rest, at2, &expected, Duration::from_secs(30));
    close_all(nodes);
}


/// Flips one bit of one of `store`'s own files (not one it shares with its snapshot).
fn flip_a_bit(store: &Path, rng: &mut impl rand::Rng) {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                files(&path, out);
            } else if meta.len() > 0 && std::os::unix::fs::MetadataExt::nlink(&meta) == 1 && path.file_name().is_some_and(|n| n != "LOCK") {
                out.push(path);
            }
        }
    }
    let mut all = Vec::new();
    files(store, &mut all);
    all.sort();
    let path = &all[rng.random_range(0..all.len())];
    let mut bytes = std::fs::read(path).unwrap();
    let at = rng.random_range(0..bytes.len());
    bytes[at] ^= 1 << rng.random_range(0..8);
    std::fs::write(path, bytes).unwrap();
}

/// A follower's store damaged while it is down, past what recovery repairs: opened again,
/// the node makes its store anew from its snapshot and the group's log, and converges.
/// (Bits are flipped, the node opened and killed again, until a flip is one recovery
/// refuses; the others it repairs or does not need.)
#[test]
fn a_damaged_store_is_made_anew_from_the_snapshot_and_the_log() {
    use rand::SeedableRng;
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _, l) = started(dir.path(), snapshotting);
    open_bank(nodes[l].as_ref().unwrap());
    let f = (l + 1) % 3;
    let (id, addr) = (nodes[f].as_ref().unwrap().id(), nodes[f].as_ref().unwrap().addr());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut healed = None;
    for attempt in 0..60u64 {
        transfer(nodes[l].as_ref().unwrap(), 40, attempt).unwrap();
        nodes[f].take().unwrap().crash();
        let store = tusk_replica::stores::current(&dir.path().join(format!("n{id}"))).unwrap();
        flip_a_bit(&store, &mut rng);
        let back = open_snapshotting(dir.path(), id, Some(addr));
        let why = back.rebuilt_why().cloned();
        nodes[f] = Some(back);
        if let Some(tusk_replica::Rebuilt::Damaged(error)) = why {
            healed = Some((attempt, error));
            break;
        }
    }
    let (attempt, error) = healed.expect("no flip in 60 was one recovery refuses");
    assert!(error.contains("store.") || error.contains("store/"), "the error names the damaged file: {error}");
    let at = transfer(nodes[l].as_ref().unwrap(), 40, 1000 + attempt).unwrap();
    let expected = balances(nodes[l].as_ref().unwrap());
    converged(nodes.iter().flatten(), at, &expected, Duration::from_secs(30));
    close_all(nodes);
}
