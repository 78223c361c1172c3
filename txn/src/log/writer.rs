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
use super::partition::Taken;
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

/// The most bytes one write of a flush stages: a larger flush (a huge transaction's record)
/// goes out in pieces of this size, each written and synced in turn, so its staging copy
/// never costs more memory than this. A multiple of [`FLUSH_ALIGN`] (O_DIRECT).
const STAGE_PIECE: usize = 8 << 20;
const _: () = assert!((STAGE_PIECE as u64).is_multiple_of(FLUSH_ALIGN));

/// Appends to `stage` the bytes `range` of the stream made of `parts` one after another,
/// then `zeros` zero bytes.
fn stage_range(stage: &mut AlignedBuf, parts: [&[u8]; 3], zeros: usize, range: std::ops::Range<usize>) {
    let mut at = 0;
    for part in parts {
        let (from, to) = (range.start.max(at), range.end.min(at + part.len()));
        if from < to {
            stage.extend_from_slice(&part[from - at..to - at]);
        }
        at += part.len();
    }
    let (from, to) = (range.start.max(at), range.end.min(at + zeros));
    if from < to {
        stage.extend_zeros(to - from);
    }
}

impl Flush for PartitionWriter {
    fn write(&mut self, taken: &Taken) -> Result<(), String> {
        let (fd, offset, header) = self.file.target(taken.data.len(), &self.catalog).map_err(|e| e.to_string())?;
        let header: &[u8] = header.as_ref().map_or(&[], |h| &h[..]);
        let pad = pad_frame(offset + (header.len() + taken.data.len()) as u64);
        let len = header.len() + taken.data.len() + pad.len();
        debug_assert_eq!((offset + len as u64) % FLUSH_ALIGN, 0);
        // Zeros ahead go out in the same write: one fdatasync commits them with the flush.
        let zeros = self.file.zeros_after(offset, len);
        let total = len + zeros;
        let mut done = 0;
        while done < total {
            let end = (done + STAGE_PIECE).min(total);
            self.staging.clear();
            stage_range(&mut self.staging, [header, &taken.data, &pad], zeros, done..end);
            let piece = WriteSync { fd, offset: offset + done as u64, data: self.staging.as_slice() };
            let result = self.backend.write_and_sync(&[piece]).pop().expect("one result per request");
            if let Err(e) = result {
                return Err(format!("{}: {e}", self.file.path().display()));
            }
            done = end;
        }
        self.file.advance(len, zeros);
        self.catalog.flushed(self.partition, taken.first, taken.last, len as u64);
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
    use super::*;

    /// A flush staged in pieces is the whole stream, byte for byte, whatever the cut points.
    #[test]
    fn pieces_of_the_stream_make_the_whole() {
        let header = vec![1u8; 40];
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let pad = vec![7u8; 24];
        let zeros = 4096;
        let mut whole = AlignedBuf::new();
        stage_range(&mut whole, [&header, &data, &pad], zeros, 0..14_160);
        let want: Vec<u8> = [&header[..], &data, &pad, &[0u8; 4096]].concat();
        assert_eq!(whole.as_slice(), &want[..]);
        for piece in [1, 7, 40, 64, 4096, 10_040, 14_159] {
            let mut joined = Vec::new();
            let mut done = 0;
            while done < want.len() {
                let end = (done + piece).min(want.len());
                let mut stage = AlignedBuf::new();
                stage_range(&mut stage, [&header, &data, &pad], zeros, done..end);
                joined.extend_from_slice(stage.as_slice());
                done = end;
            }
            assert_eq!(joined, want, "pieces of {piece} bytes");
        }
    }
}
