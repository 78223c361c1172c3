//! A replicated group on this machine's loopback, for `tusk demo --nodes N` and `tusk bench
//! replicated`: N nodes in this process, each in its own directory and on its own port.
//! Nodes can be killed and opened again while client threads use the group.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use tusk_replica::{NodeConfig, ReplicatedNode};

/// Node `id`'s write journal, when the group journals its writes.
fn journal(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("n{id}")).join("journal")
}

/// What the group's nodes are opened with beside their store's options.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How long a `Sync` commit waits for the group.
    pub commit_timeout: Duration,
    /// Proposals the leader has in flight at once (`NodeConfig::proposals_in_flight`).
    pub proposals_in_flight: usize,
    /// Journal every write of each node's store (`Io::Recording`, in `n<id>/journal`) with
    /// this window between a write and its sync, so that [`LocalGroup::power_cut`] can roll
    /// back what a node had not synced.
    pub journaled: Option<Duration>,
    /// `NodeConfig::snapshot_after_log_bytes` and `log_kept_after_snapshot`.
    pub snapshot_after_log_bytes: Option<u64>,
    pub log_kept_after_snapshot: u64,
    /// `NodeConfig::election_timeout`.
    pub election_timeout: (Duration, Duration),
    /// `NodeConfig::runtime_threads`.
    pub runtime_threads: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        let defaults = NodeConfig::new(0, "127.0.0.1:0".parse().expect("an address"));
        Settings {
            commit_timeout: defaults.commit_timeout,
            proposals_in_flight: defaults.proposals_in_flight,
            journaled: None,
            snapshot_after_log_bytes: defaults.snapshot_after_log_bytes,
            log_kept_after_snapshot: defaults.log_kept_after_snapshot,
            election_timeout: defaults.election_timeout,
            runtime_threads: defaults.runtime_threads,
        }
    }
}

pub struct LocalGroup {
    dir: PathBuf,
    options: tusk::Options,
    settings: Settings,
    addrs: Vec<SocketAddr>,
    slots: Vec<RwLock<Option<ReplicatedNode>>>,
    /// Each node's disk faults (a group that journals its writes: they fail its requests).
    disks: Vec<Arc<tusk::FaultPlan>>,
}

/// Node `id`'s configuration: `options` for its store, but the group commit interval a
/// replicated node's store has by default.
fn config(dir: &Path, id: u64, listen: SocketAddr, options: &tusk::Options, settings: Settings, disk: &Arc<tusk::FaultPlan>) -> NodeConfig {
    let defaults = NodeConfig {
        commit_timeout: settings.commit_timeout,
        proposals_in_flight: settings.proposals_in_flight,
        snapshot_after_log_bytes: settings.snapshot_after_log_bytes,
        log_kept_after_snapshot: settings.log_kept_after_snapshot,
        election_timeout: settings.election_timeout,
        runtime_threads: settings.runtime_threads,
        ..NodeConfig::new(id, listen)
    };
    let mut store = tusk::Options { group_commit_interval: defaults.store.group_commit_interval, ..options.clone() };
    if let Some(window) = settings.journaled {
        store.io = tusk::Io::Recording(tusk::RecordConfig { journal: journal(dir, id), window, faults: Some(disk.clone()) });
    }
    NodeConfig { store, ..defaults }
}

impl LocalGroup {
    /// Opens `n` nodes in `dir/n1..` with `options` and `settings` and makes them a group.
    pub fn start(dir: &Path, n: usize, options: tusk::Options, settings: Settings) -> Result<LocalGroup, tusk_replica::ReplicaError> {
        let mut slots = Vec::with_capacity(n);
        let mut addrs = Vec::with_capacity(n);
        let disks: Vec<_> = (0..n).map(|_| tusk::FaultPlan::new()).collect();
        for id in 1..=n as u64 {
            let node = ReplicatedNode::open(dir.join(format!("n{id}")), config(dir, id, "127.0.0.1:0".parse().expect("an address"), &options, settings, &disks[id as usize - 1]))?;
            addrs.push(node.addr());
            slots.push(RwLock::new(Some(node)));
        }
        let members: Vec<(u64, SocketAddr)> = addrs.iter().enumerate().map(|(i, &a)| (i as u64 + 1, a)).collect();
        slots[0].read().expect("not poisoned").as_ref().expect("open").initialize(&members)?;
        Ok(LocalGroup { dir: dir.to_path_buf(), options, settings, addrs, slots, disks })
    }

    /// Node `i`'s directory.
    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{}", i + 1))
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Node `i` (0-based), unless it is down.
    pub fn node(&self, i: usize) -> Option<RwLockReadGuard<'_, Option<ReplicatedNode>>> {
        let slot = self.slots[i].read().expect("not poisoned");
        slot.is_some().then_some(slot)
    }

    /// The index of the node that leads and takes updates, waiting up to `timeout` for one.
    pub fn leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            for i in 0..self.len() {
                if self.node(i).is_some_and(|n| n.as_ref().is_some_and(ReplicatedNode::is_leader)) {
                    return Some(i);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills node `i` as a killed process dies (its transactions in flight finish first).
    pub fn kill(&self, i: usize) {
        if let Some(node) = self.slots[i].write().expect("not poisoned").take() {
            node.crash();
        }
    }

    /// Kills node `i` and cuts its disk's power: of the writes its store had not synced,
    /// `keep` decides sector by sector which reached the disk (a group that journals its
    /// writes only). The node stays down.
    pub fn power_cut(&self, i: usize, keep: &mut dyn FnMut(&Path, u64) -> bool) -> Result<tusk_storage::io::record::PowerCut, Box<dyn std::error::Error>> {
        if self.settings.journaled.is_none() {
            return Err("the group does not journal its writes".into());
        }
        self.kill(i);
        let journal = journal(&self.dir, i as u64 + 1);
        let cut = tusk_storage::io::record::power_cut(&journal, keep)?;
        // What the journal said is applied: the store starts a new one when opened again.
        std::fs::write(&journal, b"")?;
        Ok(cut)
    }

    /// Node `i`'s disk fails every request (writes and syncs of its store and of its copy of
    /// the group's log) with `errno` after `after` more succeed, until mended (a group that
    /// journals its writes only).
    pub fn fail_disk(&self, i: usize, after: u64, errno: i32) -> Result<(), Box<dyn std::error::Error>> {
        if self.settings.journaled.is_none() {
            return Err("the group does not journal its writes".into());
        }
        self.disks[i].fail_after(after, errno);
        Ok(())
    }

    /// Node `i`'s disk fails nothing any more.
    pub fn mend_disk(&self, i: usize) {
        self.disks[i].fail_after(u64::MAX, libc::EIO);
    }

    /// Requests the nodes' disks failed so far.
    pub fn disk_failures(&self) -> u64 {
        self.disks.iter().map(|d| d.failures()).sum()
    }

    /// Opens node `i` again on its address; returns whether it rebuilt its store.
    pub fn restart(&self, i: usize) -> Result<Option<tusk_replica::Rebuilt>, tusk_replica::ReplicaError> {
        let node = ReplicatedNode::open(self.dir.join(format!("n{}", i + 1)), config(&self.dir, i as u64 + 1, self.addrs[i], &self.options, self.settings, &self.disks[i]))?;
        let rebuilt = node.rebuilt_why().cloned();
        *self.slots[i].write().expect("not poisoned") = Some(node);
        Ok(rebuilt)
    }

    /// Closes every node that is up.
    pub fn close(self) -> Result<(), tusk_replica::ReplicaError> {
        for slot in self.slots {
            if let Some(node) = slot.into_inner().expect("not poisoned") {
                node.close()?;
            }
        }
        Ok(())
    }
}
