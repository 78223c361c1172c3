//! Replicated tusk: a group of nodes, each a tusk store, that agree on one log through
//! [openraft](https://docs.rs/openraft) 0.9 (its `storage-v2` traits), over HTTP on the
//! group's sockets (axum serves, reqwest calls).
//!
//! The leader runs update transactions; each committed transaction's redo record, as its
//! store's log appended it, reaches the group in LSN order, batched into Raft entries; every
//! member applies committed entries to its store, the entry's position written with them in
//! one transaction. Followers serve readers (read-only transactions, snapshots, GPU mirrors)
//! at the position they have applied, and [`ReplicatedNode::wait_applied`] waits for one.
//! See docs/ARCHITECTURE.md, "Replication".

// openraft's traits fix their error type, `StorageError` (224 bytes); the helpers return it too.
#![allow(clippy::result_large_err)]

pub mod error;
pub mod log_store;
pub mod network;
pub mod node;
pub mod source;
pub mod state_machine;
pub mod types;

pub use error::ReplicaError;
pub use node::{NodeConfig, Position, ReplicatedNode};
pub use types::NodeId;
