//! Redo-log formats: segment headers and records.
//!
//! A log partition is a sequence of segment files. Each segment starts with a
//! [`SEGMENT_HEADER_SIZE`]-byte header, followed by records:
//!
//! ```text
//! frame   [magic u32][payload length u32][crc32 of payload u32][reserved u32 = 0]
//!         payload, then zero padding to a multiple of 8 bytes
//! payload [lsn u64][flags u8][partition varint][write count varint]
//!         [void_from u64][void_to u64]          only with FLAG_MARKER
//!         ([gap varint][length varint][bytes])*
//! ```
//! Records are after-images: replaying one writes its bytes at its offsets. A write's heap
//! offset is delta-encoded: `gap` is its distance from the end of the record's previous
//! write (from 0 for the first), so writes ascend and never overlap within a record. A
//! varint is unsigned LEB128 (7 bits a byte, low first). Integers of fixed size are
//! little-endian. (Version 1 had fixed-size fields throughout: a record of 6 random words
//! took 160 bytes; version 2 takes 112, so the log fills, and checkpoints come, less often.)
//!
//! Every flush of a partition is written with O_DIRECT, so it ends on a 4 KiB boundary: the
//! writer closes it with a pad frame `[PAD_MAGIC u32][pad length u32]` and zeros up to the
//! boundary (a whole block when already aligned). Pad frames make flush boundaries visible,
//! which is how recovery tells a torn last flush from damage in an earlier one.
//!
//! A small flush that extends a segment also writes [`ZERO_AHEAD`] bytes of zeros after
//! itself, so that the next flushes overwrite blocks the file already has: their fdatasync
//! then has no file size or block allocation to commit to the file system's journal, only
//! the data (on ext4 about half the latency of an appending flush). A segment's data thus
//! ends either at the end of the file or where the rest of the file is zeros
//! ([`Frame::Zeros`]); zeros anywhere else are damage like any other bytes. The writer cuts
//! the zeros off a segment before it starts the next one, so only a partition's last
//! segment may end in zeros.

/// The record was committed with `Commit::Partition`: it survives an LSN gap.
pub const FLAG_PARTITION: u32 = 1;
/// The record is a recovery marker: LSNs in `(void_from, void_to]` were resolved by an
/// earlier recovery (their non-Partition records dropped, their Partition records applied).
pub const FLAG_MARKER: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_PARTITION | FLAG_MARKER;

pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"TKRC");
pub const PAD_MAGIC: u32 = u32::from_le_bytes(*b"TKPD");
/// Flushes end on multiples of this (the O_DIRECT block).
pub const FLUSH_ALIGN: u64 = 4096;
/// Zeros written ahead of a flush that extends its segment (a multiple of [`FLUSH_ALIGN`]).
pub const ZERO_AHEAD: u64 = 256 << 10;
/// Flushes larger than this write no zeros ahead: they are bound by bandwidth, not by the
/// journal commit an appending fdatasync adds, and zeros would double their bytes.
pub const ZERO_AHEAD_MAX_FLUSH: u64 = 16 << 10;
pub const FRAME_HEADER_SIZE: usize = 16;
/// Smallest payload: LSN, flags, and one-byte varints for partition and write count.
const PAYLOAD_FIXED: usize = 8 + 1 + 1 + 1;
/// Largest encoding of a u64 varint.
pub(crate) const MAX_VARINT: usize = 10;
/// Largest payload a record may have: 3 GiB, within the frame's u32 length with room to
/// spare. One record is one transaction, so this bounds a transaction's writes: about 38 M
/// whole lines (2.4 GiB of heap), enough for a 64 M-key B-link load in one transaction.
pub const MAX_PAYLOAD: usize = 3 << 30;
const _: () = assert!(MAX_PAYLOAD <= u32::MAX as usize, "the frame stores the payload length as a u32");

pub const SEGMENT_MAGIC: [u8; 8] = *b"TUSKLOG\0";
/// 2: delta-encoded writes (version 1: fixed-size fields).
pub const SEGMENT_VERSION: u32 = 2;
pub const SEGMENT_HEADER_SIZE: usize = 32;

/// The header of a log segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub partition: u32,
    pub seq: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_SIZE] {
        let mut out = [0u8; SEGMENT_HEADER_SIZE];
        out[0..8].copy_from_slice(&SEGMENT_MAGIC);
        out[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&self.partition.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let crc = crc32fast::hash(&out[0..24]);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, String> {
        if bytes.len() < SEGMENT_HEADER_SIZE {
            return Err(format!("segment header needs {SEGMENT_HEADER_SIZE} bytes, file has {}", bytes.len()));
        }
        if bytes[0..8] != SEGMENT_MAGIC {
            return Err("not a tusk log segment (bad magic)".into());
        }
        let crc = u32::from_le_bytes(bytes[24..28].try_into().unwrap());
        if crc != crc32fast::hash(&bytes[0..24]) {
            return Err("segment header checksum mismatch".into());
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        if version < SEGMENT_VERSION {
            return Err(format!(
                "segment format version {version} was written by an older tusk; this build reads only version \
                 {SEGMENT_VERSION} (delta-encoded records): recover the store with the tusk that wrote it"
            ));
        }
        if version != SEGMENT_VERSION {
            return Err(format!("segment format version {version}, this build reads {SEGMENT_VERSION}"));
        }
        Ok(SegmentHeader {
            partition: u32::from_le_bytes(bytes[12..16].try_into().unwrap()),
            seq: u64::from_le_bytes(bytes[16..24].try_into().unwrap()),
        })
    }
}

/// Fixed fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub lsn: u64,
    pub partition: u32,
    pub flags: u32,
    /// For markers: the resolved LSN range `(from, to]`.
    pub void: Option<(u64, u64)>,
}

/// Appends `v` as an unsigned LEB128 varint. Byte by byte: on the commit path
/// ([`crate::line_record`]) this measured 80 ns per Hathi record against 108 ns for one
/// fixed-size copy cut to the varint's length.
#[inline]
pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Reads a varint from the front of `rest`, advancing it; `None` if truncated or longer
/// than a u64.
#[inline]
fn take_varint(rest: &mut &[u8]) -> Option<u64> {
    // Most varints of a record (gaps of nearby words, lengths, counts) fit in one byte.
    if let Some(&b) = rest.first().filter(|&&b| b < 0x80) {
        *rest = &rest[1..];
        return Some(u64::from(b));
    }
    let mut v = 0u64;
    for (i, &b) in rest.iter().enumerate().take(MAX_VARINT) {
        let bits = u64::from(b & 0x7F);
        if i == MAX_VARINT - 1 && b > 1 {
            return None;
        }
        v |= bits << (7 * i);
        if b & 0x80 == 0 {
            *rest = &rest[i + 1..];
            return Some(v);
        }
    }
    None
}

/// Appends one record to a buffer: `begin`, any number of `push_write` (at ascending,
/// non-overlapping offsets), then `finish`. Markers, checkpoint records and tests use it;
/// commits encode their write sets with [`crate::line_record`].
pub struct RecordEncoder {
    start: usize,
    /// Writes are counted into the header when the record is finished: the count's varint
    /// is reserved at full width here and the header is shifted left if it comes out shorter.
    count_at: usize,
    writes: u32,
    /// End of the previous write: the next write's offset is encoded as its gap from here.
    end: u64,
}

/// Bytes reserved for the write count's varint (a u32).
const COUNT_RESERVED: usize = 5;

impl RecordEncoder {
    pub fn begin(buf: &mut Vec<u8>, header: RecordHeader) -> RecordEncoder {
        debug_assert!(buf.len().is_multiple_of(8), "records start 8-aligned");
        let start = buf.len();
        buf.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
        buf.extend_from_slice(&header.lsn.to_le_bytes());
        let flags = header.flags | if header.void.is_some() { FLAG_MARKER } else { 0 };
        debug_assert!(flags <= u32::from(u8::MAX));
        buf.push(flags as u8);
        put_varint(buf, u64::from(header.partition));
        let count_at = buf.len();
        buf.extend_from_slice(&[0u8; COUNT_RESERVED]);
        if let Some((from, to)) = header.void {
            buf.extend_from_slice(&from.to_le_bytes());
            buf.extend_from_slice(&to.to_le_bytes());
        }
        RecordEncoder { start, count_at, writes: 0, end: 0 }
    }

    #[inline]
    fn push_header(&mut self, buf: &mut Vec<u8>, offset: u64, len: usize) {
        assert!(offset >= self.end || self.writes == 0, "record writes must ascend without overlap ({offset} < {})", self.end);
        put_varint(buf, offset - if self.writes == 0 { 0 } else { self.end });
        put_varint(buf, len as u64);
        self.end = offset + len as u64;
        self.writes += 1;
    }

    pub fn push_write(&mut self, buf: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
        self.push_header(buf, offset, bytes.len());
        buf.extend_from_slice(bytes);
    }

    /// Appends a write whose bytes are the little-endian encodings of `words`.
    pub fn push_write_words(&mut self, buf: &mut Vec<u8>, offset: u64, words: impl ExactSizeIterator<Item = u64>) {
        buf.reserve(2 * MAX_VARINT + words.len() * 8);
        self.push_header(buf, offset, words.len() * 8);
        for w in words {
            buf.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Seals the record; returns its framed length.
    pub fn finish(self, buf: &mut Vec<u8>) -> usize {
        let mut count = Vec::with_capacity(COUNT_RESERVED);
        put_varint(&mut count, u64::from(self.writes));
        // Close the reserved gap: move everything after it left.
        let reserved_end = self.count_at + COUNT_RESERVED;
        buf[self.count_at..self.count_at + count.len()].copy_from_slice(&count);
        buf.copy_within(reserved_end.., self.count_at + count.len());
        buf.truncate(buf.len() - (COUNT_RESERVED - count.len()));
        seal_frame(buf, self.start)
    }
}

/// Completes the record whose frame starts at `start` and whose payload is the rest of
/// `buf`: writes the frame header (with the payload's checksum) and pads to 8 bytes;
/// returns the framed length.
pub(crate) fn seal_frame(buf: &mut Vec<u8>, start: usize) -> usize {
    let payload_start = start + FRAME_HEADER_SIZE;
    let payload_len = buf.len() - payload_start;
    assert!(payload_len <= MAX_PAYLOAD, "record payload of {payload_len} bytes exceeds MAX_PAYLOAD");
    let crc = crc32fast::hash(&buf[payload_start..]);
    let frame = &mut buf[start..payload_start];
    frame[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    frame[4..8].copy_from_slice(&(payload_len as u32).to_le_bytes());
    frame[8..12].copy_from_slice(&crc.to_le_bytes());
    let padded = buf.len().next_multiple_of(8);
    buf.resize(padded, 0);
    buf.len() - start
}

/// A decoded record, borrowing its writes from the buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    pub header: RecordHeader,
    writes: &'a [u8],
    count: u32,
}

impl<'a> RecordView<'a> {
    /// The (heap offset, bytes) pairs, in the order they were logged (ascending).
    pub fn writes(&self) -> WriteIter<'a> {
        WriteIter { rest: self.writes, left: self.count, end: 0, first: true, cut_short: false }
    }

    pub fn write_count(&self) -> u32 {
        self.count
    }
}

pub struct WriteIter<'a> {
    rest: &'a [u8],
    left: u32,
    /// End of the previous write (offsets are gaps from it).
    end: u64,
    first: bool,
    /// The bytes stopped holding writes before the count did.
    cut_short: bool,
}

impl<'a> WriteIter<'a> {
    /// The next write, or `None` where the bytes do not hold one (truncated varints or
    /// bytes, offsets past u64).
    #[inline]
    fn decode_next(&mut self) -> Option<(u64, &'a [u8])> {
        let mut rest = self.rest;
        let gap = take_varint(&mut rest)?;
        let len = usize::try_from(take_varint(&mut rest)?).ok()?;
        let offset = if self.first { gap } else { self.end.checked_add(gap)? };
        let end = offset.checked_add(len as u64)?;
        let bytes = rest.get(..len)?;
        self.rest = &rest[len..];
        self.end = end;
        self.first = false;
        Some((offset, bytes))
    }
}

impl<'a> Iterator for WriteIter<'a> {
    type Item = (u64, &'a [u8]);

    fn next(&mut self) -> Option<(u64, &'a [u8])> {
        if self.left == 0 {
            return None;
        }
        // `decode_frame` validated the bounds of the records it returns, but a view from
        // `decode_validated` at a position the scan did not validate may claim more writes
        // than it holds: the iteration then ends instead of indexing past the record (found
        // by the log_records fuzz target). Same bounds checks as slicing, no panic path.
        match self.decode_next() {
            Some(w) => {
                self.left -= 1;
                Some(w)
            }
            None => {
                self.left = 0;
                self.cut_short = true;
                None
            }
        }
    }
}

impl WriteIter<'_> {
    /// Once the iteration has ended: whether the write list held exactly its count of
    /// writes and nothing after them (what [`decode_frame`] checks, and [`scan_frame`]
    /// leaves to replay).
    pub fn check_end(&self) -> Result<(), String> {
        if self.cut_short {
            return Err("write runs past the record".into());
        }
        if self.left == 0 && !self.rest.is_empty() {
            return Err(format!("{} unexplained bytes after the writes", self.rest.len()));
        }
        Ok(())
    }
}

/// The pad that closes a flush ending at file position `end`: its bytes, to append.
pub fn pad_frame(end: u64) -> Vec<u8> {
    debug_assert!(end.is_multiple_of(8));
    let gap = match FLUSH_ALIGN - end % FLUSH_ALIGN {
        0 => FLUSH_ALIGN,
        g => g,
    } as usize;
    let mut pad = vec![0u8; gap];
    pad[0..4].copy_from_slice(&PAD_MAGIC.to_le_bytes());
    pad[4..8].copy_from_slice(&(gap as u32).to_le_bytes());
    pad
}

/// What sits at a position of a segment.
#[derive(Debug)]
pub enum Frame<'a> {
    /// A valid record and the position after it.
    Record(RecordView<'a>, usize),
    /// A valid pad frame (the end of a flush) and the position after it.
    Pad(usize),
    /// Exactly the end of the data.
    End,
    /// The rest of the data is zeros: space written ahead of the segment's last flush (see
    /// [`ZERO_AHEAD`]); the segment's records end here.
    Zeros,
    /// Not a valid record: torn, zeroed, or damaged (which one is decided by the caller from
    /// what follows).
    Invalid(String),
}

/// Decodes the frame at `at` of `data`, the record's write list included.
pub fn decode_frame(data: &[u8], at: usize) -> Frame<'_> {
    decode_frame_with(data, at, true)
}

/// [`decode_frame`] for the recovery scan: the same checks (frame, checksum, header), except
/// that a record's write list is not walked. The checksum vouches for those bytes being the
/// ones the writer wrote; replay walks the list anyway and reports one that does not parse
/// ([`WriteIter::check_end`]), so the scan need not decode every write a second time (7% of
/// a recovery's time in an A/B on a 1 GiB heap + 1 GiB log).
pub fn scan_frame(data: &[u8], at: usize) -> Frame<'_> {
    decode_frame_with(data, at, false)
}

fn decode_frame_with(data: &[u8], at: usize, walk_writes: bool) -> Frame<'_> {
    if at == data.len() {
        return Frame::End;
    }
    // Neither magic starts with a zero byte, so only a frame that is invalid anyway pays
    // for the scan.
    if data[at] == 0 && crate::zeros::all_zero(&data[at..]) {
        return Frame::Zeros;
    }
    if data.len() - at >= 8 && data[at..at + 4] == PAD_MAGIC.to_le_bytes() {
        let len = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()) as usize;
        let end = at + len;
        let valid = (8..=FLUSH_ALIGN as usize).contains(&len)
            && (end as u64).is_multiple_of(FLUSH_ALIGN)
            && end <= data.len()
            && crate::zeros::all_zero(&data[at + 8..end]);
        return if valid { Frame::Pad(end) } else { Frame::Invalid("damaged pad frame".into()) };
    }
    if data.len() - at < FRAME_HEADER_SIZE {
        return Frame::Invalid(format!("{} trailing bytes, shorter than a frame header", data.len() - at));
    }
    let word = |i: usize| u32::from_le_bytes(data[at + i..at + i + 4].try_into().unwrap());
    if word(0) != RECORD_MAGIC {
        return Frame::Invalid("bad record magic".into());
    }
    let len = word(4) as usize;
    if !(PAYLOAD_FIXED..=MAX_PAYLOAD).contains(&len) {
        return Frame::Invalid(format!("implausible record length {len}"));
    }
    let payload_start = at + FRAME_HEADER_SIZE;
    let Some(end) = payload_start.checked_add(len).filter(|&end| end <= data.len()) else {
        return Frame::Invalid(format!("record of {len} bytes runs past the end of the file"));
    };
    let payload = &data[payload_start..end];
    if crc32fast::hash(payload) != word(8) {
        return Frame::Invalid("record checksum mismatch".into());
    }
    // The reserved word and the alignment bytes carry nothing, but the format says they are
    // zero: a flipped bit there is damage too, not something to skip silently.
    if word(12) != 0 {
        return Frame::Invalid("reserved frame word is not zero".into());
    }
    let next = end.next_multiple_of(8).min(data.len());
    if data[end..next].iter().any(|&b| b != 0) {
        return Frame::Invalid("alignment bytes after the record are not zero".into());
    }
    match decode_payload(payload, walk_writes) {
        Ok(view) => Frame::Record(view, next),
        Err(reason) => Frame::Invalid(reason),
    }
}

/// Decodes the record at `at` that [`decode_frame`] already validated (no checksum pass:
/// replay reads every record again, on every worker). `None` if it is not a valid record.
pub fn decode_validated(data: &[u8], at: usize) -> Option<RecordView<'_>> {
    let len = u32::from_le_bytes(data.get(at + 4..at + 8)?.try_into().ok()?) as usize;
    let payload = data.get(at + FRAME_HEADER_SIZE..(at + FRAME_HEADER_SIZE).checked_add(len)?)?;
    decode_header(payload).ok()
}

/// The fixed fields of a payload, and its writes left undecoded.
fn decode_header(payload: &[u8]) -> Result<RecordView<'_>, String> {
    if payload.len() < PAYLOAD_FIXED {
        return Err("record payload too short".into());
    }
    let lsn = u64::from_le_bytes(payload[0..8].try_into().unwrap());
    let flags = u32::from(payload[8]);
    let mut rest = &payload[9..];
    let partition = take_varint(&mut rest).and_then(|p| u32::try_from(p).ok()).ok_or("bad partition varint")?;
    let count = take_varint(&mut rest).and_then(|c| u32::try_from(c).ok()).ok_or("bad write count varint")?;
    let void = if flags & FLAG_MARKER != 0 {
        let v = rest.get(0..16).ok_or("marker record too short")?;
        let from = u64::from_le_bytes(v[0..8].try_into().unwrap());
        let to = u64::from_le_bytes(v[8..16].try_into().unwrap());
        rest = &rest[16..];
        Some((from, to))
    } else {
        None
    };
    Ok(RecordView { header: RecordHeader { lsn, partition, flags, void }, writes: rest, count })
}

fn decode_payload(payload: &[u8], walk_writes: bool) -> Result<RecordView<'_>, String> {
    let view = decode_header(payload)?;
    let RecordHeader { lsn, flags, void, .. } = view.header;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown record flags {flags:#x}"));
    }
    if lsn == 0 {
        return Err("record with LSN 0".into());
    }
    if let Some((from, to)) = void {
        if from >= to || to >= lsn {
            return Err(format!("marker record voids an invalid range ({from}, {to}] at LSN {lsn}"));
        }
    }
    if walk_writes {
        let mut writes = view.writes();
        writes.by_ref().for_each(drop);
        writes.check_end()?;
    }
    Ok(view)
}

/// Looks past damage at `from` for a later flush: a valid pad frame followed by a valid
/// record. Returns that record's position. Damage with a later flush behind it cannot be a
/// torn write (only the last flush is ever in flight); damage without one can.
pub fn later_flush_after(data: &[u8], from: usize) -> Option<usize> {
    let mut at = from.next_multiple_of(8);
    let mut seen_pad = false;
    while at + 8 <= data.len() {
        let magic = &data[at..at + 4];
        if magic == PAD_MAGIC.to_le_bytes() {
            if let Frame::Pad(next) = decode_frame(data, at) {
                seen_pad = true;
                at = next;
                continue;
            }
        } else if magic == RECORD_MAGIC.to_le_bytes() {
            if let Frame::Record(_, next) = decode_frame(data, at) {
                if seen_pad {
                    return Some(at);
                }
                at = next;
                continue;
            }
        }
        at += 8;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(lsn: u64, flags: u32, writes: &[(u64, &[u8])]) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut enc = RecordEncoder::begin(&mut buf, RecordHeader { lsn, partition: 3, flags, void: None });
        for (off, bytes) in writes {
            enc.push_write(&mut buf, *off, bytes);
        }
        enc.finish(&mut buf);
        buf
    }

    #[test]
    fn record_round_trips() {
        let buf = record(42, FLAG_PARTITION, &[(8, b"hello"), (4096, &[1, 2, 3, 4, 5, 6, 7, 8])]);
        assert_eq!(buf.len() % 8, 0);
        let Frame::Record(view, next) = decode_frame(&buf, 0) else { panic!("not decoded") };
        assert_eq!(next, buf.len());
        assert_eq!(view.header, RecordHeader { lsn: 42, partition: 3, flags: FLAG_PARTITION, void: None });
        let writes: Vec<_> = view.writes().collect();
        assert_eq!(writes, vec![(8, &b"hello"[..]), (4096, &[1u8, 2, 3, 4, 5, 6, 7, 8][..])]);
        assert!(matches!(decode_frame(&buf, buf.len()), Frame::End));
    }

    #[test]
    fn writes_of_an_unvalidated_record_end_instead_of_running_past_it() {
        // decode_validated skips the checks of decode_frame: a record claiming more writes
        // than it holds (count bumped from 1 to 3) must not make iteration index past it.
        let mut buf = record(7, 0, &[(16, b"abc")]);
        // LSN, flags, partition 3 (one varint byte), then the count (one byte).
        let count_at = FRAME_HEADER_SIZE + 10;
        assert_eq!(buf[count_at], 1);
        buf[count_at] = 3;
        let view = decode_validated(&buf, 0).expect("decode_validated does not check writes");
        assert_eq!(view.writes().collect::<Vec<_>>(), vec![(16, &b"abc"[..])]);
        // A write whose length runs past the record.
        let mut buf = record(7, 0, &[(16, b"abc")]);
        // After the count: the gap (16, one byte), then the length (3, one byte).
        let len_at = FRAME_HEADER_SIZE + 12;
        assert_eq!(buf[len_at], 3);
        buf[len_at] = 100;
        let view = decode_validated(&buf, 0).unwrap();
        assert_eq!(view.writes().count(), 0);
        assert!(matches!(decode_frame(&buf, 0), Frame::Invalid(_)), "the scan rejects it");
    }

    /// Recomputes a patched record's checksum, as if the writer had written it so.
    fn reseal(buf: &mut [u8]) {
        let len = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
        let crc = crc32fast::hash(&buf[FRAME_HEADER_SIZE..FRAME_HEADER_SIZE + len]);
        buf[8..12].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn scan_frame_leaves_the_write_list_to_replay() {
        let whole = record(7, 0, &[(16, b"abc")]);
        let Frame::Record(view, _) = scan_frame(&whole, 0) else { panic!("not decoded") };
        let mut writes = view.writes();
        assert_eq!(writes.by_ref().collect::<Vec<_>>(), vec![(16, &b"abc"[..])]);
        assert_eq!(writes.check_end(), Ok(()));
        // LSN, flags, partition 3 (one varint byte), then the count (one byte).
        let count_at = FRAME_HEADER_SIZE + 10;
        for (count, reason) in [(3u8, "write runs past the record"), (0, "5 unexplained bytes after the writes")] {
            let mut buf = whole.clone();
            buf[count_at] = count;
            reseal(&mut buf);
            let Frame::Invalid(why) = decode_frame(&buf, 0) else { panic!("count {count}: decode_frame walks the writes") };
            assert_eq!(why, reason);
            let Frame::Record(view, next) = scan_frame(&buf, 0) else { panic!("count {count}: the checksum matches") };
            assert_eq!(next, buf.len());
            let mut writes = view.writes();
            writes.by_ref().for_each(drop);
            assert_eq!(writes.check_end(), Err(reason.to_string()), "count {count}");
        }
        // Everything else is checked as by decode_frame: a flipped payload byte.
        let mut buf = whole.clone();
        buf[FRAME_HEADER_SIZE + 13] ^= 1;
        assert!(matches!(scan_frame(&buf, 0), Frame::Invalid(_)));
    }

    #[test]
    fn offsets_are_delta_encoded_and_round_trip() {
        let far = (1u64 << 40) + 8;
        let writes: &[(u64, &[u8])] = &[(0, b"a"), (1, b"bc"), (4096, &[7; 8]), (4104, &[8; 16]), (far, b"z"), (u64::MAX - 2, b"xy")];
        let buf = record(9, 0, writes);
        let Frame::Record(view, _) = decode_frame(&buf, 0) else { panic!("not decoded") };
        assert_eq!(view.writes().collect::<Vec<_>>(), writes.to_vec());
        assert_eq!(view.write_count(), writes.len() as u32);
    }

    /// The Hathi record (6 random words of a 1 GiB heap) is 112 bytes (160 in version 1).
    #[test]
    fn six_random_words_take_112_bytes() {
        let mut buf = Vec::new();
        let mut enc = RecordEncoder::begin(&mut buf, RecordHeader { lsn: 1 << 33, partition: 1, flags: 0, void: None });
        for i in 1..=6u64 {
            enc.push_write_words(&mut buf, i * (1 << 30) / 7 / 8 * 8, [i].into_iter());
        }
        assert_eq!(enc.finish(&mut buf), 112);
        assert!(matches!(decode_frame(&buf, 0), Frame::Record(v, 112) if v.writes().count() == 6));
    }

    #[test]
    #[should_panic(expected = "ascend")]
    fn writes_out_of_order_are_refused() {
        record(1, 0, &[(64, b"a"), (8, b"b")]);
    }

    #[test]
    fn a_varint_past_u64_is_not_a_record() {
        let mut rest: &[u8] = &[0xFF; 11];
        assert_eq!(take_varint(&mut rest), None);
        let mut rest: &[u8] = &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01];
        assert_eq!(take_varint(&mut rest), Some(u64::MAX));
        let mut rest: &[u8] = &[0x80];
        assert_eq!(take_varint(&mut rest), None, "truncated");
    }

    #[test]
    fn an_old_segment_version_is_refused_clearly() {
        let mut bytes = SegmentHeader { partition: 0, seq: 1 }.encode();
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32fast::hash(&bytes[0..24]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
        let err = SegmentHeader::decode(&bytes).unwrap_err();
        assert!(err.contains("version 1") && err.contains("older tusk"), "{err}");
    }

    /// What the log_records fuzz target checks, on random mutations of valid records whose
    /// checksums are repaired (so the varint decoding behind the CRC is reached): never a
    /// panic, and the replay decoder agrees with the scan on every record that validates.
    #[test]
    fn mutated_records_never_panic_and_both_decoders_agree() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let base = record(42, FLAG_PARTITION, &[(8, b"hello"), (4096, &[1, 2, 3, 4, 5, 6, 7, 8]), (1 << 35, b"x")]);
        for _ in 0..50_000 {
            let mut buf = base.clone();
            for _ in 0..1 + next() % 4 {
                let at = FRAME_HEADER_SIZE + (next() as usize % (buf.len() - FRAME_HEADER_SIZE));
                buf[at] = next() as u8;
            }
            if next() % 2 == 0 {
                let len = (next() as usize % (buf.len() - FRAME_HEADER_SIZE)) as u32;
                buf[4..8].copy_from_slice(&len.to_le_bytes());
            }
            let len = (u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize).min(buf.len() - FRAME_HEADER_SIZE);
            let crc = crc32fast::hash(&buf[FRAME_HEADER_SIZE..FRAME_HEADER_SIZE + len]);
            buf[8..12].copy_from_slice(&crc.to_le_bytes());
            if let Frame::Record(view, _) = decode_frame(&buf, 0) {
                let again = decode_validated(&buf, 0).expect("a validated record decodes again");
                assert_eq!(again.header, view.header);
                assert!(again.writes().eq(view.writes()));
                assert_eq!(view.writes().count(), view.write_count() as usize);
            }
            if let Some(view) = decode_validated(&buf, 0) {
                let _ = view.writes().take(64).count();
            }
        }
    }

    #[test]
    fn marker_round_trips() {
        let mut buf = Vec::new();
        let enc = RecordEncoder::begin(&mut buf, RecordHeader { lsn: 10, partition: 0, flags: 0, void: Some((4, 9)) });
        enc.finish(&mut buf);
        let Frame::Record(view, _) = decode_frame(&buf, 0) else { panic!() };
        assert_eq!(view.header.void, Some((4, 9)));
        assert_eq!(view.header.flags & FLAG_MARKER, FLAG_MARKER);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let buf = record(7, 0, &[(64, b"abcdefgh")]);
        for bit in 0..buf.len() * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            match decode_frame(&damaged, 0) {
                Frame::Record(view, _) => {
                    // Only flips in the reserved word or the padding leave the record intact.
                    assert_eq!(view.header.lsn, 7, "bit {bit}");
                    assert_eq!(view.writes().next(), Some((64, &b"abcdefgh"[..])), "bit {bit}");
                }
                Frame::Invalid(_) => {}
                Frame::End | Frame::Zeros | Frame::Pad(_) => panic!("bit {bit}: not a record"),
            }
        }
    }

    #[test]
    fn every_truncation_is_invalid() {
        let buf = record(7, 0, &[(64, b"abcdefgh")]);
        for len in 1..buf.len() {
            // Fixed fields, one-byte gap and length varints, 8 bytes.
            let payload_end = FRAME_HEADER_SIZE + PAYLOAD_FIXED + 2 + 8;
            match decode_frame(&buf[..len], 0) {
                Frame::Invalid(_) => assert!(len < payload_end),
                Frame::Record(..) => assert!(len >= payload_end, "len {len}"),
                Frame::End | Frame::Zeros | Frame::Pad(_) => panic!("len {len}: not a record"),
            }
        }
    }

    #[test]
    fn damage_is_torn_only_without_a_later_flush() {
        // Flush 1: records 1, 2 and a pad; flush 2: record 3 and a pad.
        let mut buf = record(1, 0, &[(8, b"x")]);
        buf.extend(record(2, 0, &[(16, b"y")]));
        buf.extend(pad_frame(buf.len() as u64));
        assert_eq!(buf.len() as u64 % FLUSH_ALIGN, 0);
        let flush2 = buf.len();
        buf.extend(record(3, 0, &[(24, b"z")]));
        buf.extend(pad_frame(buf.len() as u64));
        let mut damaged = buf.clone();
        damaged[20] ^= 0xFF;
        assert!(matches!(decode_frame(&damaged, 0), Frame::Invalid(_)));
        assert_eq!(later_flush_after(&damaged, 8), Some(flush2), "damage in an earlier flush");
        let mut torn = buf.clone();
        torn[flush2 + 20] ^= 0xFF;
        assert_eq!(later_flush_after(&torn, flush2 + 8), None, "damage in the last flush");
    }

    #[test]
    fn pads_end_on_block_boundaries() {
        for end in (0..3 * FLUSH_ALIGN).step_by(8) {
            let pad = pad_frame(end);
            assert!(pad.len() >= 8 && pad.len() as u64 <= FLUSH_ALIGN);
            assert_eq!((end + pad.len() as u64) % FLUSH_ALIGN, 0);
            let mut data = vec![0u8; end as usize];
            data.extend(&pad);
            assert!(matches!(decode_frame(&data, end as usize), Frame::Pad(n) if n == data.len()));
        }
    }

    #[test]
    fn segment_header_round_trips_and_detects_damage() {
        let h = SegmentHeader { partition: 5, seq: 99 };
        let bytes = h.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(h));
        let mut bad = bytes;
        bad[17] ^= 1;
        assert!(SegmentHeader::decode(&bad).is_err());
        assert!(SegmentHeader::decode(&bytes[..10]).is_err());
    }

    /// Found by `tusk crashtest --seed 7` (torn fault): a bit flipped in a record's reserved
    /// frame word or its alignment bytes was accepted silently.
    #[test]
    fn damage_in_reserved_or_alignment_bytes_is_invalid() {
        let rec = record(5, 0, &[(64, &[1, 2, 3, 4])]);
        assert!(rec.len().is_multiple_of(8) && rec.len() > FRAME_HEADER_SIZE);
        assert!(matches!(decode_frame(&rec, 0), Frame::Record(..)));
        let payload = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
        let end = FRAME_HEADER_SIZE + payload;
        assert!(end < rec.len(), "this record has alignment bytes");
        for at in [12, 15, end, rec.len() - 1] {
            let mut bad = rec.clone();
            bad[at] ^= 0x10;
            assert!(matches!(decode_frame(&bad, 0), Frame::Invalid(_)), "byte {at} flipped was accepted");
        }
    }

    #[test]
    fn zeros_to_the_end_end_the_data_and_zeros_before_more_bytes_are_damage() {
        let mut data = record(9, 0, &[(64, &[7; 20])]);
        let end = data.len();
        data.extend_from_slice(&pad_frame(end as u64));
        let flush_end = data.len();
        data.resize(flush_end + ZERO_AHEAD as usize, 0);
        assert!(matches!(decode_frame(&data, 0), Frame::Record(_, n) if n == end));
        assert!(matches!(decode_frame(&data, end), Frame::Pad(n) if n == flush_end));
        assert!(matches!(decode_frame(&data, flush_end), Frame::Zeros));
        // One byte of anything after the zeros: not space written ahead, but damage.
        let last = data.len() - 1;
        data[last] = 1;
        assert!(matches!(decode_frame(&data, flush_end), Frame::Invalid(_)));
        // A record whose first bytes were zeroed is damaged, not the end.
        let mut rec = record(9, 0, &[(64, &[7; 20])]);
        rec[..8].fill(0);
        assert!(matches!(decode_frame(&rec, 0), Frame::Invalid(_)));
    }
}
