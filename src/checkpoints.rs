//! The background checkpoint service of a store: one thread that takes a checkpoint every
//! `checkpoint_interval`, sharing one [`Checkpointer`] with [`crate::Store::checkpoint`].

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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
    checkpointer: Arc<Mutex<Checkpointer>>,
    status: Arc<Mutex<Status>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl CheckpointService {
    pub fn start(engine: Arc<Engine>, checkpointer: Checkpointer, interval: Option<Duration>) -> Result<CheckpointService, Error> {
        let checkpointer = Arc::new(Mutex::new(checkpointer));
        let status = Arc::new(Mutex::new(Status::default()));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = match interval {
            None => None,
            Some(interval) => {
                let (checkpointer, status, stop) = (checkpointer.clone(), status.clone(), stop.clone());
                let handle = std::thread::Builder::new()
                    .name("tusk-checkpointer".into())
                    .spawn(move || loop {
                        {
                            let (lock, cv) = &*stop;
                            let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
                            let (guard, _) = cv.wait_timeout_while(guard, interval, |stopped| !*stopped).unwrap_or_else(|e| e.into_inner());
                            if *guard {
                                return;
                            }
                        }
                        let result = checkpointer.lock().unwrap_or_else(|e| e.into_inner()).run(&engine);
                        record(&status, result.map_err(Error::from));
                    })
                    .map_err(|source| Error::Io { path: "tusk-checkpointer thread".into(), source })?;
                Some(handle)
            }
        };
        Ok(CheckpointService { checkpointer, status, stop, thread })
    }

    /// Takes a checkpoint now (waits for a running one first).
    pub fn run_now(&self, engine: &Engine) -> Result<CheckpointReport, Error> {
        let result = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner()).run(engine).map_err(Error::from);
        record(&self.status, result.as_ref().map(|r| r.clone()).map_err(|e| Error::LogFailed(e.to_string())));
        result
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
