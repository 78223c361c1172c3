//! The leader's side of replication: the records its store's log appends, put back in LSN
//! order ([`crate::types::Batch`]es are proposed in that order), and the committers waiting
//! for the group to commit them.
//!
//! The store's [`tusk::CommitTap`] passes every LSN once, from the committing threads, in
//! LSN order per log partition only; the source holds what arrives early until the LSNs
//! before it are in. LSNs that carry nothing for the group are passed over: records without
//! writes (a checkpoint's or snapshot's LSN, recovery markers), and the node's own writes of
//! its replica line, which it makes inside [`local_only`].

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tusk_storage::log_format::decode_validated;

use crate::types::PIECE_BYTES;

thread_local! {
    static LOCAL_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's commits kept from the group (the node's own replica line).
pub fn local_only<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            LOCAL_ONLY.with(|l| l.set(self.0));
        }
    }
    let _reset = Reset(LOCAL_ONLY.with(|l| l.replace(true)));
    f()
}

/// Most bytes of records one proposal carries (one entry: answered within the heartbeat
/// interval, as a piece must be).
pub const MAX_BATCH_BYTES: usize = 2 << 20;
/// Commits whose group position a committer can still look up (one per proposal).
const POSITIONS_KEPT: usize = 1 << 16;

#[derive(Default)]
struct State {
    /// Whether this node leads and proposes: before, every LSN is ignored.
    leading: bool,
    /// The next LSN to take, in order.
    next: u64,
    /// LSNs arrived ahead of `next`; `None`: nothing to propose.
    early: BTreeMap<u64, Option<Vec<u8>>>,
    /// Every LSN up to this one is committed by the group or needed no commit.
    committed: u64,
    /// What was taken and is not yet known committed, in LSN order, by the last LSN of
    /// each take. The watermark moves only over a prefix of it: LSNs passed over after a
    /// proposal still in flight wait for it.
    taken: VecDeque<(u64, Taken)>,
    /// The index of the last entry known committed.
    last_index: u64,
    /// (last LSN of a proposal, its entry's index in the group's log), oldest first.
    positions: VecDeque<(u64, u64)>,
    /// Why no LSN will be committed any more (leadership lost, a proposal failed).
    failed: Option<String>,
    /// Committers waiting, by the LSN each waits for: woken only once it is committed (a
    /// condition variable woke every committer at every commit, tens of needless thread
    /// switches per commit with many committers).
    waiters: Vec<(u64, std::thread::Thread)>,
}

/// See the module doc.
#[derive(Default)]
pub struct Source {
    state: Mutex<State>,
    /// The proposer's wake-up.
    pub ready: tokio::sync::Notify,
}

/// A take of LSNs: proposed (the index of its entry once committed), or carrying nothing.
#[derive(Clone, Copy, Debug)]
enum Taken {
    Proposed(Option<u64>),
    PassedOver,
}

/// Marks the take whose last LSN is `lsn`, and every take before it, committed at entry
/// `index` or below.
fn mark_committed(s: &mut State, lsn: u64, index: u64) {
    let at = s.taken.partition_point(|&(last, _)| last < lsn);
    // (Not there: a later entry's answer already marked it, and it went.)
    if s.taken.get(at).is_some_and(|&(last, _)| last == lsn) {
        // Every proposal taken before it is committed too: their entries lie at or below
        // this one.
        for k in 0..=at {
            if let Taken::Proposed(known) = &mut s.taken[k].1 {
                *known = Some(known.map_or(index, |i| i.min(index)));
            }
        }
    }
    s.last_index = s.last_index.max(index);
}

/// Moves the watermark over the prefix of `taken` known committed; whether it moved.
fn advance(s: &mut State) -> bool {
    let mut moved = false;
    loop {
        let (last, index) = match s.taken.front() {
            Some(&(last, Taken::Proposed(Some(index)))) => (last, index),
            // Held by the entry before it, or a later one.
            Some(&(last, Taken::PassedOver)) => (last, s.positions.back().map_or(s.last_index, |p| p.1)),
            _ => break,
        };
        s.taken.pop_front();
        s.committed = s.committed.max(last);
        if s.positions.len() == POSITIONS_KEPT {
            s.positions.pop_front();
        }
        s.positions.push_back((last, index));
        moved = true;
    }
    moved
}

/// Why a committer's wait ended without its LSN committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitError {
    Failed(String),
    TimedOut,
}

impl Source {
    /// The tap: every record the store's log appends.
    pub fn tap(&self, lsn: u64, record: &[u8]) {
        let mut s = self.state.lock();
        if !s.leading || lsn < s.next {
            return;
        }
        let carries = !LOCAL_ONLY.with(Cell::get)
            && decode_validated(record, 0).is_some_and(|view| view.header.void.is_none() && view.write_count() > 0);
        s.early.insert(lsn, carries.then(|| record.to_vec()));
        if lsn == s.next {
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Starts proposing with the LSN after `last_lsn` (the store's last when the node took
    /// the lead: everything up to it the group already holds).
    pub fn lead(&self, last_lsn: u64) {
        let mut s = self.state.lock();
        s.leading = true;
        s.next = last_lsn + 1;
        s.committed = last_lsn;
        s.taken.clear();
        s.early.retain(|&lsn, _| lsn > last_lsn);
        s.failed = None;
    }

    /// Whether no LSN will be committed any more (it failed, or does not lead).
    pub fn is_failed(&self) -> bool {
        self.state.lock().failed.is_some()
    }

    /// Stops taking LSNs: what is waiting fails with `why`.
    pub fn fail(&self, why: String) {
        let mut s = self.state.lock();
        s.leading = false;
        s.early.clear();
        s.failed.get_or_insert(why);
        wake(s, |_| true);
    }

    /// Takes the records ready in LSN order, up to [`MAX_BATCH_BYTES`] (at least one), and
    /// the last LSN they cover (0: none ready). A record larger than [`PIECE_BYTES`] is taken
    /// alone (it is proposed in pieces). The caller proposes them, in this order, and
    /// reports the entry with [`Source::committed`]; a range without records needs no report.
    pub fn take_ready(&self) -> (Vec<(u64, Vec<u8>)>, u64) {
        let mut s = self.state.lock();
        let (mut out, mut bytes, mut last) = (Vec::new(), 0usize, 0);
        while s.leading {
            let next = s.next;
            let huge = s.early.get(&next).is_some_and(|r| r.as_ref().is_some_and(|r| r.len() > PIECE_BYTES));
            if huge && !out.is_empty() {
                break;
            }
            let Some(record) = s.early.remove(&next) else { break };
            if let Some(record) = record {
                bytes += record.len();
                out.push((next, record));
            }
            last = next;
            s.next += 1;
            if bytes >= MAX_BATCH_BYTES || huge {
                break;
            }
        }
        if last != 0 {
            s.taken.push_back((last, if out.is_empty() { Taken::PassedOver } else { Taken::Proposed(None) }));
            settle(s);
        }
        (out, last)
    }

    /// The group committed the proposal taken up to `lsn`, as its log's entry `index`.
    /// Proposals' answers may come in any order (each is awaited on its own task); an entry
    /// committed means every entry before it is.
    pub fn committed(&self, lsn: u64, index: u64) {
        let mut s = self.state.lock();
        mark_committed(&mut s, lsn, index);
        settle(s);
    }

    /// The group committed entry `index`, which holds record `lsn`: seen as the leader
    /// applies its own entry, before the proposal's answer comes back through openraft
    /// (tens of µs later), so its committers go on sooner. Nothing if no take still waiting
    /// holds `lsn` (an earlier leadership's record, or one known committed).
    pub fn committed_holding(&self, lsn: u64, index: u64) {
        let mut s = self.state.lock();
        if !s.leading || lsn <= s.committed {
            return;
        }
        // Takes cover consecutive LSNs from the watermark on: the first whose last LSN is at
        // or past `lsn` holds it.
        let at = s.taken.partition_point(|&(last, _)| last < lsn);
        let Some(&(last, Taken::Proposed(_))) = s.taken.get(at) else { return };
        mark_committed(&mut s, last, index);
        settle(s);
    }

    /// Waits until the group committed `lsn`; returns the index of the entry that holds it
    /// (or a later one).
    pub fn wait_committed(&self, lsn: u64, timeout: Duration) -> Result<u64, WaitError> {
        let deadline = Instant::now() + timeout;
        let me = std::thread::current();
        loop {
            let left = {
                let mut s = self.state.lock();
                let done = if s.committed >= lsn {
                    let at = s.positions.partition_point(|&(last, _)| last < lsn);
                    Some(Ok(s.positions.get(at).or(s.positions.back()).map_or(0, |&(_, index)| index)))
                } else if let Some(why) = &s.failed {
                    Some(Err(WaitError::Failed(why.clone())))
                } else {
                    let left = deadline.saturating_duration_since(Instant::now());
                    left.is_zero().then_some(Err(WaitError::TimedOut)).or_else(|| {
                        // (A spurious wake-up finds itself still listed.)
                        if !s.waiters.iter().any(|(_, t)| t.id() == me.id()) {
                            s.waiters.push((lsn, me.clone()));
                        }
                        None
                    })
                };
                if let Some(done) = done {
                    s.waiters.retain(|(_, t)| t.id() != me.id());
                    return done;
                }
                deadline.saturating_duration_since(Instant::now())
            };
            std::thread::park_timeout(left);
        }
    }
}

/// Moves the watermark over what is known committed and wakes the committers it passed.
fn settle(mut s: parking_lot::MutexGuard<'_, State>) {
    if advance(&mut s) {
        let committed = s.committed;
        wake(s, |lsn| lsn <= committed);
    }
}

/// Wakes the committers waiting for an LSN `ready` says is settled (committed, or failed).
fn wake(mut s: parking_lot::MutexGuard<'_, State>, ready: impl Fn(u64) -> bool) {
    let mut woken = Vec::new();
    s.waiters.retain(|(lsn, thread)| {
        let go = ready(*lsn);
        if go {
            woken.push(thread.clone());
        }
        !go
    });
    drop(s);
    for thread in woken {
        thread.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tusk_storage::log_format::{RecordEncoder, RecordHeader};

    fn record(lsn: u64, writes: usize) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut enc = RecordEncoder::begin(&mut buf, RecordHeader { lsn, partition: 0, flags: 0, void: None });
        for w in 0..writes {
            enc.push_write(&mut buf, 16384 + 64 * w as u64, &[lsn as u8; 8]);
        }
        enc.finish(&mut buf);
        buf
    }

    /// LSNs arriving out of order come out in order, once the ones before are in; empty
    /// records and local-only ones are passed over but still count; nothing before `lead`.
    #[test]
    fn records_come_out_in_lsn_order_without_the_empty_and_local_ones() {
        let source = Source::default();
        source.tap(3, &record(3, 1));
        assert_eq!(source.take_ready(), (vec![], 0), "not leading: ignored");
        source.lead(10);
        source.tap(12, &record(12, 2));
        source.tap(13, &record(13, 0));
        assert_eq!(source.take_ready(), (vec![], 0), "11 is not in yet");
        local_only(|| source.tap(11, &record(11, 1)));
        source.tap(14, &record(14, 1));
        let (records, last) = source.take_ready();
        assert_eq!(last, 14);
        assert_eq!(records.iter().map(|r| r.0).collect::<Vec<_>>(), vec![12, 14], "11 local, 13 empty");
        assert_eq!(records[0].1, record(12, 2));
        source.tap(9, &record(9, 1));
        assert_eq!(source.take_ready(), (vec![], 0), "an LSN the group holds already");
    }

    /// A record larger than a piece is taken alone: after the records before it, and before
    /// those after it.
    #[test]
    fn a_record_larger_than_a_piece_is_taken_alone() {
        let huge = |lsn: u64| {
            let mut buf = Vec::new();
            let mut enc = RecordEncoder::begin(&mut buf, RecordHeader { lsn, partition: 0, flags: 0, void: None });
            enc.push_write(&mut buf, 16384, &vec![lsn as u8; PIECE_BYTES]);
            enc.finish(&mut buf);
            buf
        };
        let source = Source::default();
        source.lead(0);
        source.tap(1, &record(1, 1));
        source.tap(2, &huge(2));
        source.tap(3, &record(3, 1));
        let lsns = |(records, last): (Vec<(u64, Vec<u8>)>, u64)| (records.iter().map(|r| r.0).collect::<Vec<_>>(), last);
        assert_eq!(lsns(source.take_ready()), (vec![1], 1));
        assert_eq!(lsns(source.take_ready()), (vec![2], 2));
        assert_eq!(lsns(source.take_ready()), (vec![3], 3));
    }

    /// LSNs that carry nothing, taken after a proposal still in flight, are not committed
    /// before it (found by the three-node test: a `Sync` commit returned before its entry
    /// was committed, and its position named an earlier entry).
    #[test]
    fn lsns_passed_over_wait_for_the_proposals_before_them() {
        let source = Source::default();
        source.lead(0);
        source.tap(1, &record(1, 1));
        assert_eq!(source.take_ready().1, 1, "LSN 1 proposed");
        local_only(|| source.tap(2, &record(2, 1)));
        let (records, last) = source.take_ready();
        assert!(records.is_empty() && last == 2, "LSN 2 carries nothing");
        assert_eq!(source.wait_committed(2, Duration::from_millis(20)), Err(WaitError::TimedOut), "LSN 1 is in flight");
        assert_eq!(source.wait_committed(1, Duration::ZERO), Err(WaitError::TimedOut));
        source.committed(1, 5);
        assert_eq!(source.wait_committed(1, Duration::ZERO), Ok(5));
        assert_eq!(source.wait_committed(2, Duration::ZERO), Ok(5));
    }

    /// A commit wakes the committers of the LSNs it covers; the others stay parked, listed.
    #[test]
    fn a_commit_wakes_only_the_committers_it_covers() {
        let source = std::sync::Arc::new(Source::default());
        source.lead(0);
        let waiters: Vec<_> = (1..=3u64)
            .map(|lsn| {
                let s = source.clone();
                std::thread::spawn(move || s.wait_committed(lsn, Duration::from_secs(20)))
            })
            .collect();
        while source.state.lock().waiters.len() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        for lsn in 1..=2 {
            source.tap(lsn, &record(lsn, 1));
        }
        assert_eq!(source.take_ready().1, 2);
        source.committed(2, 7);
        let mut waiters = waiters.into_iter();
        for _ in 1..=2 {
            assert_eq!(waiters.next().unwrap().join().unwrap(), Ok(7));
        }
        let third = waiters.next().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!third.is_finished(), "LSN 3 is not committed");
        assert_eq!(source.state.lock().waiters.iter().map(|w| w.0).collect::<Vec<_>>(), vec![3]);
        source.fail("lost the lead".into());
        assert_eq!(third.join().unwrap(), Err(WaitError::Failed("lost the lead".into())));
        assert!(source.state.lock().waiters.is_empty());
    }

    #[test]
    fn committers_wait_for_their_lsn_and_learn_its_entry() {
        let source = std::sync::Arc::new(Source::default());
        source.lead(0);
        assert_eq!(source.wait_committed(1, Duration::from_millis(10)), Err(WaitError::TimedOut));
        let s = source.clone();
        let waiter = std::thread::spawn(move || s.wait_committed(5, Duration::from_secs(10)));
        for lsn in 1..=6 {
            source.tap(lsn, &record(lsn, 1));
            if lsn == 3 || lsn == 6 {
                assert_eq!(source.take_ready().1, lsn);
            }
        }
        // Answers out of order: entry 8 (LSNs 4..=6) before entry 7 (up to 3).
        source.committed(6, 8);
        source.committed(3, 7);
        assert_eq!(waiter.join().unwrap(), Ok(8), "LSN 5 lies in the entry covering 4..=6");
        let two = source.wait_committed(2, Duration::ZERO).unwrap();
        assert!((7..=8).contains(&two), "LSN 2 lies in entry 7, or is reported in a later one: {two}");
        source.fail("lost the lead".into());
        assert_eq!(source.wait_committed(7, Duration::from_secs(1)), Err(WaitError::Failed("lost the lead".into())));
    }

    /// A record seen committed as its entry is applied commits its whole take (the LSNs
    /// passed over at its end too), and nothing of another leadership.
    #[test]
    fn a_record_applied_commits_the_take_that_holds_it() {
        let source = Source::default();
        source.lead(10);
        source.tap(11, &record(11, 1));
        source.tap(12, &record(12, 1));
        source.tap(13, &record(13, 0));
        assert_eq!(source.take_ready().1, 13, "one take: 11 and 12 proposed, 13 passed over");
        source.tap(14, &record(14, 1));
        assert_eq!(source.take_ready().1, 14);
        source.committed_holding(9, 3);
        assert_eq!(source.wait_committed(11, Duration::ZERO), Err(WaitError::TimedOut), "LSN 9 is of an earlier leadership");
        source.committed_holding(12, 5);
        assert_eq!(source.wait_committed(13, Duration::ZERO), Ok(5), "the take up to 13 is in entry 5");
        assert_eq!(source.wait_committed(14, Duration::ZERO), Err(WaitError::TimedOut), "the next take is not");
        source.committed(14, 6);
        assert_eq!(source.wait_committed(14, Duration::ZERO), Ok(6));
        source.committed_holding(12, 5);
        source.committed(13, 5);
        assert_eq!(source.wait_committed(14, Duration::ZERO), Ok(6), "late answers change nothing");
        source.fail("lost the lead".into());
        source.committed_holding(15, 7);
        assert_eq!(source.wait_committed(15, Duration::ZERO), Err(WaitError::Failed("lost the lead".into())));
    }
}
