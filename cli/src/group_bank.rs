//! The bank on a replicated group (`tusk demo --nodes N`, `tusk crashtest --nodes N`): the
//! accounts loaded through the leader, transfer workers that follow whoever leads, and the
//! check every node must pass.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, HeapPtr};
use tusk_replica::{Position, ReplicaError, ReplicatedNode};

use super::demo_bank::{alloc_bank, transfer_in, INITIAL_BALANCE};
use super::group::LocalGroup;

const LOAD_BATCH: u64 = 8_192;
/// How long the bank waits for an election or a node to catch up before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Where the bank lives in every node's heap: the balances, and each worker's count of its
/// transfers (written in the same transaction as the transfer).
#[derive(Clone, Copy)]
pub struct Bank {
    pub bank: HeapPtr,
    pub stats: HeapPtr,
    pub accounts: u64,
    pub threads: usize,
}

/// What one worker saw: transfers acknowledged, and those whose outcome it cannot know
/// (the leader failed before acknowledging them).
#[derive(Default, Clone, Copy)]
pub struct Tally {
    pub acked: u64,
    pub uncertain: u64,
}

/// What the workers report as they go (times in nanoseconds since `started`).
#[derive(Clone, Copy)]
pub struct Clock<'a> {
    pub started: Instant,
    /// When a leader was last killed (`u64::MAX`: not yet).
    pub kill_ns: &'a AtomicU64,
    /// The first commit after it.
    pub resumed_ns: &'a AtomicU64,
    /// The greatest position a commit returned.
    pub last_index: &'a AtomicU64,
}

fn on_leader<T>(group: &LocalGroup, f: impl FnOnce(&ReplicatedNode) -> T) -> Result<T, String> {
    let i = group.leader(PATIENCE).ok_or("no leader elected")?;
    let slot = group.node(i).ok_or("the leader went down")?;
    Ok(f(slot.as_ref().expect("up")))
}

/// Loads `accounts` accounts through the leader in `Sync` batches.
pub fn load(group: &LocalGroup, accounts: u64, threads: usize) -> Result<Bank, Box<dyn std::error::Error>> {
    Ok(on_leader(group, |leader| {
        let ((bank, stats), _) = leader.transact(Commit::Sync, |tx| alloc_bank(tx, accounts, threads))?;
        let mut loaded = 0;
        while loaded < accounts {
            let end = (loaded + LOAD_BATCH).min(accounts);
            leader.transact(Commit::Sync, |tx| (loaded..end).try_for_each(|i| tx.write_u64_at(bank, i * 8, INITIAL_BALANCE)))?;
            loaded = end;
        }
        Ok::<_, ReplicaError>(Bank { bank, stats, accounts, threads })
    })??)
}

/// Whether a `transact` that failed with `e` wrote nothing: the node stopped leading before
/// the transaction ran (or refused its update), or its store's log had failed (a disk fault:
/// the commit is refused before its record is appended, and the node gives up the lead), or
/// it had stopped (its rebuild failed on that disk; the leader watch had not yet seen it go:
/// seeds 3200 and 4000 stopped on it).
fn wrote_nothing(e: &ReplicaError) -> bool {
    matches!(
        e,
        ReplicaError::NotLeader { .. } | ReplicaError::Stopped { .. } | ReplicaError::Store(tusk::Error::UpdatesRefused | tusk::Error::LogFailed(_))
    )
}

/// One worker: `Sync` transfers on whichever node leads, each counting itself in the
/// worker's slot, until `stop`.
pub fn transfer(group: &LocalGroup, t: usize, at: Bank, stop: &AtomicBool, clock: Clock<'_>) -> Tally {
    let Bank { bank, stats, accounts, .. } = at;
    let mut rng = SmallRng::seed_from_u64(t as u64 + 1);
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let Some(i) = group.leader(Duration::from_millis(200)) else { continue };
        let Some(slot) = group.node(i) else { continue };
        let leader = slot.as_ref().expect("up");
        let (from, to, amount) = (rng.random_range(0..accounts), rng.random_range(0..accounts), rng.random_range(1..=50));
        let done = leader.transact(Commit::Sync, |tx| transfer_in(tx, bank, stats, t, (from, to, amount)));
        match done {
            Ok((_, position)) => {
                tally.acked += 1;
                let now = clock.started.elapsed().as_nanos() as u64;
                if now > clock.kill_ns.load(Ordering::SeqCst) {
                    clock.resumed_ns.fetch_min(now, Ordering::SeqCst);
                }
                clock.last_index.fetch_max(position.map_or(0, |p| p.index), Ordering::SeqCst);
            }
            // Its leader failed on the way: the transfer may or may not be in the group's log.
            Err(ReplicaError::NotCommitted { .. } | ReplicaError::CommitTimedOut { .. }) => tally.uncertain += 1,
            Err(e) if wrote_nothing(&e) => {}
            Err(e) => panic!("worker {t}: {e}"),
        }
    }
    tally
}

fn balances(node: &ReplicatedNode, bank: Bank) -> Result<(Vec<u64>, Vec<u64>), String> {
    let store = node.store().map_err(|e| e.to_string())?;
    let (both, _) = store.transact(Commit::Async, |tx| {
        let b = (0..bank.accounts).map(|a| tx.read_u64_at(bank.bank, 8 * a)).collect::<Result<Vec<_>, _>>()?;
        let s = (0..bank.threads as u64).map(|t| tx.read_u64_at(bank.stats, 8 * t)).collect::<Result<Vec<_>, _>>()?;
        Ok((b, s))
    }).map_err(|e| e.to_string())?;
    Ok(both)
}

/// Every node, once it holds the group's log up to `last`: money conserved, every
/// acknowledged transfer there and none beyond those whose outcome was unknown, every
/// node's balances alike, and then, at one position, every node's heap alike.
pub fn verify(group: &LocalGroup, bank: Bank, tallies: &[Tally], last: Position) -> Result<(), String> {
    // Balances are compared with every node at one position: a transfer of unknown outcome
    // may commit after `last`, and be applied on one node before another.
    for i in 0..group.len() {
        let slot = group.node(i).ok_or(format!("node {} is down", i + 1))?;
        if !slot.as_ref().expect("up").wait_applied(last, PATIENCE) {
            return Err(format!("node {} did not apply the group's log up to {} within {PATIENCE:?}", i + 1, last.index));
        }
    }
    settled(group, Instant::now() + PATIENCE)?;
    let mut reference: Option<Vec<u64>> = None;
    for i in 0..group.len() {
        let slot = group.node(i).ok_or(format!("node {} is down", i + 1))?;
        let node = slot.as_ref().expect("up");
        if !node.wait_applied(last, PATIENCE) {
            return Err(format!("node {} did not apply the group's log up to {} within {PATIENCE:?}", i + 1, last.index));
        }
        let (b, counts) = balances(node, bank).map_err(|e| format!("node {}: {e}", i + 1))?;
        let total: u64 = b.iter().sum();
        if total != bank.accounts * INITIAL_BALANCE {
            return Err(format!("node {}: money not conserved: {total} != {}", i + 1, bank.accounts * INITIAL_BALANCE));
        }
        for (t, (&n, tally)) in counts.iter().zip(tallies).enumerate() {
            if n < tally.acked || n > tally.acked + tally.uncertain {
                return Err(format!("node {}: worker {t} counted {n} transfers, acknowledged {} (+{} unknown)", i + 1, tally.acked, tally.uncertain));
            }
        }
        match &reference {
            None => reference = Some(b),
            Some(r) if *r != b => return Err(format!("node {} differs from node 1 at position {}", i + 1, last.index)),
            Some(_) => {}
        }
    }
    heaps_alike(group)
}

/// Every node's heap at one position of the group's log (the highest any has applied, once
/// no node moves), byte for byte but for each node's own replica line: its crc32.
fn heaps_alike(group: &LocalGroup) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    for _ in 0..10 {
        let at = settled(group, deadline)?;
        let mut digests = Vec::with_capacity(group.len());
        for i in 0..group.len() {
            let slot = group.node(i).ok_or(format!("node {} is down", i + 1))?;
            digests.push(heap_crc(slot.as_ref().expect("up")).map_err(|e| format!("node {}: {e}", i + 1))?);
        }
        // Nothing moved while the heaps were read: they are at `at`.
        if settled(group, deadline)? != at {
            continue;
        }
        return match digests.iter().position(|d| *d != digests[0]) {
            None => Ok(()),
            Some(i) => Err(format!("node {}'s heap differs from node 1's at position {at}: {digests:x?}", i + 1)),
        };
    }
    Err("the group's nodes kept applying entries: no position to compare their heaps at".into())
}

/// Waits until every node has applied the same entry and none moves for a moment; that entry.
fn settled(group: &LocalGroup, deadline: Instant) -> Result<u64, String> {
    let applied = || -> Result<Vec<u64>, String> {
        (0..group.len()).map(|i| group.node(i).and_then(|n| n.as_ref().map(|n| n.applied().index)).ok_or(format!("node {} is down", i + 1))).collect()
    };
    loop {
        let first = applied()?;
        std::thread::sleep(Duration::from_millis(100));
        let again = applied()?;
        if first == again && again.iter().all(|&a| a == again[0]) {
            return Ok(again[0]);
        }
        if Instant::now() > deadline {
            return Err(format!("the nodes did not settle at one position within {PATIENCE:?}: {again:?}"));
        }
    }
}

/// The crc32 of `node`'s heap up to its used extent, its replica line read as zeros.
fn heap_crc(node: &ReplicatedNode) -> Result<u32, Box<dyn std::error::Error>> {
    let snap = node.store()?.snapshot(tusk::SnapshotMode::Memcpy)?;
    let extent = snap.info().extent;
    let line = tusk_storage::layout::REPLICA_OFF..tusk_storage::layout::REPLICA_OFF + 8 * tusk_storage::layout::REPLICA_WORDS as u64;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0;
    while at < extent {
        let n = (extent - at).min(buf.len() as u64) as usize;
        snap.read(HeapPtr(at), &mut buf[..n])?;
        for off in line.clone().filter(|o| (at..at + n as u64).contains(o)) {
            buf[(off - at) as usize] = 0;
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(h.finalize())
}

/// A region every node's heap holds, rewritten whole by large transactions (`tusk crashtest
/// --nodes N --large-mib M`): each writes its number in the first word and a pattern of that
/// number after it. Its record is larger than an entry of the group's log, so it travels in
/// pieces; every node must show one whole transaction's contents, never a mix.
#[derive(Clone, Copy)]
pub struct Blob {
    pub at: HeapPtr,
    /// Words after the number.
    pub words: u64,
}

/// What the large writer saw: the greatest number acknowledged, and the numbers whose
/// outcome it cannot know.
#[derive(Default, Clone)]
pub struct BlobTally {
    pub acked: u64,
    pub uncertain: Vec<u64>,
}

fn blob_bytes(n: u64, words: u64) -> Vec<u8> {
    std::iter::once(n).chain((0..words).map(|i| n ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15))).flat_map(u64::to_le_bytes).collect()
}

/// Allocates the region (number 0, its pattern) through the leader.
pub fn load_blob(group: &LocalGroup, mib: u64) -> Result<Blob, Box<dyn std::error::Error>> {
    let words = (mib << 20) / 8;
    Ok(on_leader(group, |leader| {
        let (at, _) = leader.transact(Commit::Sync, |tx| {
            let at = tx.alloc(8 * (words + 1))?;
            tx.write(at, &blob_bytes(0, words))?;
            Ok(at)
        })?;
        Ok::<_, ReplicaError>(Blob { at, words })
    })??)
}

/// The large writer: rewrites the region with numbers 1, 2, … on whichever node leads, one
/// `Sync` transaction each, `pause` apart, until `stop`.
pub fn write_blobs(group: &LocalGroup, blob: Blob, pause: Duration, stop: &AtomicBool) -> BlobTally {
    let mut tally = BlobTally::default();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let Some(i) = group.leader(Duration::from_millis(200)) else { continue };
        let Some(slot) = group.node(i) else { continue };
        let leader = slot.as_ref().expect("up");
        n += 1;
        let bytes = blob_bytes(n, blob.words);
        match leader.transact(Commit::Sync, |tx| tx.write(blob.at, &bytes)) {
            Ok(_) => tally.acked = n,
            Err(ReplicaError::NotCommitted { .. } | ReplicaError::CommitTimedOut { .. }) => tally.uncertain.push(n),
            Err(e) if wrote_nothing(&e) => {}
            Err(e) => panic!("large writer: {e}"),
        }
        drop(slot);
        std::thread::sleep(pause);
    }
    tally
}

/// Every node (at the group's position `last`): the region holds one transaction's contents
/// whole, that of the last acknowledged number or of a later one whose outcome was unknown.
pub fn verify_blob(group: &LocalGroup, blob: Blob, tally: &BlobTally, last: Position) -> Result<(), String> {
    for i in 0..group.len() {
        let slot = group.node(i).ok_or(format!("node {} is down", i + 1))?;
        let node = slot.as_ref().expect("up");
        if !node.wait_applied(last, PATIENCE) {
            return Err(format!("node {} did not apply the group's log up to {} within {PATIENCE:?}", i + 1, last.index));
        }
        let store = node.store().map_err(|e| e.to_string())?;
        let mut bytes = vec![0u8; 8 * (blob.words as usize + 1)];
        store.transact(Commit::Async, |tx| tx.read(blob.at, &mut bytes)).map_err(|e| format!("node {}: {e}", i + 1))?;
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        if bytes != blob_bytes(n, blob.words) {
            return Err(format!("node {}: the large region mixes transactions (its number says {n})", i + 1));
        }
        if n < tally.acked || (n > tally.acked && !tally.uncertain.contains(&n)) {
            return Err(format!("node {}: the large region holds number {n}; acknowledged up to {} (unknown: {:?})", i + 1, tally.acked, tally.uncertain));
        }
    }
    Ok(())
}
