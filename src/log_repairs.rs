//! The log's repairs after a crash, made on a thread of their own (`tusk-repair`): a reopen
//! returns before the journal commits they cost (a `set_len` and an fsync for each partition
//! whose last segment ends in zeros or a torn tail: 0.5–1 ms on the 16-core device host, up
//! to 12 ms on the 2-core machine), and no new log segment is made before they are done (see
//! tusk-txn's `PendingRepairs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use tusk_recovery::scan::Repair;
use tusk_txn::log::PendingRepairs;

use crate::Error;

pub(crate) struct LogRepairs {
    dir: PathBuf,
    pending: Option<Arc<PendingRepairs>>,
    thread: Option<JoinHandle<()>>,
}

/// Says the repairs failed if their thread ends without saying how they went (a panic):
/// a log waiting for them must not wait for ever.
struct FinishOnDrop(Arc<PendingRepairs>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish(Err("the repair thread stopped before it was done".into()));
    }
}

impl LogRepairs {
    /// Starts making `repairs` to the log of the store in `dir` (nothing when there are none).
    pub fn start(dir: PathBuf, repairs: Vec<Repair>) -> Result<LogRepairs, Error> {
        if repairs.is_empty() {
            return Ok(LogRepairs { dir, pending: None, thread: None });
        }
        let pending = Arc::new(PendingRepairs::default());
        let done = FinishOnDrop(pending.clone());
        let thread = std::thread::Builder::new()
            .name("tusk-repair".into())
            .spawn(move || {
                let result = repairs.iter().try_for_each(Repair::apply_if_there).map_err(|e| e.to_string());
                done.0.finish(result);
            })
            .map_err(|source| Error::Io { path: "tusk-repair thread".into(), source })?;
        Ok(LogRepairs { dir, pending: Some(pending), thread: Some(thread) })
    }

    /// What the log's new segments wait for.
    pub fn pending(&self) -> Option<Arc<PendingRepairs>> {
        self.pending.clone()
    }

    /// Waits for the repairs; their error, if they failed.
    pub fn join(&mut self) -> Result<(), Error> {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        match &self.pending {
            Some(pending) => pending.wait().map_err(|reason| Error::Io { path: tusk_storage::log_files::log_dir(&self.dir), source: std::io::Error::other(reason) }),
            None => Ok(()),
        }
    }
}

impl Drop for LogRepairs {
    fn drop(&mut self) {
        let _ = self.join();
    }
}
