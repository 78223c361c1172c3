//! What can go wrong in a replicated node.

use crate::types::NodeId;

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The node's store failed (or the transaction's own error).
    #[error(transparent)]
    Store(#[from] tusk::Error),
    /// Update transactions run on the leader only.
    #[error("node {me} does not lead the group (leader: {leader:?})")]
    NotLeader { me: NodeId, leader: Option<NodeId> },
    /// The group did not commit the transaction's record: leadership moved while it was on
    /// its way. Its writes are in this node's heap, which is rebuilt from the group's log
    /// when the node is opened again.
    #[error("the group did not commit LSN {lsn}: {why}")]
    NotCommitted { lsn: u64, why: String },
    /// No majority committed the record within the node's commit timeout.
    #[error("LSN {lsn} not committed by the group within {waited:?}")]
    CommitTimedOut { lsn: u64, waited: std::time::Duration },
    /// The node has stopped: closed, or its store's rebuild failed (open it again).
    #[error("node {me} has stopped: {why}")]
    Stopped { me: NodeId, why: String },
    /// The Raft engine refused or failed.
    #[error("raft: {0}")]
    Raft(String),
    /// The node's copy of the group's log holds an entry damaged after it was durable: the
    /// node may have acknowledged it, so it must not take part as it is. Remove it from the
    /// group (`remove_member` on the leader), delete its directory and add it back
    /// (`add_member`): it catches up from the others.
    #[error("the node's copy of the group's log is damaged ({}, byte {offset}: {why}): remove the node from the group, delete its directory and add it back", path.display())]
    LogDamaged { path: std::path::PathBuf, offset: u64, why: String },
    /// The node's files or sockets.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}
