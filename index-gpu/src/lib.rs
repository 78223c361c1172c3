//! tusk-index: the B-link tree and the Adaptive Radix Tree stored in the transactional heap,
//! and their GPU mirror (DESIGN.md).
//!
//! - [`heap`]: the word-level heap access the indexes are written against, so that read paths
//!   can later run over a snapshot image or feed the GPU mirror unchanged.
//! - [`btree`]: the B-link tree (u64 → u64), its node layout, and its validator.
//! - [`art`]: the Adaptive Radix Tree (byte strings → u64) in per-node-type slabs, and its
//!   validator.
//! - [`error`]: the crate's typed errors.
//!
//! The ART and the device mirror are still to come (issue 5 and the GPU issue).

pub mod art;
pub mod btree;
pub mod error;
pub mod heap;

pub use art::{Art, ArtIter, ArtStats, MAX_KEY_LEN};
pub use btree::BTree;
pub use error::IndexError;
