//! Snapshots for query readers (docs/ARCHITECTURE.md, Snapshots).
//!
//! - [`gate`]: the barrier commit write-back passes and a snapshot closes.
//! - [`copy`]: the consistent incremental page copy, shared by memcpy snapshots and the GPU
//!   mirror (any [`copy::PageSink`]).
//! - [`image`]: the in-memory image target of memcpy snapshots.
//! - fork snapshots: [`Engine::fork_server`](crate::engine::Engine::fork_server) forks under the closed gate.

pub mod copy;
pub mod gate;
#[cfg(not(loom))]
pub mod image;

#[cfg(not(loom))]
mod fork {
    use std::time::Duration;

    use tusk_storage::process::ForkServer;
    use tusk_storage::{Heap, StorageError};

    use crate::engine::Engine;
    use crate::TxnError;

    impl Engine {
        /// Forks a child whose copy-on-write image of the heap is the committed state at the
        /// returned LSN; it answers requests with `serve(heap, request, answer)` (see
        /// [`ForkServer`]). Writers are held for the fork itself, the returned pause. Also
        /// starts a dirty epoch: pages stamped above the returned one changed after the fork.
        pub fn fork_server(
            &self,
            shm_bytes: usize,
            serve: impl Fn(&Heap, &[u8], &mut [u8]) -> usize,
        ) -> Result<(ForkServer, u64, u64, Duration), TxnError> {
            let heap = self.heap();
            // The child closes the image files and runs no loaders: every chunk first.
            heap.load_all().map_err(TxnError::DamagedChunk)?;
            let ((server, lsn, epoch), pause) = self.with_gate_closed(|lsn| {
                let server = ForkServer::spawn(shm_bytes, |req, out| serve(heap, req, out));
                (server, lsn, self.advance_dirty_epoch())
            })?;
            let server = server.map_err(|e| TxnError::Storage(StorageError::io("fork", e)))?;
            Ok((server, lsn, epoch, pause))
        }
    }
}
