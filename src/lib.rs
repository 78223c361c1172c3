#![warn(missing_docs)]
//! tusk: an embedded, durable, transactional in-memory index store.
//!
//! An application opens a directory, runs serializable transactions over an in-memory heap
//! addressed by [`HeapPtr`] offsets, and gets durability from partitioned redo logs with
//! three commit modes ([`Commit`]) and split-phase commit ([`Store::is_stable`]).
//!
//! ```
//! # fn main() -> Result<(), tusk::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let store = tusk::Store::open(dir.path(), tusk::Options::default())?;
//! let (p, lsn) = store.transact(tusk::Commit::Sync, |tx| {
//!     let p = tx.alloc(16)?;
//!     tx.write(p, b"hello, tusk!")?;
//!     tx.set_root("greeting", p)?;
//!     Ok(p)
//! })?;
//! assert!(store.is_stable(lsn.unwrap(), false), "Sync returns once durable");
//! store.close()?;
//!
//! let store = tusk::Store::open(dir.path(), tusk::Options::default())?; // recovers
//! let (text, _) = store.transact(tusk::Commit::Async, |tx| {
//!     let p = tx.root("greeting")?.expect("root survives the restart");
//!     let mut buf = [0u8; 12];
//!     tx.read(p, &mut buf)?;
//!     Ok(buf)
//! })?;
//! assert_eq!(&text, b"hello, tusk!");
//! # Ok(()) }
//! ```

mod checkpoints;
mod error;
mod heap_export;
mod heap_loader;
mod log_repairs;
mod index;
mod mirror;
mod options;
mod prefault;
mod replication;
mod snapshot;
mod store;
mod transaction;

pub use error::Error;
pub use index::{Art, ArtOp, ArtRange, ArtStats, BTree, BTreeOp, BTreeRange, BTreeStats, BatchOutcome};
pub use mirror::{Answers, ArtLookupBuffers, GpuBackend, GpuDevices, GpuMirror, GpuOptions, LookupBuffers, MirrorArt, MirrorContents, MirrorBTree, RangeBuffers, StageTiming, SyncReport};
pub use options::{Durability, Options};
pub use heap_export::{install_heap, installing_dir, HeapExport, HeapShape};
pub use replication::ReplicaWords;
pub use tusk_txn::CommitTap;
pub use snapshot::{
    snapshot_costs, Snapshot, SnapshotArt, SnapshotArtRange, SnapshotBTree, SnapshotBTreeRange, SnapshotCosts, SnapshotInfo, SnapshotMode,
    SnapshotOptions,
};
pub use store::Store;
pub use transaction::Transaction;
pub use tusk_index::btree::TreeStats as BTreeSnapshotStats;
pub use tusk_recovery::{FileKind, HeapLoad, RecoveryReport, TornTail};
pub use tusk_storage::io::{FaultPlan, Io, RecordConfig};
pub use tusk_txn::log::catalog::FlushTotals;
pub use tusk_storage::HeapPtr;
pub use tusk_txn::{CheckpointReport, Commit, Lsn};

/// Longest ART key, in bytes (longer keys fail with [`Error::KeyTooLong`]).
pub const ART_MAX_KEY_LEN: usize = tusk_index::MAX_KEY_LEN;

/// Longest root name, in bytes.
pub const ROOT_NAME_MAX: usize = tusk_storage::layout::ROOT_NAME_MAX;
