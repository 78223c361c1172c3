//! The background checkpoint service of a store: one thread that takes a checkpoint every
//! `checkpoint_interval`, and sooner when the log passes half of `max_log_bytes`, sharing one
//! [`Checkpointer`] with [`crate::Store::checkpoint`]. While it runs, the log carries the
//! space bound `max_log_bytes` (committers stall above it until a checkpoint trims the log).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tusk_txn::{CheckpointReport, Checkpointer, Engine};

use crate::Error;

/// What the service last did.
#[derive(Default)]
pub(crate) struct Status {
    pub last: Option<CheckpointReport>,
    pub last_error: Option<String>,
    pub taken: u64,
}

pub(crate) struct CheckpointService {
    /// Checkpoints are taken in the background (`checkpoint_interval` is set), and so at
    /// close too.
    automatic: bool,
    checkpointer: Arc<Mutex<Checkpointer>>,
    status: Arc<Mutex<Status>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl CheckpointService {
    /// How often the service looks at the log's size between interval checkpoints.
    const LOG_POLL: Duration = Duration::from_millis(20);

    pub fn start(engine: Arc<Engine>, checkpointer: Checkpointer, interval: Option<Duration>, max_log_bytes: u64, stall_at: u64) -> Result<CheckpointService, Error> {
        let checkpointer = Arc::new(Mutex::new(checkpointer));
        let status = Arc::new(Mutex::new(Status::default()));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let automatic = interval.is_some();
        let thread = match interval {
            None => None,
            Some(interval) => {
                if let Some(log) = engine.log() {
                    log.catalog().set_limit(stall_at);
                }
                let (checkpointer, status, stop) = (checkpointer.clone(), status.clone(), stop.clone());
                let handle = std::thread::Builder::new()
                    .name("tusk-checkpointer".into())
                    .spawn(move || {
                        // Best effort: at normal priority the checkpoint still works, it just
                        // takes a fair share of the cores from transactions.
                        let _ = tusk_storage::sched::lower_current_thread_priority(tusk_storage::sched::BACKGROUND_NICE);
                        let mut last = Instant::now();
                        loop {
                            {
                                let (lock, cv) = &*stop;
                                let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
                                let poll = Self::LOG_POLL.min(interval);
                                let (guard, _) = cv.wait_timeout_while(guard, poll, |stopped| !*stopped).unwrap_or_else(|e| e.into_inner());
                                if *guard {
                                    return;
                                }
                            }
                            let log_bytes = engine.log().map_or(0, |l| l.catalog().total_bytes());
                            if last.elapsed() < interval && log_bytes <= max_log_bytes / 2 {
                                continue;
                            }
                            let result = checkpointer.lock().unwrap_or_else(|e| e.into_inner()).run(&engine);
                            record(&status, result.map_err(Error::from));
                            last = Instant::now();
                        }
                    })
                    .map_err(|source| Error::Io { path: "tusk-checkpointer thread".into(), source })?;
                Some(handle)
            }
        };
        Ok(CheckpointService { automatic, checkpointer, status, stop, thread })
    }

    /// Takes a checkpoint now (waits for a running one first).
    pub fn run_now(&self, engine: &Engine) -> Result<CheckpointReport, Error> {
        let result = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner()).run(engine).map_err(Error::from);
        record(&self.status, result.as_ref().map(|r| r.clone()).map_err(|e| Error::LogFailed(e.to_string())));
        result
    }

    /// Stops the background thread; then, where checkpoints are automatic and a reopen
    /// would replay more than `replay_above` bytes of log, takes one last checkpoint, so that
    /// the next open replays (almost) nothing. Call while the log still takes records.
    pub fn finish(&mut self, engine: &Engine, replay_above: u64) -> Result<(), Error> {
        self.stop();
        if !self.automatic {
            return Ok(());
        }
        // Flushed first, so that the catalog counts what the partitions still buffer.
        engine.is_stable(engine.last_lsn(), true);
        let to_replay = {
            let checkpointer = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner());
            log_to_replay(engine, &checkpointer)
        };
        if to_replay > replay_above {
            self.run_now(engine)?;
        }
        Ok(())
    }

    pub fn status(&self) -> (Option<CheckpointReport>, Option<String>, u64) {
        let s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        (s.last.clone(), s.last_error.clone(), s.taken)
    }

    /// Stops the background thread (a checkpoint in progress finishes first).
    pub fn stop(&mut self) {
        {
            let (lock, cv) = &*self.stop;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Bytes of log a reopen would read: the segments holding records after the oldest chunk
/// LSN of the newest checkpoint (all of the log where there is none yet).
fn log_to_replay(engine: &Engine, checkpointer: &Checkpointer) -> u64 {
    let after = checkpointer.last().map_or(0, |m| m.min_lsn());
    engine.log().map_or(0, |log| log.catalog().bytes_needed_after(after))
}

fn record(status: &Mutex<Status>, result: Result<CheckpointReport, Error>) {
    let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
    match result {
        Ok(report) => {
            s.taken += 1;
            s.last = Some(report);
            s.last_error = None;
        }
        Err(e) => s.last_error = Some(e.to_string()),
    }
}

impl Drop for CheckpointService {
    fn drop(&mut self) {
        self.stop();
    }
}
