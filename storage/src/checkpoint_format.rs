//! Checkpoint formats: segments of chunk images, and manifests.
//!
//! ```text
//! DIR/ckpt/seg-EEEEEEEEEE.ckpt            segment: the chunk images checkpoint E wrote,
//!                                         back to back, each a multiple of 4096 bytes
//!   per image  block 0  [magic "TUSKCHNK"][version u32 = 3][block size in pages u32]
//!                       [chunk index u64][epoch u64][chunk LSN u64][data length u64]
//!                       [crc32 of the block table u32][crc32 of the above u32], zeros to 64,
//!                       the block table (a crc32 per block of the data), zeros to 4096 bytes
//!                       (image version 2, still read: [0 u32], the crc32 of all the data,
//!                       no table)
//!              then     the chunk's bytes (a multiple of 4096)
//! DIR/MANIFEST-EEEEEEEEEE                 manifest of checkpoint E
//!   [magic "TUSKMANF"][version u32][0 u32][epoch u64][chunk size u64][covered bytes u64]
//!   [chunk count u64], then per chunk [segment epoch u64][offset in the segment u64]
//!   [chunk LSN u64][crc32 u32][0 u32], then [crc32 of everything before u32]
//! ```
//! A chunk image holds every write with an LSN below its chunk LSN and none above; its
//! header names the chunk and the checkpoint that wrote it, so an image found at the wrong
//! place is recognised. The manifest names, for every chunk below `covered bytes`, where the
//! image that belongs to this checkpoint lies: in its own segment, or in an older one when
//! the chunk stayed clean. One segment per checkpoint (not one file per chunk) lets a
//! checkpoint write its images in large sequential writes and sync the file once.
//!
//! Version 1 kept one file per chunk image (`ckpt/cIIIIIIIIII-eEEEEEEEEE.chunk`); this build
//! refuses such a store with [`ManifestError::Older`] rather than misreading it.

use std::path::{Path, PathBuf};

pub const CHUNK_MAGIC: [u8; 8] = *b"TUSKCHNK";
pub const MANIFEST_MAGIC: [u8; 8] = *b"TUSKMANF";
pub const CHECKPOINT_VERSION: u32 = 2;
/// Size of a chunk image's header block.
pub const CHUNK_HEADER_SIZE: usize = 4096;
/// Bytes of one manifest entry.
const ENTRY_SIZE: usize = 32;
/// Bytes of a manifest before its entries, and of its trailer.
const MANIFEST_HEAD: usize = 48;
const MANIFEST_TRAILER: usize = 4;

pub fn checkpoint_dir(store_dir: &Path) -> PathBuf {
    store_dir.join("ckpt")
}

/// The segment that checkpoint `epoch` writes its images into.
pub fn image_segment_path(store_dir: &Path, epoch: u64) -> PathBuf {
    checkpoint_dir(store_dir).join(format!("seg-{epoch:010}.ckpt"))
}

/// A segment no manifest names any more, kept to be written over by the next checkpoint
/// instead of deleted: unlinking a 1 GiB file and allocating a new one cost the disk as much
/// as writing a third of it. Its name matches no segment, so nothing ever reads it.
pub fn spare_segment_path(store_dir: &Path) -> PathBuf {
    checkpoint_dir(store_dir).join("spare.ckpt")
}

/// Epoch from a segment's file name.
pub fn parse_image_segment_name(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?.strip_suffix(".ckpt")?.parse().ok()
}

/// Bytes one image of a `chunk_size` chunk takes in a segment.
pub fn image_size(chunk_size: u64) -> u64 {
    CHUNK_HEADER_SIZE as u64 + chunk_size
}

pub fn manifest_path(store_dir: &Path, epoch: u64) -> PathBuf {
    store_dir.join(format!("MANIFEST-{epoch:010}"))
}

/// Epoch from a manifest's file name.
pub fn parse_manifest_name(name: &str) -> Option<u64> {
    name.strip_prefix("MANIFEST-")?.parse().ok()
}

/// Chunk image versions: version 2 checks an image's data with one checksum; version 3, which
/// this build writes, with one per block ([`block_size`]), listed in the header, so that a
/// reopen on demand can read and check a single block of a chunk (issue 32). Both are read.
pub const IMAGE_VERSION_WHOLE: u32 = 2;
pub const IMAGE_VERSION_BLOCKS: u32 = 3;
/// Where a version 3 header's table of block checksums starts, and the most blocks it holds.
pub const BLOCK_TABLE_AT: usize = 64;
pub const MAX_BLOCKS: u64 = ((CHUNK_HEADER_SIZE - BLOCK_TABLE_AT) / 4) as u64;

/// The block of a chunk of `chunk_size` bytes (a multiple of 4096) that a reopen on demand
/// reads and checks alone: a page, or as many pages as keep a chunk's blocks within
/// [`MAX_BLOCKS`] (chunks over 4 MiB).
pub fn block_size(chunk_size: u64) -> u64 {
    const PAGE: u64 = crate::PAGE_SIZE;
    chunk_size.div_ceil(PAGE).div_ceil(MAX_BLOCKS).max(1) * PAGE
}

/// The header of a chunk image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub index: u64,
    pub epoch: u64,
    pub lsn: u64,
    pub len: u64,
    /// The data's checksum (version 2), or the block table's (version 3); a manifest entry
    /// repeats it.
    pub crc: u32,
    /// Version 3: the block size and each block's checksum.
    pub blocks: Option<BlockTable>,
}

/// The checksums of an image's blocks, in order; the last block may be short.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTable {
    pub block_size: u64,
    pub crcs: Vec<u32>,
}

impl BlockTable {
    /// The table of `data` in blocks of `block_size`.
    pub fn of(data: &[u8], block_size: u64) -> BlockTable {
        BlockTable { block_size, crcs: data.chunks(block_size as usize).map(crc32fast::hash).collect() }
    }

    /// The table's own checksum (the header's `crc`).
    pub fn crc(&self) -> u32 {
        let mut h = crc32fast::Hasher::new();
        self.crcs.iter().for_each(|c| h.update(&c.to_le_bytes()));
        h.finalize()
    }

    /// Whether `bytes` are block `block`'s (all of it, or up to the data's end).
    pub fn holds(&self, block: usize, bytes: &[u8]) -> bool {
        self.crcs.get(block) == Some(&crc32fast::hash(bytes))
    }

    /// The first block of `data` (blocks from `first` on) that fails its checksum.
    pub fn first_bad(&self, first: usize, data: &[u8]) -> Option<usize> {
        data.chunks(self.block_size as usize).enumerate().find(|&(i, b)| !self.holds(first + i, b)).map(|(i, _)| first + i)
    }
}

impl ChunkHeader {
    /// The version 3 header of an image of `data`.
    pub fn of(index: u64, epoch: u64, lsn: u64, data: &[u8]) -> ChunkHeader {
        let table = BlockTable::of(data, block_size(data.len() as u64));
        ChunkHeader { index, epoch, lsn, len: data.len() as u64, crc: table.crc(), blocks: Some(table) }
    }

    pub fn encode(&self) -> [u8; CHUNK_HEADER_SIZE] {
        let mut b = [0u8; CHUNK_HEADER_SIZE];
        self.encode_into(&mut b);
        b
    }

    /// Writes the header into the first [`CHUNK_HEADER_SIZE`] bytes of `b` (an image buffer).
    pub fn encode_into(&self, b: &mut [u8]) {
        let b = &mut b[..CHUNK_HEADER_SIZE];
        b.fill(0);
        b[0..8].copy_from_slice(&CHUNK_MAGIC);
        let version = if self.blocks.is_some() { IMAGE_VERSION_BLOCKS } else { IMAGE_VERSION_WHOLE };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        if let Some(t) = &self.blocks {
            assert!(t.crcs.len() as u64 <= MAX_BLOCKS && t.block_size.is_multiple_of(crate::PAGE_SIZE), "a block table fits its header");
            b[12..16].copy_from_slice(&u32::try_from(t.block_size / crate::PAGE_SIZE).expect("blocks of pages").to_le_bytes());
            for (i, c) in t.crcs.iter().enumerate() {
                b[BLOCK_TABLE_AT + 4 * i..BLOCK_TABLE_AT + 4 * i + 4].copy_from_slice(&c.to_le_bytes());
            }
        }
        b[16..24].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.lsn.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b[48..52].copy_from_slice(&self.crc.to_le_bytes());
        let hcrc = crc32fast::hash(&b[0..52]);
        b[52..56].copy_from_slice(&hcrc.to_le_bytes());
    }

    /// Decodes and checks a header: its own checksum, and a version 3 table's against `crc`
    /// (which the header's checksum covers, so the whole block is).
    pub fn decode(b: &[u8]) -> Result<ChunkHeader, String> {
        if b.len() < CHUNK_HEADER_SIZE {
            return Err(format!("chunk image of {} bytes is shorter than its header", b.len()));
        }
        if b[0..8] != CHUNK_MAGIC {
            return Err("not a tusk chunk image (bad magic)".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32_at(52) != crc32fast::hash(&b[0..52]) {
            return Err("chunk header checksum mismatch".into());
        }
        let (index, epoch, lsn, len, crc) = (u64_at(16), u64_at(24), u64_at(32), u64_at(40), u32_at(48));
        let blocks = match u32_at(8) {
            IMAGE_VERSION_WHOLE => None,
            IMAGE_VERSION_BLOCKS => {
                let block_size = u64::from(u32_at(12)) * crate::PAGE_SIZE;
                if block_size == 0 || len.div_ceil(block_size) > MAX_BLOCKS {
                    return Err(format!("blocks of {block_size} bytes do not fit {len} bytes in a header's table"));
                }
                let count = len.div_ceil(block_size) as usize;
                let table = BlockTable { block_size, crcs: (0..count).map(|i| u32_at(BLOCK_TABLE_AT + 4 * i)).collect() };
                if table.crc() != crc {
                    return Err("chunk block table checksum mismatch".into());
                }
                Some(table)
            }
            version => return Err(format!("chunk format version {version}, this build reads {IMAGE_VERSION_WHOLE} and {IMAGE_VERSION_BLOCKS}")),
        };
        Ok(ChunkHeader { index, epoch, lsn, len, crc, blocks })
    }

    /// Checks all of an image's `data` against the header: its length and checksum(s).
    pub fn check_data(&self, data: &[u8]) -> Result<(), String> {
        if data.len() as u64 != self.len {
            return Err(format!("image holds {} bytes, its header says {}", data.len(), self.len));
        }
        match &self.blocks {
            None if crc32fast::hash(data) != self.crc => Err("chunk image checksum mismatch".into()),
            None => Ok(()),
            Some(t) => match t.first_bad(0, data) {
                Some(block) => Err(format!("chunk image checksum mismatch in block {block} (bytes {} of the chunk)", block as u64 * t.block_size)),
                None => Ok(()),
            },
        }
    }
}

/// One chunk's entry in a manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// The checkpoint epoch that wrote the image this checkpoint uses (its segment).
    pub image_epoch: u64,
    /// Where the image starts in that segment.
    pub offset: u64,
    pub lsn: u64,
    pub crc: u32,
}

/// Why a manifest cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Written by an older build in a format this one does not read.
    #[error("checkpoint format version {version} is older than this build reads ({CHECKPOINT_VERSION}); open the store with the build that wrote it and export its data")]
    Older { version: u32 },
    /// Written by a newer build.
    #[error("manifest format version {version} is newer than this build reads ({CHECKPOINT_VERSION})")]
    Newer { version: u32 },
    /// Not a manifest, or damaged.
    #[error("{0}")]
    Damaged(String),
}

/// A checkpoint: which image holds each chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub epoch: u64,
    pub chunk_size: u64,
    /// Bytes of heap the chunks cover (the allocator's brk when chunk 0 was copied).
    pub covered: u64,
    pub chunks: Vec<ChunkEntry>,
}

impl Manifest {
    pub fn min_lsn(&self) -> u64 {
        self.chunks.iter().map(|c| c.lsn).min().unwrap_or(0)
    }

    pub fn max_lsn(&self) -> u64 {
        self.chunks.iter().map(|c| c.lsn).max().unwrap_or(0)
    }

    /// The segments this checkpoint reads, ascending.
    pub fn segments(&self) -> Vec<u64> {
        let mut s: Vec<u64> = self.chunks.iter().map(|c| c.image_epoch).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MANIFEST_HEAD + ENTRY_SIZE * self.chunks.len() + MANIFEST_TRAILER);
        b.extend_from_slice(&MANIFEST_MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.chunk_size.to_le_bytes());
        b.extend_from_slice(&self.covered.to_le_bytes());
        b.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        for c in &self.chunks {
            b.extend_from_slice(&c.image_epoch.to_le_bytes());
            b.extend_from_slice(&c.offset.to_le_bytes());
            b.extend_from_slice(&c.lsn.to_le_bytes());
            b.extend_from_slice(&c.crc.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, ManifestError> {
        let damaged = |s: String| Err(ManifestError::Damaged(s));
        if b.len() < MANIFEST_HEAD + MANIFEST_TRAILER || b[0..8] != MANIFEST_MAGIC {
            return damaged("not a tusk manifest".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let body = b.len() - MANIFEST_TRAILER;
        // The version is judged only on a manifest whose checksum holds (every version so far
        // ends in a crc32 of the rest), so that damage is not taken for another format.
        let intact = u32_at(body) == crc32fast::hash(&b[..body]);
        let version = u32_at(8);
        if intact && version > CHECKPOINT_VERSION {
            return Err(ManifestError::Newer { version });
        }
        if intact && version != 0 && version < CHECKPOINT_VERSION {
            return Err(ManifestError::Older { version });
        }
        if version != CHECKPOINT_VERSION {
            return damaged(format!("unknown manifest format version {version}"));
        }
        let count = u64_at(40);
        let expected = count.checked_mul(ENTRY_SIZE as u64).and_then(|n| n.checked_add((MANIFEST_HEAD + MANIFEST_TRAILER) as u64));
        if expected != Some(b.len() as u64) {
            return damaged(format!("manifest of {} bytes cannot hold {count} chunks", b.len()));
        }
        if !intact {
            return damaged("manifest checksum mismatch".into());
        }
        let chunk_size = u64_at(24);
        if chunk_size == 0 || chunk_size % 4096 != 0 {
            return damaged(format!("invalid chunk size {chunk_size}"));
        }
        let covered = u64_at(32);
        // Recovery loads `count` chunks into a heap checked against `covered` only: the two
        // must agree, or a chunk could lie past the heap's end.
        if count != covered.div_ceil(chunk_size).max(1) {
            return damaged(format!("manifest lists {count} chunks of {chunk_size} bytes for {covered} covered bytes"));
        }
        let image = image_size(chunk_size);
        let mut chunks = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let at = MANIFEST_HEAD + ENTRY_SIZE * i;
            let entry = ChunkEntry { image_epoch: u64_at(at), offset: u64_at(at + 8), lsn: u64_at(at + 16), crc: u32_at(at + 24) };
            // Images lie at whole image slots: anything else cannot be one (and would make
            // unaligned direct reads).
            if !entry.offset.is_multiple_of(image) {
                return damaged(format!("chunk {i} at segment offset {}, not a multiple of the image size {image}", entry.offset));
            }
            chunks.push(entry);
        }
        Ok(Manifest { epoch: u64_at(16), chunk_size, covered, chunks })
    }
}

/// The manifests in `store_dir`, newest first.
pub fn list_manifests(store_dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(store_dir)? {
        let entry = entry?;
        if let Some(epoch) = parse_manifest_name(&entry.file_name().to_string_lossy()) {
            out.push((epoch, entry.path()));
        }
    }
    out.sort_unstable_by_key(|m| std::cmp::Reverse(m.0));
    Ok(out)
}

/// The checkpoint segments in `store_dir`, oldest first.
pub fn list_image_segments(store_dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let dir = checkpoint_dir(store_dir);
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if let Some(epoch) = parse_image_segment_name(&entry.file_name().to_string_lossy()) {
            out.push((epoch, entry.path()));
        }
    }
    out.sort_unstable_by_key(|s| s.0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let image = image_size(1 << 20);
        Manifest {
            epoch: 7,
            chunk_size: 1 << 20,
            covered: 3 << 20,
            chunks: (0..3).map(|i| ChunkEntry { image_epoch: 7 - i, offset: i * image, lsn: 100 + i, crc: i as u32 }).collect(),
        }
    }

    fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
        let body = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn manifest_round_trips_and_rejects_damage() {
        let m = manifest();
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes), Ok(m.clone()));
        assert_eq!((m.min_lsn(), m.max_lsn()), (100, 102));
        assert_eq!(m.segments(), vec![5, 6, 7]);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Manifest::decode(&bad).is_err(), "flip at byte {i} undetected");
        }
    }

    #[test]
    fn other_versions_are_named_as_such() {
        let mut newer = manifest().encode();
        newer[8] = 9;
        assert_eq!(Manifest::decode(&with_crc(newer)), Err(ManifestError::Newer { version: 9 }));
        let mut older = manifest().encode();
        older[8] = 1;
        let err = Manifest::decode(&with_crc(older)).unwrap_err();
        assert_eq!(err, ManifestError::Older { version: 1 });
        assert!(err.to_string().contains("older than this build reads (2)"), "{err}");
        // A damaged version field (checksum wrong) is damage, not another format.
        let mut flipped = manifest().encode();
        flipped[8] = 1;
        assert!(matches!(Manifest::decode(&flipped), Err(ManifestError::Damaged(_))));
    }

    #[test]
    fn blocks_are_pages_up_to_4_mib_chunks_then_fit_the_table() {
        assert_eq!(block_size(4096), 4096);
        assert_eq!(block_size(1 << 20), 4096);
        assert_eq!(block_size(MAX_BLOCKS * 4096), 4096);
        assert_eq!(block_size(MAX_BLOCKS * 4096 + 4096), 8192);
        for chunk in [1u64 << 22, 1 << 23, 1 << 26, 3 << 20] {
            assert!(chunk.div_ceil(block_size(chunk)) <= MAX_BLOCKS && block_size(chunk).is_multiple_of(4096), "{chunk}");
        }
    }

    #[test]
    fn an_offset_off_the_image_slots_is_refused() {
        let mut m = manifest();
        m.chunks[1].offset += 4096;
        assert!(matches!(Manifest::decode(&m.encode()), Err(ManifestError::Damaged(r)) if r.contains("not a multiple")));
    }

    #[test]
    fn chunk_header_round_trips_and_names_parse() {
        let whole = ChunkHeader { index: 3, epoch: 9, lsn: 1234, len: 1 << 20, crc: 0xDEAD, blocks: None };
        assert_eq!(ChunkHeader::decode(&whole.encode()), Ok(whole.clone()));
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        let blocks = ChunkHeader::of(3, 9, 1234, &data);
        assert_eq!(blocks.blocks.as_ref().map(|t| (t.block_size, t.crcs.len())), Some((4096, 256)));
        assert_eq!(ChunkHeader::decode(&blocks.encode()), Ok(blocks.clone()));
        assert_eq!(blocks.check_data(&data), Ok(()));
        for h in [whole, blocks] {
            let encoded = h.encode();
            // Every bit of the header and of its table counts.
            for byte in (0..56).chain(64..64 + 4 * 256) {
                let mut bad = encoded;
                bad[byte] ^= 1;
                if h.blocks.is_some() || byte < 56 {
                    assert!(ChunkHeader::decode(&bad).is_err(), "byte {byte} flipped");
                }
            }
        }
        let mut flipped = data.clone();
        flipped[5 * 4096 + 17] ^= 0x40;
        let h = ChunkHeader::of(3, 9, 1234, &data);
        assert!(h.check_data(&flipped).unwrap_err().contains("block 5"));
        let t = h.blocks.unwrap();
        assert!(t.holds(4, &flipped[4 * 4096..5 * 4096]) && !t.holds(5, &flipped[5 * 4096..6 * 4096]));
        let s = image_segment_path(Path::new("/s"), 9);
        assert_eq!(parse_image_segment_name(&s.file_name().unwrap().to_string_lossy()), Some(9));
        let m = manifest_path(Path::new("/s"), 12);
        assert_eq!(parse_manifest_name(&m.file_name().unwrap().to_string_lossy()), Some(12));
    }
}
