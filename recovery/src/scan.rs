//! Reading the log: every partition's segments, validated frame by frame.
//!
//! A record that fails to decode is a torn tail when it lies in the last segment of its
//! partition and no later flush follows it (a pad frame, then a valid record): the writer
//! only ever has the last flush of the last segment in flight, so a crash can damage
//! nothing else. The tail is reported, and cut off (the file truncated there) by recovery
//! once the replay has succeeded ([`Scan::repairs`]), so that a store refused for damage the
//! replay finds is left as it was. Damage anywhere else is an error. A record's write list
//! is covered by its checksum here and walked by the replay ([`scan_frame`]).

use std::path::{Path, PathBuf};

use tusk_storage::log_files::{list_partitions, list_segments, SegmentInfo};
use tusk_storage::log_seal::{self, tail_crc, SegmentSeal, SEAL_TAIL};
use tusk_storage::log_format::{later_flush_after, scan_frame, Frame, SegmentHeader, FLAG_MARKER, FLAG_PARTITION, SEGMENT_HEADER_SIZE};
use tusk_storage::mapped::MappedFile;
use tusk_storage::StorageError;

use crate::{FileKind, RecoveryError};

/// A torn tail found (and, when repairing, cut off) during the scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment file.
    pub path: PathBuf,
    /// Where the damaged bytes start (the file's new length after the cut).
    pub offset: u64,
    /// How many bytes were cut.
    pub bytes: u64,
    /// What made the tail invalid.
    pub reason: String,
}

impl TornTail {
    /// The tail, what was wrong with it, and what recovery does (`cut`: it was cut off;
    /// else it would be, as `inspect` reports): `log segment log/p0000/…seg, offset 8192:
    /// torn tail of 100 bytes (bad frame magic); cut`.
    pub fn describe(&self, cut: bool) -> String {
        let action = if cut { "cut" } else { "would be cut" };
        format!(
            "{} {}, offset {}: torn tail of {} bytes ({}); {action}",
            FileKind::LogSegment,
            self.path.display(),
            self.offset,
            self.bytes,
            self.reason
        )
    }
}

/// A segment's bytes in memory.
pub struct Segment {
    pub path: PathBuf,
    pub partition: u32,
    map: SegmentBytes,
    /// Valid bytes (a torn tail is cut off).
    len: usize,
}

impl Segment {
    pub fn data(&self) -> &[u8] {
        &self.map.as_slice()[..self.len]
    }
}

/// A segment's bytes: mapped whole, or (a sealed segment read from a mark on) its header and
/// its bytes from the mark read into memory, zeros between, where nothing is read.
enum SegmentBytes {
    Mapped(MappedFile),
    Read(Vec<u8>),
}

impl SegmentBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            SegmentBytes::Mapped(m) => m.as_slice(),
            SegmentBytes::Read(bytes) => bytes,
        }
    }
}

/// A sealed segment's mark (LSN, offset) the scan starts at, and the file's bytes it needs.
type SealedRead = ((u64, u64), Vec<u8>);

/// A partition's last segment as its seal describes it: where the scan for `covered` starts
/// (see tusk-storage's `log_seal`) and the file's header and bytes from there on, read with
/// two reads in flight together, where sequence, length and tail still fit the seal; `None` otherwise, and where
/// the scan would start at the first record anyway. Not mapped: page faults on a file the
/// log wrote past the page cache read it a page or a read-around at a time (a 170 KiB tail
/// took 6 ms on this machine, its two reads 0.3 ms).
fn read_sealed(path: &Path, seq: u64, seal: &SegmentSeal, covered: u64) -> Result<Option<SealedRead>, RecoveryError> {
    use std::os::unix::fs::FileExt;
    let io = |e| StorageError::io(path, e);
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let Some(mark) = seal.start_for(seq, len, seal.tail_crc, covered).filter(|&(_, at)| at as usize > SEGMENT_HEADER_SIZE) else {
        return Ok(None);
    };
    let page = tusk_storage::PAGE_SIZE;
    let from = (mark.1.min(len.saturating_sub(SEAL_TAIL as u64)) / page * page).max(SEGMENT_HEADER_SIZE as u64);
    let mut bytes = vec![0u8; len as usize];
    // The tail's read starts first and runs beside the header's.
    tusk_storage::io::sync::start_reading(std::os::fd::AsRawFd::as_raw_fd(&file), from, len - from);
    file.read_exact_at(&mut bytes[..SEGMENT_HEADER_SIZE], 0).map_err(io)?;
    file.read_exact_at(&mut bytes[from as usize..], from).map_err(io)?;
    Ok((seal.start_for(seq, len, tail_crc(&bytes), covered) == Some(mark)).then_some((mark, bytes)))
}

/// Where a record lies: 16 bytes, so the index of a log of ten million records stays small
/// and cheap to build (recovery time is spent on memory, not on decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef {
    pub lsn: u64,
    /// Index into [`Scan::segments`].
    pub segment: u32,
    /// The record's position in its segment (a multiple of 8) with its flags in the low bits.
    offset_flags: u32,
}

/// Records start 8-aligned, which leaves three low bits of the offset for the flags.
const FLAG_BITS: u32 = 7;
const _: () = assert!((FLAG_PARTITION | FLAG_MARKER) & !FLAG_BITS == 0);

impl RecordRef {
    #[cfg(test)]
    pub(crate) fn for_test(lsn: u64, segment: u32) -> RecordRef {
        RecordRef { lsn, segment, offset_flags: 0 }
    }

    fn new(lsn: u64, segment: u32, offset: u32, flags: u32) -> RecordRef {
        assert!(offset & FLAG_BITS == 0 && flags & !FLAG_BITS == 0, "records are 8-aligned and have 2 flags");
        RecordRef { lsn, segment, offset_flags: offset | flags }
    }

    pub fn offset(&self) -> usize {
        (self.offset_flags & !FLAG_BITS) as usize
    }

    pub fn flags(&self) -> u32 {
        self.offset_flags & FLAG_BITS
    }

    /// A recovery marker: it voids an LSN range and writes nothing.
    pub fn is_marker(&self) -> bool {
        self.flags() & FLAG_MARKER != 0
    }
}

/// A change that makes the log what the scan read: the tail of a segment past its last
/// valid flush cut off, or a segment that never got its header removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repair {
    Cut { path: PathBuf, len: usize },
    Remove { path: PathBuf },
}

impl Repair {
    /// Makes the change, durably.
    pub fn apply(&self) -> Result<(), RecoveryError> {
        match self {
            Repair::Cut { path, len } => cut(path, *len),
            Repair::Remove { path } => std::fs::remove_file(path).map_err(|e| StorageError::io(path, e).into()),
        }
    }

    /// [`Repair::apply`], where the file may have gone meanwhile: a checkpoint that covers a
    /// segment deletes it, and then there is nothing left to repair.
    pub fn apply_if_there(&self) -> Result<(), RecoveryError> {
        match self.apply() {
            Err(RecoveryError::Storage(StorageError::Io { source, .. })) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

#[derive(Default)]
pub struct Scan {
    pub segments: Vec<Segment>,
    /// Every segment on disk, per partition in sequence order: its LSN range and size. For a
    /// segment not read ([`Scan::below_checkpoint`]) the range ends just below the next
    /// segment's first LSN.
    pub infos: Vec<SegmentInfo>,
    /// Each partition's records, in ascending LSN order (the writer assigns a partition's
    /// LSNs under its append lock, and the scan checks it).
    pub partitions: Vec<Vec<RecordRef>>,
    /// The LSN ranges `(from, to]` resolved by recovery markers.
    pub voids: Vec<(u64, u64)>,
    pub torn: Vec<TornTail>,
    /// What recovery changes on disk once the replay has succeeded (torn tails and the
    /// zeros after a partition's last flush cut off, headerless segments removed).
    pub repairs: Vec<Repair>,
    pub log_bytes: u64,
    /// Segments not read because every record in them is at or below the LSN the scan was
    /// told the checkpoint covers (see [`scan`]), and their bytes.
    pub below_checkpoint: Vec<PathBuf>,
    pub below_checkpoint_bytes: u64,
}

impl Scan {
    pub fn record_count(&self) -> usize {
        self.partitions.iter().map(Vec::len).sum()
    }

    /// Every record in ascending LSN order (records of one LSN side by side, in partition
    /// order): the partitions' runs placed by LSN, a window at a time (see `merge.rs`).
    pub fn merged(&self) -> impl Iterator<Item = RecordRef> + '_ {
        crate::merge::by_lsn(&self.partitions)
    }
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> RecoveryError {
    RecoveryError::Corrupt { kind: FileKind::LogSegment, path: path.to_path_buf(), offset: Some(offset), reason: reason.into() }
}

/// Reads all segments under `dir/log`, one thread per partition. Changes nothing on disk:
/// the repairs it finds are listed in [`Scan::repairs`].
///
/// A segment all of whose records have LSNs ≤ `covered` (records the checkpoint's images
/// already hold, which replay skips) is not read: the first LSN of the partition's next
/// segment, peeked from its first bytes, bounds it. Only a prefix of a partition's segments
/// can be so, never its last one, and damage in them goes unseen, as it does not change
/// what is recovered. Pass 0 to read everything.
pub fn scan(dir: &Path, covered: u64) -> Result<Scan, RecoveryError> {
    let partitions = list_partitions(dir)?;
    let seals = log_seal::read(dir);
    // The first partition on this thread: a store written by one thread has one, and a
    // thread's start is a tenth of a reopen's time on the device host.
    let scans: Vec<Result<Scan, RecoveryError>> = std::thread::scope(|s| {
        let others: Vec<_> = partitions
            .iter()
            .skip(1)
            .map(|&p| {
                let seal = log_seal::of_partition(&seals, p);
                s.spawn(move || scan_partition(dir, p, covered, seal))
            })
            .collect();
        let first = partitions.first().map(|&p| scan_partition(dir, p, covered, log_seal::of_partition(&seals, p)));
        first.into_iter().chain(others.into_iter().map(|h| h.join().expect("log scan thread panicked"))).collect()
    });
    let mut out = Scan::default();
    for part in scans {
        let mut part = part?;
        let shift = out.segments.len() as u32;
        let mut records = part.partitions.pop().unwrap_or_default();
        if shift != 0 {
            records.iter_mut().for_each(|r| r.segment += shift);
        }
        out.partitions.push(records);
        out.segments.extend(part.segments);
        out.infos.extend(part.infos);
        out.voids.extend(part.voids);
        out.torn.extend(part.torn);
        out.repairs.extend(part.repairs);
        out.log_bytes += part.log_bytes;
        out.below_checkpoint.extend(part.below_checkpoint);
        out.below_checkpoint_bytes += part.below_checkpoint_bytes;
    }
    Ok(out)
}

/// Bytes read to find a segment's first record: its header and a first flush of small records.
const FIRST_RECORD_PEEK: usize = 64 << 10;

/// The LSN of the first record of a segment, read from its first bytes; `None` when they
/// do not start with a valid record (a damaged or empty segment, a first record larger than
/// the peek): the segment before it is then read as usual.
fn first_lsn(path: &Path) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).ok()?;
    let len = usize::try_from(file.metadata().ok()?.len()).ok()?.min(FIRST_RECORD_PEEK);
    let mut head = vec![0u8; len];
    file.read_exact_at(&mut head, 0).ok()?;
    SegmentHeader::decode(&head).ok()?;
    match scan_frame(&head, SEGMENT_HEADER_SIZE) {
        Frame::Record(view, _) => Some(view.header.lsn),
        _ => None,
    }
}

/// The segments of a partition (ascending) wholly at or below `covered`, a prefix: segment i
/// is when segment i + 1 starts at or below `covered + 1`. For each, the next one's first LSN.
fn below_checkpoint_prefix(segments: &[(u64, PathBuf)], covered: u64) -> Vec<u64> {
    let mut out = Vec::new();
    while covered > 0 && out.len() + 1 < segments.len() {
        let Some(next_first) = first_lsn(&segments[out.len() + 1].1).filter(|&f| f <= covered.saturating_add(1)) else { break };
        out.push(next_first);
    }
    out
}

/// Bytes of the log segments a scan for `covered` reads (those not wholly at or below it):
/// the log's tail after a checkpoint, from file sizes and a peek at each segment's first
/// record, without reading the tail.
pub fn log_bytes_after(dir: &Path, covered: u64) -> Result<u64, RecoveryError> {
    let mut bytes = 0;
    let seals = log_seal::read(dir);
    for partition in list_partitions(dir)? {
        let segments = list_segments(dir, partition)?;
        let skipped = below_checkpoint_prefix(&segments, covered).len();
        for (i, (seq, path)) in segments.iter().enumerate().skip(skipped) {
            let len = std::fs::metadata(path).map_err(|e| StorageError::io(path, e))?.len();
            let seal = log_seal::of_partition(&seals, partition).filter(|_| i + 1 == segments.len());
            // The seal's own tail checksum, not the file's: an estimate that needs no read
            // (one per partition, one after another). A seal that no longer fits the file
            // makes the scan read it all, and only this estimate was off.
            let start = match seal {
                Some(seal) => seal.start_for(*seq, len, seal.tail_crc, covered).map_or(0, |(_, at)| at),
                None => 0,
            };
            bytes += len - start;
        }
    }
    Ok(bytes)
}

/// Cuts a segment's file at `len`, durably.
fn cut(path: &Path, len: usize) -> Result<(), RecoveryError> {
    let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| StorageError::io(path, e))?;
    f.set_len(len as u64).map_err(|e| StorageError::io(path, e))?;
    f.sync_all().map_err(|e| StorageError::io(path, e))?;
    Ok(())
}

/// The smallest framed record: a frame header and the fixed payload, padded to 8 bytes.
const MIN_FRAMED_RECORD: u64 = 32;

/// A partition's segments as [`scan`] reads them; its last segment from the last mark of
/// `seal` at or below `covered + 1` on, where the seal fits the file (see tusk-storage's
/// `log_seal`).
fn scan_partition(dir: &Path, partition: u32, covered: u64, seal: Option<&SegmentSeal>) -> Result<Scan, RecoveryError> {
    let mut out = Scan::default();
    let mut records = Vec::new();
    let mut last_lsn = 0u64;
    {
        let mut segments = list_segments(dir, partition)?;
        // Segments wholly at or below `covered`: segment i is when segment i + 1 starts at
        // or below `covered + 1`. LSNs ascend across a partition's segments, so they are a
        // prefix. Listed with their LSN range bounded by the next segment's first record.
        // The first LSN of the segment being considered: peeked only once it is left out
        // (the one before it gave it otherwise).
        let mut first: Option<u64> = None;
        let mut skip = 0;
        for next_first in below_checkpoint_prefix(&segments, covered) {
            let (seq, path) = &segments[skip];
            let bytes = std::fs::metadata(path).map_err(|e| StorageError::io(path, e))?.len();
            out.infos.push(SegmentInfo {
                partition,
                seq: *seq,
                path: path.clone(),
                min_lsn: first.or_else(|| first_lsn(path)).unwrap_or(0),
                max_lsn: next_first - 1,
                bytes,
                open: false,
            });
            out.below_checkpoint.push(path.clone());
            out.below_checkpoint_bytes += bytes;
            first = Some(next_first);
            skip += 1;
        }
        segments.drain(..skip);
        let count = segments.len();
        // Reserved once for the most records the files can hold: untouched capacity costs
        // no memory, while growing by doubling would copy the index and fault in fresh
        // pages at every step.
        let most = segments.iter().map(|(_, path)| std::fs::metadata(path).map_or(0, |m| m.len())).sum::<u64>() / MIN_FRAMED_RECORD;
        records.reserve_exact(most as usize);
        // Every segment's read is under way before the first is parsed: one after another,
        // each waited for its own (a killed writer's 7.8 MB in three segments took 7 ms on the
        // device host, about half its disk's rate).
        let opened = segments
            .into_iter()
            .enumerate()
            .map(|(i, (seq, path))| {
                // Records before the mark are all at or below `covered`: not read (they
                // would only be skipped by the replay).
                let read = seal.filter(|_| i + 1 == count).map(|s| read_sealed(&path, seq, s, covered)).transpose()?.flatten();
                let (map, sealed) = match read {
                    Some((mark, bytes)) => (SegmentBytes::Read(bytes), Some(mark)),
                    None => {
                        let mapped = MappedFile::map(&path)?;
                        mapped.will_need(0);
                        (SegmentBytes::Mapped(mapped), None)
                    }
                };
                Ok((seq, path, map, sealed))
            })
            .collect::<Result<Vec<_>, RecoveryError>>()?;
        for (i, (seq, path, map, sealed)) in opened.into_iter().enumerate() {
            let is_last = i + 1 == count;
            let data = map.as_slice();
            let skipped = sealed.map_or(0, |(_, at)| at - SEGMENT_HEADER_SIZE as u64);
            let header = SegmentHeader::decode(data);
            out.log_bytes += data.len() as u64 - skipped;
            out.below_checkpoint_bytes += skipped;
            let header = match header {
                Ok(h) => h,
                // A segment created just before a crash: its header never became durable, so
                // no fdatasync of it completed and nothing in it was acknowledged.
                Err(reason)
                    if is_last && (data.len() < SEGMENT_HEADER_SIZE || data[..SEGMENT_HEADER_SIZE].iter().all(|&b| b == 0)) =>
                {
                    out.torn.push(TornTail { path: path.clone(), offset: 0, bytes: data.len() as u64, reason });
                    out.repairs.push(Repair::Remove { path: path.clone() });
                    continue;
                }
                Err(reason) => return Err(corrupt(&path, 0, reason)),
            };
            let data = map.as_slice();
            if header.partition != partition || header.seq != seq {
                return Err(corrupt(
                    &path,
                    0,
                    format!("header says partition {} segment {}, the file name says {partition} / {seq}", header.partition, header.seq),
                ));
            }
            let segment_index = out.segments.len() as u32;
            let first_record = records.len();
            let mut at = SEGMENT_HEADER_SIZE;
            if let Some((lsn, mark)) = sealed {
                at = mark as usize;
                last_lsn = last_lsn.max(lsn - 1);
            }
            let end = loop {
                match scan_frame(data, at) {
                    Frame::Record(view, next) => {
                        if view.header.partition != partition {
                            return Err(corrupt(&path, at as u64, format!("record of partition {} in partition {partition}", view.header.partition)));
                        }
                        let lsn = view.header.lsn;
                        if lsn <= last_lsn {
                            return Err(corrupt(&path, at as u64, format!("LSN {lsn} after LSN {last_lsn}: a partition's LSNs ascend")));
                        }
                        last_lsn = lsn;
                        let offset = u32::try_from(at).map_err(|_| corrupt(&path, at as u64, "segment larger than 4 GiB"))?;
                        if offset % 8 != 0 {
                            return Err(corrupt(&path, at as u64, "record not 8-aligned"));
                        }
                        out.voids.extend(view.header.void);
                        records.push(RecordRef::new(lsn, segment_index, offset, view.header.flags & (FLAG_PARTITION | FLAG_MARKER)));
                        at = next;
                    }
                    Frame::Pad(next) => at = next,
                    Frame::End => break data.len(),
                    // Space the writer zeroed ahead of its last flush; it cuts the zeros off
                    // a segment before starting the next, so only the last may end so.
                    Frame::Zeros if is_last => {
                        out.repairs.push(Repair::Cut { path: path.clone(), len: at });
                        break at;
                    }
                    Frame::Zeros => {
                        return Err(corrupt(&path, at as u64, "zeros from here to the end of a segment that is not the partition's last"));
                    }
                    Frame::Invalid(reason) => {
                        if !is_last {
                            return Err(corrupt(&path, at as u64, format!("{reason} (in a segment that is not the partition's last)")));
                        }
                        if let Some(valid) = later_flush_after(data, at + 8) {
                            return Err(corrupt(&path, at as u64, format!("{reason}; a later flush follows at offset {valid}")));
                        }
                        out.torn.push(TornTail { path: path.clone(), offset: at as u64, bytes: (data.len() - at) as u64, reason });
                        out.repairs.push(Repair::Cut { path: path.clone(), len: at });
                        break at;
                    }
                }
            };
            let mine = &records[first_record..];
            out.infos.push(SegmentInfo {
                partition,
                seq,
                path: path.clone(),
                // A sealed segment read from a mark on starts at its seal's first mark.
                min_lsn: sealed.and(seal).map_or(mine.first().map(|r| r.lsn), |s| s.marks.first().map(|&(lsn, _)| lsn)).unwrap_or(0),
                max_lsn: mine.last().map_or(0, |r| r.lsn),
                bytes: end as u64,
                open: false,
            });
            out.segments.push(Segment { path, partition, map, len: end });
        }
    }
    out.partitions.push(records);
    Ok(out)
}
