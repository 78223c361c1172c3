//! The log writer thread: takes the partitions' buffers, writes them as one batch, advances
//! the durable watermark, wakes waiters.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;
use tusk_storage::io::{AlignedBuf, IoBackend, WriteSync};
use tusk_storage::log_format::{pad_frame, FLUSH_ALIGN};

use super::partition::Taken;
use super::segments::SegmentFiles;
use super::Shared;
use crate::TxnError;

const CLOSE: u8 = 1;
const ABANDON: u8 = 2;

#[derive(Default)]
pub struct Stop {
    mode: AtomicU8,
    pub backend_name: Mutex<String>,
}

impl Stop {
    pub fn request(&self, abandon: bool) {
        let mode = if abandon { ABANDON } else { CLOSE };
        self.mode.fetch_max(mode, Ordering::SeqCst);
    }

    fn mode(&self) -> u8 {
        self.mode.load(Ordering::SeqCst)
    }
}

pub fn spawn(
    shared: Arc<Shared>,
    mut backend: Box<dyn IoBackend>,
    files: SegmentFiles,
    kicked: Receiver<()>,
    stop: Arc<Stop>,
) -> Result<JoinHandle<()>, TxnError> {
    *stop.backend_name.lock() = backend.name();
    let staging = (0..shared.partitions.len()).map(|_| AlignedBuf::new()).collect();
    let mut writer = Writer { files, staging };
    std::thread::Builder::new()
        .name("tusk-log-writer".into())
        .spawn(move || loop {
            let _ = kicked.recv_timeout(shared.config.group_commit_interval);
            match stop.mode() {
                ABANDON => return,
                CLOSE => {
                    while writer.round(&shared, backend.as_mut()) {}
                    return;
                }
                _ => {
                    writer.round(&shared, backend.as_mut());
                }
            }
        })
        .map_err(|e| TxnError::Storage(tusk_storage::StorageError::io("tusk-log-writer thread", e)))
}

/// The writer thread's own state.
struct Writer {
    files: SegmentFiles,
    /// Per partition: the O_DIRECT-aligned copy of its buffer, closed by a pad frame.
    staging: Vec<AlignedBuf>,
}

impl Writer {
    /// One flush of every partition with buffered records. Returns whether anything was written.
    fn round(&mut self, shared: &Shared, backend: &mut dyn IoBackend) -> bool {
        if shared.failure().is_some() {
            shared.notify();
            return false;
        }
        let taken: Vec<(usize, Taken)> =
            shared.partitions.iter().enumerate().filter_map(|(i, p)| p.take().map(|t| (i, t))).collect();
        if taken.is_empty() {
            shared.advance_watermark();
            shared.notify();
            return false;
        }
        let mut targets = Vec::with_capacity(taken.len());
        for (i, t) in &taken {
            let (fd, offset, header) = match self.files.target(*i, t.data.len(), &shared.catalog) {
                Ok(target) => target,
                Err(e) => {
                    shared.fail(e.to_string());
                    return false;
                }
            };
            let stage = &mut self.staging[*i];
            stage.clear();
            if let Some(header) = header {
                stage.extend_from_slice(&header);
            }
            stage.extend_from_slice(&t.data);
            stage.extend_from_slice(&pad_frame(offset + stage.len() as u64));
            debug_assert_eq!((offset + stage.len() as u64) % FLUSH_ALIGN, 0);
            targets.push((fd, offset));
        }
        let reqs: Vec<WriteSync> = taken
            .iter()
            .zip(&targets)
            .map(|((i, _), &(fd, offset))| WriteSync { fd, offset, data: self.staging[*i].as_slice() })
            .collect();
        let results = backend.write_and_sync(&reqs);
        drop(reqs);
        for ((i, t), result) in taken.into_iter().zip(results) {
            match result {
                Ok(()) => {
                    self.files.advance(i, self.staging[i].len());
                    shared.catalog.flushed(i as u32, t.first, t.last, self.staging[i].len() as u64);
                    shared.partitions[i].written(t);
                }
                // The buffer stays in flight: the watermark cannot pass it, and nothing later
                // in this partition is ever written.
                Err(e) => shared.fail(format!("{}: {e}", self.files.path(i).display())),
            }
        }
        shared.advance_watermark();
        shared.notify();
        true
    }
}
