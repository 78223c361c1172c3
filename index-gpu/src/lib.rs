//! tusk-index: the B-link tree and the Adaptive Radix Tree stored in the transactional heap,
//! and their GPU mirror (docs/ARCHITECTURE.md, Indexes and GPU mirror).
//!
//! - [`heap`]: the word-level heap access the indexes are written against, so that read paths
//!   can later run over a snapshot image or feed the GPU mirror unchanged.
//! - [`btree`]: the B-link tree (u64 → u64), its node layout, and its validator.
//! - [`art`]: the Adaptive Radix Tree (byte strings → u64) in per-node-type slabs, and its
//!   validator.
//! - [`image`]: a plain read-only heap image on which the read paths run without the STM.
//! - [`error`]: the crate's typed errors.
//! - [`stripe`]: per-thread copies of the descriptors' hot counters, so concurrent inserts
//!   do not conflict on them.
//!
//! - [`mirror`]: the GPU mirror (device copy of the heap synced by dirty pages, batch
//!   kernels) and its CPU engine over a host image.

pub mod art;
pub mod btree;
pub mod catalog;
pub mod error;
pub mod heap;
pub mod image;
pub mod mirror;
pub mod named;
pub mod stripe;

pub use art::{Art, ArtIter, ArtOp, ArtStats, MAX_KEY_LEN};
pub use btree::BTree;
pub use btree::{BatchOutcome, Op};
pub use error::IndexError;
