//! The store's `tusk-prefault` thread: it populates the heap ahead of brk, so the
//! transactions that take new memory do not stop for the page faults of its first touch (see
//! tusk-txn's `growth`). At most `Options::prefault_ahead` bytes beyond brk are populated.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{select, Sender};
use tusk_storage::layout::BRK_OFF;
use tusk_txn::Engine;

use crate::Error;

/// Pages populated per call, so a stop waits for one step at most.
const STEP: u64 = 2 << 20;

pub(crate) struct PrefaultService {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl PrefaultService {
    /// Starts the thread, keeping `ahead` bytes beyond brk populated (0: no thread).
    pub fn start(engine: Arc<Engine>, ahead: u64) -> Result<PrefaultService, Error> {
        if ahead == 0 {
            return Ok(PrefaultService { stop: None, thread: None });
        }
        let (wake, woken) = crossbeam_channel::bounded(1);
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let brk = engine.heap().load_word(BRK_OFF);
        let ready = brk.next_multiple_of(STEP);
        engine.growth().listen(wake, ahead, ready);
        let thread = std::thread::Builder::new()
            .name("tusk-prefault".into())
            .spawn(move || {
                let _ = tusk_storage::sched::lower_current_thread_priority(tusk_storage::sched::BACKGROUND_NICE);
                let heap = engine.heap();
                let mut done = ready;
                loop {
                    select! {
                        recv(stopped) -> _ => return,
                        recv(woken) -> _ => {}
                    }
                    let wanted = engine.growth().wanted().min(heap.capacity());
                    while done < wanted {
                        if stopped.try_recv().is_ok() {
                            return;
                        }
                        let len = STEP.min(wanted - done);
                        heap.prefault(done, len);
                        done += len;
                    }
                }
            })
            .map_err(|source| Error::Io { path: "tusk-prefault thread".into(), source })?;
        Ok(PrefaultService { stop: Some(stop), thread: Some(thread) })
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for PrefaultService {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tusk_storage::Heap;
    use tusk_txn::EngineConfig;

    use super::*;

    #[test]
    fn the_heap_beyond_brk_is_populated_once_brk_nears_it() {
        const MIB: u64 = 1 << 20;
        let config = EngineConfig { stripes_log2: 10, log: None, existing_segments: Vec::new() };
        let engine = Arc::new(Engine::start(config, Heap::new(256 * MIB).unwrap(), 0).unwrap());
        let mut service = PrefaultService::start(engine.clone(), 32 * MIB).unwrap();
        let heap = engine.heap();
        assert_eq!(heap.resident_bytes(64 * MIB, 32 * MIB), 0, "nothing asked for yet");
        engine.growth().taken(60 * MIB);
        let asked = Instant::now();
        while heap.resident_bytes(60 * MIB, 32 * MIB) < 32 * MIB {
            assert!(asked.elapsed() < Duration::from_secs(20), "32 MiB beyond brk not populated");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(heap.resident_bytes(128 * MIB, 64 * MIB), 0, "no more than `ahead` beyond brk");
        service.stop();
    }
}
