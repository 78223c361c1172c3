//! The I/O side of a partition's flush slot, and the background flusher thread that flushes
//! every partition at the group-commit interval (for `Async` commits, whose committers do not
//! wait) or when a buffer fills. Committers that wait lead their own flushes (see
//! [`super::progress`]), so this thread is never on a `Sync` or `Partition` commit's path.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Receiver;

use tusk_storage::io::{AlignedBuf, IoBackend, WriteSync};
use tusk_storage::log_format::{pad_frame, FLUSH_ALIGN};

use super::catalog::SegmentCatalog;
use super::partition::Taken;
use super::progress::{Flush, Streamed};
use super::segments::SegmentFile;
use tusk_storage::log_seal::SegmentSeal;
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

    /// Closes the partition's open segment (a clean close, every flush done); returns the
    /// seal of its last segment.
    pub fn close(&mut self) -> Result<Option<SegmentSeal>, TxnError> {
        Ok(self.file.close(&self.catalog)?)
    }
}

/// The most bytes one write of a flush stages: a larger flush (a huge transaction's record)
/// goes out in pieces of this size, each written and synced in turn, so its staging copy
/// never costs more memory than this. A multiple of [`FLUSH_ALIGN`] (O_DIRECT).
const STAGE_PIECE: usize = 8 << 20;
const _: () = assert!((STAGE_PIECE as u64).is_multiple_of(FLUSH_ALIGN));

/// A flush's bytes on their way out: gathered in the O_DIRECT-aligned staging buffer and
/// written and synced [`STAGE_PIECE`] bytes at a time, at ascending offsets from `offset`.
/// After a failed write the rest is taken and dropped, so that a producer handing bytes on
/// need not stop; [`Staged::finish`] reports the failure.
struct Staged<'w> {
    backend: &'w mut dyn IoBackend,
    staging: &'w mut AlignedBuf,
    fd: RawFd,
    offset: u64,
    /// Bytes taken so far (written, or staged to be).
    taken: usize,
    failure: Option<String>,
}

impl<'w> Staged<'w> {
    fn new(backend: &'w mut dyn IoBackend, staging: &'w mut AlignedBuf, fd: RawFd, offset: u64) -> Staged<'w> {
        staging.clear();
        Staged { backend, staging, fd, offset, taken: 0, failure: None }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = (STAGE_PIECE - self.staging.len()).min(bytes.len());
            self.staging.extend_from_slice(&bytes[..n]);
            self.stage_done(n);
            bytes = &bytes[n..];
        }
    }

    fn push_zeros(&mut self, mut count: usize) {
        while count > 0 {
            let n = (STAGE_PIECE - self.staging.len()).min(count);
            self.staging.extend_zeros(n);
            self.stage_done(n);
            count -= n;
        }
    }

    fn stage_done(&mut self, n: usize) {
        self.taken += n;
        if self.staging.len() == STAGE_PIECE {
            self.write_out();
        }
    }

    fn write_out(&mut self) {
        if self.failure.is_none() {
            let at = self.offset + (self.taken - self.staging.len()) as u64;
            let piece = WriteSync { fd: self.fd, offset: at, data: self.staging.as_slice() };
            if let Err(e) = self.backend.write_and_sync(&[piece]).pop().expect("one result per request") {
                self.failure = Some(e.to_string());
            }
        }
        self.staging.clear();
    }

    /// Nothing more is to be written (what was is left as a torn flush).
    fn fail(&mut self, why: String) {
        self.failure.get_or_insert(why);
    }

    /// Writes what is staged; Ok once every byte taken is on disk.
    fn finish(mut self) -> Result<(), String> {
        if !self.staging.is_empty() {
            self.write_out();
        }
        self.failure.map_or(Ok(()), Err)
    }
}

impl Flush for PartitionWriter {
    fn write(&mut self, taken: &Taken, streamed: Option<&mut dyn Streamed>) -> Result<(), String> {
        let streamed_len = streamed.as_ref().map_or(0, |s| s.size());
        let data_len = taken.data.len() + streamed_len;
        let (fd, offset, header) = self.file.target(data_len, &self.catalog).map_err(|e| e.to_string())?;
        let header: &[u8] = header.as_ref().map_or(&[], |h| &h[..]);
        let pad = pad_frame(offset + (header.len() + data_len) as u64);
        let len = header.len() + data_len + pad.len();
        debug_assert_eq!((offset + len as u64) % FLUSH_ALIGN, 0);
        // Zeros ahead go out in the same write: one fdatasync commits them with the flush.
        let zeros = self.file.zeros_after(offset, len);
        let started = std::time::Instant::now();
        let mut out = Staged::new(self.backend.as_mut(), &mut self.staging, fd, offset);
        out.push(header);
        out.push(&taken.data);
        if let Some(streamed) = streamed {
            let from = out.taken;
            let produced = streamed.produce(&mut |bytes| out.push(bytes));
            match produced {
                Err(why) => out.fail(why),
                Ok(()) if out.taken - from != streamed_len => {
                    out.fail(format!("a streamed record gave {} bytes, not the {streamed_len} it announced", out.taken - from))
                }
                Ok(()) => {}
            }
        }
        out.push(&pad);
        out.push_zeros(zeros);
        out.finish().map_err(|e| format!("{}: {e}", self.file.path().display()))?;
        self.file.advance(len, zeros, taken.first, offset + header.len() as u64);
        self.catalog.flushed(self.partition, taken.first, taken.last, len as u64, started.elapsed());
        self.file.close_if_full(&self.catalog).map_err(|e| e.to_string())
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
                    match partition.flush_due(interval, now) {
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use tusk_storage::io::{open_log_backend, Io};

    use super::*;

    /// What is pushed, in pieces of any size and across many staging pieces, lands in the
    /// file byte for byte.
    #[test]
    fn staged_pushes_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let mut backend = open_log_backend(&Io::Sync).unwrap();
        let mut staging = AlignedBuf::new();
        let data: Vec<u8> = (0..2 * STAGE_PIECE + 5000).map(|i| (i % 251) as u8).collect();
        let mut want = Vec::new();
        let mut out = Staged::new(backend.as_mut(), &mut staging, file.as_raw_fd(), 4096);
        let mut at = 0;
        for (k, piece) in [1usize, 7, 4096, 3 << 20, 9 << 20, 1].iter().cycle().enumerate() {
            let end = (at + piece).min(data.len());
            out.push(&data[at..end]);
            want.extend_from_slice(&data[at..end]);
            if k % 3 == 0 {
                out.push_zeros(100);
                want.extend_from_slice(&[0; 100]);
            }
            at = end;
            if at == data.len() {
                break;
            }
        }
        out.push_zeros(STAGE_PIECE + 3);
        want.resize(want.len() + STAGE_PIECE + 3, 0);
        out.finish().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 4096 + want.len());
        assert!(got[4096..] == want[..], "the file differs from what was pushed");
    }
}
