//! The recording backend of power-cut crash runs, and the power cut itself.
//!
//! A power cut keeps what was fsynced and an arbitrary subset of the later writes, each torn
//! at 512-byte sectors (the model of ALICE and CrashMonkey). A process that is killed cannot
//! say what it had synced, so [`RecordingIo`] writes the real data to the real files and, beside
//! them, a journal: before each write, the file, the range and the bytes it overwrites; after
//! each fdatasync, that the file is synced. After the writer died, [`power_cut`] reads the
//! journal and rolls every write not followed by a sync of its file back, sector by sector, as
//! a chooser decides — what the disk would hold had the power failed at the moment of the kill.
//!
//! Limits of the model: metadata operations (file creation, rename, unlink) that the store does
//! outside the backend are each followed at once by a directory fsync, and are taken as durable.
//! A journal entry is appended before its write starts and a sync entry after its fdatasync
//! returned, so a write is never taken as synced when it was not; one backend writes its files
//! one request after the other, and two backends (log, checkpoint) never share a file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::sync::{fdatasync, pwrite_all};
use super::{IoBackend, WriteSync};
use crate::StorageError;

/// Sector size of the power-cut model: a sector is written whole or not at all.
pub const SECTOR: u64 = 512;

const KIND_WRITE: u8 = b'W';
const KIND_SYNC: u8 = b'S';

/// Where a recording backend writes its journal.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    /// The journal file (appended to; several backends may share it).
    pub journal: PathBuf,
    /// Pause between writing a batch and syncing it: widens the window in which a crash
    /// finds writes not yet durable.
    pub window: Duration,
    /// Failures to inject as well (a group's crash runs cut a node's power and fail its
    /// disk): requests the plan refuses are neither written nor journaled.
    pub faults: Option<std::sync::Arc<super::FaultPlan>>,
}

/// Writes through plain pwrite + fdatasync, journaling every write and every sync.
pub struct RecordingIo {
    journal: File,
    window: Duration,
}

impl RecordingIo {
    pub fn new(config: &RecordConfig) -> std::io::Result<RecordingIo> {
        let journal = OpenOptions::new().create(true).append(true).open(&config.journal)?;
        Ok(RecordingIo { journal, window: config.window })
    }

    /// Appends one entry with a single write(2) (O_APPEND): a kill leaves at most the last
    /// entry incomplete, and its checksum tells.
    fn append(&mut self, body: &[u8]) -> std::io::Result<()> {
        let mut frame = Vec::with_capacity(body.len() + 8);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        frame.extend_from_slice(body);
        self.journal.write_all(&frame)
    }

    /// Journals a write before it happens: the file's length and the bytes it overwrites.
    fn record_write(&mut self, path: &Path, offset: u64, len: u64) -> std::io::Result<()> {
        let file = File::open(path)?;
        let old_len = file.metadata()?.len();
        let end = (offset + len).min(old_len);
        let mut old = vec![0u8; end.saturating_sub(offset) as usize];
        if !old.is_empty() {
            file.read_exact_at(&mut old, offset)?;
        }
        let mut body = vec![KIND_WRITE];
        push_path(&mut body, path);
        body.extend_from_slice(&offset.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(&old_len.to_le_bytes());
        body.extend_from_slice(&old);
        self.append(&body)
    }

    fn record_sync(&mut self, path: &Path) -> std::io::Result<()> {
        let mut body = vec![KIND_SYNC];
        push_path(&mut body, path);
        self.append(&body)
    }
}

fn push_path(body: &mut Vec<u8>, path: &Path) {
    let bytes = path.as_os_str().as_encoded_bytes();
    body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    body.extend_from_slice(bytes);
}

/// The file a descriptor refers to (Linux: the /proc link).
fn fd_path(fd: std::os::fd::RawFd) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
}

impl IoBackend for RecordingIo {
    fn name(&self) -> String {
        "recording(sync)".into()
    }

    fn write_and_sync(&mut self, reqs: &[WriteSync<'_>]) -> Vec<std::io::Result<()>> {
        // Every write of the batch first, then every sync: a crash in between finds them all
        // written and none durable.
        let written: Vec<std::io::Result<PathBuf>> = reqs
            .iter()
            .map(|r| {
                let path = fd_path(r.fd)?;
                self.record_write(&path, r.offset, r.data.len() as u64)?;
                pwrite_all(r.fd, r.offset, r.data)?;
                Ok(path)
            })
            .collect();
        if !self.window.is_zero() {
            std::thread::sleep(self.window);
        }
        reqs.iter()
            .zip(written)
            .map(|(r, w)| {
                let path = w?;
                fdatasync(r.fd)?;
                self.record_sync(&path)
            })
            .collect()
    }

    fn write(&mut self, req: &WriteSync<'_>) -> std::io::Result<()> {
        let path = fd_path(req.fd)?;
        self.record_write(&path, req.offset, req.data.len() as u64)?;
        pwrite_all(req.fd, req.offset, req.data)
    }

    fn sync(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<()> {
        let path = fd_path(fd)?;
        fdatasync(fd)?;
        self.record_sync(&path)
    }
}

/// One journal entry.
#[derive(Debug)]
enum Entry {
    Write { path: PathBuf, offset: u64, len: u64, old_len: u64, old: Vec<u8> },
    Sync { path: PathBuf },
}

fn take<'a>(body: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if body.len() < n {
        return None;
    }
    let (head, rest) = body.split_at(n);
    *body = rest;
    Some(head)
}

fn take_u64(body: &mut &[u8]) -> Option<u64> {
    take(body, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

fn take_path(body: &mut &[u8]) -> Option<PathBuf> {
    let len = u32::from_le_bytes(take(body, 4)?.try_into().ok()?) as usize;
    let bytes = take(body, len)?;
    Some(PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes)))
}

fn decode_entry(mut body: &[u8]) -> Option<Entry> {
    let kind = take(&mut body, 1)?[0];
    let path = take_path(&mut body)?;
    match kind {
        KIND_WRITE => {
            let offset = take_u64(&mut body)?;
            let len = take_u64(&mut body)?;
            let old_len = take_u64(&mut body)?;
            Some(Entry::Write { path, offset, len, old_len, old: body.to_vec() })
        }
        KIND_SYNC => Some(Entry::Sync { path }),
        _ => None,
    }
}

/// The journal's entries up to the first incomplete one (the writer may have died inside an
/// append).
fn read_journal(journal: &Path) -> Result<Vec<Entry>, StorageError> {
    let mut data = Vec::new();
    match File::open(journal) {
        Ok(mut f) => f.read_to_end(&mut data).map_err(|e| StorageError::io(journal, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StorageError::io(journal, e)),
    };
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 8 <= data.len() {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        let Some(body) = data.get(at + 8..at + 8 + len) else { break };
        if crc32fast::hash(body) != crc {
            break;
        }
        match decode_entry(body) {
            Some(e) => out.push(e),
            None => break,
        }
        at += 8 + len;
    }
    Ok(out)
}

/// What a power cut did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PowerCut {
    /// Writes in the journal.
    pub writes: u64,
    /// Writes no later fsync of their file covered: the ones the cut may lose.
    pub unsynced: u64,
    /// Sectors of unsynced writes kept, and lost (restored to what was there before).
    pub sectors_kept: u64,
    pub sectors_lost: u64,
    /// Unsynced writes to files that no longer exist (deleted after the write).
    pub files_gone: u64,
}

/// Applies a power cut to the files a [`RecordingIo`] wrote, as its journal describes: every
/// write that no later fsync of its file covered keeps each of its sectors only where
/// `keep(path, sector_offset)` says so; a lost sector gets back the bytes it overwrote (zeros
/// past the file's old end), and a file shrinks back to end at its last kept sector (never
/// below its old length). Writes are undone newest first.
pub fn power_cut(journal: &Path, keep: &mut dyn FnMut(&Path, u64) -> bool) -> Result<PowerCut, StorageError> {
    let entries = read_journal(journal)?;
    let mut cut = PowerCut::default();
    let mut unsynced = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if let Entry::Write { path, .. } = e {
            cut.writes += 1;
            let synced = entries[i + 1..].iter().any(|later| matches!(later, Entry::Sync { path: p } if p == path));
            if !synced {
                unsynced.push(e);
            }
        }
    }
    cut.unsynced = unsynced.len() as u64;
    for e in unsynced.into_iter().rev() {
        let Entry::Write { path, offset, len, old_len, old } = e else { continue };
        let file = match OpenOptions::new().write(true).open(path) {
            Ok(f) => f,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                cut.files_gone += 1;
                continue;
            }
            Err(err) => return Err(StorageError::io(path, err)),
        };
        let current = file.metadata().map_err(|err| StorageError::io(path, err))?.len();
        let end = offset + len;
        let mut kept_end = 0u64;
        let mut sector = *offset;
        while sector < end {
            let sector_end = (sector + SECTOR).min(end);
            if keep(path, sector) {
                cut.sectors_kept += 1;
                kept_end = sector_end;
            } else {
                cut.sectors_lost += 1;
                let mut before = vec![0u8; (sector_end - sector) as usize];
                // Bytes below the old end come back from the journal; past it, zeros.
                let old_part = old_len.saturating_sub(sector).min(sector_end - sector) as usize;
                let from = (sector - offset) as usize;
                if old_part > 0 {
                    let saved = old.get(from..from + old_part).ok_or_else(|| {
                        StorageError::io(journal, std::io::Error::other(format!("journal entry for {} lacks the old bytes", path.display())))
                    })?;
                    before[..old_part].copy_from_slice(saved);
                }
                file.write_all_at(&before, sector).map_err(|err| StorageError::io(path, err))?;
            }
            sector = sector_end;
        }
        // The write made the file's end: it ends where its last kept sector does now.
        if end >= current {
            let new_len = kept_end.max(*old_len);
            if new_len < current {
                file.set_len(new_len).map_err(|err| StorageError::io(path, err))?;
            }
        }
        file.sync_all().map_err(|err| StorageError::io(path, err))?;
    }
    Ok(cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn backend(dir: &Path) -> RecordingIo {
        RecordingIo::new(&RecordConfig { journal: dir.join("journal"), window: Duration::ZERO, faults: None }).unwrap()
    }

    /// Runs one request and forgets its sync entry, as if the kill came between the write and
    /// the fsync: the journal then holds an unsynced write.
    fn write_unsynced(dir: &Path, file: &File, offset: u64, data: &[u8]) {
        let journal = dir.join("journal");
        let before = std::fs::metadata(&journal).map_or(0, |m| m.len());
        let mut io = backend(dir);
        let results = io.write_and_sync(&[WriteSync { fd: file.as_raw_fd(), offset, data }]);
        assert!(results[0].is_ok());
        // Drop the trailing sync entry.
        let bytes = std::fs::read(&journal).unwrap();
        let mut at = before as usize;
        let mut last_start = at;
        while at < bytes.len() {
            last_start = at;
            at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        }
        std::fs::write(&journal, &bytes[..last_start]).unwrap();
    }

    fn setup() -> (tempfile::TempDir, PathBuf, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).unwrap();
        (dir, path, file)
    }

    #[test]
    fn synced_writes_survive_every_cut() {
        let (dir, path, file) = setup();
        let mut io = backend(dir.path());
        let data = vec![7u8; 4096];
        assert!(io.write_and_sync(&[WriteSync { fd: file.as_raw_fd(), offset: 0, data: &data }])[0].is_ok());
        let cut = power_cut(&dir.path().join("journal"), &mut |_, _| false).unwrap();
        assert_eq!((cut.writes, cut.unsynced, cut.sectors_lost), (1, 0, 0));
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    #[test]
    fn unsynced_append_loses_chosen_sectors_and_shrinks_to_the_last_kept() {
        let (dir, path, file) = setup();
        let mut io = backend(dir.path());
        let first = vec![1u8; 4096];
        assert!(io.write_and_sync(&[WriteSync { fd: file.as_raw_fd(), offset: 0, data: &first }])[0].is_ok());
        let second = vec![2u8; 4096];
        write_unsynced(dir.path(), &file, 4096, &second);
        // Keep sectors 1 and 3 of the eight; lose the rest.
        let mut cut = power_cut(&dir.path().join("journal"), &mut |_, at| at == 4096 + 512 || at == 4096 + 3 * 512).unwrap();
        assert_eq!((cut.writes, cut.unsynced, cut.sectors_kept, cut.sectors_lost), (2, 1, 2, 6));
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back.len(), 4096 + 4 * 512, "the file ends with its last kept sector");
        assert_eq!(&back[..4096], &first[..], "the synced write is untouched");
        assert!(back[4096..4096 + 512].iter().all(|&b| b == 0), "a lost sector past the old end reads zeros");
        assert!(back[4096 + 512..4096 + 1024].iter().all(|&b| b == 2));
        assert!(back[4096 + 1024..4096 + 1536].iter().all(|&b| b == 0));
        assert!(back[4096 + 1536..].iter().all(|&b| b == 2));
        // The cut is applied once: a second run over the same journal changes nothing kept.
        cut = power_cut(&dir.path().join("journal"), &mut |_, _| true).unwrap();
        assert_eq!(cut.sectors_lost, 0);
        assert_eq!(std::fs::read(&path).unwrap(), back);
    }

    #[test]
    fn losing_every_sector_restores_the_old_file() {
        let (dir, path, file) = setup();
        let mut io = backend(dir.path());
        let first: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        assert!(io.write_and_sync(&[WriteSync { fd: file.as_raw_fd(), offset: 0, data: &first }])[0].is_ok());
        // An overwrite straddling the old end, then an append: both unsynced.
        write_unsynced(dir.path(), &file, 4096, &vec![9u8; 8192]);
        write_unsynced(dir.path(), &file, 12288, &vec![5u8; 1024]);
        let cut = power_cut(&dir.path().join("journal"), &mut |_, _| false).unwrap();
        assert_eq!(cut.unsynced, 2);
        assert_eq!(std::fs::read(&path).unwrap(), first, "old bytes come back, the file shrinks to its old length");
    }

    /// The split the checkpointer uses: writes through `write`, one `sync` at the end. Before
    /// the sync a cut may lose them; after it, none.
    #[test]
    fn backend_writes_are_durable_only_after_the_backend_syncs_the_file() {
        let (dir, path, file) = setup();
        let mut io = backend(dir.path());
        let data = vec![6u8; 8192];
        io.write(&WriteSync { fd: file.as_raw_fd(), offset: 0, data: &data[..4096] }).unwrap();
        io.write(&WriteSync { fd: file.as_raw_fd(), offset: 4096, data: &data[4096..] }).unwrap();
        let journal = std::fs::read(dir.path().join("journal")).unwrap();
        let cut = power_cut(&dir.path().join("journal"), &mut |_, _| false).unwrap();
        assert_eq!(cut.unsynced, 2, "written, not synced: a cut loses both");
        assert!(std::fs::read(&path).unwrap().is_empty());

        std::fs::write(dir.path().join("journal"), journal).unwrap();
        let mut io = backend(dir.path());
        io.write(&WriteSync { fd: file.as_raw_fd(), offset: 0, data: &data }).unwrap();
        io.sync(file.as_raw_fd()).unwrap();
        let cut = power_cut(&dir.path().join("journal"), &mut |_, _| false).unwrap();
        assert_eq!(cut.unsynced, 0, "the sync covers every write before it");
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    #[test]
    fn a_later_sync_of_the_file_makes_earlier_writes_durable() {
        let (dir, path, file) = setup();
        write_unsynced(dir.path(), &file, 0, &[3u8; 1024]);
        let mut io = backend(dir.path());
        assert!(io.write_and_sync(&[WriteSync { fd: file.as_raw_fd(), offset: 1024, data: &[4u8; 1024] }])[0].is_ok());
        let cut = power_cut(&dir.path().join("journal"), &mut |_, _| false).unwrap();
        assert_eq!(cut.unsynced, 0, "the fsync after the second write covers the first");
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back.len(), 2048);
        assert!(back[..1024].iter().all(|&b| b == 3) && back[1024..].iter().all(|&b| b == 4));
    }

    #[test]
    fn a_torn_journal_entry_is_ignored() {
        let (dir, path, file) = setup();
        write_unsynced(dir.path(), &file, 0, &[6u8; 512]);
        let journal = dir.path().join("journal");
        let mut bytes = std::fs::read(&journal).unwrap();
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2]);
        std::fs::write(&journal, bytes).unwrap();
        let cut = power_cut(&journal, &mut |_, _| false).unwrap();
        assert_eq!((cut.writes, cut.unsynced), (1, 1));
        assert_eq!(std::fs::read(&path).unwrap().len(), 0);
    }

    #[test]
    fn missing_journal_is_no_cut() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(power_cut(&dir.path().join("none"), &mut |_, _| false).unwrap(), PowerCut::default());
    }
}
