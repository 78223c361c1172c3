//! The group's Raft log: its entries in segment files (`raft-log/`, [`crate::log_segments`]),
//! told durable to openraft only once synced, so that a `Sync` commit acknowledged by a
//! majority is on a majority's disks; the vote, the purged position and the memberships
//! applied in a redb database beside them (`raft.redb`), each write synced.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use tusk_storage::io::Io;
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::log_segments::{SegmentError, Segments};
use crate::types::{storage_error, Entry, LogId, NodeId, StorageError, StoredMembership, TypeConfig};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// The memberships applied, by the index of their entry: the state machine's, which it
/// reports with its applied position after a restart.
const MEMBERSHIPS: TableDefinition<u64, &[u8]> = TableDefinition::new("memberships");
const VOTE: &str = "vote";
/// redb's page cache (its default is 1 GiB; it holds a few small rows here).
const CACHE_BYTES: usize = 4 << 20;
const PURGED: &str = "purged";

/// Why a node's copy of the group's log did not open.
#[derive(Debug, thiserror::Error)]
pub enum LogOpenError {
    /// Held by an earlier handle of this process that is letting go (a node closing, a
    /// rebuild): passes once it has.
    #[error("{0} is still open")]
    Busy(String),
    /// An entry's frame was damaged after it was durable (see [`crate::log_segments`]).
    #[error("{}: damaged at byte {offset}: {why}", path.display())]
    Damaged { path: std::path::PathBuf, offset: u64, why: String },
    #[error("{0}")]
    Failed(String),
}

/// The log store (cheap to clone: readers share the database).
#[derive(Clone)]
pub struct LogStore {
    /// The node whose log this is.
    me: NodeId,
    db: Arc<Database>,
    entries: Segments,
    /// Bytes of entries appended since it was opened (what a snapshot makes up for).
    appended: Arc<AtomicU64>,
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serialize(value).expect("raft types serialize")
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StorageError> {
    bincode::deserialize(bytes).map_err(|e| storage_error(StorageIOError::read_logs, format!("{what}: {e}")))
}

fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, StorageError> {
    let r = db.begin_read().map_err(|e| storage_error(StorageIOError::read_logs, e))?;
    let t = r.open_table(META).map_err(|e| storage_error(StorageIOError::read_logs, e))?;
    match t.get(key).map_err(|e| storage_error(StorageIOError::read_logs, e))? {
        Some(v) => Ok(Some(decode(v.value(), key)?)),
        None => Ok(None),
    }
}

/// The vote openraft starts from: the stored one, except that this node's own committed vote
/// (it led that term) comes back uncommitted, so that the node must win an election in a
/// later term before it leads again. openraft 0.9 would restore it as the leader of its old
/// term at once, and with the patched openraft (vendor/openraft/PATCHED.md) a leader's
/// entries reach its followers before its own copy is synced: opened again after a power
/// cut, it could lack entries it had sent, which the group may have committed, and give
/// their log ids (same term, same index) to new entries, which the followers would take for
/// the ones they hold.
fn vote_at_open(stored: Option<Vote<NodeId>>, me: NodeId) -> Option<Vote<NodeId>> {
    stored.map(|v| if v.is_committed() && v.leader_id().voted_for() == Some(me) { Vote::new(v.leader_id().get_term(), me) } else { v })
}

impl LogStore {
    /// Opens (or creates) node `me`'s log in node directory `dir` (`raft.redb`, `raft-log/`),
    /// its entries written through `io`.
    pub fn open(dir: &Path, io: &Io, me: NodeId) -> Result<LogStore, LogOpenError> {
        let path = dir.join("raft.redb");
        let db = redb::Builder::new().set_cache_size(CACHE_BYTES).create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => LogOpenError::Busy(path.display().to_string()),
            e => LogOpenError::Failed(format!("{}: {e}", path.display())),
        })?;
        let failed = |e: &dyn std::fmt::Display| LogOpenError::Failed(format!("{}: {e}", path.display()));
        let w = db.begin_write().map_err(|e| failed(&e))?;
        w.open_table(META).map_err(|e| failed(&e))?;
        w.open_table(MEMBERSHIPS).map_err(|e| failed(&e))?;
        w.commit().map_err(|e| failed(&e))?;
        let purged: Option<LogId> = read_meta(&db, PURGED).map_err(|e| failed(&e))?;
        let entries = Segments::open(&dir.join("raft-log"), io, purged.map(|id| id.index)).map_err(|e| match e {
            SegmentError::Locked(dir) => LogOpenError::Busy(dir.display().to_string()),
            SegmentError::Damaged { path, offset, why } => LogOpenError::Damaged { path, offset, why },
            e => LogOpenError::Failed(e.to_string()),
        })?;
        Ok(LogStore { me, db: Arc::new(db), entries, appended: Arc::default() })
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError> {
        read_meta(&self.db, key)
    }

    fn set_meta<T: Serialize>(&self, key: &str, value: &T, kind: fn(openraft::AnyError) -> StorageIOError<NodeId>) -> Result<(), StorageError> {
        let w = self.db.begin_write().map_err(|e| storage_error(kind, e))?;
        {
            let mut t = w.open_table(META).map_err(|e| storage_error(kind, e))?;
            t.insert(key, encode(value).as_slice()).map_err(|e| storage_error(kind, e))?;
        }
        w.commit().map_err(|e| storage_error(kind, e))
    }

    /// The last entry purged from the log (what a snapshot must reach to rebuild from).
    pub fn purged(&self) -> Result<Option<LogId>, StorageError> {
        self.meta(PURGED)
    }

    /// See [`Segments::sync_in_background`].
    pub fn sync_in_background(&self, background: bool) {
        self.entries.sync_in_background(background);
    }

    /// Bytes of entries appended since the log was opened.
    pub fn appended_bytes(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    /// Keeps a membership the state machine applied (synced before it returns).
    pub fn save_membership(&self, membership: &StoredMembership) -> Result<(), StorageError> {
        let index = membership.log_id().map_or(0, |id| id.index);
        let kind = StorageIOError::write_state_machine;
        let w = self.db.begin_write().map_err(|e| storage_error(kind, e))?;
        {
            let mut t = w.open_table(MEMBERSHIPS).map_err(|e| storage_error(kind, e))?;
            t.insert(index, encode(membership).as_slice()).map_err(|e| storage_error(kind, e))?;
        }
        w.commit().map_err(|e| storage_error(kind, e))
    }

    /// The last membership applied at or below `index`.
    pub fn membership_at_or_below(&self, index: u64) -> Result<Option<StoredMembership>, StorageError> {
        let kind = StorageIOError::read_state_machine;
        let r = self.db.begin_read().map_err(|e| storage_error(kind, e))?;
        let t = r.open_table(MEMBERSHIPS).map_err(|e| storage_error(kind, e))?;
        let last = t.range(..=index).map_err(|e| storage_error(kind, e))?.next_back();
        match last {
            Some(row) => {
                let (_, v) = row.map_err(|e| storage_error(kind, e))?;
                Ok(Some(decode(v.value(), "membership")?))
            }
            None => Ok(None),
        }
    }

    /// The entries with indexes in `range`, in order.
    pub fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Some(e),
            Bound::Excluded(&0) => return Ok(Vec::new()),
            Bound::Excluded(&e) => Some(e - 1),
            Bound::Unbounded => None,
        };
        if end.is_some_and(|e| e < start) {
            return Ok(Vec::new());
        }
        let rows = self.entries.visit_limited(start, end.unwrap_or(u64::MAX), u64::MAX, |_, bytes| decode(bytes, "log entry"));
        rows.map_err(|e| storage_error(StorageIOError::read_logs, e.to_string()))?.into_iter().collect()
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StorageError> {
        let Some(last) = self.entries.last() else { return Ok(None) };
        Ok(self.entries(last..=last)?.pop().map(|e| e.log_id))
    }
}

/// Bytes of entries one AppendEntries carries at most (at least one entry): openraft asks for
/// up to 300 entries, which with large transactions' entries (MiBs each) was a read of GiBs
/// per call, repeated every retry while a member was down, on the runtime thread the group's
/// commits need (a 1 GiB load of 4 MiB transactions stalled past the commit timeout). And a
/// call must be answered within openraft's heartbeat interval (50 ms) or it is sent again:
/// 64 MiB never was here, 16 MiB was, 8 MiB took up to 52 ms (an entry is at most
/// [`crate::types::PIECE_BYTES`]).
pub const MAX_REPLICATION_BYTES: u64 = 2 << 20;

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(&mut self, range: RB) -> Result<Vec<Entry>, StorageError> {
        self.entries(range)
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError> {
        if end <= start {
            return Ok(Vec::new());
        }
        let rows = self.entries.visit_limited(start, end - 1, MAX_REPLICATION_BYTES, |_, bytes| decode(bytes, "log entry"));
        rows.map_err(|e| storage_error(StorageIOError::read_logs, e.to_string()))?.into_iter().collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.meta(PURGED)?;
        // (Entries at or below the purge may wait in a segment to be deleted.)
        let last_log_id = self.last_entry_id()?.filter(|last| last_purged_log_id.is_none_or(|p| last.index > p.index)).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.set_meta(VOTE, vote, StorageIOError::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(vote_at_open(self.meta(VOTE)?, self.me))
    }

    // The committed position is not kept (openraft's default): keeping it cost a synced
    // write per entry on every node, and after a restart the group tells a node again what
    // is committed, while the store's replica line says what it applied.

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<(u64, Vec<u8>)> = entries.into_iter().map(|e| (e.log_id.index, encode(&e))).collect();
        self.appended.fetch_add(entries.iter().map(|(_, b)| b.len() as u64).sum(), Ordering::Relaxed);
        // openraft hears once the sync thread has synced them; a failure stops the group's
        // engine on this node (its writes are then lost to it, as a crash's are).
        let written = self.entries.append(&entries, Box::new(move |synced| callback.log_io_completed(synced)));
        written.map_err(|e| storage_error(StorageIOError::write_logs, e.to_string()))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.entries.truncate(log_id.index).map_err(|e| storage_error(StorageIOError::write_logs, e.to_string()))
    }

    /// The purged position is kept first: entries below it in a segment not yet deleted are
    /// then ignored at the next open.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.set_meta(PURGED, &log_id, StorageIOError::write_logs)?;
        self.entries.purge(log_id.index).map_err(|e| storage_error(StorageIOError::write_logs, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_led_opens_with_its_vote_uncommitted() {
        let led = Vote::new_committed(4, 1);
        let reopened = vote_at_open(Some(led), 1).unwrap();
        assert!(!reopened.is_committed(), "it must win an election before it leads again");
        assert_eq!(reopened.leader_id().get_term(), 4, "its term kept: it campaigns in a later one");
        assert_eq!(reopened.leader_id().voted_for(), Some(1));
        assert_eq!(vote_at_open(Some(Vote::new_committed(4, 2)), 1), Some(Vote::new_committed(4, 2)), "another leader's vote is kept");
        assert_eq!(vote_at_open(Some(Vote::new(5, 1)), 1), Some(Vote::new(5, 1)), "a candidate's vote is kept");
        assert_eq!(vote_at_open(None, 1), None);
    }
}
