//! The group's Raft types: what one log entry carries, and what applying it answers.

use serde::{Deserialize, Serialize};

/// One entry of the group's log: the records a leader's store appended, in LSN order, from
/// one proposal (the records that were ready together: replication's group commit); or one
/// piece of a record too large for one entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Which process proposed it: (node id, a number drawn when the node started). The
    /// proposer's heap already holds these records; every other node applies them.
    pub origin: (u64, u64),
    /// The leader's LSN of each record and its framed bytes.
    #[serde(with = "records_as_bytes")]
    pub records: Vec<(u64, Vec<u8>)>,
    /// A piece of one record (then `records` is empty).
    pub piece: Option<Piece>,
}

/// Bytes of a record past which it travels in pieces of this size, one entry each: an
/// AppendEntries must reach a follower, be written and synced there and answered within
/// openraft's heartbeat interval (50 ms), or the leader gives up on it and sends it again;
/// a 64 MiB entry never made it here, and the followers elected another leader meanwhile.
/// An 8 MiB piece took 22–52 ms here, at the edge; 2 MiB leave a disk four times slower room,
/// and a 256 MiB transaction reached every node 11% sooner with them.
pub const PIECE_BYTES: usize = 2 << 20;

/// A piece of a record larger than [`PIECE_BYTES`]: the record's pieces lie in consecutive
/// entries of its origin (entries of openraft's own, memberships, may come between), `at`
/// ascending from 0; the record is applied once its last piece is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub lsn: u64,
    /// The whole record's bytes.
    pub len: u64,
    /// Where in the record this piece begins.
    pub at: u64,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

impl Piece {
    /// The pieces of record `lsn`, in order.
    pub fn split(lsn: u64, record: &[u8]) -> Vec<Piece> {
        let len = record.len() as u64;
        record.chunks(PIECE_BYTES).enumerate().map(|(k, bytes)| Piece { lsn, len, at: (k * PIECE_BYTES) as u64, bytes: bytes.to_vec() }).collect()
    }

    pub fn is_last(&self) -> bool {
        self.at + self.bytes.len() as u64 == self.len
    }
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

    /// Records encode as bincode encoded them before they were byte strings (a length, then
    /// the bytes, not a sequence of numbers).
    #[test]
    fn a_batch_encodes_its_records_as_a_length_and_the_bytes() {
        let batch = Batch { origin: (3, 9), records: vec![(7, vec![1, 2, 3]), (8, Vec::new())], piece: None };
        let bytes = bincode::serialize(&batch).unwrap();
        #[derive(Serialize)]
        struct Plain {
            origin: (u64, u64),
            records: Vec<(u64, Vec<u8>)>,
            piece: Option<()>,
        }
        assert_eq!(bytes, bincode::serialize(&Plain { origin: batch.origin, records: batch.records.clone(), piece: None }).unwrap());
        assert_eq!(bincode::deserialize::<Batch>(&bytes).unwrap(), batch);
    }

    #[test]
    fn a_record_splits_into_pieces_that_make_it_again() {
        let record: Vec<u8> = (0..2 * PIECE_BYTES + 5).map(|i| (i % 251) as u8).collect();
        let pieces = Piece::split(9, &record);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.iter().map(|p| p.at).collect::<Vec<_>>(), vec![0, PIECE_BYTES as u64, 2 * PIECE_BYTES as u64]);
        assert_eq!(pieces.iter().map(Piece::is_last).collect::<Vec<_>>(), vec![false, false, true]);
        assert!(pieces.iter().all(|p| p.lsn == 9 && p.len == record.len() as u64));
        assert_eq!(pieces.iter().flat_map(|p| p.bytes.iter().copied()).collect::<Vec<_>>(), record);
    }
}
