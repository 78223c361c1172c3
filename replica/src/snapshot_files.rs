//! The node's snapshots of its state machine, in `DIR/snapshots/`: what a member far behind
//! (or new) installs instead of the group's log, and what a rebuild starts from.
//!
//! A snapshot file is `[chunk images][tail records][trailer]`:
//! - the images: a consistent heap image as [`tusk::Store::export_heap`] writes it (the
//!   checkpoint segment format, each image with its header and checksums); installing
//!   makes the file, through a hard link, the new store's one checkpoint segment;
//! - the tail: records of the snapshot's last entries that the image was copied before
//!   (a leader's image: see `state_machine.rs`), framed as the log framed them, back to back;
//! - the trailer ([`TRAILER_SIZE`] bytes, checksummed): the images' shape and the tail's
//!   length and checksum.
//!
//! Beside each `ID.snap` lies `ID.meta`, openraft's `SnapshotMeta` (bincode), written once the
//! file is complete and synced: a snapshot without its meta file is not one (a crash while
//! it was made or received), and is deleted when the node opens.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tusk::HeapShape;
use tusk_storage::log_format::{decode_frame, Frame};

use crate::types::{LogId, SnapshotMeta};

/// Identifies a snapshot file's trailer ("TUSKSNAP").
const MAGIC: [u8; 8] = *b"TUSKSNAP";
const VERSION: u32 = 1;
/// Bytes of the trailer.
pub const TRAILER_SIZE: u64 = 64;

/// What a snapshot file's trailer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub shape: HeapShape,
    pub tail_bytes: u64,
    pub tail_crc: u32,
}

impl Trailer {
    fn encode(&self) -> [u8; TRAILER_SIZE as usize] {
        let mut b = [0u8; TRAILER_SIZE as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.shape.chunk_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.shape.covered.to_le_bytes());
        b[32..40].copy_from_slice(&self.tail_bytes.to_le_bytes());
        b[40..44].copy_from_slice(&self.tail_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Trailer, String> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        if b[0..8] != MAGIC {
            return Err("not a tusk snapshot (no trailer)".into());
        }
        if u32_at(60) != crc32fast::hash(&b[..60]) {
            return Err("snapshot trailer checksum mismatch".into());
        }
        if u32_at(8) != VERSION {
            return Err(format!("snapshot format version {}, this build reads {VERSION}", u32_at(8)));
        }
        let chunk_size = u64_at(16);
        if chunk_size == 0 || !chunk_size.is_multiple_of(4096) {
            return Err(format!("chunk size {chunk_size}"));
        }
        Ok(Trailer { shape: HeapShape { chunk_size, covered: u64_at(24) }, tail_bytes: u64_at(32), tail_crc: u32_at(40) })
    }
}

/// Appends the tail and the trailer to a file holding `shape`'s images.
pub fn finish(file: &mut std::fs::File, shape: HeapShape, tail: &[Vec<u8>]) -> std::io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    let mut bytes = 0;
    for record in tail {
        file.write_all(record)?;
        crc.update(record);
        bytes += record.len() as u64;
    }
    file.write_all(&Trailer { shape, tail_bytes: bytes, tail_crc: crc.finalize() }.encode())?;
    file.sync_all()
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("snapshot {}: {why}", path.display()))
}

/// Reads and checks a snapshot file's trailer and tail (the images are checked when
/// installed); the tail's records, each whole.
pub fn read(path: &Path) -> std::io::Result<(Trailer, Vec<Vec<u8>>)> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len < TRAILER_SIZE {
        return Err(invalid(path, format!("{len} bytes, shorter than a trailer")));
    }
    let mut b = [0u8; TRAILER_SIZE as usize];
    file.seek(SeekFrom::Start(len - TRAILER_SIZE))?;
    file.read_exact(&mut b)?;
    let trailer = Trailer::decode(&b).map_err(|why| invalid(path, why))?;
    let tail_at = trailer.shape.bytes();
    if tail_at.checked_add(trailer.tail_bytes).and_then(|n| n.checked_add(TRAILER_SIZE)) != Some(len) {
        return Err(invalid(path, format!("{len} bytes, the trailer says {} of images and {} of tail", tail_at, trailer.tail_bytes)));
    }
    let mut tail = vec![0u8; trailer.tail_bytes as usize];
    file.seek(SeekFrom::Start(tail_at))?;
    file.read_exact(&mut tail)?;
    if crc32fast::hash(&tail) != trailer.tail_crc {
        return Err(invalid(path, "tail checksum mismatch"));
    }
    let mut records = Vec::new();
    let mut at = 0;
    while at < tail.len() {
        match decode_frame(&tail[at..], 0) {
            Frame::Record(_, end) => {
                records.push(tail[at..at + end].to_vec());
                at += end;
            }
            _ => return Err(invalid(path, format!("tail byte {at} is not a record"))),
        }
    }
    Ok((trailer, records))
}

/// The snapshot folder of a node.
#[derive(Clone, Debug)]
pub struct SnapshotFiles {
    dir: PathBuf,
}

/// A snapshot id as a file name: ids this code makes are `INDEX-TERM-NODE-NONCE` in hex and
/// digits; anything else (from another build) is refused.
fn checked_id(id: &str) -> std::io::Result<&str> {
    if !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        Ok(id)
    } else {
        Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("snapshot id {id:?} is not a file name")))
    }
}

/// A new snapshot id for the entry `last`.
pub fn new_id(last: LogId) -> String {
    format!("{:020}-{}-{}-{:016x}", last.index, last.leader_id.term, last.leader_id.node_id, rand::random::<u64>())
}

impl SnapshotFiles {
    /// The folder `node_dir/snapshots`, created, with whatever a crash left half made removed.
    pub fn open(node_dir: &Path) -> std::io::Result<SnapshotFiles> {
        let dir = node_dir.join("snapshots");
        std::fs::create_dir_all(&dir)?;
        let files = SnapshotFiles { dir };
        let complete: Vec<String> = files.metas()?.into_iter().map(|(id, _)| id).collect();
        for entry in std::fs::read_dir(&files.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let keep = name.strip_suffix(".snap").or_else(|| name.strip_suffix(".meta")).is_some_and(|id| complete.iter().any(|c| c == id));
            if !keep {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(files)
    }

    /// The complete snapshots: (id, meta), newest last.
    fn metas(&self) -> std::io::Result<Vec<(String, SnapshotMeta)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".meta") else { continue };
            if !self.dir.join(format!("{id}.snap")).exists() {
                continue;
            }
            let bytes = std::fs::read(self.dir.join(&name))?;
            let meta: SnapshotMeta = bincode::deserialize(&bytes).map_err(|e| invalid(&self.dir.join(&name), e))?;
            out.push((id.to_string(), meta));
        }
        out.sort_by_key(|(_, m)| m.last_log_id);
        Ok(out)
    }

    /// The newest complete snapshot: its meta and file.
    pub fn current(&self) -> std::io::Result<Option<(SnapshotMeta, PathBuf)>> {
        Ok(self.metas()?.pop().map(|(id, meta)| (meta, self.dir.join(format!("{id}.snap")))))
    }

    /// A new file to make or receive a snapshot in.
    pub fn new_file(&self, what: &str) -> std::io::Result<(std::fs::File, PathBuf)> {
        let path = self.dir.join(format!("{what}-{:016x}.part", rand::random::<u64>()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        Ok((file, path))
    }

    /// Makes `part` (synced) the snapshot `meta` describes, and deletes the older ones.
    pub fn keep(&self, part: &Path, meta: &SnapshotMeta) -> std::io::Result<PathBuf> {
        let id = checked_id(&meta.snapshot_id)?;
        let snap = self.dir.join(format!("{id}.snap"));
        std::fs::rename(part, &snap)?;
        let tmp = self.dir.join(format!("{id}.meta.part"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bincode::serialize(meta).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(format!("{id}.meta")))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        for (old, _) in self.metas()?.into_iter().filter(|(old, _)| old != id) {
            // The meta first: a snapshot without it is no longer one.
            std::fs::remove_file(self.dir.join(format!("{old}.meta")))?;
            std::fs::remove_file(self.dir.join(format!("{old}.snap")))?;
        }
        Ok(snap)
    }
}
