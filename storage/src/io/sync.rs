//! Plain pwrite + fdatasync, one request after the other.

use std::os::fd::RawFd;

use super::{IoBackend, WriteSync};

/// The portable backend, and the fallback when io_uring is unavailable.
pub struct SyncIo;

/// Writes all of `data` at `offset` of `fd`, retrying short writes and EINTR.
pub fn pwrite_all(fd: RawFd, mut offset: u64, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a valid readable slice for its length; fd validity is checked by the kernel.
        let n = unsafe { libc::pwrite(fd, data.as_ptr() as *const libc::c_void, data.len(), offset as libc::off_t) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
        }
        data = &data[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

/// Fills `buf` from `offset` of `fd`; returns how many bytes were read (less only at the
/// end of the file). Retries short reads and EINTR.
pub fn pread_full(fd: RawFd, mut offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid writable slice for its length.
        let n = unsafe { libc::pread(fd, rest.as_mut_ptr() as *mut libc::c_void, rest.len(), offset as libc::off_t) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
        offset += n as u64;
    }
    Ok(done)
}

/// fdatasync, retrying EINTR.
pub fn fdatasync(fd: RawFd) -> std::io::Result<()> {
    loop {
        // SAFETY: plain syscall on a descriptor; no memory is passed.
        if unsafe { libc::fdatasync(fd) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Writes back everything pending on the file system holding `path` (syncfs): lets a
/// measurement start from a disk that is not still busy with earlier writes and deletions.
pub fn sync_file_system(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path)?;
    // SAFETY: plain syscall on a descriptor that `dir` keeps open; no memory is passed.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl IoBackend for SyncIo {
    fn name(&self) -> String {
        "sync".into()
    }

    fn write_and_sync(&mut self, reqs: &[WriteSync<'_>]) -> Vec<std::io::Result<()>> {
        reqs.iter().map(|r| pwrite_all(r.fd, r.offset, r.data).and_then(|()| fdatasync(r.fd))).collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sync_backend_writes_batches() {
        super::super::backend_tests::batch_writes_land(&mut super::SyncIo);
    }
}
