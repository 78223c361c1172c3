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

#[cfg(all(test, not(loom)))]
mod tests {
    use std::any::Any;

    use tusk_storage::Heap;

    use super::Deferred;
    use crate::in_place::IN_PLACE_FROM;
    use crate::write_set::LINE_BYTES;
    use crate::{Commit, Engine, EngineConfig, Transaction, TxnError};

    const BASE: u64 = 1 << 16;

    /// Work that writes one word, then fails as a full heap does.
    struct WritesThenFails;

    impl Deferred for WritesThenFails {
        fn finish(self: Box<Self>, txn: &mut Transaction<'_>) -> Result<(), TxnError> {
            txn.store(BASE, 999)?;
            Err(TxnError::HeapExhausted { requested: 1, capacity: 0 })
        }

        fn as_any(&self) -> &dyn Any {
            self
        }

        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// Deferred work that fails fails the commit, and whatever the error, the attempt ends
    /// whole: a run in place gives its lines back (a full heap did not end it before), and
    /// the transaction is doomed until it starts again.
    #[test]
    fn failed_deferred_work_ends_the_attempt_and_its_run() {
        let config = EngineConfig { stripes_log2: 14, log: None, existing_segments: Vec::new() };
        let engine = Engine::start(config, Heap::new(8 << 20).unwrap(), 0).unwrap();
        let lines = IN_PLACE_FROM as u64 * 2;
        let mut tx = engine.begin();
        for i in 0..lines {
            tx.store(BASE + i * LINE_BYTES + 8, i + 1).unwrap();
        }
        assert!(tx.is_in_place());
        assert!(tx.defer(7, || WritesThenFails).is_some());
        assert!(tx.defer::<WritesThenFails>(7, || unreachable!("kept under its key")).is_some());
        assert!(matches!(tx.commit(Commit::Async), Err(TxnError::HeapExhausted { .. })));
        assert!(!tx.is_in_place(), "the run ended with the failed work");
        assert!(matches!(tx.load(BASE), Err(TxnError::Conflict)), "doomed until it restarts");
        tx.restart();
        assert!(tx.deferred::<WritesThenFails>(7).is_none(), "the work went with the attempt");
        assert_eq!(tx.load(BASE).unwrap(), 0, "the deferred store was undone");
        assert_eq!(tx.load(BASE + 8).unwrap(), 0, "and so was the run's");
        drop(tx);
        assert!(engine.in_place.with_free(|_| ()).is_some(), "the run's state is back");
    }
}
