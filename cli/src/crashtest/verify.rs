//! What recovery must produce, and the checks.
//!
//! The child announces each transaction (its sequence number, mode and data writes) before
//! committing it and acknowledges it with its LSN after; LSNs ascend with sequence numbers
//! (see [`super::workload`]), so an unacknowledged transaction's LSN lies between its
//! acknowledged neighbours'. After recovery to LSN `R`, with the marks telling which
//! transactions are in the recovered state:
//! - lost acknowledged: a Sync (or confirmed split-phase) commit with LSN > R or absent; an
//!   acknowledged Partition commit absent; after a clean close, any acknowledged commit absent;
//! - gap rule: every transaction with LSN ≤ R present (for an unacknowledged one: when a
//!   later one with LSN ≤ R is); none beyond R present unless it committed with Partition (for
//!   an unacknowledged one: when an earlier one is beyond R or absent); nothing present that
//!   was never announced;
//! - the state: the words from the start of the cycle with the present transactions applied
//!   in LSN order, word for word (hathi: the heap equals the model; bank: the balances too),
//!   and for bank the total conserved, unless Partition records beyond a gap were applied
//!   (their after-images may rest on transfers the gap dropped — the documented cost of
//!   Partition commits).

use std::collections::BTreeMap;

use super::protocol::{Event, Mode};
use super::workload::{self, mark_index, Writes, ACCOUNTS, DATA, MARKS, TOTAL};
use super::Workload;
use tusk::RecoveryReport;

/// A transaction the child announced.
#[derive(Clone, Debug)]
pub struct Intent {
    /// The child's committing thread, from 0.
    pub thread: u32,
    /// The transaction's sequence number (the value it writes to the sequence word).
    pub seq: u64,
    /// How it commits.
    pub mode: Mode,
    /// Its data writes: (word index, value), as `workload::apply` takes them.
    pub writes: Writes,
}

/// An acknowledged transaction.
#[derive(Clone, Debug)]
pub struct Acked {
    /// The announcement the acknowledgement answers.
    pub intent: Intent,
    /// The LSN the commit returned.
    pub lsn: u64,
    /// A split-phase commit whose `is_stable(lsn, true)` returned true.
    pub stable: bool,
}

/// Everything one child reported, sorted out.
#[derive(Clone, Debug, Default)]
pub struct CycleLog {
    /// (LSN when the child opened the store, first sequence number), once it was ready.
    pub ready: Option<(u64, u64)>,
    /// Acknowledged transactions, in the order of their acknowledgements.
    pub acked: Vec<Acked>,
    /// Announced transactions not acknowledged that may have committed: per thread the last
    /// one, and every refused one.
    pub pending: Vec<Intent>,
    /// Commits refused (the log failed).
    pub refused: u64,
    /// Broken promises seen in the report itself (an ack after a refusal, an LSN out of order).
    pub problems: Vec<String>,
}

impl CycleLog {
    /// Sorts out a child's events: pairs each acknowledgement with its announcement, keeps
    /// what may have committed unacknowledged, and notes broken promises (an ack without
    /// its announcement or after a refusal, an LSN not above the start, a child error).
    pub fn from_events(events: &[Event]) -> CycleLog {
        let mut log = CycleLog::default();
        let mut pending: BTreeMap<u32, Intent> = BTreeMap::new();
        let mut refused: BTreeMap<u32, u64> = BTreeMap::new();
        for e in events {
            match e {
                Event::Ready { start_lsn, first_seq } => log.ready = Some((*start_lsn, *first_seq)),
                Event::Intent { thread, seq, mode, writes } => {
                    pending.insert(*thread, Intent { thread: *thread, seq: *seq, mode: *mode, writes: writes.clone() });
                }
                Event::Ack { thread, seq, lsn } => {
                    if let Some(first) = refused.get(thread) {
                        log.problems.push(format!("thread {thread}: commit of seq {seq} acknowledged (LSN {lsn}) after the log failed (refused seq {first})"));
                    }
                    match pending.remove(thread).filter(|i| i.seq == *seq) {
                        Some(intent) => {
                            if log.ready.is_some_and(|(start, _)| *lsn <= start) {
                                log.problems.push(format!("seq {seq} got LSN {lsn}, not above the LSN the store opened at"));
                            }
                            log.acked.push(Acked { intent, lsn: *lsn, stable: false });
                        }
                        None => log.problems.push(format!("thread {thread}: acknowledgement of seq {seq} without its announcement")),
                    }
                }
                Event::Stable { thread, seq } => {
                    if let Some(a) = log.acked.iter_mut().rev().find(|a| a.intent.thread == *thread && a.intent.seq == *seq) {
                        a.stable = true;
                    }
                }
                Event::Refused { thread, seq, .. } => {
                    log.refused += 1;
                    refused.entry(*thread).or_insert(*seq);
                    // Refused after its point of no return (the log failed while it waited):
                    // it committed in memory, and its record may be on disk.
                    if let Some(intent) = pending.remove(thread).filter(|i| i.seq == *seq) {
                        log.pending.push(intent);
                    }
                }
                Event::Error(why) => log.problems.push(format!("child error: {why}")),
            }
        }
        log.pending.extend(pending.into_values());
        log
    }

    /// Every LSN up to this one must survive: the largest Sync or confirmed split-phase ack.
    pub fn required_lsn(&self) -> u64 {
        self.acked.iter().filter(|a| a.intent.mode == Mode::Sync || a.stable).map(|a| a.lsn).max().unwrap_or(0)
    }

    /// LSNs of acknowledged Partition commits (they must survive on their own).
    pub fn partition_acked(&self) -> Vec<u64> {
        self.acked.iter().filter(|a| a.intent.mode == Mode::Partition).map(|a| a.lsn).collect()
    }

    /// The LSN of the cycle's first transaction.
    pub fn first_lsn(&self) -> u64 {
        self.ready.map_or(u64::MAX, |(start, _)| start + 1)
    }
}

/// How much must survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strictness {
    /// A crash: acknowledged Sync, confirmed split-phase and Partition commits.
    Crash,
    /// A clean close: every acknowledged commit.
    Clean,
    /// Recovery repaired media damage by cutting a log: acknowledged commits may be gone
    /// with the damaged record, but what is there must still follow every rule.
    Damaged,
}

/// What the checks found.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Acknowledged commits that recovery lost, one message each.
    pub lost: Vec<String>,
    /// Rules broken, one message each: the gap rule, the model, the bank total, LSN order,
    /// and what the child or recovery did wrong.
    pub violations: Vec<String>,
}

impl Verdict {
    /// Whether nothing was lost and no rule broken.
    pub fn ok(&self) -> bool {
        self.lost.is_empty() && self.violations.is_empty()
    }
}

/// The value each word of `writes` is left with: its last write.
fn final_writes(writes: &Writes) -> impl Iterator<Item = (u64, u64)> + '_ {
    let last: BTreeMap<u64, usize> = writes.iter().enumerate().map(|(k, &(word, _))| (word, k)).collect();
    writes.iter().enumerate().filter(move |(k, (word, _))| last[word] == *k).map(|(_, &w)| w)
}

/// The sum of the bank's balances.
pub fn bank_total(words: &[u64]) -> u64 {
    words[DATA as usize..(DATA + ACCOUNTS) as usize].iter().sum()
}

/// Checks the recovered words against the cycle's log. `baseline`: the words when the
/// cycle started.
pub fn check(log: &CycleLog, baseline: &[u64], actual: &[u64], report: &RecoveryReport, w: Workload, strictness: Strictness) -> Verdict {
    let mut v = Verdict::default();
    if actual.len() != baseline.len() {
        v.violations.push(format!("{} words recovered, {} expected", actual.len(), baseline.len()));
        return v;
    }
    let r = report.recovered_lsn;
    let Some((start, first)) = log.ready else {
        if actual != baseline {
            v.violations.push("the state changed in a cycle whose child never opened the store".into());
        }
        return v;
    };
    if r < start {
        if strictness == Strictness::Damaged {
            // Damage cut in a record at or below the cycle's start (a bit flipped in the one
            // record of a partition's last segment, from an earlier cycle: the rules cut it as
            // a torn tail, reported). The state now lies before this cycle's baseline, from
            // which the model replays: nothing of it can be judged by this cycle's log. (It
            // was judged as if it could, and reported as undetected damage: a CI-like run of
            // large hathi transactions, seed 2413, cycle 3.)
            v.violations.extend(log.problems.iter().cloned());
            return v;
        }
        v.violations.push(format!("recovered LSN {r} is below the LSN {start} the cycle started from"));
    }
    let present = |seq: u64| actual[mark_index(seq) as usize] == seq;
    let mut candidates: BTreeMap<u64, Vec<(&Intent, bool)>> = BTreeMap::new();
    for a in &log.acked {
        candidates.entry(a.intent.seq).or_default().push((&a.intent, true));
    }
    for p in &log.pending {
        candidates.entry(p.seq).or_default().push((p, false));
    }
    // Acknowledged LSNs by sequence number: they must ascend together.
    let acked_lsn: BTreeMap<u64, u64> = log.acked.iter().map(|a| (a.intent.seq, a.lsn)).collect();
    if acked_lsn.len() != log.acked.len() {
        v.violations.push("two acknowledged commits share a sequence number".into());
    }
    let mut prev: Option<(u64, u64)> = None;
    for (&seq, &lsn) in &acked_lsn {
        if let Some((ps, pl)) = prev.filter(|&(_, pl)| pl >= lsn) {
            v.violations.push(format!("seq {seq} got LSN {lsn}, seq {ps} before it LSN {pl}: LSNs do not follow the order of conflicting commits"));
        }
        prev = Some((seq, lsn));
    }

    let mut lost_seqs = Vec::new();
    if strictness != Strictness::Damaged {
        for a in &log.acked {
            let needs_lsn = a.intent.mode == Mode::Sync || a.stable || strictness == Strictness::Clean;
            let there = present(a.intent.seq);
            if (needs_lsn && a.lsn > r) || ((needs_lsn || a.intent.mode == Mode::Partition) && !there) {
                lost_seqs.push(a.intent.seq);
                v.lost.push(format!(
                    "{:?} commit LSN {} (seq {}, thread {}{}) acknowledged, but recovery reached LSN {r} and it is {}",
                    a.intent.mode,
                    a.lsn,
                    a.intent.seq,
                    a.intent.thread,
                    if a.stable { ", confirmed stable" } else { "" },
                    if there { "present" } else { "absent" }
                ));
            }
        }
    }

    // The gap rule, transaction by transaction in LSN order (the marks of this cycle never
    // wrap). `last_within`: the last acknowledged seq with LSN ≤ R: everything before it has
    // a lower LSN and must be there. `first_beyond`: the first acknowledged seq with LSN > R:
    // everything after it is beyond R too.
    let last_within = acked_lsn.iter().filter(|&(_, &l)| l <= r).map(|(&s, _)| s).max();
    let first_beyond = acked_lsn.iter().filter(|&(_, &l)| l > r).map(|(&s, _)| s).min();
    let mut first_absent: Option<u64> = None;
    let mut applied: Vec<(u64, Vec<&Intent>)> = Vec::new();
    for seq in first..first + MARKS - 64 {
        let lsn = acked_lsn.get(&seq).copied();
        let here = present(seq);
        if !here {
            first_absent.get_or_insert(seq);
            let within = match lsn {
                Some(l) => l <= r,
                None => last_within.is_some_and(|s| s > seq),
            };
            if within && !lost_seqs.contains(&seq) {
                v.violations.push(format!(
                    "seq {seq} ({}) is not in the recovered state, which claims every LSN ≤ {r}",
                    lsn.map_or("unacknowledged, before an acknowledged LSN ≤ R".to_string(), |l| format!("LSN {l}"))
                ));
            }
            continue;
        }
        let cands = candidates.get(&seq).cloned().unwrap_or_default();
        if cands.is_empty() {
            v.violations.push(format!("seq {seq} is in the recovered state but no transaction announced it"));
            continue;
        }
        // An acknowledged transaction owns its sequence number; otherwise one of the threads
        // that announced it committed it.
        let owners: Vec<&Intent> = match cands.iter().find(|(_, acked)| *acked) {
            Some((i, _)) => vec![*i],
            None => cands.iter().map(|(i, _)| *i).collect(),
        };
        let beyond = match lsn {
            Some(l) => l > r,
            None => first_beyond.is_some_and(|s| s < seq) || first_absent.is_some(),
        };
        if beyond && !owners.iter().any(|i| i.mode == Mode::Partition) {
            v.violations.push(format!(
                "seq {seq} ({:?}{}) is beyond the recovered LSN {r} (after an absent or later transaction) yet was applied without the Partition flag",
                owners[0].mode,
                lsn.map_or(String::new(), |l| format!(", LSN {l}"))
            ));
        }
        applied.push((seq, owners));
    }

    // The model: the cycle's start with the present transactions applied in LSN order.
    // Where two threads announced one sequence number and neither was acknowledged, the one
    // that committed is the one whose values are there, where no later commit wrote (a word
    // a transaction writes twice holds its last value). Of those that fit, the one whose
    // values changed the most words the way the heap shows wins: one fits by default when a
    // later commit wrote every word it names, and it was taken for the one that committed
    // (a CI run: the committed transfer's two balances were then missing from the model).
    // Which words a later commit writes depends on whose writes are chosen there: chosen
    // once with every announced writer counted, then again with the chosen ones only.
    let choose = |last_writer: &BTreeMap<u64, u64>| -> (Vec<u64>, Vec<&Intent>) {
        let mut expected = baseline.to_vec();
        let mut chosen = Vec::with_capacity(applied.len());
        for (seq, owners) in &applied {
            let pick = match owners.as_slice() {
                [only] => *only,
                many => {
                    let later = |word: u64| last_writer.get(&word).is_some_and(|&s| s > *seq);
                    let fits = |i: &Intent| final_writes(&i.writes).all(|(word, value)| actual[word as usize] == value || later(word));
                    let shown = |i: &Intent| final_writes(&i.writes).filter(|&(word, value)| !later(word) && actual[word as usize] == value && expected[word as usize] != value).count();
                    // (`max_by_key` keeps the last of equals: reversed, the first announced.)
                    many.iter().copied().rev().filter(|i| fits(i)).max_by_key(|i| shown(i)).unwrap_or(many[0])
                }
            };
            workload::apply(&mut expected, *seq, &pick.writes);
            chosen.push(pick);
        }
        (expected, chosen)
    };
    let writers = |owners: &mut dyn Iterator<Item = (u64, &Intent)>| {
        let mut last_writer: BTreeMap<u64, u64> = BTreeMap::new();
        for (seq, i) in owners {
            for &(word, _) in &i.writes {
                last_writer.insert(word, seq);
            }
        }
        last_writer
    };
    let announced = writers(&mut applied.iter().flat_map(|(seq, owners)| owners.iter().map(|i| (*seq, *i))));
    let (_, first_choice) = choose(&announced);
    let (expected, _) = choose(&writers(&mut applied.iter().map(|(seq, _)| *seq).zip(first_choice)));
    let differ: Vec<usize> = (0..expected.len()).filter(|&i| expected[i] != actual[i]).collect();
    if let Some(&i) = differ.first() {
        v.violations.push(format!(
            "the recovered heap differs from the model replayed to LSN {r}: {} words, first word {i}: recovered {}, model {}",
            differ.len(),
            actual[i],
            expected[i]
        ));
    }
    if w == Workload::Bank {
        // Relative to the cycle's start: an earlier cycle may have applied Partition records
        // beyond a gap, which the rules allow to skew the total.
        let (before, after) = (bank_total(baseline), bank_total(actual));
        if after != before && report.partition_records_after_gap == 0 {
            v.violations.push(format!("bank total is {after}, it was {before} when the cycle started (opening total {TOTAL})"));
        }
    }
    v.violations.extend(log.problems.iter().cloned());
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crashtest::workload::total_words;

    fn intent(thread: u32, seq: u64, mode: Mode, word: u64, value: u64) -> Event {
        Event::Intent { thread, seq, mode, writes: vec![(DATA + word, value)] }
    }

    /// Words after applying (seq, word, value) to a fresh hathi heap.
    fn state(txns: &[(u64, u64, u64)]) -> Vec<u64> {
        let mut w = vec![0; total_words(Workload::Hathi) as usize];
        for &(seq, word, value) in txns {
            workload::apply(&mut w, seq, &[(DATA + word, value)]);
        }
        w
    }

    fn report(r: u64, after_gap: u64) -> RecoveryReport {
        RecoveryReport { recovered_lsn: r, partition_records_after_gap: after_gap, ..RecoveryReport::default() }
    }

    #[test]
    fn a_prefix_with_every_sync_ack_passes() {
        let events = vec![
            Event::Ready { start_lsn: 10, first_seq: 1 },
            intent(0, 1, Mode::Sync, 5, 50),
            Event::Ack { thread: 0, seq: 1, lsn: 11 },
            intent(1, 2, Mode::Async, 6, 60),
            Event::Ack { thread: 1, seq: 2, lsn: 12 },
            intent(0, 3, Mode::Async, 5, 70),
        ];
        let log = CycleLog::from_events(&events);
        let base = state(&[]);
        // Recovered through LSN 12: the pending seq 3 did not make it.
        let v = check(&log, &base, &state(&[(1, 5, 50), (2, 6, 60)]), &report(12, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.ok(), "{v:?}");
        // The pending one made it too (LSN 13).
        let v = check(&log, &base, &state(&[(1, 5, 50), (2, 6, 60), (3, 5, 70)]), &report(13, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.ok(), "{v:?}");
        // A clean close needs the Async ack too.
        let v = check(&log, &base, &state(&[(1, 5, 50)]), &report(11, 0), Workload::Hathi, Strictness::Clean);
        assert_eq!(v.lost.len(), 1, "{v:?}");
    }

    #[test]
    fn losses_and_gap_rule_breaches_are_caught() {
        let events = vec![
            Event::Ready { start_lsn: 0, first_seq: 1 },
            intent(0, 1, Mode::Async, 1, 1),
            Event::Ack { thread: 0, seq: 1, lsn: 1 },
            intent(1, 2, Mode::Sync, 2, 2),
            Event::Ack { thread: 1, seq: 2, lsn: 2 },
            intent(0, 3, Mode::Async, 3, 3),
            Event::Ack { thread: 0, seq: 3, lsn: 3 },
        ];
        let log = CycleLog::from_events(&events);
        let base = state(&[]);
        let v = check(&log, &base, &state(&[(1, 1, 1)]), &report(1, 0), Workload::Hathi, Strictness::Crash);
        assert_eq!(v.lost.len(), 1, "the Sync commit at LSN 2 is lost: {v:?}");
        // LSN 3 applied beyond a gap at 2 without the Partition flag.
        let v = check(&log, &base, &state(&[(1, 1, 1), (3, 3, 3)]), &report(1, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.violations.iter().any(|m| m.contains("without the Partition flag")), "{v:?}");
        // The right marks but a wrong value: the heap differs from the model.
        let mut wrong = state(&[(1, 1, 1), (2, 2, 2)]);
        wrong[(DATA + 1) as usize] = 99;
        let v = check(&log, &base, &wrong, &report(2, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.violations.iter().any(|m| m.contains("differs from the model")), "{v:?}");
    }

    /// Two threads announced the same sequence number and the kill came before either
    /// acknowledgement: the one whose values are there is the one that committed, judged by
    /// the last value of a word it wrote twice (a large hathi transaction draws words with
    /// repeats; judging by every write picked the other thread: CI run of stop 34).
    #[test]
    fn an_unacknowledged_owner_is_judged_by_each_words_last_value() {
        let writes = |first: u64, last: u64| vec![(DATA + 1, first), (DATA + 2, 20), (DATA + 1, last)];
        let events = vec![
            Event::Ready { start_lsn: 0, first_seq: 1 },
            Event::Intent { thread: 0, seq: 1, mode: Mode::Sync, writes: vec![(DATA + 3, 30)] },
            Event::Intent { thread: 1, seq: 1, mode: Mode::Sync, writes: writes(10, 11) },
        ];
        let log = CycleLog::from_events(&events);
        let base = state(&[]);
        let mut committed = base.clone();
        workload::apply(&mut committed, 1, &writes(10, 11));
        let v = check(&log, &base, &committed, &report(1, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.ok(), "thread 1 committed: {v:?}");
        let mut neither = base.clone();
        workload::apply(&mut neither, 1, &writes(10, 12));
        let v = check(&log, &base, &neither, &report(1, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.violations.iter().any(|m| m.contains("differs from the model")), "{v:?}");
    }

    /// Two threads announced seq 1 and neither was acknowledged; the one announced first
    /// wrote only a word that seq 2 wrote again, so its values fit by default. The other's
    /// value is there: it committed (a CI run took the first, and its model lacked the
    /// committed transfer's balances).
    #[test]
    fn an_owner_whose_words_were_all_written_again_is_not_taken_over_one_whose_values_are_there() {
        let events = vec![
            Event::Ready { start_lsn: 0, first_seq: 1 },
            intent(0, 1, Mode::Async, 3, 30),
            intent(1, 1, Mode::Async, 1, 10),
            intent(2, 2, Mode::Async, 3, 31),
            Event::Ack { thread: 2, seq: 2, lsn: 2 },
        ];
        let log = CycleLog::from_events(&events);
        let base = state(&[]);
        let v = check(&log, &base, &state(&[(1, 1, 10), (2, 3, 31)]), &report(2, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.ok(), "thread 1 committed seq 1: {v:?}");
        // Neither thread's value of seq 1 there: still a difference from the model.
        let v = check(&log, &base, &state(&[(1, 1, 12), (2, 3, 31)]), &report(2, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.violations.iter().any(|m| m.contains("differs from the model")), "{v:?}");
    }

    /// A cut of damaged log below the cycle's start is the repair the rules allow for a
    /// flipped bit; after a crash, falling below the start is a loss.
    #[test]
    fn a_damage_cut_below_the_cycles_start_is_no_violation_but_a_crash_there_is() {
        let events = vec![Event::Ready { start_lsn: 10, first_seq: 1 }, intent(0, 1, Mode::Sync, 5, 50), Event::Ack { thread: 0, seq: 1, lsn: 11 }];
        let log = CycleLog::from_events(&events);
        let base = state(&[(0, 7, 70)]);
        // Recovered to LSN 9, before the cycle's start: the baseline's write is gone too.
        let before_start = state(&[]);
        let v = check(&log, &base, &before_start, &report(9, 0), Workload::Hathi, Strictness::Damaged);
        assert!(v.ok(), "{v:?}");
        let v = check(&log, &base, &before_start, &report(9, 0), Workload::Hathi, Strictness::Crash);
        assert!(v.violations.iter().any(|m| m.contains("below the LSN 10")), "{v:?}");
    }

    #[test]
    fn report_problems_are_violations() {
        let events = vec![
            Event::Ready { start_lsn: 5, first_seq: 1 },
            intent(0, 1, Mode::Sync, 1, 1),
            Event::Refused { thread: 0, seq: 1, why: "EIO".into() },
            intent(0, 2, Mode::Sync, 1, 2),
            Event::Ack { thread: 0, seq: 2, lsn: 4 },
        ];
        let log = CycleLog::from_events(&events);
        assert_eq!(log.problems.len(), 2, "an ack after a refusal, and an LSN below the start: {:?}", log.problems);
    }
}
