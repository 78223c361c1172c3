//! Index handles: `tx.btree("name")` and `tx.art("name")`.
//!
//! A handle borrows its transaction, so every operation on it is part of that transaction:
//! it commits, aborts and retries with everything else the closure did, and the redo log,
//! checkpoints and recovery cover the index with no code of their own (docs/ARCHITECTURE.md, "one
//! heap of offsets"). The trees themselves live in `tusk-index`; these modules only name them under
//! roots and turn their errors into [`Error`].

mod art;
mod btree;

pub use art::{Art, ArtOp, ArtRange, ArtStats};
pub use btree::{BTree, BTreeOp, BTreeRange, BTreeStats, BatchOutcome};

use tusk_index::IndexError;

use crate::Error;

/// How [`Error::NotAnIndex`] names each kind of index.
pub(crate) const BTREE_KIND: &str = "B-link tree";
pub(crate) const ART_KIND: &str = "adaptive radix tree";

impl From<IndexError> for Error {
    fn from(e: IndexError) -> Error {
        match e {
            IndexError::Txn(e) => e.into(),
            IndexError::NotABTree(offset) => Error::NotAnIndex { offset, kind: BTREE_KIND },
            IndexError::Invariant { node, what } => Error::IndexDamaged { node, what },
            IndexError::NotEmpty => Error::BulkLoadNotEmpty,
            IndexError::NotSorted { at_index } => Error::BulkLoadNotSorted { at_index },
            IndexError::NotAnArt(offset) => Error::NotAnIndex { offset, kind: ART_KIND },
            IndexError::KeyTooLong { len, max } => Error::KeyTooLong { len, max },
            IndexError::ArtInvariant { node, what } => Error::IndexDamaged { node, what },
        }
    }
}
