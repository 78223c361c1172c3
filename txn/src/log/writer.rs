//! The I/O side of a partition's flush slot, and the background flusher thread that flushes
//! every partition at the group-commit interval (for `Async` commits, whose committers do not
//! wait) or when a buffer fills. Committers that wait lead their own flushes (see
//! [`super::progress`]), so this thread is never on a `Sync` or `Partition` commit's path.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Receiver;
use tusk_storage::io::{AlignedBuf, IoBackend, WriteSync};
use tusk_storage::log_format::{pad_frame, FLUSH_ALIGN};

use super::catalog::SegmentCatalog;
use super::partition::{Taken, MAX_KEPT_BUFFER};
use super::progress::Flush;
use super::segments::SegmentFile;
use super::Shared;
use crate::TxnError;

/// What a flush of one partition needs: its segment file, an O_DIRECT-aligned staging
/// copy of the taken buffer (closed by a pad frame), and its own I/O backend (a flush is
/// one write + fdatasync, done by the thread holding the slot: no hand-off to other threads).
pub struct PartitionWriter {
    partition: u32,
    file: SegmentFile,
    staging: AlignedBuf,
    backend: Box<dyn IoBackend>,
    catalog: Arc<SegmentCatalog>,
}

impl PartitionWriter {
    pub fn new(partition: u32, file: SegmentFile, backend: Box<dyn IoBackend>, catalog: Arc<SegmentCatalog>) -> PartitionWriter {
        PartitionWriter { partition, file, staging: AlignedBuf::new(), backend, catalog }
    }

    pub fn backend_name(&self) -> String {
        self.backend.name()
    }
}

impl Flush for PartitionWriter {
    fn write(&mut self, taken: &Taken) -> Result<(), String> {
        let (fd, offset, header) = self.file.target(taken.data.len(), &self.catalog).map_err(|e| e.to_string())?;
        let stage = &mut self.staging;
        stage.clear();
        if let Some(header) = header {
            stage.extend_from_slice(&header);
        }
        stage.extend_from_slice(&taken.data);
        stage.extend_from_slice(&pad_frame(offset + stage.len() as u64));
        debug_assert_eq!((offset + stage.len() as u64) % FLUSH_ALIGN, 0);
        let len = stage.len();
        // Zeros ahead go out in the same write: one fdatasync commits them with the flush.
        let zeros = self.file.zeros_after(offset, len);
        stage.extend_zeros(zeros);
        let result = self.backend.write_and_sync(&[WriteSync { fd, offset, data: stage.as_slice() }]).pop();
        if stage.capacity() > MAX_KEPT_BUFFER {
            *stage = AlignedBuf::new();
        }
        match result.expect("one result per request") {
            Ok(()) => {
                self.file.advance(len, zeros);
                self.catalog.flushed(self.partition, taken.first, taken.last, len as u64);
                self.file.close_if_full(&self.catalog).map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("{}: {e}", self.file.path().display())),
        }
    }
}

/// The scheduler slice the background flusher asks for (see `spawn`).
const WRITER_SLICE_NS: u64 = 100_000;

/// Starts the background flusher: it flushes each partition that is due (see
/// [`super::partition::Partition::flush_due`]: nothing flushed it for a group-commit
/// interval), or every partition when kicked (a full buffer, or a waiter that needs several
/// partitions flushed side by side). A partition whose slot is busy is being flushed already;
/// what was appended since goes with the next pass. Then it advances the watermark.
pub fn spawn(shared: Arc<Shared>, kicked: Receiver<()>) -> Result<JoinHandle<()>, TxnError> {
    let interval = shared.config.group_commit_interval;
    std::thread::Builder::new()
        .name("tusk-log-writer".into())
        .spawn(move || {
            // While the committers keep every core busy, this thread got a core only after a
            // whole default slice: at a 1 ms interval on 2 cores a partition's flushes came
            // every 8 ms (p50; 20 ms p99), and every 1.6 ms (p50; 11 ms p99) with short
            // slices. Best effort: older kernels ignore it.
            let _ = tusk_storage::sched::shorten_current_thread_slice(WRITER_SLICE_NS);
            let mut wait = interval;
            loop {
                let kick = kicked.recv_timeout(wait).is_ok();
                let group = &shared.group;
                if group.is_stopped() || group.failure().is_some() {
                    return;
                }
                let now = Instant::now();
                let mut next = now + interval;
                for (p, partition) in group.partitions.iter().enumerate() {
                    match partition.flush_due(interval) {
                        Some(due) if kick || due <= now => {
                            group.flush(p);
                        }
                        Some(due) => next = next.min(due),
                        None => {}
                    }
                }
                group.watermark.advance(&group.clock, &group.partitions);
                wait = next.saturating_duration_since(Instant::now());
            }
        })
        .map_err(|e| TxnError::Storage(tusk_storage::StorageError::io("tusk-log-writer thread", e)))
}
