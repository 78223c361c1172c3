//! The group's state machine: the node's tusk store. Applying entries writes their records'
//! after-images (from other nodes' proposals) and the node's replica line in one transaction,
//! so that what the heap holds and the log position it says it holds are always durable
//! together, whatever the store's own LSNs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{EntryPayload, LeaderId, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use parking_lot::{Condvar, Mutex};
use tusk::{Commit, ReplicaWords, Store};

use crate::log_store::LogStore;
use crate::source::local_only;
use crate::types::{storage_error, Applied, Entry, LogId, StorageError, StoredMembership, TypeConfig};

/// Marks a replica line in use ("TUSKREPL").
const REPLICA_MAGIC: u64 = u64::from_le_bytes(*b"TUSKREPL");

/// What a node's replica line says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaLine {
    /// The last entry of the group's log the heap holds.
    pub applied: Option<LogId>,
    /// The node has led: its heap may hold records the group never committed.
    pub led: bool,
}

impl ReplicaLine {
    pub fn decode(words: ReplicaWords) -> ReplicaLine {
        if words[0] != REPLICA_MAGIC {
            return ReplicaLine::default();
        }
        let applied = (words[1] == 1).then(|| LogId { leader_id: LeaderId { term: words[3], node_id: words[4] }, index: words[2] });
        ReplicaLine { applied, led: words[5] == 1 }
    }

    pub fn encode(&self) -> ReplicaWords {
        let mut w = [0u64; tusk_storage::layout::REPLICA_WORDS];
        w[0] = REPLICA_MAGIC;
        if let Some(id) = self.applied {
            (w[1], w[2], w[3], w[4]) = (1, id.index, id.leader_id.term, id.leader_id.node_id);
        }
        w[5] = u64::from(self.led);
        w
    }
}

/// The applied position, for readers that wait for one.
#[derive(Default)]
pub struct AppliedWatch {
    index: Mutex<u64>,
    changed: Condvar,
}

impl AppliedWatch {
    pub fn get(&self) -> u64 {
        *self.index.lock()
    }

    fn set(&self, index: u64) {
        *self.index.lock() = index;
        self.changed.notify_all();
    }

    /// Waits until the entry at `index` is applied; false on timeout.
    pub fn wait(&self, index: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut at = self.index.lock();
        while *at < index {
            if self.changed.wait_until(&mut at, deadline).timed_out() {
                return *at >= index;
            }
        }
        true
    }
}

/// See the module doc.
pub struct StateMachine {
    pub store: Arc<Store>,
    pub log: LogStore,
    /// This process's proposals' origin: their records are in the heap already.
    pub origin: (u64, u64),
    /// Set once this node leads (kept in every replica line written after).
    pub led: Arc<AtomicBool>,
    pub applied: Arc<AppliedWatch>,
}

fn sm_error(e: impl std::fmt::Display) -> StorageError {
    storage_error(StorageIOError::write_state_machine, e)
}

impl StateMachine {
    fn line(&self) -> Result<ReplicaLine, StorageError> {
        Ok(ReplicaLine::decode(self.store.replica().map_err(sm_error)?))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = NoSnapshots;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.line()?.applied;
        let membership = match applied {
            Some(id) => self.log.membership_at_or_below(id.index)?.unwrap_or_default(),
            None => StoredMembership::default(),
        };
        self.applied.set(applied.map_or(0, |id| id.index));
        Ok((applied, membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records: Vec<Vec<u8>> = Vec::new();
        let mut out = Vec::new();
        let mut last = None;
        for entry in entries {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => {
                    if batch.origin != self.origin {
                        records.extend(batch.records.into_iter().map(|(_, r)| r));
                    }
                }
                EntryPayload::Membership(m) => {
                    self.log.save_membership(&StoredMembership::new(Some(entry.log_id), m))?;
                }
            }
            last = Some(entry.log_id);
            out.push(Applied { index: entry.log_id.index });
        }
        let Some(last) = last else { return Ok(out) };
        let led = self.led.load(Ordering::SeqCst);
        let line = ReplicaLine { applied: Some(last), led }.encode();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        // A node that has led rebuilds its store when opened again, whatever its line says
        // it applied: nothing to write for entries whose records it holds already (the
        // leader's own, one transaction less per entry).
        if !(refs.is_empty() && led) {
            local_only(|| {
                if refs.is_empty() {
                    self.store.write_replica(line, Commit::Async)
                } else {
                    self.store.apply_replicated(&refs, line, Commit::Async)
                }
            })
            .map_err(sm_error)?;
        }
        self.applied.set(last.index);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> NoSnapshots {
        NoSnapshots
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<std::io::Cursor<Vec<u8>>>, StorageError> {
        Err(no_snapshots())
    }

    async fn install_snapshot(&mut self, _meta: &SnapshotMeta<u64, openraft::BasicNode>, _snapshot: Box<std::io::Cursor<Vec<u8>>>) -> Result<(), StorageError> {
        Err(no_snapshots())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(None)
    }
}

/// The group's log is never purged in this version, so a node that is behind, or rebuilt,
/// catches up by replaying it from the start, and no snapshot is ever built or sent (the
/// group's [`openraft::SnapshotPolicy`] is `Never`). Catch-up by checkpoint is to come.
pub struct NoSnapshots;

fn no_snapshots() -> StorageError {
    storage_error(StorageIOError::read_state_machine, "tusk-replica builds no snapshots: the group's log is kept whole and replayed")
}

impl RaftSnapshotBuilder<TypeConfig> for NoSnapshots {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        Err(no_snapshots())
    }
}
