//! The group's log entries on disk: append-only segment files in `NODE/raft-log/`, each named
//! by the index of its first entry, written through the node store's I/O backend (so that
//! crash runs journal, cut and fail them as they do the store's own files) and made durable by
//! a thread of their own. An append returns once its bytes are written and hears that they are
//! durable when an fdatasync begun after them has ended: many appends share one sync, and a
//! leader's write to its disk overlaps its followers' (openraft counts the leader's own copy
//! only once it is durable). Where nothing runs beside the appends (a follower, which answers
//! the leader once its append is durable) the appender syncs itself: no hand-off to wait for
//! ([`Segments::sync_in_background`]).
//!
//! A frame: `[u32 body length][u32 crc32 of the rest][u64 index][u64 durable][body]`, where
//! `durable` is how many bytes of its segment were known durable when it was written (an
//! fdatasync begun after them had ended). A small append that extends its segment writes zeros
//! ahead of itself ([`ZERO_AHEAD`], as the store's log does): the next appends overwrite blocks
//! the file has, and their fdatasync commits no file size or allocation to the file system's
//! journal. Opening scans every segment: a frame torn or failing its checksum (zeros included)
//! ends the last segment (the tail a crash left, cut off) — unless a sound frame after it says
//! its bytes were durable before: then they were synced and have since been damaged, and the
//! entries there may have been acknowledged, so cutting them could lose a commit. Such damage,
//! and any in an earlier segment (cut to its frames and synced before the next was begun), is
//! reported with file and offset, and the log does not open. (Damage to the last synced
//! frames, with nothing sound written after them, looks like a torn write and is cut.)
//! Entries of a segment follow each other; a gap between segments is allowed only below the
//! log's purged index.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tusk_storage::io::sync::prefer_in_place_writes;
use tusk_storage::io::{open_log_backend, Io, IoBackend, WriteSync};
use tusk_storage::log_format::{ZERO_AHEAD, ZERO_AHEAD_MAX_FLUSH};

/// Bytes after which the writer begins a new segment (purging deletes whole segments).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Bytes of a frame's header.
const HEADER: usize = 24;
/// Largest body a frame may claim (a larger length is damage, not an entry).
const MAX_BODY: usize = 1 << 30;

/// Told once an append is durable, or that it never will be.
pub type Done = Box<dyn FnOnce(std::io::Result<()>) + Send>;

#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: damaged at byte {offset}: {why}", path.display())]
    Damaged { path: PathBuf, offset: u64, why: String },
    #[error("the group's log failed earlier and takes no more entries: {0}")]
    Failed(String),
    #[error("entry {got} appended after entry {last:?} (purged up to {purged:?}): entries must follow each other")]
    NotNext { got: u64, last: Option<u64>, purged: Option<u64> },
    #[error("{} is open elsewhere", .0.display())]
    Locked(PathBuf),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io { path: path.to_path_buf(), source }
}

struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Where entry `first + i`'s frame begins.
    starts: Vec<u64>,
    /// Where the next frame goes.
    end: u64,
    /// The file's length: zeros from `end` on, written ahead.
    allocated: u64,
}

impl Segment {
    fn last(&self) -> Option<u64> {
        (!self.starts.is_empty()).then(|| self.first + self.starts.len() as u64 - 1)
    }

    /// The byte range of entries `from..=to` (both within the segment).
    fn range(&self, from: u64, to: u64) -> (u64, u64) {
        let (a, b) = ((from - self.first) as usize, (to - self.first) as usize);
        (self.starts[a], self.starts.get(b + 1).copied().unwrap_or(self.end))
    }
}

#[derive(Default)]
struct State {
    segments: VecDeque<Segment>,
    /// Entries up to this index are gone (a snapshot holds them).
    purged: Option<u64>,
    /// Appends, counted; `written`: the last one whose bytes are all written.
    written: u64,
    /// Appends not yet known durable, oldest first: their count, the segment they went to
    /// (its first index) and where they ended in it.
    waiting: VecDeque<(u64, u64, u64, Done)>,
    /// Bytes of the last segment known durable (frames written carry it).
    durable: u64,
    /// Why the log takes nothing more (a write or a sync failed).
    failed: Option<String>,
    closing: bool,
}

impl State {
    fn last(&self) -> Option<u64> {
        self.segments.back().and_then(Segment::last)
    }
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
    /// Two instances of the node's backend: the appender's writes never wait for the sync
    /// thread's fdatasync. Holding `writer` is holding the right to change the segments.
    writer: Mutex<Box<dyn IoBackend>>,
    syncer: Mutex<Box<dyn IoBackend>>,
    segment_bytes: u64,
    /// Whether the sync thread syncs appends, or the appender itself.
    background: std::sync::atomic::AtomicBool,
    _lock: File,
}

/// Tells the sync thread to finish once the last handle is gone.
struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.state.lock().closing = true;
        self.0.wake.notify_all();
    }
}

/// The segments of one node's log (cheap to clone: readers share them).
#[derive(Clone)]
pub struct Segments {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

fn frame_into(buf: &mut Vec<u8>, index: u64, durable: u64, body: &[u8]) {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&index.to_le_bytes());
    crc.update(&durable.to_le_bytes());
    crc.update(body);
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    buf.extend_from_slice(&durable.to_le_bytes());
    buf.extend_from_slice(body);
}

/// A sound frame's parts.
struct Frame<'b> {
    index: u64,
    body: &'b [u8],
    /// Its length, header included.
    len: usize,
}

/// The little-endian word at `at` of `bytes`.
fn word_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The frame at the start of `bytes`; `Err` says why it is not one.
fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>, String> {
    if bytes.len() < HEADER {
        return Err(format!("a frame's header cut short ({} bytes)", bytes.len()));
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let index = word_at(bytes, 8);
    if len > MAX_BODY {
        return Err(format!("a frame claims {len} bytes"));
    }
    let Some(body) = bytes.get(HEADER..HEADER + len) else { return Err(format!("a frame of {len} bytes cut short")) };
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[8..HEADER]);
    h.update(body);
    if h.finalize() != crc {
        return Err(format!("entry {index}'s checksum does not match"));
    }
    Ok(Frame { index, body, len: HEADER + len })
}

/// A sound frame after the unsound one at `bad` (entry `expected` belonged there) that was
/// written once byte `bad` was durable: its entry and where it lies. Only such a frame is
/// looked for, so every byte after `bad` is tried as a frame's start (the unsound frame's
/// length cannot be trusted), most of them rejected by their header alone.
fn durable_after(bytes: &[u8], bad: usize, expected: u64) -> Option<(u64, usize)> {
    (bad + 1..bytes.len().saturating_sub(HEADER - 1)).find_map(|at| {
        let (index, durable) = (word_at(bytes, at + 8), word_at(bytes, at + 16));
        // Entries after `bad` follow `expected`, at least a header's bytes apart, and a frame
        // never counts its own bytes durable.
        let plausible = index > expected && index - expected <= ((at - bad) / HEADER) as u64 && durable > bad as u64 && durable <= at as u64;
        (plausible && parse_frame(&bytes[at..]).is_ok_and(|f| f.index == index)).then_some((index, at))
    })
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

fn sync_dir(dir: &Path) -> Result<(), SegmentError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// What a segment's scan found where its frames end before its bytes do.
struct Unsound {
    offset: u64,
    why: String,
    /// A sound frame after it was written once its bytes were durable: damage, not a tear.
    durable_after: Option<(u64, u64)>,
}

/// Reads a segment's frames up to the first that is not whole and sound.
fn scan(path: &Path, first: u64) -> Result<(Segment, Option<Unsound>), SegmentError> {
    let file = OpenOptions::new().read(true).write(true).open(path).map_err(io_error(path))?;
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let mut segment = Segment { first, path: path.to_path_buf(), file: Arc::new(file), starts: Vec::new(), end: 0, allocated: bytes.len() as u64 };
    let mut at = 0usize;
    while at < bytes.len() {
        let expected = first + segment.starts.len() as u64;
        let why = match parse_frame(&bytes[at..]) {
            Ok(frame) if frame.index == expected => {
                segment.starts.push(at as u64);
                at += frame.len;
                segment.end = at as u64;
                continue;
            }
            Ok(frame) => format!("entry {} where entry {expected} belongs", frame.index),
            Err(why) => why,
        };
        let durable_after = durable_after(&bytes, at, expected).map(|(index, found)| (index, found as u64));
        return Ok((segment, Some(Unsound { offset: at as u64, why, durable_after })));
    }
    Ok((segment, None))
}

impl Segments {
    /// Opens (or creates) the segments in `dir`, written through `io`; entries up to
    /// `purged` are no longer needed (their segments are deleted).
    pub fn open(dir: &Path, io: &Io, purged: Option<u64>) -> Result<Segments, SegmentError> {
        Segments::open_sized(dir, io, purged, SEGMENT_BYTES)
    }

    /// [`Segments::open`], a new segment begun once one holds `segment_bytes`.
    fn open_sized(dir: &Path, io: &Io, purged: Option<u64>, segment_bytes: u64) -> Result<Segments, SegmentError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        prefer_in_place_writes(dir).map_err(io_error(dir))?;
        let lock_path = dir.join("LOCK");
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io_error(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(SegmentError::Locked(dir.to_path_buf())),
            Err(std::fs::TryLockError::Error(source)) => return Err(SegmentError::Io { path: lock_path, source }),
        }
        let mut firsts = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            if path.extension().is_some_and(|x| x == "seg") {
                let first = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u64>().ok());
                match first {
                    Some(first) => firsts.push((first, path)),
                    None => return Err(SegmentError::Damaged { path, offset: 0, why: "not a segment's name".into() }),
                }
            }
        }
        firsts.sort();
        let count = firsts.len();
        let mut segments: VecDeque<Segment> = VecDeque::new();
        for (k, (first, path)) in firsts.into_iter().enumerate() {
            let (mut segment, bad) = scan(&path, first)?;
            if let Some(Unsound { offset, why, durable_after }) = bad {
                if let Some((index, at)) = durable_after {
                    let why = format!("{why}; entry {index} at byte {at} was written once these bytes were durable");
                    return Err(SegmentError::Damaged { path, offset, why });
                }
                if k + 1 < count {
                    return Err(SegmentError::Damaged { path, offset, why });
                }
                // The tail a crash left: cut off, and the cut made durable.
                segment.file.set_len(offset).map_err(io_error(&path))?;
                segment.end = offset;
                segment.allocated = offset;
            }
            if k + 1 == count {
                // What the last segment holds now counts as durable (frames written after
                // the open say so): a crash of the process alone leaves unsynced writes to be
                // read back, so they are synced here.
                segment.file.sync_all().map_err(io_error(&path))?;
            }
            let below_purged = segment.last().is_none_or(|l| purged.is_some_and(|p| l <= p));
            if below_purged {
                std::fs::remove_file(&path).map_err(io_error(&path))?;
                continue;
            }
            // (A segment before a gap would end at or below the purge, deleted above.)
            if let Some(before) = segments.back().and_then(Segment::last).filter(|&b| b + 1 != first) {
                return Err(SegmentError::Damaged { path, offset: 0, why: format!("begins at entry {first}, the segment before ends at entry {before}") });
            }
            segments.push_back(segment);
        }
        // Deleted segments stay deleted.
        sync_dir(dir)?;
        let open = || open_log_backend(io).map_err(io_error(dir));
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            state: Mutex::new(State { durable: segments.back().map_or(0, |g| g.end), segments, purged, ..State::default() }),
            wake: Condvar::new(),
            writer: Mutex::new(open()?),
            syncer: Mutex::new(open()?),
            segment_bytes,
            background: std::sync::atomic::AtomicBool::new(false),
            _lock: lock,
        });
        let syncing = inner.clone();
        std::thread::Builder::new().name("tusk-raft-log-sync".into()).spawn(move || sync_loop(&syncing)).map_err(io_error(dir))?;
        Ok(Segments { _owner: Arc::new(Owner(inner.clone())), inner })
    }

    /// The last entry's index (`None`: no entry after the purged ones).
    pub fn last(&self) -> Option<u64> {
        self.inner.state.lock().last()
    }

    /// Writes `entries` (indexes following the last entry's, or the purged index when every
    /// entry is purged); `done` hears when they are durable. Returns once they are written.
    pub fn append(&self, entries: &[(u64, Vec<u8>)], done: Done) -> Result<(), SegmentError> {
        let inner = &self.inner;
        let Some(&(first, _)) = entries.first() else {
            done(Ok(()));
            return Ok(());
        };
        for (k, (index, _)) in entries.iter().enumerate() {
            assert_eq!(*index, first + k as u64, "one append's entries follow each other");
        }
        let frames_len: u64 = entries.iter().map(|(_, b)| (HEADER + b.len()) as u64).sum();
        let mut writer = inner.writer.lock();
        let (file, offset, durable, segment_first, zeros) = {
            let mut s = inner.state.lock();
            if let Some(why) = &s.failed {
                return Err(SegmentError::Failed(why.clone()));
            }
            let last = s.last();
            // `fresh`: the log begins, or resumes after a snapshot purged past its last entry,
            // in a segment of its own.
            let fresh = match (last, s.purged) {
                (Some(l), _) if first == l + 1 => false,
                (None, None) => true,
                (l, Some(p)) if first == p + 1 && l.is_none_or(|l| l <= p) => true,
                _ => return Err(SegmentError::NotNext { got: first, last, purged: s.purged }),
            };
            if fresh || s.segments.back().is_none_or(|g| g.end >= inner.segment_bytes) {
                drop(s);
                self.begin_segment(&mut writer, first, fresh)?;
                s = inner.state.lock();
            }
            let g = s.segments.back().expect("a segment to write");
            let zeros = frames_len <= ZERO_AHEAD_MAX_FLUSH && g.end + frames_len > g.allocated;
            (g.file.clone(), g.end, s.durable, g.first, zeros)
        };
        let mut buf = Vec::with_capacity(frames_len as usize + if zeros { ZERO_AHEAD as usize } else { 0 });
        let mut lens = Vec::with_capacity(entries.len());
        for (index, body) in entries {
            lens.push(buf.len() as u64);
            frame_into(&mut buf, *index, durable, body);
        }
        debug_assert_eq!(buf.len() as u64, frames_len);
        if zeros {
            buf.resize(buf.len() + ZERO_AHEAD as usize, 0);
        }
        let written = writer.write(&WriteSync { fd: file.as_raw_fd(), offset, data: &buf });
        let mut s = inner.state.lock();
        if let Err(e) = written {
            let why = format!("writing entries {first}..: {e}");
            s.failed = Some(why.clone());
            drop(s);
            inner.wake.notify_all();
            return Err(SegmentError::Failed(why));
        }
        let g = s.segments.back_mut().expect("the segment written");
        g.starts.extend(lens.iter().map(|l| offset + l));
        g.end = offset + frames_len;
        g.allocated = g.allocated.max(offset + buf.len() as u64);
        s.written += 1;
        let count = s.written;
        s.waiting.push_back((count, segment_first, offset + frames_len, done));
        drop(s);
        if inner.background.load(std::sync::atomic::Ordering::Relaxed) {
            inner.wake.notify_all();
            Ok(())
        } else {
            self.sync_now(&mut writer)
        }
    }

    /// Whether appends return once written, synced by the sync thread (a leader: its write
    /// overlaps its followers'), or only once synced by the appender (default).
    pub fn sync_in_background(&self, background: bool) {
        self.inner.background.store(background, std::sync::atomic::Ordering::Relaxed);
    }

    /// Begins the segment whose first entry is `first`: the one before synced first (its
    /// entries count durable once the sync thread syncs a later segment), or every one before
    /// dropped when `drop_before` (all of them purged).
    fn begin_segment(&self, writer: &mut Box<dyn IoBackend>, first: u64, drop_before: bool) -> Result<(), SegmentError> {
        let inner = &self.inner;
        let before = inner.state.lock().segments.back().map(|g| (g.file.clone(), g.path.clone(), g.end));
        if let Some((file, path, end)) = before.filter(|_| !drop_before) {
            // Only the last segment may end in zeros.
            file.set_len(end).map_err(io_error(&path))?;
            writer.sync(file.as_raw_fd()).map_err(io_error(&path))?;
        }
        let path = inner.dir.join(segment_name(first));
        // An empty file of that name may be left from a segment begun and never written.
        let file = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).map_err(io_error(&path))?;
        sync_dir(&inner.dir)?;
        let mut s = inner.state.lock();
        let gone: Vec<PathBuf> = if drop_before { s.segments.drain(..).map(|g| g.path).collect() } else { Vec::new() };
        s.segments.push_back(Segment { first, path, file: Arc::new(file), starts: Vec::new(), end: 0, allocated: 0 });
        s.durable = 0;
        drop(s);
        for path in gone {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
        }
        Ok(())
    }

    /// The entries `from..=to` that are in the log, in order, each checked against its
    /// checksum.
    pub fn read(&self, from: u64, to: u64) -> Result<Vec<(u64, Vec<u8>)>, SegmentError> {
        self.read_limited(from, to, u64::MAX)
    }

    /// The entries `from..=to` that are in the log, in order, but only as many as fit in
    /// `budget` bytes of frames (at least one).
    pub fn read_limited(&self, from: u64, to: u64, budget: u64) -> Result<Vec<(u64, Vec<u8>)>, SegmentError> {
        self.visit_limited(from, to, budget, |index, body| (index, body.to_vec()))
    }

    /// [`Segments::read_limited`], each entry's body handed to `each` where it was read
    /// (no copy of it: a reader that decodes it makes its own).
    pub fn visit_limited<T>(&self, from: u64, to: u64, budget: u64, mut each: impl FnMut(u64, &[u8]) -> T) -> Result<Vec<T>, SegmentError> {
        let pieces: Vec<(Arc<File>, PathBuf, u64, u64, u64)> = {
            let s = self.inner.state.lock();
            let mut left = budget;
            let mut pieces = Vec::new();
            for g in &s.segments {
                let Some(last) = g.last() else { continue };
                let a = from.max(g.first);
                let mut b = to.min(last);
                if a > b {
                    continue;
                }
                if left == 0 && !pieces.is_empty() {
                    break;
                }
                // The last entry that still fits (the first always does).
                let start = g.range(a, a).0;
                let fits = |i: u64| g.range(i, i).1 - start <= left;
                if !fits(b) {
                    let (mut lo, mut hi) = (a, b);
                    while lo < hi {
                        let mid = lo + (hi - lo).div_ceil(2);
                        if fits(mid) {
                            lo = mid;
                        } else {
                            hi = mid - 1;
                        }
                    }
                    if !pieces.is_empty() && !fits(lo) {
                        break;
                    }
                    b = lo;
                }
                let (start, end) = g.range(a, b);
                left = left.saturating_sub(end - start);
                pieces.push((g.file.clone(), g.path.clone(), a, start, end));
                if b < to.min(last) {
                    break;
                }
            }
            pieces
        };
        let mut out = Vec::new();
        for (file, path, mut index, start, end) in pieces {
            let mut bytes = vec![0u8; (end - start) as usize];
            file.read_exact_at(&mut bytes, start).map_err(io_error(&path))?;
            let mut at = 0usize;
            while at < bytes.len() {
                let frame = parse_frame(&bytes[at..]).map_err(|why| SegmentError::Damaged { path: path.clone(), offset: start + at as u64, why })?;
                if frame.index != index {
                    return Err(SegmentError::Damaged { path: path.clone(), offset: start + at as u64, why: format!("entry {} where entry {index} belongs", frame.index) });
                }
                out.push(each(index, frame.body));
                index += 1;
                at += frame.len;
            }
        }
        Ok(out)
    }

    /// Removes the entries from `index` on, durably (a vote cast on the longer log is
    /// already kept). What was appended before is synced and told so first.
    pub fn truncate(&self, index: u64) -> Result<(), SegmentError> {
        let inner = &self.inner;
        let mut writer = inner.writer.lock();
        self.sync_now(&mut writer)?;
        let mut s = inner.state.lock();
        let mut gone = Vec::new();
        while s.segments.back().is_some_and(|g| g.first >= index) {
            gone.push(s.segments.pop_back().expect("a segment").path);
        }
        let cut = s.segments.back_mut().filter(|g| g.last().is_some_and(|l| l >= index)).map(|g| {
            let at = g.starts[(index - g.first) as usize];
            g.starts.truncate((index - g.first) as usize);
            g.end = at;
            g.allocated = at;
            (g.file.clone(), g.path.clone(), at)
        });
        // Everything left was synced above (earlier segments before the next was begun).
        s.durable = s.segments.back().map_or(0, |g| g.end);
        drop(s);
        if let Some((file, path, at)) = cut {
            file.set_len(at).and_then(|()| file.sync_all()).map_err(io_error(&path))?;
        }
        for path in &gone {
            std::fs::remove_file(path).map_err(io_error(path))?;
        }
        if !gone.is_empty() {
            sync_dir(&inner.dir)?;
        }
        Ok(())
    }

    /// Forgets the entries up to `index`: whole segments at or below it are deleted (the
    /// caller keeps the purged index durably first).
    pub fn purge(&self, index: u64) -> Result<(), SegmentError> {
        let inner = &self.inner;
        let _writer = inner.writer.lock();
        let mut s = inner.state.lock();
        s.purged = Some(s.purged.map_or(index, |p| p.max(index)));
        let mut gone = Vec::new();
        // The segment being written stays while it has entries past the purge.
        while s.segments.len() > 1 && s.segments.front().and_then(Segment::last).is_some_and(|l| l <= index) {
            gone.push(s.segments.pop_front().expect("a segment").path);
        }
        drop(s);
        for path in &gone {
            std::fs::remove_file(path).map_err(io_error(path))?;
        }
        Ok(())
    }

    /// Syncs what is written now and tells whoever waits for it (the caller holds `writer`).
    fn sync_now(&self, writer: &mut Box<dyn IoBackend>) -> Result<(), SegmentError> {
        let (through, file) = {
            let s = self.inner.state.lock();
            if let Some(why) = &s.failed {
                return Err(SegmentError::Failed(why.clone()));
            }
            (s.written, s.segments.back().map(|g| (g.file.clone(), g.path.clone())))
        };
        let Some((file, path)) = file else { return Ok(()) };
        let synced = writer.sync(file.as_raw_fd()).map_err(|e| format!("syncing {}: {e}", path.display()));
        self.inner.settle(through, synced.clone());
        synced.map_err(SegmentError::Failed)
    }
}

impl Inner {
    /// Appends up to `through` are durable (`Ok`), or the sync failed and none waiting will be.
    fn settle(&self, through: u64, synced: Result<(), String>) {
        let told: Vec<Done> = {
            let mut s = self.state.lock();
            match &synced {
                Ok(()) => {
                    let n = s.waiting.iter().take_while(|(count, ..)| *count <= through).count();
                    let back = s.segments.back().map(|g| g.first);
                    let durable = s.waiting.iter().take(n).filter(|(_, segment, ..)| Some(*segment) == back).map(|(_, _, end, _)| *end).max();
                    if let Some(end) = durable {
                        s.durable = s.durable.max(end);
                    }
                    s.waiting.drain(..n).map(|(.., done)| done).collect()
                }
                Err(why) => {
                    s.failed.get_or_insert_with(|| why.clone());
                    s.waiting.drain(..).map(|(.., done)| done).collect()
                }
            }
        };
        for done in told {
            done(synced.clone().map_err(std::io::Error::other));
        }
    }
}

/// The sync thread: syncs the segment being written whenever an append waits, until the last
/// handle is gone and nothing waits.
fn sync_loop(inner: &Inner) {
    loop {
        let (through, file) = {
            let mut s = inner.state.lock();
            while s.waiting.is_empty() && !s.closing {
                inner.wake.wait(&mut s);
            }
            if s.waiting.is_empty() {
                return;
            }
            if let Some(why) = s.failed.clone() {
                drop(s);
                inner.settle(u64::MAX, Err(why));
                continue;
            }
            // Earlier segments were synced when the next was begun.
            let g = s.segments.back().expect("appends waiting have a segment");
            (s.written, (g.file.clone(), g.path.clone()))
        };
        let synced = inner.syncer.lock().sync(file.0.as_raw_fd());
        inner.settle(through, synced.map_err(|e| format!("syncing {}: {e}", file.1.display())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn entries(from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
        (from..=to).map(|i| (i, format!("entry {i}").into_bytes())).collect()
    }

    /// Appends and waits until they are durable.
    fn append(log: &Segments, from: u64, to: u64) {
        let (tx, rx) = mpsc::channel();
        log.append(&entries(from, to), Box::new(move |r| tx.send(r.is_ok()).unwrap())).unwrap();
        assert!(rx.recv().unwrap(), "durable");
    }

    #[test]
    fn entries_read_back_across_segments_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let log = Segments::open(dir.path(), &Io::Sync, None).unwrap();
        assert_eq!(log.last(), None);
        append(&log, 1, 3);
        append(&log, 4, 4);
        assert_eq!(log.read(1, 10).unwrap(), entries(1, 4));
        assert_eq!(log.read(2, 3).unwrap(), entries(2, 3));
        assert!(matches!(log.append(&entries(6, 6), Box::new(|_| {})), Err(SegmentError::NotNext { got: 6, last: Some(4), .. })));
        drop(log);
        let log = patient_open(dir.path(), None);
        assert_eq!((log.last(), log.read(1, 4).unwrap()), (Some(4), entries(1, 4)));
    }

    /// The lock is let go of once the sync thread ends, just after the last handle.
    fn patient_open(dir: &Path, purged: Option<u64>) -> Segments {
        patient_open_sized(dir, purged, SEGMENT_BYTES)
    }

    fn patient_open_sized(dir: &Path, purged: Option<u64>, segment_bytes: u64) -> Segments {
        for _ in 0..500 {
            match Segments::open_sized(dir, &Io::Sync, purged, segment_bytes) {
                Err(SegmentError::Locked(_)) => std::thread::sleep(std::time::Duration::from_millis(2)),
                other => return other.unwrap(),
            }
        }
        panic!("the log stayed locked");
    }

    /// A torn last frame is cut off at open; damage in an earlier segment is reported.
    #[test]
    fn a_torn_tail_is_cut_and_damage_before_it_reported() {
        let dir = tempfile::tempdir().unwrap();
        let log = Segments::open(dir.path(), &Io::Sync, None).unwrap();
        append(&log, 1, 5);
        drop(log);
        let path = dir.path().join(segment_name(1));
        let frames: u64 = entries(1, 5).iter().map(|(_, b)| (HEADER + b.len()) as u64).sum();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), frames + ZERO_AHEAD, "zeros written ahead");
        OpenOptions::new().write(true).open(&path).unwrap().set_len(frames - 3).unwrap();
        let log = patient_open(dir.path(), None);
        assert_eq!(log.last(), Some(4), "entry 5 was torn");
        append(&log, 5, 6);
        assert_eq!(log.read(1, 6).unwrap(), entries(1, 6));
        drop(log);
        // A later segment makes the first one's damage more than a torn tail. The next
        // segment begun, and nothing written to it yet: the one before was cut to its frames.
        let frames: u64 = entries(1, 6).iter().map(|(_, b)| (HEADER + b.len()) as u64).sum();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(frames).unwrap();
        std::fs::write(dir.path().join(segment_name(7)), b"").unwrap();
        {
            let log = patient_open(dir.path(), None);
            assert_eq!(log.last(), Some(6), "an empty segment is no entry");
            assert!(!dir.path().join(segment_name(7)).exists());
        }
        {
            let log = patient_open_sized(dir.path(), None, 1);
            append(&log, 7, 7);
            assert!(dir.path().join(segment_name(7)).exists(), "a full segment ends");
        }
        drop(patient_open(dir.path(), None));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 2] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let damaged = (0..500).find_map(|_| match Segments::open(dir.path(), &Io::Sync, None) {
            Err(SegmentError::Locked(_)) => {
                std::thread::sleep(std::time::Duration::from_millis(2));
                None
            }
            other => Some(other),
        });
        match damaged {
            Some(Err(SegmentError::Damaged { path: p, offset: 0, why })) => assert!(p == path && why.contains("checksum"), "{why}"),
            _ => panic!("damage not reported"),
        }
    }

    /// Opens `dir`, waiting out the lock the last handle's sync thread lets go of.
    fn open_result(dir: &Path) -> Result<Segments, SegmentError> {
        for _ in 0..500 {
            match Segments::open(dir, &Io::Sync, None) {
                Err(SegmentError::Locked(_)) => std::thread::sleep(std::time::Duration::from_millis(2)),
                other => return other,
            }
        }
        panic!("the log stayed locked");
    }

    /// In the last segment, an unsound frame is a torn write only while nothing after it was
    /// written once it was durable. Entries 4–6 went out in one append: a crash may persist 5
    /// and 6 without 4, so 4 unsound is a tear, cut with what follows. Entry 8, appended
    /// after 7 was synced, says 7 was durable: 7 unsound is damage to an entry the group may
    /// count on, reported with its offset, and the log does not open.
    #[test]
    fn a_durable_frame_damaged_under_later_ones_is_reported_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(segment_name(1));
        let log = Segments::open(dir.path(), &Io::Sync, None).unwrap();
        append(&log, 1, 3);
        append(&log, 4, 6);
        drop(log);
        let frame_at = |index: u64| (1..index).map(|i| (HEADER + entries(i, i)[0].1.len()) as u64).sum::<u64>() as usize;
        let flip = |at: usize| {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[at] ^= 0x10;
            std::fs::write(&path, &bytes).unwrap();
        };
        flip(frame_at(4) + HEADER + 1);
        let log = open_result(dir.path()).unwrap();
        assert_eq!(log.last(), Some(3), "a torn append is cut whole");
        append(&log, 4, 4);
        append(&log, 5, 5);
        drop(log);
        flip(frame_at(4) + HEADER + 1);
        match open_result(dir.path()) {
            Err(SegmentError::Damaged { path: p, offset, why }) => {
                assert_eq!((p, offset), (path.clone(), frame_at(4) as u64));
                assert!(why.contains("checksum") && why.contains("entry 5"), "{why}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("damage to a durable entry was cut as a tear"),
        }
        // The length word damaged: the frames after it are found all the same.
        flip(frame_at(4) + HEADER + 1);
        flip(frame_at(4) + 1);
        assert!(matches!(open_result(dir.path()), Err(SegmentError::Damaged { .. })));
    }

    /// A read within a byte budget returns the entries that fit, at least one, across
    /// segments.
    #[test]
    fn reads_within_a_budget_return_what_fits_and_at_least_one() {
        let dir = tempfile::tempdir().unwrap();
        // A segment per append of three entries.
        let log = Segments::open_sized(dir.path(), &Io::Sync, None, 1).unwrap();
        for first in [1, 4, 7] {
            append(&log, first, first + 2);
        }
        let frame = (HEADER + entries(1, 1)[0].1.len()) as u64;
        assert_eq!(log.read_limited(1, 9, 0).unwrap(), entries(1, 1), "at least one");
        assert_eq!(log.read_limited(1, 9, frame - 1).unwrap(), entries(1, 1));
        assert_eq!(log.read_limited(1, 9, 2 * frame).unwrap(), entries(1, 2));
        assert_eq!(log.read_limited(2, 9, 4 * frame).unwrap(), entries(2, 5), "across a segment's end");
        assert_eq!(log.read_limited(2, 9, 4 * frame + 1).unwrap(), entries(2, 5));
        assert_eq!(log.read_limited(1, 9, u64::MAX).unwrap(), entries(1, 9));
        assert_eq!(log.read_limited(3, 8, 100 * frame).unwrap(), entries(3, 8));
    }

    #[test]
    fn truncate_and_purge_keep_what_follows() {
        let dir = tempfile::tempdir().unwrap();
        let log = Segments::open(dir.path(), &Io::Sync, None).unwrap();
        append(&log, 1, 10);
        log.truncate(8).unwrap();
        assert_eq!(log.last(), Some(7));
        append(&log, 8, 9);
        assert_eq!(log.read(1, 9).unwrap(), entries(1, 9));
        log.purge(5).unwrap();
        assert_eq!(log.read(6, 9).unwrap(), entries(6, 9));
        // A snapshot past the end: the log resumes after it in a segment of its own.
        log.purge(20).unwrap();
        append(&log, 21, 22);
        assert_eq!(log.read(1, 30).unwrap(), entries(21, 22));
        drop(log);
        let log = patient_open(dir.path(), Some(20));
        assert_eq!(log.read(1, 30).unwrap(), entries(21, 22));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| n.ends_with(".seg")).collect();
        assert_eq!(names, vec![segment_name(21)]);
        log.truncate(21).unwrap();
        assert_eq!(log.last(), None);
    }

    /// Synced by the appender, an append is durable when it returns; synced in the
    /// background, it returns at once and is told later, with the appends after it.
    #[test]
    fn appends_are_synced_by_the_appender_or_the_sync_thread() {
        let dir = tempfile::tempdir().unwrap();
        let log = Segments::open(dir.path(), &Io::Sync, None).unwrap();
        let told = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tell = |told: &Arc<std::sync::atomic::AtomicU64>| -> Done {
            let told = told.clone();
            Box::new(move |r| {
                assert!(r.is_ok());
                told.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        };
        log.append(&entries(1, 1), tell(&told)).unwrap();
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1, "durable on return");
        log.sync_in_background(true);
        for i in 2..=50 {
            log.append(&entries(i, i), tell(&told)).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while told.load(std::sync::atomic::Ordering::SeqCst) < 50 {
            assert!(std::time::Instant::now() < deadline, "the sync thread told every append");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(log.read(1, 50).unwrap(), entries(1, 50));
    }

    /// A sync that fails in the background fails what waits for it and every later append.
    #[test]
    fn a_failed_background_sync_fails_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let plan = tusk_storage::io::FaultPlan::new();
        let log = Segments::open(dir.path(), &Io::Faulty(plan.clone()), None).unwrap();
        log.sync_in_background(true);
        append(&log, 1, 2);
        // The write goes through; its sync does not.
        plan.fail_after(1, libc::EIO);
        let (tx, rx) = mpsc::channel();
        log.append(&entries(3, 3), Box::new(move |r| tx.send(r.map_err(|e| e.to_string())).unwrap())).unwrap();
        let told = rx.recv().unwrap();
        assert!(told.as_ref().is_err_and(|e| e.contains("syncing")), "{told:?}");
        assert!(matches!(log.append(&entries(4, 4), Box::new(|_| {})), Err(SegmentError::Failed(_))));
    }

    /// A failed write fails the log: no later append is taken.
    #[test]
    fn a_failed_write_fails_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let plan = tusk_storage::io::FaultPlan::new();
        let log = Segments::open(dir.path(), &Io::Faulty(plan.clone()), None).unwrap();
        append(&log, 1, 2);
        plan.fail_after(0, libc::EIO);
        let (tx, rx) = mpsc::channel();
        let first = log.append(&entries(3, 3), Box::new(move |r| tx.send(r.is_ok()).unwrap()));
        match first {
            Err(SegmentError::Failed(why)) => assert!(why.contains("entries 3"), "{why}"),
            Ok(()) => assert!(!rx.recv().unwrap(), "the sync failed"),
            Err(e) => panic!("{e}"),
        }
        assert!(matches!(log.append(&entries(4, 4), Box::new(|_| {})), Err(SegmentError::Failed(_))));
    }
}
