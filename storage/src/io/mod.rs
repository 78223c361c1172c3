//! I/O backends: how log buffers and checkpoint images reach the disk.
//!
//! Every backend does one thing: write a batch of buffers, each at an offset of its file,
//! and make each file's data durable (fdatasync), with all requests of a batch in flight
//! together. [`uring::UringIo`] submits them as linked write+fsync pairs on one io_uring;
//! [`sync::SyncIo`] does pwrite + fdatasync one after the other; [`fault::FaultyIo`] wraps
//! another backend and fails chosen requests (tests and crash runs); [`record::RecordingIo`]
//! journals every write and sync so that a crash run can cut the power afterwards.

pub mod aligned;
pub mod fault;
pub mod record;
pub mod sync;
pub mod uring;

use std::os::fd::RawFd;
use std::sync::Arc;

pub use aligned::{AlignedBuf, DIRECT_ALIGN};
pub use fault::FaultPlan;
pub use record::{power_cut, PowerCut, RecordConfig};

/// One request of a batch: write `data` at `offset` of `fd`, then fdatasync `fd`.
#[derive(Clone, Copy, Debug)]
pub struct WriteSync<'a> {
    pub fd: RawFd,
    pub offset: u64,
    pub data: &'a [u8],
}

/// A way of writing durable data.
pub trait IoBackend: Send {
    /// Short name for reports ("io_uring", "sync", "faulty(..)").
    fn name(&self) -> String;

    /// Performs every request; returns one result per request, in order. A request is Ok
    /// only when all its bytes were written and the fdatasync that followed succeeded.
    fn write_and_sync(&mut self, reqs: &[WriteSync<'_>]) -> Vec<std::io::Result<()>>;

    /// Writes all of `req` without a sync: its bytes are durable only once a later
    /// [`IoBackend::sync`] of the same file returned (a checkpoint writes its segment's images
    /// so, then syncs the file once).
    fn write(&mut self, req: &WriteSync<'_>) -> std::io::Result<()> {
        sync::pwrite_all(req.fd, req.offset, req.data)
    }

    /// fdatasync of `fd`: every write to it before the call is durable when it returns Ok.
    fn sync(&mut self, fd: RawFd) -> std::io::Result<()> {
        sync::fdatasync(fd)
    }
}

/// Which backend a store uses.
#[derive(Clone, Debug, Default)]
pub enum Io {
    /// io_uring when the kernel allows it, plain pwrite/fdatasync otherwise.
    #[default]
    Auto,
    /// io_uring, or an error at open when io_uring_setup fails.
    Uring,
    /// Plain pwrite + fdatasync.
    Sync,
    /// The automatic backend wrapped in fault injection (for tests and crash runs).
    Faulty(Arc<FaultPlan>),
    /// Plain pwrite + fdatasync that journals every write and sync, so that a crash run can
    /// apply a power cut afterwards ([`record::power_cut`]); with `faults`, failing the
    /// requests a plan refuses as `Faulty` does.
    Recording(RecordConfig),
}

/// Opens `path` for appending log or checkpoint data with O_DIRECT (no page-cache copy),
/// falling back to buffered I/O where the file system refuses O_DIRECT (tmpfs). Writes to it
/// must be [`DIRECT_ALIGN`]-aligned in address, length and offset either way.
pub fn open_direct(path: &std::path::Path, create_new: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags: i32| {
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).custom_flags(flags);
        if create_new {
            o.create_new(true);
        }
        o.open(path)
    };
    match open(libc::O_DIRECT) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            if create_new {
                // The failed attempt may have created the file before refusing O_DIRECT.
                let _ = std::fs::remove_file(path);
            }
            open(0)
        }
        other => other,
    }
}

/// Opens `path` for reading with O_DIRECT (straight from the device into an aligned
/// buffer), or buffered where the file system refuses O_DIRECT.
pub fn open_direct_read(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => std::fs::File::open(path),
        other => other,
    }
}

/// Opens the backend `io` names.
pub fn open_backend(io: &Io) -> std::io::Result<Box<dyn IoBackend>> {
    match io {
        Io::Auto => Ok(match uring::UringIo::new() {
            Ok(ring) => Box::new(ring),
            Err(_) => Box::new(sync::SyncIo),
        }),
        Io::Uring => Ok(Box::new(uring::UringIo::new()?)),
        Io::Sync => Ok(Box::new(sync::SyncIo)),
        Io::Faulty(plan) => Ok(Box::new(fault::FaultyIo::new(open_backend(&Io::Auto)?, plan.clone()))),
        Io::Recording(config) => {
            let recording = Box::new(record::RecordingIo::new(config)?);
            Ok(match &config.faults {
                Some(plan) => Box::new(fault::FaultyIo::new(recording, plan.clone())),
                None => recording,
            })
        }
    }
}

/// Opens the backend for one log partition's flushes. The log writes each partition's
/// flushes one at a time from the thread that holds the partition's flush slot (usually the
/// committer waiting for it), so io_uring would overlap nothing there and would punt every
/// fdatasync to an io-wq worker thread, adding a hand-off to each commit: `Auto` (and the
/// fault-injecting wrapper) use plain pwrite + fdatasync instead. `Uring` still gets io_uring.
pub fn open_log_backend(io: &Io) -> std::io::Result<Box<dyn IoBackend>> {
    match io {
        Io::Auto => Ok(Box::new(sync::SyncIo)),
        Io::Faulty(plan) => Ok(Box::new(fault::FaultyIo::new(Box::new(sync::SyncIo), plan.clone()))),
        other => open_backend(other),
    }
}

#[cfg(test)]
pub(crate) mod backend_tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Writes three files in one batch, twice, and reads them back.
    pub fn batch_writes_land(backend: &mut dyn IoBackend) {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<std::fs::File> = (0..3)
            .map(|i| {
                std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(dir.path().join(format!("f{i}"))).unwrap()
            })
            .collect();
        let payloads: Vec<Vec<u8>> = (0..3).map(|i| vec![b'a' + i as u8; 100_000 + i * 7]).collect();
        let reqs: Vec<WriteSync> =
            files.iter().zip(&payloads).map(|(f, p)| WriteSync { fd: f.as_raw_fd(), offset: 0, data: p }).collect();
        assert!(backend.write_and_sync(&reqs).iter().all(|r| r.is_ok()));
        let second: Vec<WriteSync> = files
            .iter()
            .zip(&payloads)
            .map(|(f, p)| WriteSync { fd: f.as_raw_fd(), offset: p.len() as u64, data: b"tail" })
            .collect();
        assert!(backend.write_and_sync(&second).iter().all(|r| r.is_ok()));
        for (i, p) in payloads.iter().enumerate() {
            let back = std::fs::read(dir.path().join(format!("f{i}"))).unwrap();
            assert_eq!(&back[..p.len()], &p[..]);
            assert_eq!(&back[p.len()..], b"tail");
        }
    }

    #[test]
    fn auto_backend_writes_batches() {
        let mut backend = open_backend(&Io::Auto).unwrap();
        batch_writes_land(backend.as_mut());
    }

    #[test]
    fn bad_descriptor_fails_only_its_request() {
        for io in [Io::Auto, Io::Sync] {
            let mut backend = open_backend(&io).unwrap();
            let file = tempfile::tempfile().unwrap();
            let reqs = [
                WriteSync { fd: file.as_raw_fd(), offset: 0, data: b"ok" },
                WriteSync { fd: -1, offset: 0, data: b"bad" },
            ];
            let results = backend.write_and_sync(&reqs);
            assert!(results[0].is_ok(), "{}", backend.name());
            assert!(results[1].is_err(), "{}", backend.name());
        }
    }
}
