//! Snapshots for query readers: a read-only view of the whole heap at one LSN, queried with
//! the index read paths and no transaction (docs/ARCHITECTURE.md, Snapshots).
//!
//! - [`SnapshotMode::Memcpy`]: a physical copy of the heap's used extent, made by
//!   `copier_threads` threads with the consistent page copy of tusk-txn (writers pause only
//!   while the pages they dirtied during the copy are copied again; see
//!   `tusk_txn::snapshot::copy`). Readers use plain loads: the snapshot is `Send + Sync`.
//! - [`SnapshotMode::Incremental`]: the same image, and [`Snapshot::refresh`] copies only
//!   the pages dirtied since (the dirty epochs), so its cost follows the pages written.
//! - [`SnapshotMode::Fork`]: a virtual, copy-on-write snapshot: a child process forked while
//!   commits are held at the gate. Queries travel to it over shared memory (`query.rs`,
//!   `wire.rs`) and answers come back the same way. It ends when the snapshot is dropped
//!   or this process dies; if it dies, the next query is [`Error::SnapshotChild`].
//! - [`SnapshotMode::Auto`]: picks one of the three per request from measured costs
//!   (`auto.rs`); [`Snapshot::mode`] says what it picked and [`SnapshotInfo::reason`] why.

mod auto;
mod query;
mod readers;
mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tusk_index::image::HeapImage;
use tusk_storage::process::ForkServer;
use tusk_storage::HeapPtr;
use tusk_txn::snapshot::copy::CopyState;
use tusk_txn::snapshot::image::ImageTarget;
use tusk_txn::Engine;

pub use auto::{snapshot_costs, SnapshotCosts};
pub use readers::{SnapshotArt, SnapshotArtRange, SnapshotBTree, SnapshotBTreeRange};

use crate::{Error, Store};
use query::{Answer, Query};

/// How a snapshot is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotMode {
    /// A full copy of the heap's used extent, every time.
    Memcpy,
    /// A copy kept up to date by copying only the pages dirtied since the last refresh.
    Incremental,
    /// A forked child process holding a copy-on-write image.
    Fork,
    /// Chooses among the three per snapshot and refresh, from measured costs.
    Auto,
}

impl SnapshotMode {
    /// The mode's name as the CLI and benchmarks print it.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotMode::Memcpy => "memcpy",
            SnapshotMode::Incremental => "incremental",
            SnapshotMode::Fork => "fork",
            SnapshotMode::Auto => "auto",
        }
    }
}

/// How a snapshot is made, beyond its mode. `SnapshotOptions::from(mode)` gives the defaults.
#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    /// The mode.
    pub mode: SnapshotMode,
    /// Threads copying a memcpy or incremental snapshot (0: one per available core).
    pub copier_threads: usize,
    /// Memory a memcpy snapshot may add, on top of the free memory check (`None`: only what
    /// the kernel reports as available). Exceeding it is [`Error::SnapshotMemory`].
    pub memory_limit: Option<u64>,
    /// Bytes of shared memory between this process and a fork snapshot's child: the largest
    /// query or answer (larger batches and ranges are split into several).
    pub fork_shared_bytes: usize,
}

impl From<SnapshotMode> for SnapshotOptions {
    fn from(mode: SnapshotMode) -> SnapshotOptions {
        SnapshotOptions { mode, copier_threads: 0, memory_limit: None, fork_shared_bytes: 8 << 20 }
    }
}

/// What making (or refreshing) a snapshot did.
#[derive(Clone, Debug)]
pub struct SnapshotInfo {
    /// The mode that made it (never `Auto`: what Auto picked).
    pub mode: SnapshotMode,
    /// The snapshot holds every LSN ≤ this and nothing after.
    pub lsn: u64,
    /// Bytes of heap the snapshot covers.
    pub extent: u64,
    /// Bytes copied (0 for fork).
    pub bytes_copied: u64,
    /// How long commits were held at the gate.
    pub pause: Duration,
    /// Wall time to make it.
    pub elapsed: Duration,
    /// Why this mode (Auto's estimates; for fixed modes, the mode's name).
    pub reason: String,
}

/// A read-only view of the heap at one LSN; see the module documentation of each mode.
/// Queries: [`Snapshot::btree`], [`Snapshot::art`], [`Snapshot::root`], [`Snapshot::read`].
pub struct Snapshot {
    engine: Arc<Engine>,
    options: SnapshotOptions,
    /// The in-memory image (memcpy, incremental, and Auto's, kept between its picks).
    image: Option<(ImageTarget, CopyState)>,
    /// The fork child, while the current pick is fork.
    fork: Option<std::sync::Mutex<ForkServer>>,
    /// The dirty epoch of the last refresh of any kind (Auto's measure of writes between
    /// refreshes).
    epoch_at_refresh: u64,
    info: SnapshotInfo,
}

impl Store {
    /// Takes a snapshot in `mode` with default options (see [`SnapshotOptions`]).
    ///
    /// ```
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// use tusk::{Commit, SnapshotMode, Store};
    /// let store = Store::open(dir.path(), tusk::Options::default())?;
    /// store.transact(Commit::Async, |tx| {
    ///     tx.btree("orders")?.insert(7, 700)?;
    ///     Ok(())
    /// })?;
    /// let snap = store.snapshot(SnapshotMode::Memcpy)?;
    /// store.transact(Commit::Async, |tx| {
    ///     tx.btree("orders")?.insert(8, 800)?;
    ///     Ok(())
    /// })?;
    /// let orders = snap.btree("orders")?;
    /// assert_eq!(orders.get(7)?, Some(700));
    /// assert_eq!(orders.get(8)?, None, "committed after the snapshot");
    /// assert_eq!(orders.count(..)?, 1);
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&self, mode: SnapshotMode) -> Result<Snapshot, Error> {
        self.snapshot_with(SnapshotOptions::from(mode))
    }

    /// Takes a snapshot with `options`.
    pub fn snapshot_with(&self, options: SnapshotOptions) -> Result<Snapshot, Error> {
        let mut snap = Snapshot {
            engine: self.engine().clone(),
            options,
            image: None,
            fork: None,
            epoch_at_refresh: 0,
            info: SnapshotInfo {
                mode: SnapshotMode::Memcpy,
                lsn: 0,
                extent: 0,
                bytes_copied: 0,
                pause: Duration::ZERO,
                elapsed: Duration::ZERO,
                reason: String::new(),
            },
        };
        snap.refresh()?;
        Ok(snap)
    }
}

impl Snapshot {
    /// Every LSN ≤ this is in the snapshot, and nothing after.
    pub fn lsn(&self) -> u64 {
        self.info.lsn
    }

    /// The mode that made the current state (what Auto picked, for Auto).
    pub fn mode(&self) -> SnapshotMode {
        self.info.mode
    }

    /// What the last snapshot or refresh did.
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// The fork child's process id, while the snapshot is a fork.
    pub fn child_pid(&self) -> Option<i32> {
        self.fork.as_ref().map(|f| lock(f).pid())
    }

    /// Brings the snapshot to the current committed state: a full copy (memcpy), the pages
    /// dirtied since the last refresh (incremental), a new child (fork), or Auto's pick.
    /// Fails with [`Error::Closed`] once the store is closed (the snapshot stays readable).
    pub fn refresh(&mut self) -> Result<&SnapshotInfo, Error> {
        let started = Instant::now();
        let (mode, reason) = match self.options.mode {
            SnapshotMode::Auto => {
                let choice = auto::choose(self)?;
                (choice.mode, choice.reason)
            }
            fixed => (fixed, fixed.name().to_string()),
        };
        let (info, epoch) = match mode {
            SnapshotMode::Fork => self.fork_now()?,
            SnapshotMode::Memcpy | SnapshotMode::Incremental => self.copy_now(mode == SnapshotMode::Incremental)?,
            SnapshotMode::Auto => unreachable!("auto picks a concrete mode"),
        };
        self.epoch_at_refresh = epoch;
        self.info = SnapshotInfo { mode, reason, elapsed: started.elapsed(), ..info };
        Ok(&self.info)
    }

    fn threads(&self) -> usize {
        match self.options.copier_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            t => t,
        }
    }

    fn copy_now(&mut self, incremental: bool) -> Result<(SnapshotInfo, u64), Error> {
        let extent = self.engine.used_extent();
        let resident = self.image.as_ref().map_or(0, |(t, _)| t.resident_bytes());
        let needed = extent.saturating_sub(resident);
        if let Some(available) = auto::memory_available(self.options.memory_limit) {
            if needed > available {
                return Err(Error::SnapshotMemory { needed, available });
            }
        }
        let threads = self.threads();
        let (mut target, previous) = match self.image.take() {
            Some((t, s)) => (t, Some(s)),
            None => (ImageTarget::new(self.engine.heap().capacity(), threads)?, None),
        };
        target.set_threads(threads);
        // A failed copy (the store closed) leaves the snapshot as it was: the copy checks
        // first and the image target cannot fail half way.
        let from = if incremental { previous } else { None };
        let (state, report) = match self.engine.copy_pages_consistent(from, &mut target) {
            Ok(done) => done,
            Err(e) => {
                self.image = previous.map(|p| (target, p));
                return Err(e.into());
            }
        };
        self.retire_fork();
        self.image = Some((target, state));
        let info = SnapshotInfo {
            mode: SnapshotMode::Memcpy,
            lsn: report.lsn,
            extent: report.extent,
            bytes_copied: report.bytes_copied(),
            pause: report.pause,
            elapsed: report.elapsed,
            reason: String::new(),
        };
        Ok((info, state.epoch))
    }

    fn fork_now(&mut self) -> Result<(SnapshotInfo, u64), Error> {
        let extent = self.engine.used_extent();
        let serve = |heap: &tusk_storage::Heap, request: &[u8], out: &mut [u8]| -> usize {
            let answer = match Query::decode(request) {
                Some(q) => query::serve(&mut &*heap, &q),
                None => Answer::Failed(Error::SnapshotQuery("the child got a malformed query".into())),
            };
            let mut bytes = answer.encode();
            if bytes.len() > out.len() {
                bytes = Answer::Failed(Error::SnapshotQuery(format!("an answer of {} bytes exceeds the shared memory", bytes.len()))).encode();
            }
            out[..bytes.len()].copy_from_slice(&bytes);
            bytes.len()
        };
        let (server, lsn, epoch, pause) = self.engine.fork_server(self.options.fork_shared_bytes, serve)?;
        // The old child (if any) ends once the new one holds the snapshot.
        self.retire_fork();
        self.fork = Some(std::sync::Mutex::new(server));
        Ok((SnapshotInfo { mode: SnapshotMode::Fork, lsn, extent, bytes_copied: 0, pause, elapsed: pause, reason: String::new() }, epoch))
    }

    /// Tells the current child (if any) to end. A thread of its own waits for the exit and
    /// reaps it (no zombie is left), so a refresh does not wait while the child tears down its
    /// copy of the address space, which takes a while for a large heap.
    fn retire_fork(&mut self) {
        if let Some(server) = self.fork.take() {
            let mut server = server.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
            server.retire();
            std::thread::spawn(move || drop(server));
        }
    }

    /// The in-memory image, when the snapshot is one.
    fn image(&self) -> Option<HeapImage<'_>> {
        match (&self.fork, &self.image) {
            (None, Some((target, _))) => Some(HeapImage::new(target.bytes())),
            _ => None,
        }
    }

    /// Answers `query` on the image, or in the fork child.
    fn ask(&self, query: &Query<'_>) -> Result<Answer, Error> {
        let answer = match (&self.fork, self.image()) {
            (Some(server), _) => {
                let mut server = lock(server);
                let pid = server.pid();
                let request = query.encode();
                if request.len() > server.capacity() {
                    return Err(Error::SnapshotQuery(format!("a query of {} bytes exceeds the shared memory of {}", request.len(), server.capacity())));
                }
                let bytes = server
                    .call(|buf| {
                        buf[..request.len()].copy_from_slice(&request);
                        request.len()
                    })
                    .map_err(|e| Error::SnapshotChild { pid, reason: e.to_string() })?;
                Answer::decode(bytes).ok_or_else(|| Error::SnapshotChild { pid, reason: "sent a malformed answer".into() })?
            }
            (None, Some(mut image)) => query::serve(&mut image, query),
            (None, None) => unreachable!("a snapshot holds an image or a child"),
        };
        match answer {
            Answer::Failed(e) => Err(e),
            a => Ok(a),
        }
    }

    /// Bytes of the largest answer a fork child can send (`usize::MAX` for images).
    fn answer_capacity(&self) -> usize {
        self.fork.as_ref().map_or(usize::MAX, |f| lock(f).capacity())
    }

    /// The pointer stored under the root `name` at the snapshot's LSN.
    pub fn root(&self, name: &str) -> Result<Option<HeapPtr>, Error> {
        match self.ask(&Query::Root(name))? {
            Answer::Ptr(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }

    /// Reads `buf.len()` bytes at `p` as they were at the snapshot's LSN (no allocation
    /// bounds are checked: a snapshot has no allocator, only the heap's bytes).
    pub fn read(&self, p: HeapPtr, buf: &mut [u8]) -> Result<(), Error> {
        let step = (self.answer_capacity() / 2).max(4096);
        for (i, chunk) in buf.chunks_mut(step).enumerate() {
            let off = p.offset() + (i * step) as u64;
            match self.ask(&Query::Read { off, len: chunk.len() as u64 })? {
                Answer::Bytes(b) if b.len() == chunk.len() => chunk.copy_from_slice(&b),
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }

    /// The index under root `name`, or [`Error::NoSuchRoot`].
    fn named(&self, name: &str) -> Result<HeapPtr, Error> {
        self.root(name)?.ok_or_else(|| Error::NoSuchRoot(name.to_string()))
    }
}

/// An answer of the wrong kind: both ends run the same code, so only a damaged message.
fn unexpected(answer: Answer) -> Error {
    Error::SnapshotQuery(format!("unexpected answer {answer:?}"))
}


/// The fork child's channel (a panic while it was held leaves nothing half done: every call
/// writes a whole request before it waits).
fn lock(server: &std::sync::Mutex<ForkServer>) -> std::sync::MutexGuard<'_, ForkServer> {
    server.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
