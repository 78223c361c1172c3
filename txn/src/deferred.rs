//! Work a transaction leaves to the moment before its commit.
//!
//! A transaction holds what it read and wrote to its end: buffered, as reads that must still
//! be valid at commit; in place, as stripe locks. An index change that every writer of the
//! index meets, such as a B-link tree's separator going up into a node near the root, is
//! thus held for a large transaction's whole length, and every other transaction that
//! splits a node under it loses or waits. Work whose result the transaction itself can do
//! without until then (the tree stays searchable through its right links) is registered here
//! instead and done by [`crate::Transaction::commit`] first, through the transaction, just
//! before it locks and validates: the shared nodes are then held for the commit, not the
//! whole transaction. A conflict in that work fails the commit like any other.
//!
//! Entries are keyed by a `u64` their owner chooses (the tree's descriptor offset), typed by
//! their owner, and dropped with the attempt when it restarts.

use std::any::Any;

use crate::{Transaction, TxnError};

/// Deferred work of one kind and key.
pub trait Deferred: Any {
    /// Does the work through `txn`, before its commit locks anything. It must not defer
    /// again under its own key (the commit does each entry once).
    fn finish(self: Box<Self>, txn: &mut Transaction<'_>) -> Result<(), TxnError>;

    fn as_any(&self) -> &dyn Any;

    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A transaction's deferred work: a few entries at most (one per index it changed).
#[derive(Default)]
pub(crate) struct DeferredWork {
    entries: Vec<(u64, Box<dyn Deferred>)>,
}

impl DeferredWork {
    pub(crate) fn get<T: Deferred>(&self, key: u64) -> Option<&T> {
        self.entries.iter().find(|(k, _)| *k == key).and_then(|(_, d)| d.as_any().downcast_ref())
    }

    /// The entry of `key`, made with `make` if there is none; `None` if `key` holds an entry
    /// of another type.
    pub(crate) fn get_or_insert<T: Deferred>(&mut self, key: u64, make: impl FnOnce() -> T) -> Option<&mut T> {
        let i = match self.entries.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.entries.push((key, Box::new(make())));
                self.entries.len() - 1
            }
        };
        self.entries[i].1.as_any_mut().downcast_mut()
    }

    pub(crate) fn take(&mut self, key: u64) -> Option<Box<dyn Deferred>> {
        let i = self.entries.iter().position(|(k, _)| *k == key)?;
        Some(self.entries.swap_remove(i).1)
    }

    pub(crate) fn take_next(&mut self) -> Option<Box<dyn Deferred>> {
        self.entries.pop().map(|(_, d)| d)
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}
