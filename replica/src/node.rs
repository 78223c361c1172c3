//! A replicated node: a tusk store, a member of a Raft group through openraft, serving the
//! group's transport on a socket.
//!
//! The leader runs update transactions on its store as usual; its log's records reach the
//! [`crate::source::Source`] and are proposed to the group in LSN order, batched; every
//! member applies the group's committed entries to its store ([`crate::state_machine`]).
//! A node that led, once it stops leading or is opened again, may hold records the group
//! never committed: it rebuilds its store from its last snapshot and the group's log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ServerState, SnapshotPolicy};
use parking_lot::{Mutex, RwLock};
use tokio::sync::oneshot;
use tusk::{Commit, CommitTap, Store, Transaction};

use crate::error::ReplicaError;
use crate::log_store::{LogOpenError, LogStore};
use crate::network::{node_for, Links, Network};
use crate::snapshot_files::SnapshotFiles;
use crate::source::{local_only, Source, WaitError};
use crate::state_machine::{retire, store_from_snapshot, AppliedWatch, Machine, ReplicaLine, StateMachine};
use crate::stores::{self, StoreSlot};
use crate::types::{Batch, NodeId, Piece, Raft, PIECE_BYTES};

/// How a node is set up.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's id in the group (unique, not 0... any u64 the group agrees on).
    pub id: NodeId,
    /// Where it listens for the group (port 0: any free port; [`ReplicatedNode::addr`] says).
    pub listen: SocketAddr,
    /// The store's options: every member must be opened with the same heap layout
    /// (`heap_capacity`), since members apply each other's writes at the same offsets.
    /// A node opened again loads its store whole (`HeapLoad::Whole`, whatever `heap_load`
    /// says), so that damage is found before it serves; a store installed from a snapshot,
    /// its images checked as they were installed, opens on demand.
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
    /// committed meanwhile wait and go together in the next (default 8: fewer, fuller
    /// entries; against 64, measured on 2 cores in three interleaved rounds, the same rate
    /// at 16 clients, and at 64 clients 0.25x one store against 0.22x, p99 2.1 against
    /// 3.4–4.0 ms).
    pub proposals_in_flight: usize,
    /// Bytes of the group's log appended since the last snapshot at which the node makes a
    /// new one (`None`, the default: the store's used heap, at least 64 MiB, so that the log
    /// a snapshot replaces is about as large as the snapshot).
    pub snapshot_after_log_bytes: Option<u64>,
    /// Entries of the group's log kept below the last snapshot (default 1000): a member
    /// that far behind still catches up from the log, one farther is sent the snapshot.
    pub log_kept_after_snapshot: u64,
    /// Worker threads of the node's async runtime (Raft, its transport, the proposer;
    /// default 1). A commit's path is a chain of hand-offs between tasks, which on one thread
    /// follow each other without waking another: one thread gave 1.7x the small `Sync`
    /// commits of two at 16 and 64 clients on 2 cores, and the same on 16 cores. (One thread
    /// once fell behind a bulk load of 4 MiB transactions with a member down: AppendEntries
    /// of 32 MiB outlived openraft's 50 ms and were sent again and again; they carry 8 MiB
    /// now, and the 4 GiB load and catch-up take the same time with one thread as with two.)
    /// Its blocking work (snapshots, store rebuilds) runs on threads of its own either way.
    pub runtime_threads: usize,
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
            proposals_in_flight: 8,
            snapshot_after_log_bytes: None,
            log_kept_after_snapshot: 1000,
            runtime_threads: 1,
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
    /// Why it stopped leading (it then takes none until rebuilt).
    lost: Mutex<Option<String>>,
    /// The member is being stopped on purpose: Raft ending is no failure then.
    stopping: AtomicBool,
}

/// What a rebuild replaces: the store and everything that runs on it.
struct Member {
    /// The store (an installed snapshot puts another in its place).
    stores: Arc<StoreSlot>,
    raft: Raft,
    source: Arc<Source>,
    applied: Arc<AppliedWatch>,
    role: Arc<Role>,
    /// Stops the server; the server's, proposer's and role watcher's tasks.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The node's parts that outlive rebuilds.
struct Shared {
    id: NodeId,
    dir: PathBuf,
    config: NodeConfig,
    addr: SocketAddr,
    links: Arc<Links>,
    /// `None` once the node is stopped.
    member: RwLock<Option<Arc<Member>>>,
    /// Rebuilds of the store in place since the node was opened (it stopped leading).
    rebuilds: AtomicU64,
    /// Set once the node is closed or crashed: no rebuild starts after.
    closed: AtomicBool,
    /// Why a rebuild failed (the node then has no member: it is stopped).
    failure: Mutex<Option<String>>,
    /// Snapshots installed from other members since the node was opened.
    installed: Arc<AtomicU64>,
    rt: tokio::runtime::Handle,
}

/// See the module doc.
pub struct ReplicatedNode {
    shared: Arc<Shared>,
    /// Whether opening rebuilt the store (it had led).
    rebuilt_at_open: Option<Rebuilt>,
    // Last: dropped after the tasks that run on it are stopped.
    rt: Option<tokio::runtime::Runtime>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ReplicaError {
    let what = what.into();
    move |source| ReplicaError::Io { what, source }
}

fn raft_error(e: impl std::fmt::Display) -> ReplicaError {
    ReplicaError::Raft(e.to_string())
}

/// Opens the node's store (the one `DIR/STORE` names). When `fresh`, or when its replica line
/// says it led (its heap may hold records the group never committed), makes a new one from
/// the node's last snapshot (empty without one) instead, for the group's log to bring up to
/// date. Returns it and whether it was made anew.
fn open_store(node_dir: &Path, options: &tusk::Options, log: &LogStore, snapshots: &SnapshotFiles, fresh: bool) -> Result<(Store, Option<Rebuilt>), ReplicaError> {
    let current = stores::current(node_dir).map_err(io(format!("the store of {}", node_dir.display())))?;
    let why = if fresh {
        Rebuilt::InPlace
    } else {
        // Loaded whole, so that damage recovery does not repair is found now, while the
        // group can still make the store anew, not by a reader later (a chunk read on
        // demand fails that read alone; the node would go on with a hole in its heap).
        match Store::open(&current, tusk::Options { heap_load: tusk::HeapLoad::Whole, ..options.clone() }) {
            Ok(store) => {
                if !ReplicaLine::decode(store.replica()?).led {
                    return Ok((store, None));
                }
                store.close()?;
                Rebuilt::Led
            }
            // Damage recovery may not repair: the group holds what the store held.
            Err(e @ tusk::Error::Corrupt { .. }) => Rebuilt::Damaged(e.to_string()),
            Err(e) => return Err(e.into()),
        }
    };
    let snapshot = snapshots.current().map_err(io(format!("the snapshots of {}", node_dir.display())))?;
    let purged = log.purged().map_err(raft_error)?;
    if snapshot.as_ref().and_then(|(meta, _)| meta.last_log_id) < purged {
        // Entries the node's log dropped are in no snapshot it has: an empty store would
        // apply the log after them on nothing.
        return Err(ReplicaError::Raft(format!(
            "node {}: its log was purged through entry {} and it holds no snapshot that far: the store cannot be rebuilt here (remove the node from the group and add it anew)",
            node_dir.display(),
            purged.map_or(0, |p| p.index)
        )));
    }
    let (store, dir) = match snapshot {
        Some((meta, path)) => store_from_snapshot(node_dir, options, log, &path, &meta).map_err(raft_error)?,
        None => {
            let dir = stores::next(node_dir).map_err(io(format!("the stores of {}", node_dir.display())))?;
            (Store::open(&dir, options.clone())?, dir)
        }
    };
    stores::switch(node_dir, &dir).map_err(io(format!("switching the store of {}", node_dir.display())))?;
    // Opened again after leading, or found damaged: the old store is closed (a rebuild in
    // place retires it).
    if !fresh && current.exists() {
        std::fs::remove_dir_all(&current).map_err(io(format!("removing {}", current.display())))?;
    }
    Ok((store, Some(why)))
}

/// Why a node's store was made anew from its snapshot and the group's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rebuilt {
    /// It had led: its heap may hold records the group never committed.
    Led,
    /// Opening it found damage recovery does not repair (the error).
    Damaged(String),
    /// In place, while the node ran (it stopped leading, or its Raft failed).
    InPlace,
}

/// How long a rebuild waits for what ending tasks and callers let go of (a port, the
/// group's log file, the old store).
const LET_GO_WITHIN: Duration = Duration::from_secs(10);

/// Retries `f` for up to [`LET_GO_WITHIN`] while it fails in a way `passes` says will pass
/// (what an ending handle of this process still holds).
fn patiently<T, E>(mut f: impl FnMut() -> Result<T, E>, passes: impl Fn(&E) -> bool) -> Result<T, E> {
    let deadline = std::time::Instant::now() + LET_GO_WITHIN;
    loop {
        match f() {
            Err(e) if passes(&e) && std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            done => return done,
        }
    }
}

/// `shared`'s only holder's value, once the others let go (within [`LET_GO_WITHIN`]).
fn sole<T>(shared: Arc<T>) -> Option<T> {
    sole_within(shared, LET_GO_WITHIN)
}

/// `shared`'s only holder's value, once the others let go within `wait`.
pub(crate) fn sole_within<T>(mut shared: Arc<T>, wait: Duration) -> Option<T> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match Arc::try_unwrap(shared) {
            Ok(value) => return Some(value),
            Err(_) if std::time::Instant::now() >= deadline => return None,
            Err(back) => {
                shared = back;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Shared {
    /// Starts a member: the store (rebuilt empty if `fresh`, or if it led), the group's log,
    /// Raft, the server on the node's address, the proposer and the role watcher.
    fn start_member(self: &Arc<Self>, fresh: bool, listener: Option<tokio::net::TcpListener>) -> Result<(Member, Option<Rebuilt>), ReplicaError> {
        let config = &self.config;
        let source = Arc::new(Source::default());
        let tapped = source.clone();
        let store_options = tusk::Options { commit_tap: Some(CommitTap(Arc::new(move |lsn, record| tapped.tap(lsn, record)))), ..config.store.clone() };
        let log = patiently(|| LogStore::open(&self.dir, &config.store.io, config.id), |e| matches!(e, LogOpenError::Busy(_))).map_err(|e| match e {
            LogOpenError::Damaged { path, offset, why } => ReplicaError::LogDamaged { path, offset, why },
            e => ReplicaError::Raft(e.to_string()),
        })?;
        let snapshots = SnapshotFiles::open(&self.dir).map_err(io(format!("the snapshots of {}", self.dir.display())))?;
        let (store, rebuilt) = open_store(&self.dir, &store_options, &log, &snapshots, fresh)?;
        // Until it leads, the store takes writes from the group only.
        store.refuse_updates(true);
        let stores = Arc::new(StoreSlot::new(Arc::new(store)));
        let origin = (config.id, rand::random::<u64>());
        let led = Arc::new(AtomicBool::new(false));
        let applied = Arc::new(AppliedWatch::default());
        let machine = Arc::new(Machine {
            node_dir: self.dir.clone(),
            stores: stores.clone(),
            store_options,
            snapshots: snapshots.clone(),
            log: log.clone(),
            source: source.clone(),
            origin,
            led: led.clone(),
            applied: applied.clone(),
            commit_timeout: config.commit_timeout,
            installed: self.installed.clone(),
        });
        let network = Network { me: config.id, client: reqwest::Client::new(), links: self.links.clone() };
        let raft_config = openraft::Config {
            cluster_name: "tusk".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            // Snapshots are made when the log since the last one is as large as the heap
            // (`snapshot_when_due`), which no policy of openraft's counts.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: config.log_kept_after_snapshot,
            ..Default::default()
        }
        .validate()
        .map_err(raft_error)?;
        let raft = self.rt.block_on(Raft::new(config.id, Arc::new(raft_config), network, log.clone(), StateMachine::new(machine))).map_err(raft_error)?;
        let listener = match listener {
            Some(l) => l,
            None => patiently(|| self.rt.block_on(tokio::net::TcpListener::bind(self.addr)), |_| true).map_err(io(format!("listening on {}", self.addr)))?,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let role = Arc::new(Role::default());
        let served = crate::network::serve(listener, raft.clone(), self.links.clone(), snapshots, async move {
            let _ = stopped.await;
        });
        let tasks = vec![
            self.rt.spawn(async move {
                let _ = served.await;
            }),
            self.rt.spawn(propose(raft.clone(), source.clone(), origin, config.proposals_in_flight, {
                let (node, id, role, stores, source) = (Arc::downgrade(self), config.id, role.clone(), stores.clone(), source.clone());
                Arc::new(move |why: String| depose(&node, id, &role, &stores.read(), &source, why))
            })),
            self.rt.spawn(watch_role(Arc::downgrade(self), origin, raft.clone(), stores.clone(), source.clone(), led, role.clone())),
            self.rt.spawn(sync_log_as_role_wants(raft.clone(), log.clone())),
            self.rt.spawn(snapshot_when_due(raft.clone(), log, stores.clone(), config.snapshot_after_log_bytes)),
        ];
        Ok((Member { stores, raft, source, applied, role, stop: Mutex::new(Some(stop)), tasks: Mutex::new(tasks) }, rebuilt))
    }

    /// The current member, or why there is none (a rebuild failed).
    fn member(&self) -> Result<Arc<Member>, ReplicaError> {
        self.member.read().clone().ok_or_else(|| ReplicaError::Stopped {
            me: self.id,
            why: self.failure.lock().clone().unwrap_or_else(|| "the node is closed".into()),
        })
    }

    /// Stops `member`'s work: it takes no more transactions, its server and tasks end, Raft
    /// shuts down. Returns its store.
    fn stop_member(&self, member: Arc<Member>) -> Arc<Store> {
        member.role.stopping.store(true, Ordering::SeqCst);
        member.role.leading.store(false, Ordering::SeqCst);
        member.source.fail(format!("node {} stopped", self.id));
        if let Some(stop) = member.stop.lock().take() {
            let _ = stop.send(());
        }
        let _ = self.rt.block_on(member.raft.shutdown());
        let tasks = std::mem::take(&mut *member.tasks.lock());
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = self.rt.block_on(task);
        }
        let store = member.stores.read().clone();
        store
    }

    /// Replaces a member that stopped leading by one with a store rebuilt from the group's
    /// log (run on a thread of its own: it stops the member's tasks).
    fn rebuild(self: &Arc<Self>) {
        // The write lock keeps callers out while the member changes.
        let mut slot = self.member.write();
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let Some(old) = slot.take() else { return };
        // Its writes the group did not commit go with it: dropped, not flushed, once its
        // readers let go of it; the new store is made in a directory of its own meanwhile.
        let store = self.stop_member(old);
        let dir = store.dir().to_path_buf();
        // Held by nobody else, it goes now (its heap's memory before the new one's is
        // taken); else once its readers let go of it.
        let held = Arc::try_unwrap(store).map(Store::crash).err();
        let started = self.start_member(true, None);
        // The old directory goes only once `STORE` names another: a rebuild that failed
        // before it made a new store (its disk failing, say) leaves the old one the node's,
        // for its next open (which rebuilds again if the store had led). Deleting it first
        // left `STORE` naming a directory being deleted while the node was opened again.
        let replaced = stores::current(&self.dir).is_ok_and(|current| current != dir);
        match held {
            Some(store) => retire(store, replaced.then_some(dir)),
            None if replaced => {
                let _ = std::fs::remove_dir_all(&dir);
            }
            None => {}
        }
        match started {
            Ok((member, _)) => {
                *slot = Some(Arc::new(member));
                self.rebuilds.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => *self.failure.lock() = Some(format!("its store's rebuild failed: {e}")),
        }
    }
}

impl ReplicatedNode {
    /// Opens (or creates) the node in `dir`: its store in `dir/store`, the group's log in
    /// `dir/raft-log/` and `dir/raft.redb`. A new group is made with [`ReplicatedNode::initialize`] on one node.
    pub fn open(dir: impl AsRef<Path>, config: NodeConfig) -> Result<ReplicatedNode, ReplicaError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        // Stores an install or a rebuild left behind (the process ended before they were let go).
        stores::remove_others(dir).map_err(io(format!("the stores of {}", dir.display())))?;
        if config.store.durability != tusk::Durability::On {
            return Err(ReplicaError::Raft("a replicated store needs durability on".into()));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.runtime_threads.max(1))
            .thread_name(format!("tusk-replica-{}", config.id))
            .enable_all()
            .build()
            .map_err(io("starting the node's runtime"))?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(config.listen)).map_err(io(format!("listening on {}", config.listen)))?;
        let addr = listener.local_addr().map_err(io("the listening address"))?;
        let shared = Arc::new(Shared {
            id: config.id,
            dir: dir.to_path_buf(),
            config,
            addr,
            links: Arc::new(Links::default()),
            member: RwLock::new(None),
            rebuilds: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            failure: Mutex::new(None),
            installed: Arc::default(),
            rt: rt.handle().clone(),
        });
        let (member, rebuilt) = shared.start_member(false, Some(listener))?;
        *shared.member.write() = Some(Arc::new(member));
        Ok(ReplicatedNode { shared, rt: Some(rt), rebuilt_at_open: rebuilt })
    }

    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    /// The address the group reaches this node at.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Whether opening made the store anew from the node's snapshot and the group's log (it
    /// had led, or its store was damaged: [`ReplicatedNode::rebuilt_why`]).
    pub fn rebuilt(&self) -> bool {
        self.rebuilt_at_open.is_some()
    }

    /// Why opening made the store anew, if it did.
    pub fn rebuilt_why(&self) -> Option<&Rebuilt> {
        self.rebuilt_at_open.as_ref()
    }

    /// How many times the store was rebuilt in place since the node was opened (each time
    /// it stopped leading, or its Raft failed on an error of its store or log).
    pub fn rebuilds(&self) -> u64 {
        self.shared.rebuilds.load(Ordering::SeqCst)
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime lives until the node is dropped")
    }

    /// Makes a new group of `members` (this node among them): call on one node only, once.
    pub fn initialize(&self, members: &[(NodeId, SocketAddr)]) -> Result<(), ReplicaError> {
        let nodes: BTreeMap<NodeId, BasicNode> = members.iter().map(|&(id, addr)| (id, node_for(addr))).collect();
        let raft = self.shared.member()?.raft.clone();
        self.rt().block_on(raft.initialize(nodes)).map_err(raft_error)
    }

    /// Adds a node to the group (first as a learner that catches up, then as a voter).
    /// Call on the leader.
    pub fn add_member(&self, id: NodeId, addr: SocketAddr) -> Result<(), ReplicaError> {
        let raft = self.shared.member()?.raft.clone();
        self.rt().block_on(async {
            raft.add_learner(id, node_for(addr), true).await.map_err(raft_error)?;
            let mut voters: std::collections::BTreeSet<NodeId> = raft.metrics().borrow().membership_config.membership().voter_ids().collect();
            voters.insert(id);
            raft.change_membership(voters, false).await.map_err(raft_error)?;
            Ok(())
        })
    }

    /// Removes a node from the group. Call on the leader.
    pub fn remove_member(&self, id: NodeId) -> Result<(), ReplicaError> {
        let raft = self.shared.member()?.raft.clone();
        self.rt().block_on(async {
            let mut voters: std::collections::BTreeSet<NodeId> = raft.metrics().borrow().membership_config.membership().voter_ids().collect();
            voters.remove(&id);
            raft.change_membership(voters, false).await.map_err(raft_error)?;
            Ok(())
        })
    }

    /// The group's leader as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.shared.member().ok()?.raft.metrics().borrow().current_leader
    }

    /// Whether this node stopped leading and its store is not yet rebuilt (it takes no
    /// transactions meanwhile; the rebuild starts at once), or its rebuild failed.
    pub fn needs_rebuild(&self) -> bool {
        self.shared.member().map_or(true, |m| m.role.lost.lock().is_some())
    }

    /// Whether this node leads and takes update transactions.
    pub fn is_leader(&self) -> bool {
        self.shared.member().is_ok_and(|m| m.role.leading.load(Ordering::SeqCst))
    }

    /// Runs `f` in a transaction on the leader (as [`Store::transact`]) and commits it with
    /// `mode`, across the group: `Sync` returns once a majority of the group holds the
    /// record durably (in its copy of the group's log) and gives the record's position in it;
    /// `Async` and `Partition` return once committed on this node (the record is proposed
    /// to the group in the background and lost if the leader fails first), without one.
    pub fn transact<T>(&self, mode: Commit, f: impl FnMut(&mut Transaction<'_>) -> Result<T, tusk::Error>) -> Result<(T, Option<Position>), ReplicaError> {
        let member = self.shared.member()?;
        // (A failed source means the lead is being given up: nothing is committed locally that
        // the group would never see.)
        if !member.role.leading.load(Ordering::SeqCst) || member.source.is_failed() {
            return Err(ReplicaError::NotLeader { me: self.id(), leader: member.raft.metrics().borrow().current_leader });
        }
        let local = if mode == Commit::Sync { Commit::Async } else { mode };
        let store = member.stores.read().clone();
        let (value, lsn) = match store.transact(local, f) {
            Ok(done) => done,
            Err(e @ tusk::Error::LogFailed(_)) => {
                // The store's disk fails it: no transaction can commit here any more, so the
                // lead goes to a member that can (this one rebuilds, or stops if it cannot).
                depose(&Arc::downgrade(&self.shared), self.id(), &member.role, &store, &member.source, format!("node {}'s store failed: {e}", self.id()));
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        let Some(lsn) = lsn.filter(|_| mode == Commit::Sync) else { return Ok((value, None)) };
        let timeout = self.shared.config.commit_timeout;
        match member.source.wait_committed(lsn, timeout) {
            Ok(index) => Ok((value, Some(Position { index }))),
            Err(WaitError::Failed(why)) => Err(ReplicaError::NotCommitted { lsn, why }),
            Err(WaitError::TimedOut) => Err(ReplicaError::CommitTimedOut { lsn, waited: timeout }),
        }
    }

    /// The store, for readers (transactions that only read, snapshots, GPU mirrors): on a
    /// follower it holds the group's log up to [`ReplicatedNode::applied`]. Update
    /// transactions go through [`ReplicatedNode::transact`] on the leader. A rebuild puts a
    /// new store in its place: hold it briefly (the rebuild waits for the old one to be let
    /// go of). `ReplicaError::Stopped` where a rebuild failed.
    pub fn store(&self) -> Result<Arc<Store>, ReplicaError> {
        Ok(self.shared.member()?.stores.read().clone())
    }

    /// Snapshots this node installed from other members since it was opened (each replaced
    /// its store: a reader holding the old one reads the old state).
    pub fn snapshots_installed(&self) -> u64 {
        self.shared.installed.load(Ordering::SeqCst)
    }

    /// The entry of the group's log this node's last snapshot holds, and the last entry it
    /// purged from its copy of the log.
    pub fn snapshot_and_purged(&self) -> (Option<u64>, Option<u64>) {
        self.shared.member().map_or((None, None), |m| {
            let metrics = m.raft.metrics().borrow().clone();
            (metrics.snapshot.map(|s| s.index), metrics.purged.map(|p| p.index))
        })
    }

    /// Makes a snapshot now (it is made in the background; see
    /// [`ReplicatedNode::snapshot_and_purged`]).
    pub fn trigger_snapshot(&self) -> Result<(), ReplicaError> {
        let raft = self.shared.member()?.raft.clone();
        self.rt().block_on(raft.trigger().snapshot()).map_err(raft_error)
    }

    /// The last entry of the group's log this node's store holds.
    pub fn applied(&self) -> Position {
        Position { index: self.shared.member().map_or(0, |m| m.applied.get()) }
    }

    /// Waits until this node's store holds the group's log up to `at` (a position a `Sync`
    /// commit returned, perhaps on another node); false if `timeout` passed first.
    pub fn wait_applied(&self, at: Position, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            // A rebuild replaces the watch: wait on the current one, a slice at a time.
            let Ok(member) = self.shared.member() else { return false };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if member.applied.wait(at.index, left.min(Duration::from_millis(50))) {
                return true;
            }
            if left.is_zero() {
                return false;
            }
        }
    }

    /// The group's transport as this node uses it (cutting links, for tests).
    pub fn links(&self) -> &Links {
        &self.shared.links
    }

    /// Leaves the group's work and closes the store cleanly.
    pub fn close(mut self) -> Result<(), ReplicaError> {
        match self.stop().and_then(sole) {
            Some(store) => Ok(store.close()?),
            None => Err(ReplicaError::Raft("the store is still in use".into())),
        }
    }

    /// Stops as a killed process would: nothing more is written or flushed.
    pub fn crash(mut self) {
        if let Some(store) = self.stop().and_then(sole) {
            store.crash();
        }
    }

    /// Stops the member (no rebuild starts after) and returns its store.
    fn stop(&mut self) -> Option<Arc<Store>> {
        self.shared.closed.store(true, Ordering::SeqCst);
        // A rebuild under way finishes first (it holds the write lock).
        let member = self.shared.member.write().take()?;
        Some(self.shared.stop_member(member))
    }
}

impl Drop for ReplicatedNode {
    fn drop(&mut self) {
        if !self.shared.closed.load(Ordering::SeqCst) {
            if let Some(store) = self.stop().and_then(sole) {
                drop(store);
            }
        }
        // The runtime goes last, its tasks stopped.
        drop(self.rt.take());
    }
}

/// Proposes the records the source has ready, one entry at a time, in LSN order, without
/// waiting for one to commit before proposing the next (openraft keeps their order): up to
/// `in_flight` are pending at once.
async fn propose(raft: Raft, source: Arc<Source>, origin: (u64, u64), in_flight: usize, lose: Arc<dyn Fn(String) + Send + Sync>) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    loop {
        let (mut records, last) = source.take_ready();
        if last == 0 {
            source.ready.notified().await;
            continue;
        }
        if records.is_empty() {
            // Nothing to propose: the source counts these LSNs committed once every
            // proposal before them is.
            continue;
        }
        // A record too large for one entry goes in pieces, one entry each; the take is
        // committed once its last entry is.
        // (`take_ready` gives such a record alone.)
        let batches: Vec<Batch> = if records.iter().any(|(_, r)| r.len() > PIECE_BYTES) {
            assert_eq!(records.len(), 1, "a record larger than a piece is taken alone");
            let (lsn, record) = records.pop().expect("the large record");
            Piece::split(lsn, &record).into_iter().map(|piece| Batch { origin, records: Vec::new(), piece: Some(piece) }).collect()
        } else {
            vec![Batch { origin, records, piece: None }]
        };
        let count = batches.len();
        for (k, batch) in batches.into_iter().enumerate() {
            let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
            match raft.client_write_ff(batch).await {
                Ok(answer) => {
                    let (source, lose) = (source.clone(), lose.clone());
                    let whole = k + 1 == count;
                    tokio::spawn(async move {
                        match answer.await {
                            Ok(Ok(written)) if whole => source.committed(last, written.log_id.index),
                            Ok(Ok(_)) => {}
                            // Raft no longer has this node lead, whatever its metrics say yet (a
                            // crash run saw them lag 9.7 s while every commit failed at once).
                            Ok(Err(e @ openraft::error::ClientWriteError::ForwardToLeader(_))) => lose(format!("proposal refused: {e}")),
                            Ok(Err(e)) => source.fail(format!("proposal failed: {e}")),
                            Err(_) => source.fail("the group's engine stopped".into()),
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    source.fail(format!("proposal failed: {e}"));
                    break;
                }
            }
        }
    }
}

/// Gives up the lead for good: no more transactions, what waits for the group fails, and the
/// store (its heap may hold records the group never committed) is rebuilt on a thread of its
/// own. Whoever comes first (the role's watcher, a proposal Raft refused) does it, once.
fn depose(node: &std::sync::Weak<Shared>, id: NodeId, role: &Role, store: &Store, source: &Source, why: String) {
    store.refuse_updates(true);
    role.leading.store(false, Ordering::SeqCst);
    source.fail(why.clone());
    {
        let mut lost = role.lost.lock();
        if lost.is_some() {
            return;
        }
        *lost = Some(why);
    }
    if let Some(node) = node.upgrade() {
        std::thread::Builder::new().name(format!("tusk-rebuild-{id}")).spawn(move || node.rebuild()).ok();
    }
}

/// Follows the node's role: takes the lead once Raft makes it leader and it has applied
/// the group's log, and gives it up for good when Raft no longer has it lead in that term.
/// A node led again in a later term is deposed all the same: its metrics may show the two
/// terms' leads with nothing between (the watch keeps only the latest), while its heap may
/// hold records of the first term that the group never committed.
async fn watch_role(node: std::sync::Weak<Shared>, origin: (u64, u64), raft: Raft, stores: Arc<StoreSlot>, source: Arc<Source>, led: Arc<AtomicBool>, role: Arc<Role>) {
    let Some(id) = node.upgrade().map(|n| n.id) else { return };
    // The server's metrics change with its role, vote or membership only (the whole
    // metrics change with every entry, and would wake this task for each).
    let mut metrics = raft.server_metrics();
    // The term this node took the lead in.
    let mut led_term = None;
    loop {
        let (leads, term) = {
            let m = metrics.borrow_and_update();
            (m.state == ServerState::Leader && m.current_leader == Some(id), m.vote.leader_id().get_term())
        };
        let was = role.leading.load(Ordering::SeqCst);
        let store = stores.read().clone();
        if was && (!leads || led_term != Some(term)) {
            depose(&node, id, &role, &store, &source, format!("node {id} stopped leading (term {term})"));
            return;
        } else if leads && !was && role.lost.lock().is_none() {
            // An empty entry of its own, committed and applied: every entry before it is
            // then applied here, so the heap the node's transactions read holds the whole
            // log. (`ensure_linearizable` did not do: a leader restored in its old term by a
            // restart, its store rebuilt empty, waited for next to nothing and took
            // transactions on a heap without the log's entries; the crash runs lost
            // acknowledged transfers to it.)
            if raft.client_write(Batch { origin, records: Vec::new(), piece: None }).await.is_ok() {
                led.store(true, Ordering::SeqCst);
                let marked = local_only(|| {
                    let mut line = ReplicaLine::decode(store.replica()?);
                    line.led = true;
                    store.write_replica(line.encode(), Commit::Sync)
                });
                let still = {
                    let m = raft.server_metrics().borrow().clone();
                    m.state == ServerState::Leader && m.vote.leader_id().get_term() == term
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
            // Raft ended. Unless the member is being stopped, it failed: its state machine
            // (the store: damage found in a chunk read on demand, an I/O error) or its log.
            // The member is rebuilt from the node's snapshot and the group's log.
            if !role.stopping.load(Ordering::SeqCst) {
                role.leading.store(false, Ordering::SeqCst);
                stores.read().refuse_updates(true);
                source.fail(format!("node {id}'s Raft stopped"));
                *role.lost.lock() = Some(format!("node {id}'s Raft stopped on an error"));
                if let Some(node) = node.upgrade() {
                    std::thread::Builder::new().name(format!("tusk-rebuild-{id}")).spawn(move || node.rebuild()).ok();
                }
            }
            return;
        }
    }
}

/// A leader's appends are synced by the log's sync thread, so that its write overlaps its
/// followers'; a follower syncs its own appends (it answers the leader once they are durable,
/// and a hand-off would only add to that).
async fn sync_log_as_role_wants(raft: Raft, log: LogStore) {
    let mut metrics = raft.server_metrics();
    loop {
        log.sync_in_background(metrics.borrow_and_update().state == ServerState::Leader);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// The least log since the last snapshot that makes a new one, by default.
const SNAPSHOT_AFTER_AT_LEAST: u64 = 64 << 20;
/// How often the node checks whether a snapshot is due.
const SNAPSHOT_POLL: Duration = Duration::from_millis(200);

/// Makes a snapshot once the group's log appended since the last one reaches `every` bytes
/// (by default the store's used heap, at least [`SNAPSHOT_AFTER_AT_LEAST`]); openraft then
/// purges the log below it (keeping [`NodeConfig::log_kept_after_snapshot`] entries, and
/// on a leader whatever a member is still being sent).
async fn snapshot_when_due(raft: Raft, log: LogStore, stores: Arc<StoreSlot>, every: Option<u64>) {
    let mut since = log.appended_bytes();
    loop {
        tokio::time::sleep(SNAPSHOT_POLL).await;
        let due = every.unwrap_or_else(|| stores.read().heap_used().max(SNAPSHOT_AFTER_AT_LEAST));
        let now = log.appended_bytes();
        if now - since >= due {
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
            since = now;
        }
    }
}
