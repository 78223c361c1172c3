use tusk_txn::TxnError;

/// Errors of the indexes.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The transaction failed (a conflict to retry, heap exhaustion, a closed store, ...).
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// The pointer does not lead to a tree of this kind (wrong root, or a foreign object).
    #[error("the object at heap offset {0} is not a B-link tree")]
    NotABTree(u64),
    /// `check()` found a broken invariant: names the node and what is wrong with it.
    #[error("B-link tree invariant broken at node {node}: {what}")]
    Invariant { node: u64, what: String },
    /// `bulk_load` needs an empty tree.
    #[error("bulk load into a tree that is not empty")]
    NotEmpty,
    /// `bulk_load` input whose key at this index (0-based) is not above the one before it.
    #[error("bulk load input not strictly ascending at index {at_index}")]
    NotSorted { at_index: u64 },
    /// The pointer does not lead to an Adaptive Radix Tree descriptor.
    #[error("the object at heap offset {0} is not an adaptive radix tree")]
    NotAnArt(u64),
    /// A key longer than the ART accepts ([`crate::art::MAX_KEY_LEN`]).
    #[error("key of {len} bytes is longer than the maximum of {max}")]
    KeyTooLong { len: usize, max: usize },
    /// The ART's `check()` (or an operation) found a broken invariant: `node` is the packed
    /// link (kind in the high byte, slab index below) of the node or leaf at fault, or the
    /// descriptor's heap offset for descriptor-wide problems.
    #[error("ART invariant broken at {node:#x}: {what}")]
    ArtInvariant { node: u64, what: String },
}

impl IndexError {
    /// Whether retrying the whole transaction may succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, IndexError::Txn(TxnError::Conflict))
    }
}
