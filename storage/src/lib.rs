//! tusk-storage: the lowest layer of tusk.
//!
//! - [`heap`]: one anonymous memory region addressed by u64 offsets ([`HeapPtr`]), with
//!   per-page dirty epochs shared by checkpoints, snapshots and the GPU mirror.
//! - [`layout`]: where the heap keeps its own metadata (superblock, allocator heads, roots).
//! - [`log_format`]: redo-log records and segment headers, framed and checksummed;
//!   [`line_record`]: the commit path's encoder of a write set as one record.
//! - [`io`]: the I/O backends (io_uring, plain pwrite/fdatasync, fault injection).
//! - [`process`]: fork, shared memory and pipes for fork snapshots.
//! - [`workers`]: the thread pool of scans and image copies.
//!
//! `unsafe` lives here and in the few modules docs/ARCHITECTURE.md (Crates and folders) names.

pub mod checkpoint_format;
pub mod error;
pub mod heap;
pub mod io;
pub mod layout;
pub mod line_record;
pub mod mapped;
pub mod on_demand;
#[cfg(not(loom))]
pub mod process;
pub mod log_files;
pub mod log_seal;
pub mod log_format;
pub mod region;
pub mod sched;
pub mod sync;
pub mod workers;
pub mod zeros;

pub use error::StorageError;
pub use heap::{Heap, HeapPtr, PAGE_SIZE};
pub use on_demand::{ChunkDamage, ChunkSource, DeferredWrite};
