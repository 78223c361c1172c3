//! The group's state machine: the node's tusk store. Applying entries writes their records'
//! after-images (from other nodes' proposals) and the node's replica line in one transaction,
//! so that what the heap holds and the log position it says it holds are always durable
//! together, whatever the store's own LSNs.
//!
//! Snapshots are heap images ([`tusk::Store::export_heap`]) at an entry of the group's log.
//! A follower's image is exact as it is: its replica line, copied with it, names the entry.
//! A leader's heap runs ahead of the group (its transactions commit locally first), and it
//! writes no line for its own entries: its image at LSN L holds its records up to L, which
//! lie in entries up to some J once the group commits L; the records of those entries after
//! L travel in the snapshot's tail, and installing applies them on the image. So every
//! snapshot is the state after entry J exactly, and holds only what the group committed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, LeaderId, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use parking_lot::{Condvar, Mutex};
use tusk::{Commit, ReplicaWords, Store};

use crate::log_store::LogStore;
use crate::pieces::Assembly;
use crate::snapshot_files::{self, SnapshotFiles};
use crate::source::{local_only, Source};
use crate::stores::{self, StoreSlot};
use crate::types::{storage_error, Applied, Entry, LogId, Piece, SnapshotMeta, StorageError, StoredMembership, TypeConfig};

/// Marks a replica line in use ("TUSKREPL").
const REPLICA_MAGIC: u64 = u64::from_le_bytes(*b"TUSKREPL");

/// What a node's replica line says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaLine {
    /// The last entry of the group's log the heap holds.
    pub applied: Option<LogId>,
    /// The node has led: its heap may hold records the group never committed.
    pub led: bool,
}

impl ReplicaLine {
    pub fn decode(words: ReplicaWords) -> ReplicaLine {
        if words[0] != REPLICA_MAGIC {
            return ReplicaLine::default();
        }
        let applied = (words[1] == 1).then(|| LogId { leader_id: LeaderId { term: words[3], node_id: words[4] }, index: words[2] });
        ReplicaLine { applied, led: words[5] == 1 }
    }

    pub fn encode(&self) -> ReplicaWords {
        let mut w = [0u64; tusk_storage::layout::REPLICA_WORDS];
        w[0] = REPLICA_MAGIC;
        if let Some(id) = self.applied {
            (w[1], w[2], w[3], w[4]) = (1, id.index, id.leader_id.term, id.leader_id.node_id);
        }
        w[5] = u64::from(self.led);
        w
    }
}

/// The applied position, for readers that wait for one.
#[derive(Default)]
pub struct AppliedWatch {
    index: Mutex<u64>,
    changed: Condvar,
}

impl AppliedWatch {
    pub fn get(&self) -> u64 {
        *self.index.lock()
    }

    fn set(&self, index: u64) {
        *self.index.lock() = index;
        self.changed.notify_all();
    }

    /// Waits until the entry at `index` is applied; false on timeout.
    pub fn wait(&self, index: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut at = self.index.lock();
        while *at < index {
            if self.changed.wait_until(&mut at, deadline).timed_out() {
                return *at >= index;
            }
        }
        true
    }
}

/// What the state machine and its snapshot builders share.
pub struct Machine {
    /// The node's directory (its stores, `snapshots/`).
    pub node_dir: PathBuf,
    pub stores: Arc<StoreSlot>,
    /// The options stores are opened with (the source's tap among them).
    pub store_options: tusk::Options,
    pub snapshots: SnapshotFiles,
    pub log: LogStore,
    pub source: Arc<Source>,
    /// This process's proposals' origin: their records are in the heap already.
    pub origin: (u64, u64),
    /// Set once this node leads (kept in every replica line written after).
    pub led: Arc<AtomicBool>,
    pub applied: Arc<AppliedWatch>,
    /// How long a leader's snapshot waits for the group to commit its image's LSN.
    pub commit_timeout: Duration,
    /// Snapshots installed from other nodes since the node opened.
    pub installed: Arc<AtomicU64>,
}

/// Bytes of records from which an apply runs on a blocking thread, not the node's runtime
/// thread: applying a 1 GiB record took seconds, during which the node answered nothing
/// (AppendEntries to it timed out, and the group stalled while both followers applied).
/// Smaller applies stay on the runtime thread: a hand-off costs a small commit more than it
/// saves.
const BLOCKING_APPLY_BYTES: usize = 1 << 20;

/// See the module doc.
pub struct StateMachine {
    machine: Arc<Machine>,
    /// Records arriving in pieces.
    assembly: Assembly,
    /// The last entry applied (given to openraft as applied).
    last_entry: Option<LogId>,
    /// The position the store's replica line holds (behind `last_entry` while a record is
    /// unfinished).
    line_applied: Option<LogId>,
}

impl StateMachine {
    pub fn new(machine: Arc<Machine>) -> StateMachine {
        StateMachine { machine, assembly: Assembly::default(), last_entry: None, line_applied: None }
    }
}

fn sm_error(e: impl std::fmt::Display) -> StorageError {
    storage_error(StorageIOError::write_state_machine, e)
}

fn snapshot_error(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::read_snapshot(None, openraft::AnyError::error(e.to_string())).into()
}

/// Makes a store from the snapshot at `path` (its meta `meta`) in a new store directory of
/// `node_dir`, opened with `options`: the image installed as its checkpoint, the tail applied with the replica line
/// naming the snapshot's entry (durable before it returns). The caller switches to it.
pub fn store_from_snapshot(node_dir: &Path, options: &tusk::Options, log: &LogStore, path: &Path, meta: &SnapshotMeta) -> Result<(Store, PathBuf), StorageError> {
    let (trailer, tail) = snapshot_files::read(path).map_err(snapshot_error)?;
    let dir = stores::next(node_dir).map_err(snapshot_error)?;
    tusk::install_heap(&dir, path, trailer.shape).map_err(snapshot_error)?;
    let store = Store::open(&dir, options.clone()).map_err(snapshot_error)?;
    store.refuse_updates(true);
    let line = ReplicaLine { applied: meta.last_log_id, led: false }.encode();
    let refs: Vec<&[u8]> = tail.iter().map(Vec::as_slice).collect();
    local_only(|| if refs.is_empty() { store.write_replica(line, Commit::Sync) } else { store.apply_replicated(&refs, line, Commit::Sync) }).map_err(snapshot_error)?;
    log.save_membership(&meta.last_membership)?;
    Ok((store, dir))
}

/// How long a retired store waits for its readers to let go of it.
const RETIRE_WITHIN: Duration = Duration::from_secs(600);

/// Lets `store` (in `dir`, no longer the node's) go once nobody holds it, and deletes its
/// directory; on a thread of its own, since readers may hold it a while. `dir` `None`: the
/// directory stays (it is still the one the node's `STORE` names).
pub fn retire(store: Arc<Store>, dir: Option<PathBuf>) {
    let spawned = std::thread::Builder::new().name("tusk-retire".into()).spawn(move || {
        // Not let go of in time: left for the node's next open, which deletes directories
        // not in use.
        if let Some(store) = crate::node::sole_within(store, RETIRE_WITHIN) {
            // Dropped as a crash drops it: writes the group did not commit are not flushed.
            store.crash();
            if let Some(dir) = dir {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    });
    drop(spawned);
}

impl Machine {
    fn store(&self) -> Arc<Store> {
        self.stores.read().clone()
    }

    fn line(&self) -> Result<ReplicaLine, StorageError> {
        Ok(ReplicaLine::decode(self.store().replica().map_err(sm_error)?))
    }

    /// Makes the snapshot of `part` (synced) current and installs it: a new store in place
    /// of the old, which is retired.
    fn install(&self, part: &Path, meta: &SnapshotMeta) -> Result<(), StorageError> {
        let path = self.snapshots.keep(part, meta).map_err(snapshot_error)?;
        let (store, dir) = store_from_snapshot(&self.node_dir, &self.store_options, &self.log, &path, meta)?;
        stores::switch(&self.node_dir, &dir).map_err(snapshot_error)?;
        let old_dir = self.store().dir().to_path_buf();
        let old = std::mem::replace(&mut *self.stores.write(), Arc::new(store));
        retire(old, Some(old_dir));
        // Counted before the position moves: whoever waits for the position then sees the
        // install (the catch-up test read the count between the two, now and then).
        self.installed.fetch_add(1, Ordering::SeqCst);
        self.applied.set(meta.last_log_id.map_or(0, |id| id.index));
        Ok(())
    }

    /// The current snapshot, opened.
    fn current_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some((meta, path)) = self.snapshots.current().map_err(snapshot_error)? else { return Ok(None) };
        let file = std::fs::File::open(&path).map_err(snapshot_error)?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(file)) }))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let m = &self.machine;
        let applied = m.line()?.applied;
        let membership = match applied {
            Some(id) => m.log.membership_at_or_below(id.index)?.unwrap_or_default(),
            None => StoredMembership::default(),
        };
        m.applied.set(applied.map_or(0, |id| id.index));
        // openraft applies from here on, every piece of an unfinished record again.
        self.assembly.reset();
        (self.last_entry, self.line_applied) = (applied, applied);
        Ok((applied, membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let m = self.machine.clone();
        let mut records: Vec<Vec<u8>> = Vec::new();
        let mut out = Vec::new();
        let before = self.last_entry;
        // This leader's last whole record in these entries, and its entry.
        let mut own: Option<(u64, u64)> = None;
        for entry in entries {
            match entry.payload {
                // A new leader's first entry: an unfinished record of the last one never ends.
                EntryPayload::Blank => self.assembly.interrupt(),
                EntryPayload::Normal(batch) => match batch.piece {
                    Some(piece) if batch.origin != m.origin => records.extend(self.assembly.piece(batch.origin, piece, self.last_entry)),
                    // This process's own record: in its heap already.
                    Some(piece) => {
                        if piece.at + piece.bytes.len() as u64 == piece.len {
                            own = Some((piece.lsn, entry.log_id.index));
                        }
                    }
                    None => {
                        self.assembly.interrupt();
                        if batch.origin != m.origin {
                            records.extend(batch.records.into_iter().map(|(_, r)| r));
                        } else if let Some(&(lsn, _)) = batch.records.last() {
                            own = Some((lsn, entry.log_id.index));
                        }
                    }
                },
                EntryPayload::Membership(mb) => {
                    m.log.save_membership(&StoredMembership::new(Some(entry.log_id), mb))?;
                }
            }
            self.last_entry = Some(entry.log_id);
            out.push(Applied { index: entry.log_id.index });
        }
        if self.last_entry == before {
            return Ok(out);
        }
        // The store holds everything up to the last entry, or up to the first piece of a
        // record still unfinished (opened again, the node replays the log from there).
        let applied = self.assembly.held_at().unwrap_or(self.last_entry);
        let led = m.led.load(Ordering::SeqCst);
        let line = ReplicaLine { applied, led }.encode();
        // A node that has led rebuilds its store when opened again, whatever its line says
        // it applied: nothing to write for entries whose records it holds already (the
        // leader's own, one transaction less per entry).
        if !(records.is_empty() && (led || applied == self.line_applied)) {
            let store = m.store();
            let bytes: usize = records.iter().map(Vec::len).sum();
            let write = move || {
                let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                local_only(|| if refs.is_empty() { store.write_replica(line, Commit::Async) } else { store.apply_replicated(&refs, line, Commit::Async) })
            };
            if bytes >= BLOCKING_APPLY_BYTES {
                tokio::task::spawn_blocking(write).await.map_err(sm_error)?.map_err(sm_error)?;
            } else {
                write().map_err(sm_error)?;
            }
            self.line_applied = applied;
        }
        m.applied.set(applied.map_or(0, |id| id.index));
        if let Some((lsn, index)) = own {
            m.source.committed_holding(lsn, index);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder(self.machine.clone())
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let (file, _) = self.machine.snapshots.new_file("receiving").map_err(snapshot_error)?;
        Ok(Box::new(tokio::fs::File::from_std(file)))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<tokio::fs::File>) -> Result<(), StorageError> {
        let file = snapshot.into_std().await;
        let machine = self.machine.clone();
        let at = meta.last_log_id;
        let meta = meta.clone();
        let installed = tokio::task::spawn_blocking(move || {
            file.sync_all().map_err(snapshot_error)?;
            // The file `begin_receiving_snapshot` made, by its descriptor.
            let part = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file))).map_err(snapshot_error)?;
            machine.install(&part, &meta)
        });
        installed.await.map_err(sm_error)??;
        // The new store holds the group's log up to the snapshot's entry (a record is never
        // unfinished there: a snapshot is of the applied position).
        self.assembly.reset();
        (self.last_entry, self.line_applied) = (at, at);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        self.machine.current_snapshot()
    }
}

/// Builds a snapshot of the state machine (see the module doc), on a blocking thread.
pub struct SnapshotBuilder(Arc<Machine>);

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let machine = self.0.clone();
        tokio::task::spawn_blocking(move || build(&machine)).await.map_err(sm_error)?
    }
}

/// What openraft takes as "nothing newer": the current snapshot, or an empty one at no entry
/// (it keeps a built snapshot only if newer than what it has).
fn nothing_new(m: &Machine, part: &Path) -> Result<Snapshot<TypeConfig>, StorageError> {
    let _ = std::fs::remove_file(part);
    if let Some(current) = m.current_snapshot()? {
        return Ok(current);
    }
    let (file, path) = m.snapshots.new_file("empty").map_err(snapshot_error)?;
    let _ = std::fs::remove_file(path);
    Ok(Snapshot { meta: SnapshotMeta::default(), snapshot: Box::new(tokio::fs::File::from_std(file)) })
}

fn build(m: &Machine) -> Result<Snapshot<TypeConfig>, StorageError> {
    let (file, part) = m.snapshots.new_file("building").map_err(snapshot_error)?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    let export = m.store().export_heap(&mut out, m.store_options.chunk_size).map_err(snapshot_error)?;
    out.flush().map_err(snapshot_error)?;
    let mut file = out.into_inner().map_err(|e| snapshot_error(e.error()))?;
    let line = ReplicaLine::decode(export.replica);
    let (last, tail) = if line.led {
        match leader_tail(m, export.lsn, line.applied)? {
            Some(found) => found,
            None => return nothing_new(m, &part),
        }
    } else {
        (line.applied, Vec::new())
    };
    let current = m.snapshots.current().map_err(snapshot_error)?.and_then(|(meta, _)| meta.last_log_id);
    let Some(last) = last.filter(|&l| Some(l) > current) else { return nothing_new(m, &part) };
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: m.log.membership_at_or_below(last.index)?.unwrap_or_default(),
        snapshot_id: snapshot_files::new_id(last),
    };
    snapshot_files::finish(&mut file, export.shape, &tail).map_err(snapshot_error)?;
    drop(file);
    let path = m.snapshots.keep(&part, &meta).map_err(snapshot_error)?;
    let file = std::fs::File::open(path).map_err(snapshot_error)?;
    Ok(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(file)) })
}

/// The entry a snapshot ends at, and the records its image lacks.
type Tail = (Option<LogId>, Vec<Vec<u8>>);

/// A leader's image at its LSN `lsn`, taken when it had applied `base` before it led: the
/// entry J whose state the image and the tail make once the group commits `lsn`, and the
/// tail (its own records after `lsn` in entries up to J). `None` if it cannot tell: it
/// stopped leading, or an entry it needs was purged.
fn leader_tail(m: &Machine, lsn: u64, base: Option<LogId>) -> Result<Option<Tail>, StorageError> {
    let Ok(committed) = m.source.wait_committed(lsn, m.commit_timeout) else { return Ok(None) };
    let base_index = base.map_or(0, |b| b.index);
    let j = committed.max(base_index);
    if j == base_index {
        return Ok(Some((base, Vec::new())));
    }
    if !m.applied.wait(j, m.commit_timeout) {
        return Ok(None);
    }
    tail_of(base_index, j, lsn, m.origin, |index| Ok(m.log.entries(index..=index)?.pop()))
}

/// The last entry of `base+1..=j` and the records after `lsn` of `origin`'s entries in that
/// range, in order; `None` where an entry needed is not there (purged). Records after `lsn`
/// lie in a suffix of the range (a leader proposes in LSN order): the walk goes back from J
/// until an entry holds a record at or below `lsn`.
fn tail_of(
    base: u64,
    j: u64,
    lsn: u64,
    origin: (u64, u64),
    mut entry_at: impl FnMut(u64) -> Result<Option<Entry>, StorageError>,
) -> Result<Option<Tail>, StorageError> {
    let mut last = None;
    let mut tail: Vec<Vec<u8>> = Vec::new();
    // The pieces of a record after `lsn`, last first.
    let mut pieces: Vec<Piece> = Vec::new();
    for index in (base + 1..=j).rev() {
        let Some(entry) = entry_at(index)? else { return Ok(None) };
        last = last.or(Some(entry.log_id));
        let EntryPayload::Normal(batch) = entry.payload else { continue };
        if batch.records.is_empty() && batch.piece.is_none() {
            continue;
        }
        if batch.origin != origin {
            return Err(snapshot_error(format!("entry {index} of another origin after this node took the lead")));
        }
        if let Some(piece) = batch.piece {
            if piece.lsn <= lsn {
                break;
            }
            let follows = match pieces.last() {
                Some(next) => next.lsn == piece.lsn && piece.at + piece.bytes.len() as u64 == next.at,
                None => piece.is_last(),
            };
            if !follows {
                return Err(snapshot_error(format!("entry {index}: a piece of record {} out of place", piece.lsn)));
            }
            let first = piece.at == 0;
            pieces.push(piece);
            if first {
                tail.insert(0, pieces.drain(..).rev().flat_map(|p| p.bytes).collect());
            }
            continue;
        }
        if !pieces.is_empty() {
            return Err(snapshot_error(format!("entry {index}: record {} began before its first piece", pieces[0].lsn)));
        }
        let after: Vec<Vec<u8>> = batch.records.iter().filter(|(l, _)| *l > lsn).map(|(_, r)| r.clone()).collect();
        let done = after.len() < batch.records.len();
        tail.splice(0..0, after);
        if done {
            break;
        }
    }
    if let Some(p) = pieces.first() {
        return Err(snapshot_error(format!("record {}'s first piece lies before the lead", p.lsn)));
    }
    Ok(Some((last, tail)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Batch;

    const ME: (u64, u64) = (1, 7);

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
        Entry { log_id: LogId { leader_id: LeaderId { term: 2, node_id: 1 }, index }, payload }
    }

    fn records(origin: (u64, u64), lsns: &[u64]) -> EntryPayload<TypeConfig> {
        EntryPayload::Normal(Batch { origin, records: lsns.iter().map(|&l| (l, vec![l as u8])).collect(), piece: None })
    }

    /// Entries 11..=15 after a lead at entry 10: the tail after LSN 23 is 24..=26 of entries
    /// 13 (which spans 23) and 15, past a blank entry; entry 12 is never read.
    #[test]
    fn the_tail_is_the_records_after_the_image_in_the_entries_up_to_j() {
        let log = [
            entry(11, records(ME, &[20, 21])),
            entry(12, records((9, 9), &[1])),
            entry(13, records(ME, &[22, 23, 24])),
            entry(14, EntryPayload::Blank),
            entry(15, records(ME, &[25, 26])),
        ];
        let mut read = Vec::new();
        let at = |i: u64| {
            read.push(i);
            Ok(log.iter().find(|e| e.log_id.index == i).cloned())
        };
        let (last, tail) = tail_of(10, 15, 23, ME, at).unwrap().unwrap();
        assert_eq!(last.unwrap().index, 15);
        assert_eq!(tail, vec![vec![24], vec![25], vec![26]]);
        assert_eq!(read, vec![15, 14, 13]);
    }

    /// A record in pieces (entries 12 and 14, an entry of openraft's own between) comes
    /// whole in the tail; a tail cut inside its pieces is refused.
    #[test]
    fn a_record_in_pieces_comes_whole_in_the_tail() {
        let big: Vec<u8> = (0..crate::types::PIECE_BYTES + 10).map(|i| (i % 253) as u8).collect();
        let mut pieces = Piece::split(21, &big).into_iter().map(|p| EntryPayload::Normal(Batch { origin: ME, records: Vec::new(), piece: Some(p) }));
        let log = [
            entry(11, records(ME, &[20])),
            entry(12, pieces.next().unwrap()),
            entry(13, EntryPayload::Blank),
            entry(14, pieces.next().unwrap()),
            entry(15, records(ME, &[22])),
        ];
        let at = |i: u64| Ok(log.iter().find(|e| e.log_id.index == i).cloned());
        let (last, tail) = tail_of(10, 15, 20, ME, at).unwrap().unwrap();
        assert_eq!((last.unwrap().index, tail), (15, vec![big.clone(), vec![22]]));
        let (_, tail) = tail_of(10, 15, 19, ME, at).unwrap().unwrap();
        assert_eq!(tail, vec![vec![20], big.clone(), vec![22]]);
        let (_, tail) = tail_of(10, 14, 20, ME, at).unwrap().unwrap();
        assert_eq!(tail, vec![big]);
        assert!(tail_of(10, 15, 21, ME, at).unwrap().unwrap().1 == vec![vec![22]], "the pieced record at the image's LSN is in the image");
        assert!(tail_of(10, 13, 20, ME, at).is_err(), "a tail that ends inside a record");
        assert!(tail_of(12, 15, 20, ME, at).is_err(), "a tail that begins inside a record");
    }

    #[test]
    fn an_image_at_an_entrys_end_has_no_tail_and_a_purged_entry_gives_up() {
        let log = [entry(11, records(ME, &[20, 21])), entry(12, records(ME, &[22]))];
        let at = |i: u64| Ok(log.iter().find(|e| e.log_id.index == i).cloned());
        let (last, tail) = tail_of(10, 12, 22, ME, at).unwrap().unwrap();
        assert_eq!((last.unwrap().index, tail.len()), (12, 0));
        // Everything after LSN 19: both entries, back to the lead.
        let (_, tail) = tail_of(10, 12, 19, ME, at).unwrap().unwrap();
        assert_eq!(tail, vec![vec![20], vec![21], vec![22]]);
        // Entry 11 purged while needed.
        let purged = |i: u64| Ok(log.iter().find(|e| e.log_id.index == i && i > 11).cloned());
        assert!(tail_of(10, 12, 19, ME, purged).unwrap().is_none());
        // Another origin's records after the lead: refused.
        let other = [entry(11, records((5, 5), &[30]))];
        assert!(tail_of(10, 11, 19, ME, |i| Ok(other.iter().find(|e| e.log_id.index == i).cloned())).is_err());
    }
}
