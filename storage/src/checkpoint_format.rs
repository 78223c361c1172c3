//! Checkpoint formats: chunk images and manifests.
//!
//! ```text
//! DIR/ckpt/cIIIIIIIIII-eEEEEEEEEE.chunk   chunk image: chunk I as written by checkpoint E
//!   block 0   [magic "TUSKCHNK"][version u32][0 u32][chunk index u64][epoch u64]
//!             [chunk LSN u64][data length u64][crc32 of data u32][crc32 of the above u32]
//!             zeros to 4096 bytes
//!   then      the chunk's bytes (a multiple of 4096)
//! DIR/MANIFEST-EEEEEEEEEE                 manifest of checkpoint E
//!   [magic "TUSKMANF"][version u32][0 u32][epoch u64][chunk size u64][covered bytes u64]
//!   [chunk count u64], then per chunk [image epoch u64][chunk LSN u64][crc32 u32][0 u32],
//!   then [crc32 of everything before u32]
//! ```
//! A chunk image holds every write with an LSN below its chunk LSN and none above. The
//! manifest names, for every chunk below `covered bytes`, the image that belongs to this
//! checkpoint (written by it, or by an earlier one when the chunk stayed clean).

use std::path::{Path, PathBuf};

pub const CHUNK_MAGIC: [u8; 8] = *b"TUSKCHNK";
pub const MANIFEST_MAGIC: [u8; 8] = *b"TUSKMANF";
pub const CHECKPOINT_VERSION: u32 = 1;
/// Size of a chunk image's header block.
pub const CHUNK_HEADER_SIZE: usize = 4096;

pub fn checkpoint_dir(store_dir: &Path) -> PathBuf {
    store_dir.join("ckpt")
}

pub fn chunk_path(store_dir: &Path, index: u64, epoch: u64) -> PathBuf {
    checkpoint_dir(store_dir).join(format!("c{index:010}-e{epoch:010}.chunk"))
}

/// (index, epoch) from a chunk image's file name.
pub fn parse_chunk_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix('c')?.strip_suffix(".chunk")?;
    let (index, epoch) = rest.split_once("-e")?;
    Some((index.parse().ok()?, epoch.parse().ok()?))
}

pub fn manifest_path(store_dir: &Path, epoch: u64) -> PathBuf {
    store_dir.join(format!("MANIFEST-{epoch:010}"))
}

/// Epoch from a manifest's file name.
pub fn parse_manifest_name(name: &str) -> Option<u64> {
    name.strip_prefix("MANIFEST-")?.parse().ok()
}

/// The header of a chunk image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub index: u64,
    pub epoch: u64,
    pub lsn: u64,
    pub len: u64,
    pub crc: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_SIZE] {
        let mut b = [0u8; CHUNK_HEADER_SIZE];
        b[0..8].copy_from_slice(&CHUNK_MAGIC);
        b[8..12].copy_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..40].copy_from_slice(&self.lsn.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b[48..52].copy_from_slice(&self.crc.to_le_bytes());
        let hcrc = crc32fast::hash(&b[0..52]);
        b[52..56].copy_from_slice(&hcrc.to_le_bytes());
        b
    }

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
        let version = u32_at(8);
        if version != CHECKPOINT_VERSION {
            return Err(format!("chunk format version {version}, this build reads {CHECKPOINT_VERSION}"));
        }
        Ok(ChunkHeader { index: u64_at(16), epoch: u64_at(24), lsn: u64_at(32), len: u64_at(40), crc: u32_at(48) })
    }
}

/// One chunk's entry in a manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// The checkpoint epoch that wrote the image this checkpoint uses.
    pub image_epoch: u64,
    pub lsn: u64,
    pub crc: u32,
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

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(48 + 24 * self.chunks.len() + 4);
        b.extend_from_slice(&MANIFEST_MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.chunk_size.to_le_bytes());
        b.extend_from_slice(&self.covered.to_le_bytes());
        b.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        for c in &self.chunks {
            b.extend_from_slice(&c.image_epoch.to_le_bytes());
            b.extend_from_slice(&c.lsn.to_le_bytes());
            b.extend_from_slice(&c.crc.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, String> {
        if b.len() < 52 || b[0..8] != MANIFEST_MAGIC {
            return Err("not a tusk manifest".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let version = u32_at(8);
        if version > CHECKPOINT_VERSION {
            return Err(format!("manifest format version {version} is newer than this build reads ({CHECKPOINT_VERSION})"));
        }
        if version != CHECKPOINT_VERSION {
            return Err(format!("unknown manifest format version {version}"));
        }
        let count = u64_at(40);
        let expected = count.checked_mul(24).and_then(|n| n.checked_add(52));
        if expected != Some(b.len() as u64) {
            return Err(format!("manifest of {} bytes cannot hold {count} chunks", b.len()));
        }
        let body = b.len() - 4;
        if u32_at(body) != crc32fast::hash(&b[..body]) {
            return Err("manifest checksum mismatch".into());
        }
        let chunk_size = u64_at(24);
        if chunk_size == 0 || chunk_size % 4096 != 0 {
            return Err(format!("invalid chunk size {chunk_size}"));
        }
        let covered = u64_at(32);
        // Recovery loads `count` chunks into a heap checked against `covered` only: the two
        // must agree, or a chunk could lie past the heap's end.
        if count != covered.div_ceil(chunk_size).max(1) {
            return Err(format!("manifest lists {count} chunks of {chunk_size} bytes for {covered} covered bytes"));
        }
        let chunks = (0..count as usize)
            .map(|i| {
                let at = 48 + 24 * i;
                ChunkEntry { image_epoch: u64_at(at), lsn: u64_at(at + 8), crc: u32_at(at + 16) }
            })
            .collect();
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
    out.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips_and_rejects_damage() {
        let m = Manifest {
            epoch: 7,
            chunk_size: 1 << 20,
            covered: 3 << 20,
            chunks: (0..3).map(|i| ChunkEntry { image_epoch: 7 - i, lsn: 100 + i, crc: i as u32 }).collect(),
        };
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes), Ok(m.clone()));
        assert_eq!((m.min_lsn(), m.max_lsn()), (100, 102));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Manifest::decode(&bad).is_err(), "flip at byte {i} undetected");
        }
        let mut newer = bytes.clone();
        newer[8] = 9;
        assert!(Manifest::decode(&newer).unwrap_err().contains("newer"));
    }

    #[test]
    fn chunk_header_round_trips_and_names_parse() {
        let h = ChunkHeader { index: 3, epoch: 9, lsn: 1234, len: 1 << 20, crc: 0xDEAD };
        assert_eq!(ChunkHeader::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[33] ^= 1;
        assert!(ChunkHeader::decode(&bad).is_err());
        let p = chunk_path(Path::new("/s"), 3, 9);
        assert_eq!(parse_chunk_name(&p.file_name().unwrap().to_string_lossy()), Some((3, 9)));
        let m = manifest_path(Path::new("/s"), 12);
        assert_eq!(parse_manifest_name(&m.file_name().unwrap().to_string_lossy()), Some(12));
    }
}
