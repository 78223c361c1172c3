//! The group's Raft log, vote and committed position, durable in a redb database beside the
//! node's store (`raft.redb`): every append is one redb transaction, synced before openraft
//! hears it is durable, so that a `Sync` commit acknowledged by a majority is on a majority's
//! disks.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{storage_error, Entry, LogId, NodeId, StorageError, StoredMembership, TypeConfig};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// The memberships applied, by the index of their entry: the state machine's, which it
/// reports with its applied position after a restart.
const MEMBERSHIPS: TableDefinition<u64, &[u8]> = TableDefinition::new("memberships");
const VOTE: &str = "vote";
/// redb's page cache (its default is 1 GiB): entries are read back once or twice (sent to
/// members, applied) soon after they are written, and a large transaction's entry would
/// otherwise stay cached beside the heap that holds it already.
const CACHE_BYTES: usize = 64 << 20;
const PURGED: &str = "purged";

/// The log store (cheap to clone: readers share the database).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// Bytes of entries appended since it was opened (what a snapshot makes up for).
    appended: Arc<AtomicU64>,
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serialize(value).expect("raft types serialize")
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StorageError> {
    bincode::deserialize(bytes).map_err(|e| storage_error(StorageIOError::read_logs, format!("{what}: {e}")))
}

impl LogStore {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<LogStore, StorageError> {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| storage_error(StorageIOError::read_logs, format!("{}: {e}", path.display())))?;
        let w = db.begin_write().map_err(|e| storage_error(StorageIOError::write_logs, e))?;
        w.open_table(LOG).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
        w.open_table(META).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
        w.open_table(MEMBERSHIPS).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
        w.commit().map_err(|e| storage_error(StorageIOError::write_logs, e))?;
        Ok(LogStore { db: Arc::new(db), appended: Arc::default() })
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError> {
        let r = self.db.begin_read().map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        let t = r.open_table(META).map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        match t.get(key).map_err(|e| storage_error(StorageIOError::read_logs, e))? {
            Some(v) => Ok(Some(decode(v.value(), key)?)),
            None => Ok(None),
        }
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
        let r = self.db.begin_read().map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        let t = r.open_table(LOG).map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        let rows = match end {
            Some(e) => t.range(start..=e),
            None => t.range(start..),
        }
        .map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        let mut out = Vec::new();
        for row in rows {
            let (_, v) = row.map_err(|e| storage_error(StorageIOError::read_logs, e))?;
            out.push(decode(v.value(), "log entry")?);
        }
        Ok(out)
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StorageError> {
        let r = self.db.begin_read().map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        let t = r.open_table(LOG).map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        let last = t.last().map_err(|e| storage_error(StorageIOError::read_logs, e))?;
        match last {
            Some((_, v)) => Ok(Some(decode::<Entry>(v.value(), "log entry")?.log_id)),
            None => Ok(None),
        }
    }

    /// Removes the entries with indexes in `range` (and records `purged`, when purging).
    fn remove(&self, range: impl RangeBounds<u64> + Clone, purged: Option<&LogId>) -> Result<(), StorageError> {
        let w = self.db.begin_write().map_err(|e| storage_error(StorageIOError::write_logs, e))?;
        {
            let mut t = w.open_table(LOG).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
            t.retain_in(range, |_, _| false).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
            if let Some(purged) = purged {
                let mut m = w.open_table(META).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
                m.insert(PURGED, encode(purged).as_slice()).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
            }
        }
        w.commit().map_err(|e| storage_error(StorageIOError::write_logs, e))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(&mut self, range: RB) -> Result<Vec<Entry>, StorageError> {
        self.entries(range)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.meta(PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.set_meta(VOTE, vote, StorageIOError::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.meta(VOTE)
    }

    // The committed position is not kept (openraft's default): keeping it cost a synced
    // write per entry on every node, and after a restart the group tells a node again what
    // is committed, while the store's replica line says what it applied.

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let written = (|| {
            let w = self.db.begin_write().map_err(|e| storage_error(StorageIOError::write_logs, e))?;
            {
                let mut t = w.open_table(LOG).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
                for entry in entries {
                    let bytes = encode(&entry);
                    self.appended.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    t.insert(entry.log_id.index, bytes.as_slice()).map_err(|e| storage_error(StorageIOError::write_logs, e))?;
                }
            }
            w.commit().map_err(|e| storage_error(StorageIOError::write_logs, e))
        })();
        match &written {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        written
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.remove(log_id.index.., None)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.remove(..=log_id.index, Some(&log_id))
    }
}
