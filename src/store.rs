use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use tusk_recovery::{FileKind, RecoveryReport};
use tusk_storage::layout::{BRK_OFF, MAGIC, MAGIC_OFF, VERSION_OFF, FORMAT_VERSION};
use tusk_storage::Heap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tusk_storage::PAGE_SIZE;
use tusk_txn::{CheckpointConfig, CheckpointReport, Checkpointer, Commit, Engine, EngineConfig, LogConfig, Lsn};

use crate::checkpoints::CheckpointService;
use crate::heap_loader::HeapLoader;
use crate::log_repairs::LogRepairs;
use crate::prefault::PrefaultService;

use crate::options::{Durability, Options};
use crate::transaction::Transaction;
use crate::{Error, FlushTotals};

/// An open store: a heap, its transactions and its log, over one directory.
///
/// Opening a directory that holds a store recovers it; opening a new or empty one creates
/// a store. At most one `Store` holds a directory at a time (a lock file enforces it).
///
/// ```
/// # fn main() -> Result<(), tusk::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// use tusk::{Commit, Options, Store};
/// let store = Store::open(dir.path(), Options::default())?;
/// let (counter, _) = store.transact(Commit::Sync, |tx| {
///     let p = match tx.root("counter")? {
///         Some(p) => p,
///         None => {
///             let p = tx.alloc(8)?;
///             tx.set_root("counter", p)?;
///             p
///         }
///     };
///     let next = tx.read_u64(p)? + 1;
///     tx.write_u64(p, next)?;
///     Ok(next)
/// })?;
/// assert_eq!(counter, 1);
/// store.close()?;
/// # Ok(()) }
/// ```
pub struct Store {
    engine: Arc<Engine>,
    checkpoints: Option<CheckpointService>,
    /// Before `_lock`: its thread holds the engine, which must be gone when the lock is.
    _prefault: PrefaultService,
    /// The same.
    loader: HeapLoader,
    repairs: LogRepairs,
    dir: PathBuf,
    recovery: RecoveryReport,
    close_checkpoint_above: u64,
    /// Transactions that write fail at commit while set ([`Store::refuse_updates`]).
    updates_refused: AtomicBool,
    _lock: File,
}

/// Runs `f` in `tx` until it commits or fails otherwise than by a conflict.
fn transact_with<T>(mut tx: Transaction<'_>, mode: Commit, mut f: impl FnMut(&mut Transaction<'_>) -> Result<T, Error>) -> Result<(T, Option<Lsn>), Error> {
    let mut attempt = 0u32;
    loop {
        let outcome = f(&mut tx).and_then(|value| Ok((value, tx.commit(mode)?)));
        match outcome {
            Err(Error::Conflict) => {
                attempt += 1;
                backoff(attempt);
                tx.inner.restart();
            }
            other => return other,
        }
    }
}

/// How long `Store::open` waits for a directory lock held elsewhere before it reports
/// [`Error::Locked`]. A lock can outlive the store that held it: a child that another thread
/// of the program forked (as `std::process::Command` does) while the store was open holds a
/// copy of the lock file's descriptor, and with it the lock, until the child execs.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes the directory's lock file (flock): one open store per directory, across processes.
fn lock_dir(dir: &Path) -> Result<File, Error> {
    use std::fs::TryLockError;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let path = dir.join("LOCK");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(5)),
            Err(TryLockError::WouldBlock) => return Err(Error::Locked(dir.to_path_buf())),
            Err(TryLockError::Error(source)) => return Err(Error::Io { path, source }),
        }
    }
}

/// The segment size the writer rolls over at. Trimming deletes whole closed segments, so
/// under a log space bound segments are kept small enough that a few per partition fit in it.
fn segment_bytes(options: &Options) -> u64 {
    let segment = options.segment_bytes.max(1 << 16);
    if options.checkpoint_interval.is_none() {
        return segment;
    }
    let partitions = options.log_partitions.max(1) as u64;
    segment.min((options.max_log_bytes / (16 * partitions)).max(1 << 16))
}

/// The log size at which committers stall: below `max_log_bytes` by what the partitions
/// may still have buffered when the stall begins (per partition, a buffer in flight and an
/// active one, each up to the Async throttle bound of 8 buffers, plus padding). The margin
/// counts buffers, not records: a committer's own record past the bound (at most two per
/// committer not yet durable, `LogManager::append`) comes on top of it, as a single large
/// record always did.
fn stall_at(options: &Options) -> u64 {
    let buffered = options.log_partitions.max(1) as u64 * options.log_buffer_bytes.max(4096) as u64 * 17;
    options.max_log_bytes.saturating_sub(buffered).max(options.max_log_bytes / 2)
}

impl Store {
    /// Opens (creating or recovering) the store in `dir`.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store, Error> {
        let dir = dir.as_ref().to_path_buf();
        if dir.exists() && !dir.is_dir() {
            return Err(Error::NotADirectory(dir));
        }
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        let lock = lock_dir(&dir)?;
        // The log's repairs (a crash's zeros or torn tail cut off: a journal commit each) are
        // made beside the store's first moments, not before it opens.
        let (heap, mut recovery) = tusk_recovery::recover_heap(&dir, options.heap_capacity, false, options.heap_load)?;
        let repairs = LogRepairs::start(dir.clone(), std::mem::take(&mut recovery.repairs))?;
        let fresh = heap.load_word(MAGIC_OFF) == 0;
        if !fresh {
            check_superblock(&dir, &heap)?;
        }
        let log = match options.durability {
            Durability::On => Some(LogConfig {
                dir: dir.clone(),
                partitions: options.log_partitions.max(1),
                io: options.io.clone(),
                log_buffer_bytes: options.log_buffer_bytes.max(4096),
                group_commit_interval: options.group_commit_interval,
                segment_bytes: segment_bytes(&options),
                stream_records_from: options.stream_records_from,
                repairs: repairs.pending(),
                tap: options.commit_tap.clone(),
            }),
            Durability::Off => None,
        };
        let config = EngineConfig {
            stripes_log2: options.stripes_log2.clamp(4, 28),
            log,
            existing_segments: recovery.segment_files.clone(),
        };
        let engine = Arc::new(Engine::start(config, heap, recovery.max_lsn)?);
        if let Some((from, to)) = recovery.marker_needed {
            engine.append_marker(from, to)?;
        }
        let checkpoints = match options.durability {
            Durability::On => {
                let loaded = recovery.checkpoint.as_ref().filter(|c| c.manifest.epoch > 0);
                let checkpointer = Checkpointer::new(
                    CheckpointConfig {
                        dir: dir.clone(),
                        chunk_size: options.chunk_size.next_multiple_of(PAGE_SIZE).max(PAGE_SIZE),
                        max_log_bytes: options.max_log_bytes,
                        io: options.io.clone(),
                        faults: options.checkpoint_faults.clone(),
                    },
                    loaded.map(|c| c.manifest.clone()),
                    loaded.and_then(|c| c.previous.clone()),
                )?;
                Some(CheckpointService::start(engine.clone(), checkpointer, options.checkpoint_interval, options.max_log_bytes, stall_at(&options))?)
            }
            Durability::Off => None,
        };
        let prefault = PrefaultService::start(engine.clone(), options.prefault_ahead)?;
        let loader = HeapLoader::start(&engine, options.load_in_background)?;
        let store = Store { engine, checkpoints, _prefault: prefault, loader, repairs, dir, recovery, close_checkpoint_above: options.close_checkpoint_above, updates_refused: AtomicBool::new(false), _lock: lock };
        if fresh {
            store.transact(Commit::Sync, |tx| Ok(tx.inner.format_heap()?))?;
        }
        Ok(store)
    }

    /// Runs `f` in a transaction and commits it with `mode`, retrying from the start on
    /// conflicts. Returns `f`'s value and the LSN (`None` for a read-only transaction).
    /// An error from `f` aborts the transaction and is returned as is.
    pub fn transact<T>(
        &self,
        mode: Commit,
        f: impl FnMut(&mut Transaction<'_>) -> Result<T, Error>,
    ) -> Result<(T, Option<Lsn>), Error> {
        transact_with(self.begin(), mode, f)
    }

    /// [`Store::transact`] for the store's own writes of replication, which a store that
    /// refuses updates still takes.
    pub(crate) fn transact_replicated<T>(&self, mode: Commit, f: impl FnMut(&mut Transaction<'_>) -> Result<T, Error>) -> Result<(T, Option<Lsn>), Error> {
        static NEVER: AtomicBool = AtomicBool::new(false);
        transact_with(Transaction { inner: self.engine.begin(), updates_refused: &NEVER }, mode, f)
    }

    /// While `refuse` is set, a transaction that writes fails at its commit with
    /// [`Error::UpdatesRefused`], writing nothing; reads go on. A replicated follower's store
    /// is so (it takes its writes from the group only, `tusk-replica`).
    pub fn refuse_updates(&self, refuse: bool) {
        self.updates_refused.store(refuse, Ordering::SeqCst);
    }

    /// Starts a transaction for callers that manage retries themselves: finish it with
    /// [`Transaction::commit`] (which may return [`Error::Conflict`]) or [`Transaction::abort`].
    pub fn begin(&self) -> Transaction<'_> {
        Transaction { inner: self.engine.begin(), updates_refused: &self.updates_refused }
    }

    /// Whether `lsn` and every lower LSN are durable. With `wait`, blocks until they are
    /// (split-phase commit: commit with `Async`, then ask here). Always false with
    /// [`Durability::Off`] or after a log failure.
    pub fn is_stable(&self, lsn: Lsn, wait: bool) -> bool {
        self.engine.is_stable(lsn, wait)
    }

    /// The durable watermark: every LSN ≤ it is on disk.
    pub fn durable_lsn(&self) -> Lsn {
        self.engine.durable_lsn()
    }

    /// The LSN of the last committed update transaction.
    pub fn last_lsn(&self) -> Lsn {
        self.engine.last_lsn()
    }

    /// Chunks of the checkpoint that a reopen on demand ([`crate::HeapLoad::OnDemand`]) has
    /// not read yet: 0 once every chunk is in, and for a store loaded whole.
    pub fn chunks_absent(&self) -> u64 {
        self.engine.heap().absent_chunks()
    }

    /// What recovery did when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log's I/O backend ("io_uring", "sync", ...), `None` without durability.
    pub fn io_backend(&self) -> Option<String> {
        self.engine.log_backend_name()
    }

    /// Bytes of the heap handed out so far (allocator high-water mark).
    pub fn heap_used(&self) -> u64 {
        self.engine.heap().load_word(BRK_OFF)
    }

    /// Backs the allocated part of the heap with memory now, so that first touches do not
    /// page-fault later (benchmarks call this before measuring).
    pub fn prefault(&self) {
        let used = self.heap_used().min(self.engine.heap().capacity());
        self.engine.heap().prefault(0, used);
    }

    /// Takes a checkpoint now: afterwards recovery starts from it, and the log it no
    /// longer needs is deleted. Also runs every `checkpoint_interval` in the background.
    pub fn checkpoint(&self) -> Result<CheckpointReport, Error> {
        match &self.checkpoints {
            Some(service) => service.run_now(&self.engine),
            None => Err(Error::LogFailed("checkpoints need Durability::On".into())),
        }
    }

    /// The last checkpoint taken since open (by the background thread or
    /// [`Store::checkpoint`]), the last error of a background checkpoint, and how many were taken.
    pub fn checkpoint_status(&self) -> (Option<CheckpointReport>, Option<String>, u64) {
        self.checkpoints.as_ref().map_or((None, None, 0), |s| s.status())
    }

    /// Bytes of log on disk.
    pub fn log_bytes(&self) -> u64 {
        self.engine.log().map_or(0, |l| l.catalog().total_bytes())
    }

    /// Log flushes written since open, their bytes (headers and pads included) and the time
    /// their writes took; zeros without durability.
    pub fn log_flush_totals(&self) -> FlushTotals {
        self.engine.log().map_or(FlushTotals::default(), |l| l.catalog().flush_totals())
    }

    /// Makes everything committed durable and closes the store.
    ///
    /// Where checkpoints are automatic (`checkpoint_interval` set) and more than
    /// `close_checkpoint_above` bytes of log lie after the last checkpoint, closing takes a
    /// checkpoint first, so that the next open does not replay them.
    pub fn close(mut self) -> Result<(), Error> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<(), Error> {
        self.loader.stop();
        // A clean close leaves no zeros after a partition's last flush, the crash's included;
        // a failed repair is reported once the rest is closed.
        let repaired = self.repairs.join();
        let checkpoint = match self.checkpoints.take() {
            Some(mut c) => c.finish(&self.engine, self.close_checkpoint_above),
            None => Ok(()),
        };
        self.engine.close()?;
        checkpoint?;
        repaired
    }

    /// Stops the store as a crash would: what is not yet durable is lost. For tests.
    #[doc(hidden)]
    pub fn crash(mut self) {
        self.loader.stop();
        if let Some(mut c) = self.checkpoints.take() {
            c.stop();
        }
        self.engine.abandon();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Nothing committed is lost if this fails: the log holds it.
        let _ = self.shut_down();
    }
}

fn check_superblock(dir: &Path, heap: &Heap) -> Result<(), Error> {
    let corrupt = |reason: String| Error::Corrupt { kind: FileKind::Store, path: dir.to_path_buf(), offset: None, reason: format!("{reason}; refused to open the store") };
    if heap.load_word(MAGIC_OFF) != MAGIC {
        return Err(corrupt("the recovered heap has no tusk superblock".into()));
    }
    let version = heap.load_word(VERSION_OFF);
    if version != FORMAT_VERSION {
        return Err(corrupt(format!("heap format version {version}, this build reads {FORMAT_VERSION}")));
    }
    let brk = heap.load_word(BRK_OFF);
    if brk > heap.capacity() {
        return Err(Error::CapacityTooSmall { path: dir.to_path_buf(), needed: brk, capacity: heap.capacity() });
    }
    Ok(())
}

/// Exponential backoff between retries: spin first, then yield, then sleep briefly.
fn backoff(attempt: u32) {
    if attempt < 4 {
        for _ in 0..(1u32 << (attempt * 2)) {
            std::hint::spin_loop();
        }
    } else if attempt < 12 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50 << (attempt - 12).min(5)));
    }
}
