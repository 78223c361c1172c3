//! The catalog of log segments on disk: their LSN ranges and sizes, kept up to date by the
//! writer, read by the checkpointer to trim the log and to bound its size.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex};
use tusk_storage::log_files::{sync_dir, SegmentInfo};
use tusk_storage::StorageError;

/// How long a committer stalled on log space sleeps before it looks at the log's health again.
const SPACE_POLL: Duration = Duration::from_millis(10);

/// The log space bound: committers stall while the log on disk is over `limit`, until a
/// checkpoint trims it. The bound holds under any update pattern because the log cannot
/// grow while it is over (by more than one record per committing thread).
#[derive(Default)]
pub struct SegmentCatalog {
    segments: Mutex<Vec<SegmentInfo>>,
    /// Log bytes above which committers stall (0: no bound).
    limit: AtomicU64,
    /// The log is over `limit`: committers look only at this flag on their fast path.
    over: AtomicBool,
    /// Signalled when trimming brings the log under its bound.
    under: Condvar,
    /// Why the checkpointer could not trim the log: stalled committers fail with it
    /// instead of waiting for a checkpoint that may never come.
    trim_failure: Mutex<Option<String>>,
    /// Flushes written since the store opened, their bytes (pads and headers included) and
    /// the nanoseconds their writes took (write and sync together).
    flushes: AtomicU64,
    flushed_bytes: AtomicU64,
    flush_nanos: AtomicU64,
}

/// What the log's flushes did since the store opened (see [`SegmentCatalog::flush_totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushTotals {
    pub flushes: u64,
    /// Bytes written, headers, pads and the zeros written ahead included.
    pub bytes: u64,
    /// Time spent in the flushes' writes and syncs, summed over partitions (flushes of
    /// several partitions overlap, so this can exceed the time that passed).
    pub writing: std::time::Duration,
}

impl SegmentCatalog {
    /// Starts from the segments recovery found (all closed: the writer opens new ones).
    pub fn new(found: Vec<SegmentInfo>) -> SegmentCatalog {
        let segments = found.into_iter().map(|s| SegmentInfo { open: false, ..s }).collect();
        SegmentCatalog { segments: Mutex::new(segments), ..SegmentCatalog::default() }
    }

    /// Sets the log space bound (0: none). Only a store that checkpoints on its own sets
    /// one: without a checkpointer nothing would ever lift a stall.
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::SeqCst);
        let segs = self.segments.lock();
        self.update_pressure(&segs);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Whether committers should stall (one relaxed load: the commit fast path).
    #[inline]
    pub fn over_limit(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// Records whether the last checkpoint failed (`None`: it succeeded). A failure wakes
    /// the stalled committers at once (not at their next poll): it is taken under the
    /// segments mutex, which a committer holds from its check to its sleep, so none misses it.
    pub fn set_trim_failure(&self, why: Option<String>) {
        let _segs = self.segments.lock();
        let failed = why.is_some();
        *self.trim_failure.lock() = why;
        if failed {
            self.under.notify_all();
        }
    }

    /// Blocks while the log is over its bound. `give_up` is asked every poll and ends the
    /// wait with its error (log failure, store closed); a failed checkpoint ends it with
    /// `on_trim_failure`.
    pub fn wait_for_space<E>(&self, give_up: impl Fn() -> Option<E>, on_trim_failure: impl Fn(String) -> E) -> Result<(), E> {
        let mut segs = self.segments.lock();
        while self.over.load(Ordering::SeqCst) {
            if let Some(e) = give_up() {
                return Err(e);
            }
            if let Some(why) = self.trim_failure.lock().clone() {
                let limit = self.limit.load(Ordering::Relaxed);
                return Err(on_trim_failure(format!("the log is over its bound of {limit} bytes and the checkpoint that would trim it failed: {why}")));
            }
            self.under.wait_for(&mut segs, SPACE_POLL);
        }
        Ok(())
    }

    fn update_pressure(&self, segs: &[SegmentInfo]) {
        let limit = self.limit.load(Ordering::SeqCst);
        let over = limit != 0 && segs.iter().map(|s| s.bytes).sum::<u64>() > limit;
        if !self.over.swap(over, Ordering::SeqCst) || over {
            return;
        }
        self.under.notify_all();
    }

    pub(crate) fn opened(&self, partition: u32, seq: u64, path: std::path::PathBuf) {
        let mut segs = self.segments.lock();
        for s in segs.iter_mut().filter(|s| s.partition == partition) {
            s.open = false;
        }
        segs.push(SegmentInfo { partition, seq, path, min_lsn: 0, max_lsn: 0, bytes: 0, open: true });
    }

    /// The open segment of `partition` was closed (full): trimming may delete it.
    pub(crate) fn closed(&self, partition: u32) {
        let mut segs = self.segments.lock();
        for s in segs.iter_mut().filter(|s| s.partition == partition) {
            s.open = false;
        }
    }

    pub(crate) fn flushed(&self, partition: u32, first: u64, last: u64, bytes: u64, took: std::time::Duration) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.flushed_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.flush_nanos.fetch_add(took.as_nanos().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
        let mut segs = self.segments.lock();
        if let Some(s) = segs.iter_mut().rev().find(|s| s.partition == partition && s.open) {
            if s.min_lsn == 0 {
                s.min_lsn = first;
            }
            s.max_lsn = s.max_lsn.max(last);
            s.bytes += bytes;
        }
        self.update_pressure(&segs);
    }

    /// Flushes written since the store opened, their bytes and the time their writes took.
    pub fn flush_totals(&self) -> FlushTotals {
        FlushTotals {
            flushes: self.flushes.load(Ordering::Relaxed),
            bytes: self.flushed_bytes.load(Ordering::Relaxed),
            writing: std::time::Duration::from_nanos(self.flush_nanos.load(Ordering::Relaxed)),
        }
    }

    pub fn snapshot(&self) -> Vec<SegmentInfo> {
        self.segments.lock().clone()
    }

    /// Bytes of log on disk.
    pub fn total_bytes(&self) -> u64 {
        self.segments.lock().iter().map(|s| s.bytes).sum()
    }

    /// Bytes that must stay on disk while a checkpoint needs every LSN above `lsn`.
    pub fn bytes_needed_after(&self, lsn: u64) -> u64 {
        self.segments.lock().iter().filter(|s| s.open || s.max_lsn > lsn).map(|s| s.bytes).sum()
    }

    /// Deletes every closed segment whose records all have LSNs ≤ `lsn`. Returns the number
    /// of files and bytes removed.
    pub fn trim(&self, lsn: u64) -> Result<(usize, u64), StorageError> {
        let doomed: Vec<SegmentInfo> = {
            let mut segs = self.segments.lock();
            let (gone, keep): (Vec<_>, Vec<_>) = segs.drain(..).partition(|s| !s.open && s.max_lsn <= lsn);
            *segs = keep;
            self.update_pressure(&segs);
            gone
        };
        let mut dirs = Vec::new();
        let mut bytes = 0;
        for s in &doomed {
            match std::fs::remove_file(&s.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&s.path, e)),
            }
            bytes += s.bytes;
            if let Some(d) = s.path.parent() {
                if !dirs.contains(&d.to_path_buf()) {
                    dirs.push(d.to_path_buf());
                }
            }
        }
        for d in dirs {
            sync_dir(&d)?;
        }
        Ok((doomed.len(), bytes))
    }
}

/// Loom models of the log-space stall (run by .ci/loom). loom's timed waits never time out,
/// so these pass only if every event that ends a stall wakes the stalled committers itself,
/// without the poll's help.
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::Arc;

    use loom::thread;

    use super::*;

    /// A catalog over its bound of 100 bytes: one closed segment of 200 bytes (LSN 1) and an
    /// open, empty one. The files do not exist (trimming tolerates that).
    fn over_bound() -> Arc<SegmentCatalog> {
        let dir = std::env::temp_dir();
        let catalog = SegmentCatalog::new(Vec::new());
        catalog.set_limit(100);
        catalog.opened(0, 1, dir.join("tusk-loom-absent-segment-1"));
        catalog.flushed(0, 1, 1, 200, std::time::Duration::ZERO);
        catalog.opened(0, 2, dir.join("tusk-loom-absent-segment-2"));
        assert!(catalog.over_limit());
        Arc::new(catalog)
    }

    fn stall(catalog: &SegmentCatalog) -> Result<(), String> {
        if !catalog.over_limit() {
            return Ok(());
        }
        catalog.wait_for_space(|| None, |why| why)
    }

    /// A committer stalled on the bound resumes once a checkpoint trims the log under it.
    #[test]
    fn loom_trimming_wakes_stalled_committers() {
        loom::model(|| {
            let catalog = over_bound();
            let committer = { let catalog = catalog.clone(); thread::spawn(move || stall(&catalog)) };
            assert_eq!(catalog.trim(1).unwrap(), (1, 200));
            assert!(!catalog.over_limit());
            committer.join().unwrap().unwrap();
        });
    }

    /// A committer stalled on the bound fails once the checkpoint that would trim fails
    /// (before `set_trim_failure` notified, it waited for its next poll).
    #[test]
    fn loom_a_failed_checkpoint_wakes_stalled_committers() {
        loom::model(|| {
            let catalog = over_bound();
            let committer = { let catalog = catalog.clone(); thread::spawn(move || stall(&catalog)) };
            catalog.set_trim_failure(Some("disk full".into()));
            let err = committer.join().unwrap().unwrap_err();
            assert!(err.contains("disk full"), "{err}");
        });
    }
}
