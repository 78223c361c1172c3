//! The log writer thread: takes the partitions' buffers, writes them as one batch, advances
//! the durable watermark, wakes waiters.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;
use tusk_storage::io::{IoBackend, WriteSync};

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
    mut files: SegmentFiles,
    kicked: Receiver<()>,
    stop: Arc<Stop>,
) -> Result<JoinHandle<()>, TxnError> {
    *stop.backend_name.lock() = backend.name();
    std::thread::Builder::new()
        .name("tusk-log-writer".into())
        .spawn(move || loop {
            let _ = kicked.recv_timeout(shared.config.group_commit_interval);
            match stop.mode() {
                ABANDON => return,
                CLOSE => {
                    while round(&shared, backend.as_mut(), &mut files) {}
                    return;
                }
                _ => {
                    round(&shared, backend.as_mut(), &mut files);
                }
            }
        })
        .map_err(|e| TxnError::Storage(tusk_storage::StorageError::io("tusk-log-writer thread", e)))
}

/// One flush of every partition with buffered records. Returns whether anything was written.
fn round(shared: &Shared, backend: &mut dyn IoBackend, files: &mut SegmentFiles) -> bool {
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
        match files.target(*i, t.data.len()) {
            Ok(target) => targets.push(target),
            Err(e) => {
                shared.fail(e.to_string());
                return false;
            }
        }
    }
    let reqs: Vec<WriteSync> = taken
        .iter()
        .zip(&targets)
        .map(|((_, t), &(fd, offset))| WriteSync { fd, offset, data: &t.data })
        .collect();
    let results = backend.write_and_sync(&reqs);
    drop(reqs);
    for ((i, t), result) in taken.into_iter().zip(results) {
        match result {
            Ok(()) => {
                files.advance(i, t.data.len());
                shared.partitions[i].written(t);
            }
            // The buffer stays in flight: the watermark cannot pass it, and nothing later in
            // this partition is ever written.
            Err(e) => shared.fail(format!("{}: {e}", files.path(i).display())),
        }
    }
    shared.advance_watermark();
    shared.notify();
    true
}
