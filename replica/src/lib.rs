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
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tusk::Commit;
//! use tusk_replica::{NodeConfig, ReplicatedNode};
//!
//! let dir = tempfile::tempdir()?;
//! // Three nodes on this machine's loopback (port 0: any free port), one directory each.
//! let nodes = (1..=3)
//!     .map(|id| ReplicatedNode::open(dir.path().join(format!("n{id}")), NodeConfig::new(id, "127.0.0.1:0".parse().unwrap())))
//!     .collect::<Result<Vec<_>, _>>()?;
//! let members: Vec<_> = nodes.iter().map(|n| (n.id(), n.addr())).collect();
//! nodes[0].initialize(&members)?; // once, on one node
//! let leader = loop {
//!     if let Some(n) = nodes.iter().find(|n| n.is_leader()) { break n; }
//!     std::thread::sleep(Duration::from_millis(10));
//! };
//! let (_, at) = leader.transact(Commit::Sync, |tx| {
//!     let p = tx.alloc(8)?;
//!     tx.write_u64(p, 42)?;
//!     tx.set_root("answer", p)
//! })?;
//! // Read your write on a follower, once it holds the group's log up to the commit.
//! let follower = nodes.iter().find(|n| !n.is_leader()).unwrap();
//! assert!(follower.wait_applied(at.unwrap(), Duration::from_secs(10)));
//! let (answer, _) = follower.store()?.transact(Commit::Async, |tx| {
//!     let p = tx.root("answer")?.unwrap();
//!     tx.read_u64(p)
//! })?;
//! assert_eq!(answer, 42);
//! for n in nodes { n.close()?; }
//! # Ok(()) }
//! ```

// openraft's traits fix their error type, `StorageError` (224 bytes); the helpers return it too.
#![allow(clippy::result_large_err)]

pub mod error;
pub mod log_segments;
pub mod log_store;
pub mod network;
pub mod node;
pub mod pieces;
pub mod snapshot_files;
pub mod snapshot_stream;
pub mod source;
pub mod state_machine;
pub mod stores;
pub mod types;

pub use error::ReplicaError;
pub use node::{NodeConfig, Position, Rebuilt, ReplicatedNode};
pub use types::NodeId;
