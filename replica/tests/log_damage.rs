//! A node whose copy of the group's log was damaged after its entries were durable: it does
//! not open (it may have acknowledged what it lost), and removed, emptied and added back, it
//! catches up from the others.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use tusk_replica::ReplicaError;

/// The last segment of node `dir`'s copy of the group's log, and where its frames end (the
/// zeros written ahead of the last append after them).
fn last_segment(dir: &Path) -> (std::path::PathBuf, usize) {
    let mut segments: Vec<_> = std::fs::read_dir(dir.join("raft-log")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "seg")).collect();
    segments.sort();
    let last = segments.pop().expect("a segment");
    let bytes = std::fs::read(&last).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).expect("frames") + 1;
    (last, end)
}

#[test]
fn a_follower_whose_log_was_damaged_is_refused_and_added_back_anew() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, _, l) = started(dir.path(), config);
    open_bank(nodes[l].as_ref().unwrap());
    // Transfers one by one: each is an append of its own on the follower, synced before the
    // next, so the frames after an early one say it was durable.
    for seed in 0..20 {
        transfer(nodes[l].as_ref().unwrap(), 1, seed).unwrap();
    }
    let f = (l + 1) % 3;
    let (id, addr) = (nodes[f].as_ref().unwrap().id(), nodes[f].as_ref().unwrap().addr());
    let node_dir = dir.path().join(format!("n{id}"));
    nodes[f].take().unwrap().crash();
    let (segment, end) = last_segment(&node_dir);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[end / 3] ^= 0x04;
    std::fs::write(&segment, &bytes).unwrap();

    let mut c = config(id);
    c.listen = addr;
    match tusk_replica::ReplicatedNode::open(&node_dir, c.clone()) {
        Err(ReplicaError::LogDamaged { path, offset, why }) => {
            assert_eq!(path, segment);
            assert!(offset as usize <= end / 3, "the damaged frame begins at or before the flipped byte: {offset}");
            assert!(why.contains("durable"), "{why}");
        }
        Err(e) => panic!("not reported as damage to the log: {e}"),
        Ok(_) => panic!("a node whose log lost durable entries opened"),
    }

    // The remedy the error names: out of the group, emptied, and back in.
    nodes[l].as_ref().unwrap().remove_member(id).unwrap();
    std::fs::remove_dir_all(&node_dir).unwrap();
    nodes[f] = Some(tusk_replica::ReplicatedNode::open(&node_dir, c).unwrap());
    let leader = nodes[l].as_ref().unwrap();
    leader.add_member(id, addr).unwrap();
    let at = transfer(leader, 10, 99).unwrap();
    let expected = balances(leader);
    converged(nodes.iter().flatten(), at, &expected, Duration::from_secs(30));
    close_all(nodes);
}
