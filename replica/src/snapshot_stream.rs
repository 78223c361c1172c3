//! A snapshot file moved as a stream, off the runtime's threads: a thread of its own reads
//! the sender's file piece by piece, and on the receiver a thread writes the pieces while a
//! second one syncs what is written every [`SYNC_EVERY`] bytes, so that the disk writes as
//! the bytes arrive and the last sync has only the tail left (a 1 GiB snapshot received into
//! the page cache and synced at the end spent a fifth of its catch-up in that one sync).

use std::io::{Read, Write};

pub use axum::body::Bytes;
use tokio::sync::mpsc;

/// Bytes read from a snapshot file per piece of the stream.
pub const PIECE: usize = 1 << 20;
/// Pieces in flight between a file's thread and the runtime.
const PIECES_QUEUED: usize = 16;
/// Bytes written between syncs of a file being received.
pub const SYNC_EVERY: u64 = 64 << 20;

/// The pieces of `file` from where it stands to its end, read on a thread of its own.
pub fn read_pieces(mut file: std::fs::File) -> mpsc::Receiver<std::io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(PIECES_QUEUED);
    std::thread::Builder::new()
        .name("tusk-snapshot-read".into())
        .spawn(move || loop {
            let mut buf = vec![0u8; PIECE];
            let piece = match file.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                }
                Err(e) => Err(e),
            };
            let failed = piece.is_err();
            if tx.blocking_send(piece).is_err() || failed {
                return;
            }
        })
        .expect("a thread to read a snapshot");
    rx
}

/// Writes pieces sent to it into a file, on threads of their own (see the module doc).
pub struct Writer {
    pieces: mpsc::Sender<Bytes>,
    done: std::thread::JoinHandle<std::io::Result<std::fs::File>>,
}

impl Writer {
    pub fn new(file: std::fs::File) -> std::io::Result<Writer> {
        let (pieces, mut rx) = mpsc::channel::<Bytes>(PIECES_QUEUED);
        let syncing = file.try_clone()?;
        let done = std::thread::Builder::new().name("tusk-snapshot-write".into()).spawn(move || {
            let mut file = file;
            let (sync_tx, sync_rx) = std::sync::mpsc::channel::<()>();
            let syncer = std::thread::Builder::new().name("tusk-snapshot-sync".into()).spawn(move || -> std::io::Result<()> {
                while sync_rx.recv().is_ok() {
                    // Several requests queued mean as many syncs: one covers them all.
                    while sync_rx.try_recv().is_ok() {}
                    syncing.sync_data()?;
                }
                Ok(())
            })?;
            let (mut written, mut asked) = (0u64, 0u64);
            let mut wrote = Ok(());
            while let Some(piece) = rx.blocking_recv() {
                if let Err(e) = file.write_all(&piece) {
                    wrote = Err(e);
                    break;
                }
                written += piece.len() as u64;
                if written - asked >= SYNC_EVERY {
                    asked = written;
                    let _ = sync_tx.send(());
                }
            }
            drop(sync_tx);
            let synced = syncer.join().unwrap_or_else(|_| Err(std::io::Error::other("the snapshot sync thread panicked")));
            wrote?;
            synced?;
            file.sync_data()?;
            Ok(file)
        })?;
        Ok(Writer { pieces, done })
    }

    /// Queues `piece` to be written; false if the writer stopped (its error comes from
    /// [`Writer::finish`]).
    pub async fn write(&self, piece: Bytes) -> bool {
        self.pieces.send(piece).await.is_ok()
    }

    /// [`Writer::write`] from a thread outside the runtime.
    pub fn write_blocking(&self, piece: Bytes) -> bool {
        self.pieces.blocking_send(piece).is_ok()
    }

    /// [`Writer::finish`] from a thread outside the runtime.
    pub fn finish_blocking(self) -> std::io::Result<std::fs::File> {
        let Writer { pieces, done } = self;
        drop(pieces);
        done.join().unwrap_or_else(|_| Err(std::io::Error::other("the snapshot write thread panicked")))
    }

    /// Waits until every piece is written and synced; the file.
    pub async fn finish(self) -> std::io::Result<std::fs::File> {
        let Writer { pieces, done } = self;
        drop(pieces);
        tokio::task::spawn_blocking(move || done.join().unwrap_or_else(|_| Err(std::io::Error::other("the snapshot write thread panicked"))))
            .await
            .map_err(std::io::Error::other)?
    }
}
