//! Read-only memory maps of files (log segments during recovery): no copy through a read
//! buffer, no zeroing of one.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::StorageError;

pub struct MappedFile {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value.
unsafe impl Send for MappedFile {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Maps all of `path`. The file must not shrink while mapped (recovery truncates torn
    /// tails only past the last byte it will read).
    /// Nothing is read ahead until [`MappedFile::will_need`] says from where.
    pub fn map(path: &Path) -> Result<MappedFile, StorageError> {
        let file = File::open(path).map_err(|e| StorageError::io(path, e))?;
        let len = file.metadata().map_err(|e| StorageError::io(path, e))?.len() as usize;
        if len == 0 {
            return Ok(MappedFile { ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(), len: 0 });
        }
        // SAFETY: read-only private mapping of a file we opened; checked for MAP_FAILED.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(StorageError::io(path, std::io::Error::last_os_error()));
        }
        Ok(MappedFile { ptr: ptr as *const u8, len })
    }

    /// Reads the file from `from` (rounded down to a page) to its end ahead, now. Not
    /// MADV_SEQUENTIAL: that frees pages soon after they are read, and recovery reads every
    /// record twice (scan, then replay), so a cold log was read from disk twice.
    pub fn will_need(&self, from: usize) {
        let from = from.min(self.len) / crate::PAGE_SIZE as usize * crate::PAGE_SIZE as usize;
        if from < self.len {
            // SAFETY: advice on a page-aligned part of our own mapping; it changes no contents.
            unsafe { libc::madvise(self.ptr.add(from) as *mut libc::c_void, self.len - from, libc::MADV_WILLNEED) };
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping covers `len` readable bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly what `open` mapped.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }
}
