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

/// Starts reading `len` bytes at `offset` of `fd` into the page cache and returns without
/// waiting for them (`posix_fadvise` WILLNEED): a read of them that follows finds them there
/// or on their way. Advice only: where the kernel declines, the read reads them itself.
pub fn start_reading(fd: RawFd, offset: u64, len: u64) {
    // SAFETY: posix_fadvise touches no memory of ours; any descriptor and range are valid
    // arguments (a bad one is an error return, ignored).
    unsafe { libc::posix_fadvise(fd, offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_WILLNEED) };
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

/// `FS_NOCOW_FL` of `linux/fs.h` (the libc crate does not export it): a btrfs inode flag,
/// inherited by the files and folders created in a folder that carries it.
const FS_NOCOW_FL: libc::c_long = 0x0080_0000;

/// On btrfs, marks the folder `dir` no-copy-on-write, so the files created in it from now on
/// (log segments) are overwritten in place: a log flush into a segment's zero-ahead space then
/// allocates no new extent, and its fdatasync commits less to btrfs's log tree. btrfs's own
/// data checksums are off for such files; every log record carries its own crc. Returns
/// whether the flag was set (false on other file systems, where overwrites are in place
/// already).
pub fn prefer_in_place_writes(dir: &std::path::Path) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let folder = std::fs::File::open(dir)?;
    let fd = folder.as_raw_fd();
    // SAFETY: fstatfs fills the zeroed struct it is given, which lives through the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fs` is a valid, writable statfs; `fd` is open for the call's duration.
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if fs.f_type as libc::c_long != libc::BTRFS_SUPER_MAGIC as libc::c_long {
        return Ok(false);
    }
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long into `flags`, which outlives the call.
    if unsafe { libc::ioctl(fd, libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    flags |= FS_NOCOW_FL;
    // SAFETY: FS_IOC_SETFLAGS reads one long from `flags`, which outlives the call.
    if unsafe { libc::ioctl(fd, libc::FS_IOC_SETFLAGS, &flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(true)
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
