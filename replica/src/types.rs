//! The group's Raft types: what one log entry carries, and what applying it answers.

use serde::{Deserialize, Serialize};

/// One entry of the group's log: the records a leader's store appended, in LSN order, from
/// one proposal (the records that were ready together: replication's group commit).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Which process proposed it: (node id, a number drawn when the node started). The
    /// proposer's heap already holds these records; every other node applies them.
    pub origin: (u64, u64),
    /// The leader's LSN of each record and its framed bytes.
    pub records: Vec<(u64, Vec<u8>)>,
}

/// What applying an entry answers: the group's log index it reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub index: u64,
}

openraft::declare_raft_types!(
    /// The group's Raft type configuration.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        SnapshotData = tokio::fs::File,
);

pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type Raft = openraft::Raft<TypeConfig>;

/// A storage error from any error, `kind` one of `StorageIOError`'s constructors (what
/// failed: the log's reads or writes, the vote's, the state machine's).
pub fn storage_error(kind: fn(openraft::AnyError) -> openraft::StorageIOError<NodeId>, e: impl std::fmt::Display) -> StorageError {
    kind(openraft::AnyError::error(e.to_string())).into()
}
