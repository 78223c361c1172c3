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
    #[serde(with = "records_as_bytes")]
    pub records: Vec<(u64, Vec<u8>)>,
}

/// A batch's records with their bytes as byte strings: serde takes a `Vec<u8>` for a
/// sequence of numbers, one call per byte each way (bincode's encoding is the same: a
/// length, then the bytes), which made a 4 MiB record cost more to encode and decode than
/// to write, sync and send.
mod records_as_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub fn serialize<S: Serializer>(records: &[(u64, Vec<u8>)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(records.iter().map(|(lsn, record)| (lsn, Bytes::new(record))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u64, Vec<u8>)>, D::Error> {
        let records: Vec<(u64, ByteBuf)> = Deserialize::deserialize(d)?;
        Ok(records.into_iter().map(|(lsn, record)| (lsn, record.into_vec())).collect())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Records encode as bincode encoded them before they were byte strings: logs written
    /// by an earlier build read the same.
    #[test]
    fn a_batch_encodes_its_records_as_a_length_and_the_bytes() {
        let batch = Batch { origin: (3, 9), records: vec![(7, vec![1, 2, 3]), (8, Vec::new())] };
        let bytes = bincode::serialize(&batch).unwrap();
        #[derive(Serialize)]
        struct Before {
            origin: (u64, u64),
            records: Vec<(u64, Vec<u8>)>,
        }
        assert_eq!(bytes, bincode::serialize(&Before { origin: batch.origin, records: batch.records.clone() }).unwrap());
        assert_eq!(bincode::deserialize::<Batch>(&bytes).unwrap(), batch);
    }
}
