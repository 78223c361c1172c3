//! A replicated node: a tusk store, a member of a Raft group through openraft, serving the
//! group's transport on a socket.
//!
//! The leader runs update transactions on its store as usual; its log's records reach the
//! [`crate::source::Source`] and are proposed to the group in LSN order, batched; every
//! member applies the group's committed entries to its store ([`crate::state_machine`]).
//! A node that led, once it stops leading or is opened again, may hold records the group
//! never committed: it rebuilds its store from the group's log when opened.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ServerState, SnapshotPolicy};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tusk::{Commit, CommitTap, Store, Transaction};

use crate::error::ReplicaError;
use crate::log_store::LogStore;
use crate::network::{node_for, Links, Network};
use crate::source::{local_only, Source, WaitError};
use crate::state_machine::{AppliedWatch, ReplicaLine, StateMachine};
use crate::types::{Batch, NodeId, Raft};

/// How a node is set up.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's id in the group (unique, not 0... any u64 the group agrees on).
    pub id: NodeId,
    /// Where it listens for the group (port 0: any free port; [`ReplicatedNode::addr`] says).
    pub listen: SocketAddr,
    /// The store's options: every member must be opened with the same heap layout
    /// (`heap_capacity`), since members apply each other's writes at the same offsets.
    /// [`NodeConfig::new`] sets `group_commit_interval` to 10 ms: what a member commits is
    /// durable in the group's log first, so its store's own log need not be flushed every
    /// millisecond beside it (measured: 10–15% more `Sync` commits on 2 cores).
    pub store: tusk::Options,
    /// Raft's heartbeat (default 50 ms) and election timeout range (default 300–600 ms).
    pub heartbeat: Duration,
    pub election_timeout: (Duration, Duration),
    /// How long a `Sync` commit waits for the group (default 10 s).
    pub commit_timeout: Duration,
    /// Proposals (entries of the group's log) the leader has in flight at once; records
    /// committed meanwhile wait and go together in the next (default 64).
    pub proposals_in_flight: usize,
}

impl NodeConfig {
    pub fn new(id: NodeId, listen: SocketAddr) -> NodeConfig {
        NodeConfig {
            id,
            listen,
            store: tusk::Options { group_commit_interval: Duration::from_millis(10), ..tusk::Options::default() },
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(300), Duration::from_millis(600)),
            commit_timeout: Duration::from_secs(10),
            proposals_in_flight: 64,
        }
    }
}

/// Where a committed transaction lies in the group's log: wait for it on another node with
/// [`ReplicatedNode::wait_applied`] to read one's own writes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub index: u64,
}

/// What the role watcher shares with callers.
#[derive(Default)]
struct Role {
    /// The node leads and takes update transactions.
    leading: AtomicBool,
    /// Why it stopped leading (it then takes none until opened again).
    lost: Mutex<Option<String>>,
}

/// See the module doc.
pub struct ReplicatedNode {
    id: NodeId,
    addr: SocketAddr,
    store: Arc<Store>,
    raft: Raft,
    source: Arc<Source>,
    applied: Arc<AppliedWatch>,
    role: Arc<Role>,
    links: Arc<Links>,
    commit_timeout: Duration,
    rebuilt: bool,
    stop: Option<oneshot::Sender<()>>,
    // Last: dropped after the tasks that run on it are stopped.
    rt: tokio::runtime::Runtime,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ReplicaError {
    let what = what.into();
    move |source| ReplicaError::Io { what, source }
}

fn raft_error(e: impl std::fmt::Display) -> ReplicaError {
    ReplicaError::Raft(e.to_string())
}

/// Opens the node's store in `dir`, rebuilt empty if its replica line says it led (its heap
/// may hold records the group never committed; the group's log brings it back).
fn open_store(dir: &Path, options: &tusk::Options, source: &Arc<Source>) -> Result<(Store, bool), ReplicaError> {
    let tapped = source.clone();
    let options = tusk::Options { commit_tap: Some(CommitTap(Arc::new(move |lsn, record| tapped.tap(lsn, record)))), ..options.clone() };
    let store = Store::open(dir, options.clone())?;
    if !ReplicaLine::decode(store.replica()?).led {
        return Ok((store, false));
    }
    store.close()?;
    std::fs::remove_dir_all(dir).map_err(io(format!("removing {}", dir.display())))?;
    Ok((Store::open(dir, options)?, true))
}

impl ReplicatedNode {
    /// Opens (or creates) the node in `dir`: its store in `dir/store`, the group's log in
    /// `dir/raft.redb`. A new group is made with [`ReplicatedNode::initialize`] on one node.
    pub fn open(dir: impl AsRef<Path>, config: NodeConfig) -> Result<ReplicatedNode, ReplicaError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        if config.store.durability != tusk::Durability::On {
            return Err(ReplicaError::Raft("a replicated store needs durability on".into()));
        }
        let source = Arc::new(Source::default());
        let store_dir: PathBuf = dir.join("store");
        let (store, rebuilt) = open_store(&store_dir, &config.store, &source)?;
        // Until it leads, the store takes writes from the group only.
        store.refuse_updates(true);
        let store = Arc::new(store);
        let log = LogStore::open(&dir.join("raft.redb")).map_err(raft_error)?;
        let origin = (config.id, rand::random::<u64>());
        let led = Arc::new(AtomicBool::new(false));
        let applied = Arc::new(AppliedWatch::default());
        let machine = StateMachine { store: store.clone(), log: log.clone(), origin, led: led.clone(), applied: applied.clone() };
        let links = Arc::new(Links::default());
        let network = Network { me: config.id, client: reqwest::Client::new(), links: links.clone() };
        let raft_config = openraft::Config {
            cluster_name: "tusk".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::Never,
            ..Default::default()
        }
        .validate()
        .map_err(raft_error)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("tusk-replica-{}", config.id))
            .enable_all()
            .build()
            .map_err(io("starting the node's runtime"))?;
        let raft = rt.block_on(Raft::new(config.id, Arc::new(raft_config), network, log, machine)).map_err(raft_error)?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(config.listen)).map_err(io(format!("listening on {}", config.listen)))?;
        let addr = listener.local_addr().map_err(io("the listening address"))?;
        let (stop, stopped) = oneshot::channel::<()>();
        rt.spawn(crate::network::serve(listener, raft.clone(), links.clone(), async move {
            let _ = stopped.await;
        }));
        let role = Arc::new(Role::default());
        rt.spawn(propose(raft.clone(), source.clone(), origin, config.proposals_in_flight));
        rt.spawn(watch_role(config.id, origin, raft.clone(), store.clone(), source.clone(), led, role.clone()));
        Ok(ReplicatedNode { id: config.id, addr, store, raft, source, applied, role, links, commit_timeout: config.commit_timeout, rebuilt, stop: Some(stop), rt })
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The address the group reaches this node at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether opening rebuilt the store from the group's log (it had led).
    pub fn rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// Makes a new group of `members` (this node among them): call on one node only, once.
    pub fn initialize(&self, members: &[(NodeId, SocketAddr)]) -> Result<(), ReplicaError> {
        let nodes: BTreeMap<NodeId, BasicNode> = members.iter().map(|&(id, addr)| (id, node_for(addr))).collect();
        self.rt.block_on(self.raft.initialize(nodes)).map_err(raft_error)
    }

    /// Adds a node to the group (first as a learner that catches up, then as a voter).
    /// Call on the leader.
    pub fn add_member(&self, id: NodeId, addr: SocketAddr) -> Result<(), ReplicaError> {
        self.rt.block_on(async {
            self.raft.add_learner(id, node_for(addr), true).await.map_err(raft_error)?;
            let mut voters: std::collections::BTreeSet<NodeId> = self.raft.metrics().borrow().membership_config.membership().voter_ids().collect();
            voters.insert(id);
            self.raft.change_membership(voters, false).await.map_err(raft_error)?;
            Ok(())
        })
    }

    /// Removes a node from the group. Call on the leader.
    pub fn remove_member(&self, id: NodeId) -> Result<(), ReplicaError> {
        self.rt.block_on(async {
            let mut voters: std::collections::BTreeSet<NodeId> = self.raft.metrics().borrow().membership_config.membership().voter_ids().collect();
            voters.remove(&id);
            self.raft.change_membership(voters, false).await.map_err(raft_error)?;
            Ok(())
        })
    }

    /// The group's leader as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Whether this node stopped leading: its heap may hold records the group never
    /// committed, and it takes no transactions until it is opened again (and rebuilt).
    pub fn needs_rebuild(&self) -> bool {
        self.role.lost.lock().is_some()
    }

    /// Whether this node leads and takes update transactions.
    pub fn is_leader(&self) -> bool {
        self.role.leading.load(Ordering::SeqCst)
    }

    /// Runs `f` in a transaction on the leader (as [`Store::transact`]) and commits it with
    /// `mode`, across the group: `Sync` returns once a majority of the group holds the
    /// record durably (in its copy of the group's log) and gives the record's position in it;
    /// `Async` and `Partition` return once committed on this node (the record is proposed
    /// to the group in the background and lost if the leader fails first), without one.
    pub fn transact<T>(&self, mode: Commit, f: impl FnMut(&mut Transaction<'_>) -> Result<T, tusk::Error>) -> Result<(T, Option<Position>), ReplicaError> {
        if !self.is_leader() {
            return Err(ReplicaError::NotLeader { me: self.id, leader: self.leader() });
        }
        let local = if mode == Commit::Sync { Commit::Async } else { mode };
        let (value, lsn) = self.store.transact(local, f)?;
        let Some(lsn) = lsn.filter(|_| mode == Commit::Sync) else { return Ok((value, None)) };
        match self.source.wait_committed(lsn, self.commit_timeout) {
            Ok(index) => Ok((value, Some(Position { index }))),
            Err(WaitError::Failed(why)) => Err(ReplicaError::NotCommitted { lsn, why }),
            Err(WaitError::TimedOut) => Err(ReplicaError::CommitTimedOut { lsn, waited: self.commit_timeout }),
        }
    }

    /// The store, for readers (transactions that only read, snapshots, GPU mirrors): on a
    /// follower it holds the group's log up to [`ReplicatedNode::applied`]. Update
    /// transactions go through [`ReplicatedNode::transact`] on the leader.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The last entry of the group's log this node's store holds.
    pub fn applied(&self) -> Position {
        Position { index: self.applied.get() }
    }

    /// Waits until this node's store holds the group's log up to `at` (a position a `Sync`
    /// commit returned, perhaps on another node); false if `timeout` passed first.
    pub fn wait_applied(&self, at: Position, timeout: Duration) -> bool {
        self.applied.wait(at.index, timeout)
    }

    /// The group's transport as this node uses it (cutting links, for tests).
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// Leaves the group's work and closes the store cleanly.
    pub fn close(mut self) -> Result<(), ReplicaError> {
        self.stop_raft();
        let store = self.store.clone();
        drop(self);
        match Arc::try_unwrap(store) {
            Ok(store) => Ok(store.close()?),
            Err(_) => Err(ReplicaError::Raft("the store is still in use by the node's tasks".into())),
        }
    }

    /// Stops as a killed process would: nothing more is written or flushed.
    pub fn crash(mut self) {
        self.stop_raft();
        let store = self.store.clone();
        drop(self);
        if let Ok(store) = Arc::try_unwrap(store) {
            store.crash();
        }
    }

    fn stop_raft(&mut self) {
        self.role.leading.store(false, Ordering::SeqCst);
        self.source.fail(format!("node {} stopped", self.id));
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.rt.block_on(self.raft.shutdown());
    }
}

impl Drop for ReplicatedNode {
    fn drop(&mut self) {
        self.stop_raft();
    }
}

/// Proposes the records the source has ready, one entry at a time, in LSN order, without
/// waiting for one to commit before proposing the next (openraft keeps their order): up to
/// `in_flight` are pending at once.
async fn propose(raft: Raft, source: Arc<Source>, origin: (u64, u64), in_flight: usize) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    loop {
        let (records, last) = source.take_ready();
        if last == 0 {
            source.ready.notified().await;
            continue;
        }
        if records.is_empty() {
            // Nothing to propose: the source counts these LSNs committed once every
            // proposal before them is.
            continue;
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        match raft.client_write_ff(Batch { origin, records }).await {
            Ok(answer) => {
                let source = source.clone();
                tokio::spawn(async move {
                    match answer.await {
                        Ok(Ok(written)) => source.committed(last, written.log_id.index),
                        Ok(Err(e)) => source.fail(format!("proposal failed: {e}")),
                        Err(_) => source.fail("the group's engine stopped".into()),
                    }
                    drop(permit);
                });
            }
            Err(e) => source.fail(format!("proposal failed: {e}")),
        }
    }
}

/// Follows the node's role: takes the lead once Raft makes it leader and it has applied
/// the group's log, and gives it up for good when Raft no longer has it lead in that term.
/// A node led again in a later term is deposed all the same: its metrics may show the two
/// terms' leads with nothing between (the watch keeps only the latest), while its heap may
/// hold records of the first term that the group never committed.
async fn watch_role(id: NodeId, origin: (u64, u64), raft: Raft, store: Arc<Store>, source: Arc<Source>, led: Arc<AtomicBool>, role: Arc<Role>) {
    let mut metrics = raft.metrics();
    // The term this node took the lead in.
    let mut led_term = None;
    loop {
        let (leads, term) = {
            let m = metrics.borrow_and_update();
            (m.state == ServerState::Leader && m.current_leader == Some(id), m.current_term)
        };
        let was = role.leading.load(Ordering::SeqCst);
        if was && (!leads || led_term != Some(term)) {
            store.refuse_updates(true);
            role.leading.store(false, Ordering::SeqCst);
            let why = format!("node {id} stopped leading (term {term})");
            source.fail(why.clone());
            *role.lost.lock() = Some(why);
        } else if leads && !was && role.lost.lock().is_none() {
            // An empty entry of its own, committed and applied: every entry before it is
            // then applied here, so the heap the node's transactions read holds the whole
            // log. (`ensure_linearizable` did not do: a leader restored in its old term by a
            // restart, its store rebuilt empty, waited for next to nothing and took
            // transactions on a heap without the log's entries; the crash runs lost
            // acknowledged transfers to it.)
            if raft.client_write(Batch { origin, records: Vec::new() }).await.is_ok() {
                led.store(true, Ordering::SeqCst);
                let marked = local_only(|| {
                    let mut line = ReplicaLine::decode(store.replica()?);
                    line.led = true;
                    store.write_replica(line.encode(), Commit::Sync)
                });
                let still = {
                    let m = raft.metrics().borrow().clone();
                    m.state == ServerState::Leader && m.current_term == term
                };
                if marked.is_ok() && still {
                    led_term = Some(term);
                    source.lead(store.last_lsn());
                    store.refuse_updates(false);
                    role.leading.store(true, Ordering::SeqCst);
                }
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
