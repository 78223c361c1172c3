//! tusk-recovery: rebuilds the heap from the redo logs.
//!
//! - [`scan`]: reads every partition's segments, finds torn tails (cut once the replay has
//!   succeeded), and refuses any other damage with an error naming file and offset.
//! - [`replay`]: orders the records by LSN, applies them up to the first gap, then the
//!   Partition-flagged records beyond it (docs/ARCHITECTURE.md, Recovery).

pub mod apply;
pub mod checkpoint;
pub mod error;
mod merge;
pub mod on_demand;
pub mod replay;
pub mod scan;

pub use checkpoint::{Fallback, HeapLoad, LoadedCheckpoint};
pub use error::{FileKind, RecoveryError};
pub use replay::{plan, recover, recover_heap, reopen_load, Plan, RecoveryReport};
pub use scan::TornTail;
