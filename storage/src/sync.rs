//! The atomics the lock-free protocols of this crate use: std's in normal builds, loom's
//! under `--cfg loom`, so that the loom models in tusk-txn check the code that ships.
//! Normal builds get plain re-exports: no wrapper, no cost.

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
#[cfg(not(loom))]
pub use std::thread::yield_now;

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
#[cfg(loom)]
pub use loom::thread::yield_now;
