//! What a store offers replication (`tusk-replica`): its log's records as they are appended
//! ([`crate::Options::commit_tap`]), applying another store's records, and the node's own
//! replica line (`layout::REPLICA_OFF`), which says what of the group's log the heap holds.
//!
//! A follower applies the group's records as one transaction of their after-images, the
//! replica line written in the same transaction, so that the heap and the position it holds
//! are always durable together: its own LSNs differ from the leader's (its checkpoints and
//! snapshots draw LSNs of their own), the group's log position does not.

use tusk_storage::layout::{REPLICA_OFF, REPLICA_WORDS};
use tusk_storage::log_format::{decode_frame, Frame};
use tusk_txn::{Commit, Lsn};

use crate::{Error, Store};

/// The words of a node's replica line, as `tusk-replica` defines them.
pub type ReplicaWords = [u64; REPLICA_WORDS];

/// The writes of `record`, a framed record as [`crate::CommitTap`] saw it, checked.
fn writes_of(index: usize, record: &[u8]) -> Result<tusk_storage::log_format::RecordView<'_>, Error> {
    let bad = |reason: String| Error::BadReplicatedRecord { index, reason };
    match decode_frame(record, 0) {
        Frame::Record(view, end) if end == record.len() => {
            let line = REPLICA_OFF..REPLICA_OFF + 64;
            let mut writes = view.writes();
            for (offset, bytes) in writes.by_ref() {
                if offset < line.end && offset + bytes.len() as u64 > line.start {
                    return Err(bad(format!("writes {} bytes at {offset}, the replica line", bytes.len())));
                }
            }
            writes.check_end().map_err(bad)?;
            Ok(view)
        }
        Frame::Record(_, end) => Err(bad(format!("{} bytes after the record's {end}", record.len() - end))),
        Frame::Invalid(reason) => Err(bad(reason)),
        Frame::Pad(_) | Frame::End | Frame::Zeros => Err(bad("not a record".into())),
    }
}

impl Store {
    /// Applies `records` (framed records another store's [`crate::CommitTap`] passed on, in
    /// their LSN order) as one transaction of their writes, with `replica` written to the
    /// replica line in the same transaction; commits it with `mode` and returns its LSN, this
    /// store's own. Records without writes (markers, empty records) change nothing. Every
    /// record is checked before anything is written: a bad one fails the call, writing
    /// nothing.
    pub fn apply_replicated(&self, records: &[&[u8]], replica: ReplicaWords, mode: Commit) -> Result<Lsn, Error> {
        let views = records.iter().enumerate().map(|(i, r)| writes_of(i, r)).collect::<Result<Vec<_>, _>>()?;
        let (_, lsn) = self.transact_replicated(mode, |tx| {
            for view in &views {
                for (offset, bytes) in view.writes() {
                    tx.inner.write_raw(offset, bytes)?;
                }
            }
            tx.inner.store_words(REPLICA_OFF, &replica)?;
            Ok(())
        })?;
        Ok(lsn.expect("the replica line is written"))
    }

    /// Writes the replica line alone (a local change no record of the group carries).
    pub fn write_replica(&self, replica: ReplicaWords, mode: Commit) -> Result<Lsn, Error> {
        let (_, lsn) = self.transact_replicated(mode, |tx| Ok(tx.inner.store_words(REPLICA_OFF, &replica)?))?;
        Ok(lsn.expect("the replica line is written"))
    }

    /// The replica line (zeros in a store never replicated).
    pub fn replica(&self) -> Result<ReplicaWords, Error> {
        let (words, _) = self.transact(Commit::Async, |tx| {
            let mut words = [0u64; REPLICA_WORDS];
            tx.inner.load_words(REPLICA_OFF, &mut words)?;
            Ok(words)
        })?;
        Ok(words)
    }
}
