//! What the group tests share: nodes on loopback with small stores, and a bank whose
//! transfers the tests replicate and compare.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tusk::{Commit, HeapPtr};
use tusk_replica::{NodeConfig, Position, ReplicaError, ReplicatedNode};

pub const ACCOUNTS: u64 = 64;
pub const START: u64 = 1000;

pub fn config(id: u64) -> NodeConfig {
    let mut c = NodeConfig::new(id, "127.0.0.1:0".parse().unwrap());
    c.store.heap_capacity = 256 << 20;
    c.store.log_partitions = 2;
    c.store.checkpoint_interval = Some(Duration::from_millis(200));
    c.commit_timeout = Duration::from_secs(3);
    c
}

pub fn open(dir: &Path, id: u64, listen: Option<SocketAddr>) -> ReplicatedNode {
    open_with(dir, config(id), listen)
}

pub fn open_with(dir: &Path, mut c: NodeConfig, listen: Option<SocketAddr>) -> ReplicatedNode {
    let id = c.id;
    if let Some(addr) = listen {
        c.listen = addr;
    }
    ReplicatedNode::open(dir.join(format!("n{id}")), c).unwrap()
}

/// Three nodes in `dir`, made a group; and which of them leads.
pub fn group_of_three(dir: &Path) -> (Vec<ReplicatedNode>, usize) {
    let nodes: Vec<ReplicatedNode> = (1..=3).map(|id| open(dir, id, None)).collect();
    let members: Vec<(u64, SocketAddr)> = nodes.iter().map(|n| (n.id(), n.addr())).collect();
    nodes[0].initialize(&members).unwrap();
    let l = leader_of(&nodes.iter().collect::<Vec<_>>());
    (nodes, l)
}

pub fn leader_of(nodes: &[&ReplicatedNode]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(i) = nodes.iter().position(|n| n.is_leader()) {
            return i;
        }
        assert!(Instant::now() < deadline, "no leader within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn balances(node: &ReplicatedNode) -> Vec<u64> {
    let (b, _) = node
        .store().unwrap()
        .transact(Commit::Async, |tx| {
            let bank = tx.root("bank")?.expect("the bank is replicated");
            (0..ACCOUNTS).map(|a| tx.read_u64_at(bank, 8 * a)).collect::<Result<Vec<_>, _>>()
        })
        .unwrap();
    b
}

pub fn open_bank(leader: &ReplicatedNode) -> Position {
    let (_, at) = leader
        .transact(Commit::Sync, |tx| {
            let bank = tx.alloc(8 * ACCOUNTS)?;
            for a in 0..ACCOUNTS {
                tx.write_u64_at(bank, 8 * a, START)?;
            }
            tx.set_root("bank", bank)?;
            Ok(bank)
        })
        .unwrap();
    at.expect("a Sync commit has a position")
}

/// Moves money between accounts in `Sync` transactions; returns the last position.
pub fn transfer(leader: &ReplicatedNode, count: u64, seed: u64) -> Result<Position, ReplicaError> {
    let mut last = leader.applied();
    for i in 0..count {
        let (from, to) = ((seed + i * 7) % ACCOUNTS, (seed + i * 13 + 1) % ACCOUNTS);
        let (_, at) = leader.transact(Commit::Sync, |tx| {
            let bank: HeapPtr = tx.root("bank")?.unwrap();
            let (a, b) = (tx.read_u64_at(bank, 8 * from)?, tx.read_u64_at(bank, 8 * to)?);
            let amount = (i % 17).min(a);
            if from != to {
                tx.write_u64_at(bank, 8 * from, a - amount)?;
                tx.write_u64_at(bank, 8 * to, b + amount)?;
            }
            Ok(())
        })?;
        last = at.unwrap();
    }
    Ok(last)
}


/// Every node of `nodes` holds the group's log up to `at` within `within`, and the balances
/// `expected`.
pub fn converged<'a>(nodes: impl IntoIterator<Item = &'a ReplicatedNode>, at: Position, expected: &[u64], within: Duration) {
    for n in nodes {
        assert!(n.wait_applied(at, within), "node {} applies the group's log up to {at:?}", n.id());
        assert_eq!(balances(n), expected, "node {} holds the same state at {at:?}", n.id());
    }
}

/// Closes every node that is up.
/// Kills the node in slot `i` of `nodes` and, `pause` later, opens it again on its address.
pub fn crash_and_reopen(dir: &Path, nodes: &mut [Option<ReplicatedNode>], i: usize, pause: Duration) {
    let old = nodes[i].take().expect("the node is up");
    let (id, addr) = (old.id(), old.addr());
    old.crash();
    std::thread::sleep(pause);
    nodes[i] = Some(open(dir, id, Some(addr)));
}

pub fn close_all(nodes: impl IntoIterator<Item = Option<ReplicatedNode>>) {
    for n in nodes.into_iter().flatten() {
        n.close().unwrap();
    }
}

/// Three nodes in `dir` opened with `config(id)`, made a group: the nodes (as slots a test
/// can empty), their ids and addresses, and which of them leads.
pub fn started(dir: &Path, config: impl Fn(u64) -> NodeConfig) -> (Vec<Option<ReplicatedNode>>, Vec<(u64, SocketAddr)>, usize) {
    let nodes: Vec<Option<ReplicatedNode>> = (1..=3).map(|id| Some(open_with(dir, config(id), None))).collect();
    let members: Vec<(u64, SocketAddr)> = nodes.iter().flatten().map(|n| (n.id(), n.addr())).collect();
    nodes[0].as_ref().unwrap().initialize(&members).unwrap();
    let l = leader_of(&nodes.iter().flatten().collect::<Vec<_>>());
    (nodes, members, l)
}
