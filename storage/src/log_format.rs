//! Redo-log formats: segment headers and records.
//!
//! A log partition is a sequence of segment files. Each segment starts with a
//! [`SEGMENT_HEADER_SIZE`]-byte header, followed by records:
//!
//! ```text
//! frame   [magic u32][payload length u32][crc32 of payload u32][reserved u32 = 0]
//!         payload, then zero padding to a multiple of 8 bytes
//! payload [lsn u64][partition u32][flags u32][write count u32]
//!         [void_from u64][void_to u64]          only with FLAG_MARKER
//!         ([heap offset u64][length u32][bytes])*
//! ```
//! Records are after-images: replaying one writes its bytes at its offsets. All integers
//! are little-endian.
//!
//! Every flush of a partition is written with O_DIRECT, so it ends on a 4 KiB boundary: the
//! writer closes it with a pad frame `[PAD_MAGIC u32][pad length u32]` and zeros up to the
//! boundary (a whole block when already aligned). Pad frames make flush boundaries visible,
//! which is how recovery tells a torn last flush from damage in an earlier one.

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
pub const FRAME_HEADER_SIZE: usize = 16;
const PAYLOAD_FIXED: usize = 8 + 4 + 4 + 4;
const WRITE_HEADER: usize = 8 + 4;
/// Largest payload a record may have.
pub const MAX_PAYLOAD: usize = 1 << 30;

pub const SEGMENT_MAGIC: [u8; 8] = *b"TUSKLOG\0";
pub const SEGMENT_VERSION: u32 = 1;
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

/// Appends one record to a buffer: `begin`, any number of `push_write`, then `finish`.
pub struct RecordEncoder {
    start: usize,
    count_at: usize,
    writes: u32,
}

impl RecordEncoder {
    pub fn begin(buf: &mut Vec<u8>, header: RecordHeader) -> RecordEncoder {
        debug_assert!(buf.len() % 8 == 0, "records start 8-aligned");
        let start = buf.len();
        buf.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
        buf.extend_from_slice(&header.lsn.to_le_bytes());
        buf.extend_from_slice(&header.partition.to_le_bytes());
        let flags = header.flags | if header.void.is_some() { FLAG_MARKER } else { 0 };
        buf.extend_from_slice(&flags.to_le_bytes());
        let count_at = buf.len();
        buf.extend_from_slice(&0u32.to_le_bytes());
        if let Some((from, to)) = header.void {
            buf.extend_from_slice(&from.to_le_bytes());
            buf.extend_from_slice(&to.to_le_bytes());
        }
        RecordEncoder { start, count_at, writes: 0 }
    }

    pub fn push_write(&mut self, buf: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
        buf.extend_from_slice(&offset.to_le_bytes());
        buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        buf.extend_from_slice(bytes);
        self.writes += 1;
    }

    /// Appends a write whose bytes are the little-endian encodings of `words`.
    pub fn push_write_words(&mut self, buf: &mut Vec<u8>, offset: u64, words: impl ExactSizeIterator<Item = u64>) {
        buf.extend_from_slice(&offset.to_le_bytes());
        buf.extend_from_slice(&((words.len() * 8) as u32).to_le_bytes());
        for w in words {
            buf.extend_from_slice(&w.to_le_bytes());
        }
        self.writes += 1;
    }

    /// Seals the record; returns its framed length.
    pub fn finish(self, buf: &mut Vec<u8>) -> usize {
        buf[self.count_at..self.count_at + 4].copy_from_slice(&self.writes.to_le_bytes());
        let payload_start = self.start + FRAME_HEADER_SIZE;
        let payload_len = buf.len() - payload_start;
        assert!(payload_len <= MAX_PAYLOAD, "record payload of {payload_len} bytes exceeds MAX_PAYLOAD");
        let crc = crc32fast::hash(&buf[payload_start..]);
        let frame = &mut buf[self.start..payload_start];
        frame[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        frame[4..8].copy_from_slice(&(payload_len as u32).to_le_bytes());
        frame[8..12].copy_from_slice(&crc.to_le_bytes());
        let padded = buf.len().next_multiple_of(8);
        buf.resize(padded, 0);
        buf.len() - self.start
    }
}

/// A decoded record, borrowing its writes from the buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    pub header: RecordHeader,
    writes: &'a [u8],
    count: u32,
}

impl<'a> RecordView<'a> {
    /// The (heap offset, bytes) pairs, in the order they were logged.
    pub fn writes(&self) -> WriteIter<'a> {
        WriteIter { rest: self.writes, left: self.count }
    }

    pub fn write_count(&self) -> u32 {
        self.count
    }
}

pub struct WriteIter<'a> {
    rest: &'a [u8],
    left: u32,
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
        let Some((offset, len)) = self.rest.get(0..WRITE_HEADER).map(|h| {
            (u64::from_le_bytes(h[0..8].try_into().unwrap()), u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize)
        }) else {
            self.left = 0;
            return None;
        };
        let Some(bytes) = self.rest.get(WRITE_HEADER..WRITE_HEADER + len) else {
            self.left = 0;
            return None;
        };
        self.rest = &self.rest[WRITE_HEADER + len..];
        self.left -= 1;
        Some((offset, bytes))
    }
}

/// The pad that closes a flush ending at file position `end`: its bytes, to append.
pub fn pad_frame(end: u64) -> Vec<u8> {
    debug_assert!(end % 8 == 0);
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
    /// Not a valid record: torn, zeroed, or damaged (which one is decided by the caller from
    /// what follows).
    Invalid(String),
}

/// Decodes the frame at `at` of `data`.
pub fn decode_frame(data: &[u8], at: usize) -> Frame<'_> {
    if at == data.len() {
        return Frame::End;
    }
    if data.len() - at >= 8 && data[at..at + 4] == PAD_MAGIC.to_le_bytes() {
        let len = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()) as usize;
        let end = at + len;
        let valid = (8..=FLUSH_ALIGN as usize).contains(&len)
            && end as u64 % FLUSH_ALIGN == 0
            && end <= data.len()
            && data[at + 8..end].iter().all(|&b| b == 0);
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
    if len > MAX_PAYLOAD || len < PAYLOAD_FIXED {
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
    match decode_payload(payload) {
        Ok(view) => Frame::Record(view, next),
        Err(reason) => Frame::Invalid(reason),
    }
}

/// Decodes the record at `at` that [`decode_frame`] already validated (no checksum pass:
/// replay reads every record again, on every worker). `None` if it is not a valid record.
pub fn decode_validated(data: &[u8], at: usize) -> Option<RecordView<'_>> {
    let len = u32::from_le_bytes(data.get(at + 4..at + 8)?.try_into().ok()?) as usize;
    let payload = data.get(at + FRAME_HEADER_SIZE..at + FRAME_HEADER_SIZE + len)?;
    if payload.len() < PAYLOAD_FIXED {
        return None;
    }
    let lsn = u64::from_le_bytes(payload[0..8].try_into().ok()?);
    let partition = u32::from_le_bytes(payload[8..12].try_into().ok()?);
    let flags = u32::from_le_bytes(payload[12..16].try_into().ok()?);
    let count = u32::from_le_bytes(payload[16..20].try_into().ok()?);
    let (void, writes) = if flags & FLAG_MARKER != 0 {
        let v = payload.get(PAYLOAD_FIXED..PAYLOAD_FIXED + 16)?;
        (Some((u64::from_le_bytes(v[0..8].try_into().ok()?), u64::from_le_bytes(v[8..16].try_into().ok()?))), &payload[PAYLOAD_FIXED + 16..])
    } else {
        (None, &payload[PAYLOAD_FIXED..])
    };
    Some(RecordView { header: RecordHeader { lsn, partition, flags, void }, writes, count })
}

fn decode_payload(payload: &[u8]) -> Result<RecordView<'_>, String> {
    let lsn = u64::from_le_bytes(payload[0..8].try_into().unwrap());
    let partition = u32::from_le_bytes(payload[8..12].try_into().unwrap());
    let flags = u32::from_le_bytes(payload[12..16].try_into().unwrap());
    let count = u32::from_le_bytes(payload[16..20].try_into().unwrap());
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown record flags {flags:#x}"));
    }
    if lsn == 0 {
        return Err("record with LSN 0".into());
    }
    let mut rest = &payload[PAYLOAD_FIXED..];
    let void = if flags & FLAG_MARKER != 0 {
        if rest.len() < 16 {
            return Err("marker record too short".into());
        }
        let from = u64::from_le_bytes(rest[0..8].try_into().unwrap());
        let to = u64::from_le_bytes(rest[8..16].try_into().unwrap());
        if from >= to || to >= lsn {
            return Err(format!("marker record voids an invalid range ({from}, {to}] at LSN {lsn}"));
        }
        rest = &rest[16..];
        Some((from, to))
    } else {
        None
    };
    let writes = rest;
    for _ in 0..count {
        if rest.len() < WRITE_HEADER {
            return Err("write header runs past the record".into());
        }
        let len = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
        if rest.len() - WRITE_HEADER < len {
            return Err("write bytes run past the record".into());
        }
        rest = &rest[WRITE_HEADER + len..];
    }
    if !rest.is_empty() {
        return Err(format!("{} unexplained bytes after the writes", rest.len()));
    }
    Ok(RecordView { header: RecordHeader { lsn, partition, flags, void }, writes, count })
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
        let count_at = FRAME_HEADER_SIZE + 16;
        buf[count_at..count_at + 4].copy_from_slice(&3u32.to_le_bytes());
        let view = decode_validated(&buf, 0).expect("decode_validated does not check writes");
        assert_eq!(view.writes().collect::<Vec<_>>(), vec![(16, &b"abc"[..])]);
        // A write whose length runs past the record.
        let mut buf = record(7, 0, &[(16, b"abc")]);
        let len_at = FRAME_HEADER_SIZE + 20 + 8;
        buf[len_at..len_at + 4].copy_from_slice(&1000u32.to_le_bytes());
        let view = decode_validated(&buf, 0).unwrap();
        assert_eq!(view.writes().count(), 0);
        assert!(matches!(decode_frame(&buf, 0), Frame::Invalid(_)), "the scan rejects it");
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
                Frame::End | Frame::Pad(_) => panic!("bit {bit}: not a record"),
            }
        }
    }

    #[test]
    fn every_truncation_is_invalid() {
        let buf = record(7, 0, &[(64, b"abcdefgh")]);
        for len in 1..buf.len() {
            let payload_end = FRAME_HEADER_SIZE + PAYLOAD_FIXED + WRITE_HEADER + 8;
            match decode_frame(&buf[..len], 0) {
                Frame::Invalid(_) => assert!(len < payload_end),
                Frame::Record(..) => assert!(len >= payload_end, "len {len}"),
                Frame::End | Frame::Pad(_) => panic!("len {len}: not a record"),
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
        let rec = record(5, 0, &[(64, &[1, 2, 3])]);
        assert!(rec.len() % 8 == 0 && rec.len() > FRAME_HEADER_SIZE);
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
}
