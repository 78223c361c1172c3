//! The partitioned redo log.
//!
//! Committing threads append records to the buffer of their partition (threads map to
//! partitions round-robin). Each partition has a flush slot: whoever holds it writes the
//! partition's buffer (write + fdatasync) and marks it durable, independently of the other
//! partitions. A committer that waits for durability leads its partition's next flush
//! itself; a background thread flushes at the group-commit interval for `Async` commits
//! (see [`progress`]).
//!
//! The watermark rests on one rule: an LSN is drawn and its record appended in the same
//! critical section of its partition's mutex. So after reading the LSN clock `c`, every LSN
//! ≤ c is found in some partition (pending or durable), and
//! `durable = min(c, min over partitions of (first pending LSN - 1))`.
//! Within a partition, LSNs are appended in ascending order. The watermark, the flush slots
//! and the waiters' rendezvous live in [`progress`], apart from the I/O, so that loom can
//! model them.

pub mod catalog;
pub mod partition;
pub mod progress;
mod segments;
pub use segments::PendingRepairs;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use crate::sync::AtomicU64;
use crossbeam_utils::CachePadded;
use crate::TxnError;
use catalog::SegmentCatalog;
use progress::{FlushGroup, Streamed};
use tusk_storage::io::Io;
use tusk_storage::log_files::SegmentInfo;
use writer::PartitionWriter;

/// How the log is written.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// The store directory (segments go to `dir/log/pNNNN/`).
    pub dir: PathBuf,
    pub partitions: usize,
    pub io: Io,
    /// The background flusher is kicked once a partition's buffer holds this many bytes.
    pub log_buffer_bytes: usize,
    /// Each partition is flushed at least this often while it buffers records (by the
    /// background flusher, unless a waiter led a flush of it meanwhile).
    pub group_commit_interval: Duration,
    /// A segment file is closed once it passes this size.
    pub segment_bytes: u64,
    /// A transaction running in place whose record may reach this many bytes writes it to
    /// the log as it is encoded, never holding it whole (see [`LogManager::append_streamed`]).
    pub stream_records_from: u64,
    /// Repairs of the log's files a reopen after a crash still makes: no segment is made
    /// before they are done.
    pub repairs: Option<Arc<segments::PendingRepairs>>,
    /// Sees every record as it is appended (replication's source: `tusk-replica`).
    pub tap: Option<CommitTap>,
}

/// Receives every record the log appends, with its LSN and its framed bytes (the format of
/// [`tusk_storage::log_format`]), called by the appending thread inside its partition's
/// critical section, so in LSN order per partition but not across partitions (every LSN is
/// passed once: they are gapless). It must be quick and must not commit a transaction.
#[derive(Clone)]
pub struct CommitTap(pub Arc<TapFn>);

/// What a [`CommitTap`] calls: `(lsn, framed record)`.
pub type TapFn = dyn Fn(u64, &[u8]) + Send + Sync;

// A store's options stay unwind-safe with a tap in them (tests open stores inside
// `catch_unwind`): a tap that panics leaves the log as any panic inside a commit does.
impl std::panic::RefUnwindSafe for CommitTap {}
impl std::panic::UnwindSafe for CommitTap {}

impl std::fmt::Debug for CommitTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitTap")
    }
}

/// A streamed record that also passes its bytes, once whole, to the tap.
struct TappedStream<R> {
    record: R,
    lsn: u64,
    tap: CommitTap,
}

impl<R: Streamed> Streamed for TappedStream<R> {
    fn size(&self) -> usize {
        self.record.size()
    }

    fn produce(&mut self, out: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let mut whole = Vec::with_capacity(self.record.size());
        self.record.produce(&mut |piece| {
            whole.extend_from_slice(piece);
            out(piece);
        })?;
        (self.tap.0)(self.lsn, &whole);
        Ok(())
    }
}

/// State shared by committers, waiters and the background flusher.
pub(crate) struct Shared {
    pub group: FlushGroup<PartitionWriter>,
    kick: Sender<()>,
    pub config: LogConfig,
    pub catalog: Arc<SegmentCatalog>,
}

impl Shared {
    pub fn kick(&self) {
        match self.kick.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

/// The log of one store.
pub struct LogManager {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    backend_name: String,
}

impl LogManager {
    /// Starts the background flusher. New segments are created after the existing ones
    /// (never appended to). `existing` lists the segments already on disk (from recovery),
    /// for trimming.
    pub fn start(config: LogConfig, clock: Arc<CachePadded<AtomicU64>>, existing: Vec<SegmentInfo>) -> Result<LogManager, TxnError> {
        let catalog = Arc::new(SegmentCatalog::new(existing));
        segments::prepare_log_dir(&config.dir)?;
        let mut slots = Vec::with_capacity(config.partitions);
        for p in 0..config.partitions as u32 {
            let backend = tusk_storage::io::open_log_backend(&config.io)
                .map_err(|e| TxnError::Storage(tusk_storage::StorageError::io(&config.dir, e)))?;
            let file = segments::SegmentFile::open(&config.dir, p, config.segment_bytes, config.repairs.clone())?;
            slots.push(PartitionWriter::new(p, file, backend, catalog.clone()));
        }
        let backend_name = slots.first().map_or_else(String::new, |s| s.backend_name());
        let (kick, kicked): (Sender<()>, Receiver<()>) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared { group: FlushGroup::new(clock, slots), kick, config, catalog });
        let handle = writer::spawn(shared.clone(), kicked)?;
        Ok(LogManager { shared, writer: Mutex::new(Some(handle)), backend_name })
    }

    /// Name of the I/O backend in use.
    pub fn backend_name(&self) -> String {
        self.backend_name.clone()
    }

    /// The segments on disk.
    pub fn catalog(&self) -> &SegmentCatalog {
        &self.shared.catalog
    }

    pub fn partitions(&self) -> usize {
        self.shared.group.partitions.len()
    }

    /// Draws the next LSN and appends its record to `partition`, atomically with respect to
    /// the partition (see the module docs). `encode` writes the record for the given LSN.
    /// Returns the LSN and whether the partition held more than its bound not yet durable
    /// ahead of this record, buffered or in flight (the committer should then
    /// [`LogManager::throttle`] once it has released its locks).
    ///
    /// The bound is on the bytes ahead of the record, not on the record itself: a large
    /// transaction's record alone past the bound says nothing about the disk falling behind,
    /// and throttling it made every such `Async` commit wait for its own flush (100 k-key
    /// B-link transactions spent about a fifth of their time so). Counting the buffer in
    /// flight keeps a committer of large records to about two of them not yet durable: the
    /// next waits while the one before is still being written.
    pub fn append(&self, partition: usize, waits: bool, encode: impl FnOnce(&mut Vec<u8>, u64)) -> (u64, bool) {
        let (lsn, before, len) = match &self.shared.config.tap {
            None => self.shared.group.append(partition, waits, encode),
            Some(tap) => self.shared.group.append(partition, waits, |buf, lsn| {
                let start = buf.len();
                encode(buf, lsn);
                (tap.0)(lsn, &buf[start..]);
            }),
        };
        if len >= self.shared.config.log_buffer_bytes {
            self.shared.kick();
        }
        (lsn, before > self.shared.config.log_buffer_bytes.saturating_mul(8))
    }

    /// Whether a record of up to `bytes` bytes is to be streamed.
    pub fn streams(&self, bytes: u64) -> bool {
        bytes >= self.shared.config.stream_records_from
    }

    /// Draws the next LSN and writes its record, which `record` makes for it, to `partition`
    /// as the record is produced, without holding it whole (see
    /// [`FlushGroup::flush_streamed`]). Returns once the record is durable; with the error,
    /// once it never will be (and no LSN if none was drawn: the log had failed or stopped).
    pub fn append_streamed<R: Streamed>(&self, partition: usize, record: impl FnOnce(u64) -> R) -> (Option<u64>, Result<(), TxnError>) {
        match &self.shared.config.tap {
            None => self.shared.group.flush_streamed(partition, record),
            Some(tap) => self.shared.group.flush_streamed(partition, |lsn| TappedStream { record: record(lsn), lsn, tap: tap.clone() }),
        }
    }

    /// Keeps a partition's buffer from outgrowing its bound when the disk cannot keep up:
    /// waits until the committer's own record is durable.
    pub fn throttle(&self, partition: usize, lsn: u64) -> Result<(), TxnError> {
        self.wait_partition(partition, lsn)
    }

    pub fn failure(&self) -> Option<String> {
        self.shared.group.failure()
    }

    /// Stalls the caller while the log is over its space bound (see
    /// [`SegmentCatalog::set_limit`]); returns at once when it is not.
    pub fn respect_space_limit(&self) -> Result<(), TxnError> {
        if !self.shared.catalog.over_limit() {
            return Ok(());
        }
        self.shared.catalog.wait_for_space(|| {
            if let Some(why) = self.shared.group.failure() {
                Some(TxnError::LogFailed(why))
            } else if self.shared.group.is_stopped() {
                Some(TxnError::Closed)
            } else {
                None
            }
        }, TxnError::LogFailed)
    }

    pub fn durable_lsn(&self) -> u64 {
        self.shared.group.watermark.get()
    }

    /// Waits until every LSN ≤ lsn is durable (leading the flushes it needs).
    pub fn wait_durable(&self, lsn: u64) -> Result<(), TxnError> {
        if self.durable_lsn() >= lsn {
            return Ok(());
        }
        self.shared.group.wait_durable(lsn, || self.shared.kick())
    }

    /// Waits until this partition's records up to `lsn` are durable (leading its flushes).
    pub fn wait_partition(&self, partition: usize, lsn: u64) -> Result<(), TxnError> {
        self.shared.group.wait_partition(partition, lsn)
    }

    /// Flushes everything appended so far and stops flushing.
    pub fn close(&self) -> Result<(), TxnError> {
        let group = &self.shared.group;
        let target = group.clock.load(Ordering::SeqCst);
        let flushed = if group.failure().is_none() && !group.is_stopped() { group.wait_durable(target, || self.shared.kick()) } else { Ok(()) };
        self.stop_flushing();
        flushed?;
        if let Some(why) = group.failure() {
            return Err(TxnError::LogFailed(why));
        }
        let mut seals = Vec::new();
        group.each_slot(|writer| {
            seals.extend(writer.close()?);
            Ok(())
        })?;
        // A partition that wrote nothing since the store opened keeps its earlier seal (a
        // scan checks that it still fits the file).
        let dir = &self.shared.config.dir;
        let kept: Vec<_> = tusk_storage::log_seal::read(dir).into_iter().filter(|old| !seals.iter().any(|new| new.partition == old.partition)).collect();
        seals.extend(kept);
        Ok(tusk_storage::log_seal::write(dir, &seals)?)
    }

    /// Stops flushing without writing what is buffered: what a crash would leave. A flush
    /// already under way completes (as the disk would have completed it).
    pub fn abandon(&self) {
        self.stop_flushing();
    }

    fn stop_flushing(&self) {
        self.shared.group.stop();
        self.shared.kick();
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for LogManager {
    fn drop(&mut self) {
        if !self.shared.group.is_stopped() {
            let _ = self.close();
        }
    }
}
