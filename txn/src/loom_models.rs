//! Loom models of the commit protocol end to end (run by .ci/loom): real transactions of
//! [`crate::Engine`] over a heap of loom atomics. They live above the engine, the stripes and
//! the transaction (all three take part), so that those modules import downward only; the
//! clock-mode models are in `transaction.rs`, which shares these helpers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;
use tusk_storage::Heap;

use crate::{Commit, Engine, EngineConfig, Transaction, TxnError};

/// An engine without a log, over one page of heap and two stripes: heap lines 64 and 128
/// map to different stripes, 64 and 72 to the same one.
pub(crate) fn engine() -> Arc<Engine> {
    let config = EngineConfig { stripes_log2: 1, log: None, existing_segments: Vec::new() };
    Arc::new(Engine::start(config, Heap::new(tusk_storage::PAGE_SIZE).unwrap(), 0).unwrap())
}

/// Runs `body` as one transaction, retrying on conflict like `Store::transact`. Returns
/// its value and its LSN.
pub(crate) fn transact<T>(engine: &Engine, body: impl Fn(&mut Transaction<'_>) -> Result<T, TxnError>) -> (T, Option<u64>) {
    let mut t = engine.begin();
    loop {
        match body(&mut t).and_then(|v| t.commit(Commit::Async).map(|lsn| (v, lsn))) {
            Ok(done) => return done,
            Err(TxnError::Conflict) => {
                t.restart();
                thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Runs `model` under loom with a counter kept outside the model (loom does not explore it)
/// for `model` to count the executions that did what the model is about; panics, naming
/// `what`, unless some execution did.
pub(crate) fn model_where_some_execution(what: &'static str, model: impl Fn(&Arc<AtomicUsize>) + Send + Sync + 'static) {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    loom::model(move || model(&counted));
    assert!(count.load(Ordering::Relaxed) > 0, "no execution {what}");
}

/// Two read-modify-write transactions on one word: writers exclude each other (no lost
/// update), the one that read the other's write has the larger LSN, and the stripe's
/// version only grows, ending at the last LSN, unlocked.
#[test]
fn loom_writers_exclude_each_other() {
    loom::model(|| {
        let engine = engine();
        let increment = |engine: std::sync::Arc<crate::Engine>| {
            thread::spawn(move || {
                let (old, lsn) = transact(&engine, |t| {
                    let old = t.load(64)?;
                    t.store(64, old + 1)?;
                    Ok(old)
                });
                (old, lsn.unwrap())
            })
        };
        let a = increment(engine.clone());
        let b = increment(engine.clone());
        let stripe = engine.stripes.index_of(64);
        let mut last = 0;
        for _ in 0..3 {
            let v = crate::stripes::version(engine.stripes.load(stripe));
            assert!(v >= last, "stripe version went back from {last} to {v}");
            last = v;
        }
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let (first, second) = if a.0 == 0 { (a, b) } else { (b, a) };
        assert_eq!((first.0, second.0), (0, 1), "an update was lost");
        assert!(second.1 > first.1, "a transaction that read a write has a smaller LSN than it");
        assert_eq!(engine.heap().load_word(64), 2);
        let word = engine.stripes.load(stripe);
        assert!(!crate::stripes::is_locked(word));
        assert_eq!(crate::stripes::version(word), 2);
    });
}

/// Runs `read` on a spawned thread in a new transaction beside a commit of `1` to the words
/// `a` and `b` on this thread, in every interleaving loom explores; panics unless some of
/// them ran the reader in clock mode.
pub(crate) fn reader_beside_a_commit(a: u64, b: u64, read: fn(&mut Transaction<'_>, u64, u64)) {
    model_where_some_execution("ran the reader in clock mode", move |counted| {
        let engine = engine();
        let reader = {
            let (engine, counted) = (engine.clone(), counted.clone());
            thread::spawn(move || {
                let mut t = engine.begin();
                if t.in_clock_mode() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                read(&mut t, a, b);
            })
        };
        transact(&engine, |t| {
            t.store(a, 1)?;
            t.store(b, 1)
        });
        reader.join().unwrap();
    });
}

/// A reader concurrent with a writer of two words sees both old or both new values, never a
/// mix (opacity: not even a transaction that later aborts may see one), in clock mode or in
/// stripe mode, whether the words share a stripe or not.
///
/// The reader runs on the spawned thread and the writer on the model's own: the other way
/// round, loom 0.7 explored one interleaving only when the words were on two stripes
/// (tokio-rs/loom#392: a spawned thread whose first operation is an atomic load, here
/// `begin`'s, is never scheduled elsewhere), and the model checked nothing.
fn readers_see_whole_commits(a: u64, b: u64) {
    reader_beside_a_commit(a, b, |t, a, b| {
        if let (Ok(x), Ok(y)) = (t.load(a), t.load(b)) {
            assert_eq!(x, y, "a reader saw half of a commit");
            assert_eq!(t.commit(Commit::Async).unwrap(), None);
        }
    });
}

#[test]
fn loom_readers_see_whole_commits_across_stripes() {
    readers_see_whole_commits(64, 128);
}

#[test]
fn loom_readers_see_whole_commits_within_a_stripe() {
    readers_see_whole_commits(64, 72);
}

/// The dirty-epoch contract the checkpointer relies on: after `advance_dirty_epoch`
/// returned `ended`, a chunk copy made by `copy_consistent` holds every commit ordered
/// before it (LSN below the copy's), and every commit it misses (LSN above) stamped its
/// pages with an epoch above `ended`, so the next checkpoint sees the chunk dirty. The
/// copy itself is consistent: a commit is in it whole or not at all.
#[test]
fn loom_dirty_epochs_and_consistent_copies() {
    loom::model(|| {
        let engine = engine();
        let committer = {
            let engine = engine.clone();
            thread::spawn(move || {
                transact(&engine, |t| {
                    t.store(64, 1)?;
                    t.store(128, 1)
                })
                .1
                .unwrap()
            })
        };
        let ended = engine.advance_dirty_epoch();
        let mut copy = [0u8; 192];
        let copy_lsn = engine.copy_consistent(0, &mut copy).unwrap();
        let commit_lsn = committer.join().unwrap();
        let a = u64::from_le_bytes(copy[64..72].try_into().unwrap());
        let b = u64::from_le_bytes(copy[128..136].try_into().unwrap());
        assert_eq!(a, b, "the copy holds half a commit");
        if a == 1 {
            assert!(commit_lsn < copy_lsn, "the copy holds a commit ordered after it");
        } else {
            assert!(commit_lsn > copy_lsn, "the copy misses a commit ordered before it");
            assert!(engine.heap().page_epoch(0) > ended, "a commit the copy missed left its page looking clean");
        }
    });
}


/// In-place mode (under loom a transaction runs in place from its second line): a run that
/// writes three lines, two on one stripe, beside a reader of them. The reader sees none of
/// the run's writes or all of them (or a conflict), whether the run commits or is dropped
/// after writing; a dropped run leaves every line and stripe as it found them.
fn readers_see_in_place_runs_whole(commit: bool) {
    const LINES: [u64; 3] = [64, 128, 192];
    model_where_some_execution("ran the writer in place", move |counted| {
        let engine = engine();
        let reader = {
            let engine = engine.clone();
            thread::spawn(move || {
                let mut t = engine.begin();
                let mut seen = Vec::new();
                for line in LINES {
                    match t.load(line) {
                        Ok(v) => seen.push(v),
                        Err(TxnError::Conflict) => return,
                        Err(e) => panic!("{e}"),
                    }
                }
                assert!(seen.iter().all(|&v| v == seen[0]), "a reader saw part of an in-place run: {seen:?}");
                assert!(commit || seen[0] == 0, "a reader saw a dropped run's writes");
            })
        };
        if commit {
            transact(&engine, |t| {
                for line in LINES {
                    t.store(line, 1)?;
                }
                if t.is_in_place() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            });
        } else {
            let mut t = engine.begin();
            let wrote = LINES.iter().try_for_each(|&line| t.store(line, 1));
            if wrote.is_ok() && t.is_in_place() {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            drop(t);
        }
        reader.join().unwrap();
        let expect = u64::from(commit);
        for line in LINES {
            assert_eq!(engine.heap().load_word(line), expect, "line {line} after the run");
            let word = engine.stripes.load(engine.stripes.index_of(line));
            assert!(!crate::stripes::is_locked(word), "line {line}'s stripe left locked");
        }
    });
}

#[test]
fn loom_readers_see_committed_in_place_runs_whole() {
    readers_see_in_place_runs_whole(true);
}

#[test]
fn loom_readers_see_nothing_of_dropped_in_place_runs() {
    readers_see_in_place_runs_whole(false);
}

/// An in-place run and a small transaction increment the same word (the run writes two more
/// lines, so it runs in place): no update is lost, whichever waits or retries.
#[test]
fn loom_in_place_runs_lose_no_update() {
    model_where_some_execution("ran the large transaction in place", |counted| {
        let engine = engine();
        let small = {
            let engine = engine.clone();
            thread::spawn(move || {
                transact(&engine, |t| {
                    let old = t.load(64)?;
                    t.store(64, old + 1)
                })
            })
        };
        transact(&engine, |t| {
            let old = t.load(64)?;
            t.store(64, old + 1)?;
            t.store(128, 1)?;
            t.store(192, 1)?;
            if t.is_in_place() {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        small.join().unwrap();
        assert_eq!(engine.heap().load_word(64), 2, "an update was lost");
    });
}

/// Two large transactions (under loom, in place from their second line) increment the same
/// two words in opposite orders, so each run can hold what the other waits for: the older
/// wounds the younger or a wait times out, and no update is lost or applied twice.
#[test]
fn loom_two_in_place_runs_lose_no_update() {
    fn increment_both(t: &mut Transaction<'_>, first: u64, second: u64) -> Result<bool, TxnError> {
        for line in [first, second] {
            let old = t.load(line)?;
            t.store(line, old + 1)?;
        }
        Ok(t.is_in_place())
    }
    model_where_some_execution("ran both transactions in place", |counted| {
        let engine = engine();
        let other = {
            let engine = engine.clone();
            thread::spawn(move || transact(&engine, |t| increment_both(t, 128, 64)).0)
        };
        let here = transact(&engine, |t| increment_both(t, 64, 128)).0;
        let there = other.join().unwrap();
        if here && there {
            counted.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!((engine.heap().load_word(64), engine.heap().load_word(128)), (2, 2), "an update was lost");
    });
}
