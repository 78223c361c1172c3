//! Records too large for one entry of the group's log, put back together from their pieces
//! ([`crate::types::Piece`]) as a node applies the entries that carry them.
//!
//! A record's pieces lie in consecutive entries of its origin, memberships possibly between.
//! A record whose pieces stop — a new leader's blank entry, or a whole batch, comes before
//! its last piece — was never committed whole (its last piece is what its committer waits
//! for) and is dropped. Until a record is whole, the node's applied position stays before its
//! first piece: a node opened again replays the log from there and sees every piece again.

use crate::types::{LogId, Piece};

/// A record whose last piece has not come yet.
struct Unfinished {
    origin: (u64, u64),
    lsn: u64,
    len: u64,
    bytes: Vec<u8>,
    /// The entry before its first piece.
    before: Option<LogId>,
}

/// See the module doc.
#[derive(Default)]
pub struct Assembly {
    unfinished: Option<Unfinished>,
}

impl Assembly {
    /// A piece of a record of `origin`, in the entry after `before`; the record once this
    /// piece ends it.
    pub fn piece(&mut self, origin: (u64, u64), piece: Piece, before: Option<LogId>) -> Option<Vec<u8>> {
        let continues = self.unfinished.as_ref().is_some_and(|u| u.origin == origin && u.lsn == piece.lsn && u.len == piece.len && u.bytes.len() as u64 == piece.at);
        if !continues {
            // A record begins (any unfinished one ended without its last piece), or a piece
            // whose beginning this node never saw: nothing to apply of it.
            self.unfinished = None;
            if piece.at != 0 {
                return None;
            }
            let capacity = usize::try_from(piece.len).unwrap_or(usize::MAX);
            self.unfinished = Some(Unfinished { origin, lsn: piece.lsn, len: piece.len, bytes: Vec::with_capacity(capacity), before });
        }
        let last = piece.is_last();
        let u = self.unfinished.as_mut().expect("a record being assembled");
        u.bytes.extend_from_slice(&piece.bytes);
        if last {
            return self.unfinished.take().map(|u| u.bytes);
        }
        None
    }

    /// An entry that no piece of an unfinished record can follow (a blank entry, a whole
    /// batch): the record is dropped.
    pub fn interrupt(&mut self) {
        self.unfinished = None;
    }

    /// Where the applied position stays while a record is unfinished: the entry before its
    /// first piece (`None`: nothing is unfinished).
    pub fn held_at(&self) -> Option<Option<LogId>> {
        self.unfinished.as_ref().map(|u| u.before)
    }

    /// Forgets what was being assembled (the store was replaced).
    pub fn reset(&mut self) {
        self.unfinished = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::PIECE_BYTES;
    use openraft::LeaderId;

    fn id(index: u64) -> Option<LogId> {
        Some(LogId { leader_id: LeaderId { term: 1, node_id: 1 }, index })
    }

    fn record(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    #[test]
    fn pieces_in_order_make_the_record_and_hold_the_position_until_then() {
        let rec = record(2 * PIECE_BYTES + 3, 7);
        let mut a = Assembly::default();
        let pieces = Piece::split(5, &rec);
        assert!(a.piece((2, 2), pieces[0].clone(), id(10)).is_none());
        assert_eq!(a.held_at(), Some(id(10)));
        assert!(a.piece((2, 2), pieces[1].clone(), id(11)).is_none());
        assert_eq!(a.held_at(), Some(id(10)), "held before the first piece");
        assert_eq!(a.piece((2, 2), pieces[2].clone(), id(12)), Some(rec));
        assert_eq!(a.held_at(), None);
    }

    #[test]
    fn a_record_cut_short_is_dropped_and_a_stray_piece_ignored() {
        let (r1, r2) = (record(PIECE_BYTES + 1, 3), record(PIECE_BYTES + 9, 5));
        let (p1, p2) = (Piece::split(5, &r1), Piece::split(6, &r2));
        let mut a = Assembly::default();
        // Interrupted by a blank entry: the rest of it means nothing.
        assert!(a.piece((2, 2), p1[0].clone(), id(1)).is_none());
        a.interrupt();
        assert_eq!(a.held_at(), None);
        assert!(a.piece((2, 2), p1[1].clone(), id(3)).is_none());
        // A new record's first piece ends an unfinished one; another origin's piece does not
        // continue it.
        assert!(a.piece((2, 2), p1[0].clone(), id(4)).is_none());
        assert!(a.piece((3, 3), p2[0].clone(), id(5)).is_none());
        assert_eq!(a.held_at(), Some(id(5)));
        assert!(a.piece((2, 2), p1[1].clone(), id(6)).is_none(), "not the record being assembled");
        assert_eq!(a.held_at(), None);
        assert!(a.piece((3, 3), p2[0].clone(), id(7)).is_none());
        assert_eq!(a.piece((3, 3), p2[1].clone(), id(8)), Some(r2));
    }
}
