//! The partitioned redo log.
//!
//! Committing threads append records to the buffer of their partition (threads map to
//! partitions round-robin). One writer thread takes the filled buffers of every partition
//! and hands them to the I/O backend as one batch (write + fdatasync per partition, all in
//! flight together), then advances the durable watermark and wakes waiters.
//!
//! The watermark rests on one rule: an LSN is drawn and its record appended in the same
//! critical section of its partition's mutex. So after reading the LSN clock `c`, every LSN
//! ≤ c is found in some partition (pending or durable), and
//! `durable = min(c, min over partitions of (first pending LSN - 1))`.
//! Within a partition, LSNs are appended in ascending order. The watermark and the waiters'
//! rendezvous live in [`progress`], apart from the writer's thread and I/O, so that loom can
//! model them.

pub mod catalog;
pub mod partition;
pub mod progress;
mod segments;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use crate::sync::AtomicU64;
use crate::TxnError;
use catalog::SegmentCatalog;
use partition::Partition;
use progress::{Progress, Watermark};
use tusk_storage::io::Io;
use tusk_storage::log_files::SegmentInfo;

/// How the log is written.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// The store directory (segments go to `dir/log/pNNNN/`).
    pub dir: PathBuf,
    pub partitions: usize,
    pub io: Io,
    /// A partition's buffer is handed to the writer once it holds this many bytes.
    pub log_buffer_bytes: usize,
    /// The writer flushes at least this often.
    pub group_commit_interval: Duration,
    /// A segment file is closed once it passes this size.
    pub segment_bytes: u64,
}

/// State shared by committers, waiters and the writer thread.
pub(crate) struct Shared {
    pub partitions: Vec<Partition>,
    /// Last LSN drawn (the STM's version clock).
    pub clock: Arc<AtomicU64>,
    /// Every LSN ≤ durable is on disk.
    pub watermark: Watermark,
    /// Where waiters sleep; failure and shutdown.
    progress: Progress,
    kick: Sender<()>,
    pub config: LogConfig,
    pub catalog: SegmentCatalog,
}

impl Shared {
    pub fn kick(&self) {
        match self.kick.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }

    pub fn fail(&self, why: String) {
        self.progress.fail(why);
    }

    pub fn failure(&self) -> Option<String> {
        self.progress.failure()
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        self.progress.notify();
    }

    /// Recomputes the durable watermark from the clock and the partitions.
    pub fn advance_watermark(&self) {
        self.watermark.advance(&self.clock, &self.partitions);
    }

    /// Blocks until `done()` holds or the log failed or stopped.
    fn wait_until(&self, done: impl Fn() -> bool) -> Result<(), TxnError> {
        self.progress.wait_until(done, || self.kick())
    }
}

/// The log of one store.
pub struct LogManager {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<writer::Stop>,
}

impl LogManager {
    /// Starts the writer. New segments are created after the existing ones (never appended to).
    /// `existing` lists the segments already on disk (from recovery), for trimming.
    pub fn start(config: LogConfig, clock: Arc<AtomicU64>, existing: Vec<SegmentInfo>) -> Result<LogManager, TxnError> {
        let backend = tusk_storage::io::open_backend(&config.io)
            .map_err(|e| TxnError::Storage(tusk_storage::StorageError::io(&config.dir, e)))?;
        let partitions = (0..config.partitions).map(|_| Partition::default()).collect();
        let (kick, kicked): (Sender<()>, Receiver<()>) = crossbeam_channel::bounded(1);
        let durable = clock.load(Ordering::SeqCst);
        let shared = Arc::new(Shared {
            partitions,
            clock,
            watermark: Watermark::new(durable),
            progress: Progress::new(),
            kick,
            config,
            catalog: SegmentCatalog::new(existing),
        });
        let files = segments::SegmentFiles::open(&shared.config)?;
        let stop = Arc::new(writer::Stop::default());
        let handle = writer::spawn(shared.clone(), backend, files, kicked, stop.clone())?;
        Ok(LogManager { shared, writer: Mutex::new(Some(handle)), stop })
    }

    /// Name of the I/O backend in use.
    pub fn backend_name(&self) -> String {
        self.stop.backend_name.lock().clone()
    }

    /// The segments on disk.
    pub fn catalog(&self) -> &SegmentCatalog {
        &self.shared.catalog
    }

    pub fn partitions(&self) -> usize {
        self.shared.partitions.len()
    }

    /// Draws the next LSN and appends its record to `partition`, atomically with respect to
    /// the partition (see the module docs). `encode` writes the record for the given LSN.
    /// Returns the LSN and whether the partition's buffer has outgrown its bound (the
    /// committer should then [`LogManager::throttle`] once it has released its locks).
    pub fn append(&self, partition: usize, encode: impl FnOnce(&mut Vec<u8>, u64)) -> (u64, bool) {
        let (lsn, len) = self.shared.partitions[partition].append(&self.shared.clock, encode);
        if len >= self.shared.config.log_buffer_bytes {
            self.shared.kick();
        }
        (lsn, len > self.shared.config.log_buffer_bytes.saturating_mul(8))
    }

    /// Keeps a partition's buffer from outgrowing its bound when the disk cannot keep up:
    /// waits until the committer's own record is durable.
    pub fn throttle(&self, partition: usize, lsn: u64) -> Result<(), TxnError> {
        self.wait_partition(partition, lsn)
    }

    pub fn failure(&self) -> Option<String> {
        self.shared.failure()
    }

    /// Stalls the caller while the log is over its space bound (see
    /// [`SegmentCatalog::set_limit`]); returns at once when it is not.
    pub fn respect_space_limit(&self) -> Result<(), TxnError> {
        if !self.shared.catalog.over_limit() {
            return Ok(());
        }
        self.shared.catalog.wait_for_space(|| {
            if let Some(why) = self.shared.failure() {
                Some(TxnError::LogFailed(why))
            } else if self.shared.progress.is_stopped() {
                Some(TxnError::Closed)
            } else {
                None
            }
        }, TxnError::LogFailed)
    }

    pub fn durable_lsn(&self) -> u64 {
        self.shared.watermark.get()
    }

    /// Waits until every LSN ≤ lsn is durable.
    pub fn wait_durable(&self, lsn: u64) -> Result<(), TxnError> {
        if self.durable_lsn() >= lsn {
            return Ok(());
        }
        self.shared.wait_until(|| self.durable_lsn() >= lsn)
    }

    /// Waits until this partition's records up to `lsn` are durable.
    pub fn wait_partition(&self, partition: usize, lsn: u64) -> Result<(), TxnError> {
        let p = &self.shared.partitions[partition];
        if p.durable() >= lsn {
            return Ok(());
        }
        self.shared.wait_until(|| p.durable() >= lsn)
    }

    /// Flushes everything appended so far and stops the writer.
    pub fn close(&self) -> Result<(), TxnError> {
        let target = self.shared.clock.load(Ordering::SeqCst);
        let flushed = if self.shared.failure().is_none() { self.wait_durable(target) } else { Ok(()) };
        self.stop_writer(false);
        flushed?;
        match self.shared.failure() {
            Some(why) => Err(TxnError::LogFailed(why)),
            None => Ok(()),
        }
    }

    /// Stops the writer without flushing what is buffered: what a crash would leave.
    pub fn abandon(&self) {
        self.stop_writer(true);
    }

    fn stop_writer(&self, abandon: bool) {
        self.stop.request(abandon);
        self.shared.kick();
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
        self.shared.progress.stop();
    }
}

impl Drop for LogManager {
    fn drop(&mut self) {
        self.stop_writer(false);
    }
}
