//! tusk-txn: software transactional memory over the heap, LSNs and commit modes, and the
//! partitioned redo logs that make commits durable.
//!
//! - [`stripes`]: versioned stripe locks (one word per 64-byte line, hashed).
//! - [`write_set`]: a transaction's buffered writes, word-granular with byte masks.
//! - [`transaction`]: reads with opacity (TL2-style read version with extension), commit.
//! - [`clock_hints`]: whether a thread's next transaction begins in clock mode.
//! - [`alloc`], [`roots`]: the allocator and the named roots, both transactional.
//! - [`in_place`], [`kept`]: large transactions written in place, and the buffers they keep.
//! - [`deferred`]: work a transaction leaves to the moment before its commit.
//! - [`log`]: per-partition log buffers and flush slots (committers lead their own flushes; a
//!   background flusher serves `Async`), the durable watermark.
//! - [`engine`]: what a store shares between its threads.
//! - [`snapshot`]: the snapshot gate, the consistent incremental page copy, fork servers.

pub mod alloc;
pub mod checkpoint;
pub mod clock_hints;
pub mod deferred;
pub mod engine;
pub mod error;
pub mod growth;
pub mod in_place;
pub mod kept;
pub mod log;
#[cfg(all(test, loom))]
mod loom_models;
pub mod roots;
pub mod snapshot;
pub mod stripes;
pub mod sync;
pub mod transaction;
pub mod write_set;

pub use checkpoint::{CheckpointConfig, CheckpointReport, Checkpointer};
pub use deferred::Deferred;
pub use engine::{Engine, EngineConfig};
pub use log::{CommitTap, LogConfig};
pub use error::TxnError;
pub use transaction::{Commit, Lsn, Transaction};
