//! Shared by the fuzz targets: the byte format that describes a store directory, and a pass
//! that repairs checksums so that mutated inputs reach the code behind the checksum checks
//! (a fuzzer almost never guesses a CRC on its own).

use std::path::{Path, PathBuf};

use tusk_storage::checkpoint_format::{image_segment_path, manifest_path, parse_image_segment_name, parse_manifest_name, CHUNK_HEADER_SIZE};
use tusk_storage::log_files::segment_path;
use tusk_storage::log_format::{FRAME_HEADER_SIZE, PAD_MAGIC, RECORD_MAGIC, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC};

/// The options the recovery target opens its images with (and the seeds were made with):
/// small heap, small chunks, two partitions, plain pwrite, no background checkpoints.
pub fn store_options() -> tusk::Options {
    tusk::Options {
        heap_capacity: 8 << 20,
        durability: tusk::Durability::On,
        io: tusk_storage::io::Io::Sync,
        log_partitions: 2,
        log_buffer_bytes: 4096,
        group_commit_interval: std::time::Duration::from_millis(1),
        segment_bytes: 1 << 20,
        stripes_log2: 8,
        checkpoint_interval: None,
        chunk_size: 4096,
        max_log_bytes: 64 << 20,
        checkpoint_faults: None,
        ..tusk::Options::default()
    }
}

/// At most this many files per image (more adds nothing the mutator cannot reach otherwise).
pub const MAX_FILES: usize = 8;

/// Where one file of an image goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Segment { partition: u32, seq: u64 },
    Manifest { epoch: u64 },
    /// A checkpoint's segment of chunk images.
    Images { epoch: u64 },
}

impl FileKind {
    /// The file's kind from its 3-byte tag (every tag means something).
    fn from_tag(tag: [u8; 3]) -> FileKind {
        let (a, b) = (tag[1] as u64, tag[2] as u64);
        match tag[0] % 3 {
            // Up to 8 partitions: more than 4 with records take the replay's merge by windows.
            0 => FileKind::Segment { partition: (a % 8) as u32, seq: b % 8 + 1 },
            1 => FileKind::Manifest { epoch: a % 4 + 1 },
            _ => FileKind::Images { epoch: b % 4 + 1 },
        }
    }

    fn tag(self) -> [u8; 3] {
        match self {
            FileKind::Segment { partition, seq } => [0, partition as u8, (seq - 1) as u8],
            FileKind::Manifest { epoch } => [1, (epoch - 1) as u8, 0],
            FileKind::Images { epoch } => [2, 0, (epoch - 1) as u8],
        }
    }

    pub fn path(self, dir: &Path) -> PathBuf {
        match self {
            FileKind::Segment { partition, seq } => segment_path(dir, partition, seq),
            FileKind::Manifest { epoch } => manifest_path(dir, epoch),
            FileKind::Images { epoch } => image_segment_path(dir, epoch),
        }
    }
}

/// Parses an image: a flags byte (bit 0: repair checksums), then up to [`MAX_FILES`]
/// entries of `tag[3] len[u32 le] bytes[len]` (a length past the end takes what is left).
/// Later entries with the same name replace earlier ones.
pub fn parse_image(data: &[u8]) -> (bool, Vec<(FileKind, Vec<u8>)>) {
    let Some((&flags, mut rest)) = data.split_first() else { return (false, Vec::new()) };
    let mut files: Vec<(FileKind, Vec<u8>)> = Vec::new();
    while rest.len() >= 7 && files.len() < MAX_FILES {
        let kind = FileKind::from_tag([rest[0], rest[1], rest[2]]);
        let len = (u32::from_le_bytes(rest[3..7].try_into().unwrap()) as usize).min(rest.len() - 7);
        let bytes = rest[7..7 + len].to_vec();
        rest = &rest[7 + len..];
        files.retain(|(k, _)| *k != kind);
        files.push((kind, bytes));
    }
    (flags & 1 != 0, files)
}

/// The inverse of [`parse_image`] (for seeds).
pub fn encode_image(repair: bool, files: &[(FileKind, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![repair as u8];
    for (kind, bytes) in files {
        out.extend_from_slice(&kind.tag());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// Writes an image's files under `dir` (creating their folders), repairing checksums first
/// if it asks for that.
pub fn write_image(data: &[u8], dir: &Path) -> std::io::Result<()> {
    let (repair, mut files) = parse_image(data);
    if repair {
        repair_all(&mut files);
    }
    for (kind, bytes) in &files {
        let path = kind.path(dir);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, bytes)?;
    }
    Ok(())
}

/// Reads the files of a store directory that an image can describe (for seeds).
pub fn read_store_dir(dir: &Path) -> std::io::Result<Vec<(FileKind, Vec<u8>)>> {
    let mut files = Vec::new();
    for entry in walk(dir)? {
        let name = entry.file_name().unwrap().to_string_lossy().into_owned();
        let kind = if let Some(epoch) = parse_manifest_name(&name) {
            FileKind::Manifest { epoch }
        } else if let Some(epoch) = parse_image_segment_name(&name) {
            FileKind::Images { epoch }
        } else if let Some(seq) = name.strip_suffix(".seg").and_then(|s| s.parse::<u64>().ok()) {
            let partition = entry.parent().and_then(|p| p.file_name()).and_then(|p| p.to_str()?.strip_prefix('p')?.parse().ok());
            match partition {
                Some(partition) => FileKind::Segment { partition, seq },
                None => continue,
            }
        } else {
            continue;
        };
        // Only names the tag can express: they round-trip through the image format.
        if FileKind::from_tag(kind.tag()) == kind {
            files.push((kind, std::fs::read(&entry)?));
        }
    }
    files.sort_by_key(|(k, _)| k.tag());
    Ok(files)
}

fn walk(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(walk(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

fn put_crc(bytes: &mut [u8], at: usize, crc: u32) {
    bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Recomputes every checksum an image's files carry, manifest entries last (from the chunk
/// images they name).
pub fn repair_all(files: &mut [(FileKind, Vec<u8>)]) {
    for (kind, bytes) in files.iter_mut() {
        match kind {
            FileKind::Segment { .. } => repair_segment(bytes),
            FileKind::Images { .. } => repair_images(bytes),
            FileKind::Manifest { .. } => {}
        }
    }
    let chunk_crcs: Vec<((u64, u64), u32)> = files
        .iter()
        .flat_map(|(k, b)| match *k {
            FileKind::Images { epoch } => images(b).into_iter().map(|(at, _)| ((epoch, at as u64), u32::from_le_bytes(b[at + 48..at + 52].try_into().unwrap()))).collect(),
            _ => Vec::new(),
        })
        .collect();
    for (kind, bytes) in files.iter_mut() {
        if let FileKind::Manifest { .. } = kind {
            repair_manifest(bytes, &chunk_crcs);
        }
    }
}

/// Segment header CRC, then every frame that looks like a record (magic and a length that
/// fits): its payload CRC.
pub fn repair_segment(bytes: &mut [u8]) {
    if bytes.len() >= SEGMENT_HEADER_SIZE && bytes[0..8] == SEGMENT_MAGIC {
        let crc = crc32fast::hash(&bytes[0..24]);
        put_crc(bytes, 24, crc);
    }
    repair_frames(bytes, SEGMENT_HEADER_SIZE.min(bytes.len()));
}

/// Repairs record CRCs from `at` on (a log buffer without a segment header: `at` = 0).
pub fn repair_frames(bytes: &mut [u8], mut at: usize) {
    while at + FRAME_HEADER_SIZE <= bytes.len() {
        let magic = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        if magic == RECORD_MAGIC && len <= bytes.len() - at - FRAME_HEADER_SIZE {
            let payload = at + FRAME_HEADER_SIZE;
            let crc = crc32fast::hash(&bytes[payload..payload + len]);
            put_crc(bytes, at + 8, crc);
            at = (payload + len).next_multiple_of(8);
        } else if magic == PAD_MAGIC && len >= 8 {
            at += len;
        } else {
            at += 8;
        }
    }
}

/// The images of a segment that look like ones (magic, and a length that fits): their
/// offsets and data lengths. An image that does not look like one ends the walk.
fn images(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + CHUNK_HEADER_SIZE <= bytes.len() && bytes[at..at + 8] == *b"TUSKCHNK" {
        let len = u64::from_le_bytes(bytes[at + 40..at + 48].try_into().unwrap());
        if len > (bytes.len() - at - CHUNK_HEADER_SIZE) as u64 {
            break;
        }
        out.push((at, len as usize));
        at += CHUNK_HEADER_SIZE + len as usize;
    }
    out
}

/// Chunk data CRC (version 2) or block CRCs and their table's CRC (version 3, where its
/// block size fits), then the header CRC of one image (header at the start of `bytes`).
pub fn repair_chunk(bytes: &mut [u8]) {
    use tusk_storage::checkpoint_format::{BlockTable, BLOCK_TABLE_AT, IMAGE_VERSION_BLOCKS, MAX_BLOCKS};
    if bytes.len() < CHUNK_HEADER_SIZE {
        return;
    }
    let (header, data) = bytes.split_at_mut(CHUNK_HEADER_SIZE);
    let block = u64::from(u32::from_le_bytes(header[12..16].try_into().unwrap())) * 4096;
    let blocks = u32::from_le_bytes(header[8..12].try_into().unwrap()) == IMAGE_VERSION_BLOCKS && block > 0 && (data.len() as u64).div_ceil(block) <= MAX_BLOCKS;
    let crc = if blocks {
        let table = BlockTable::of(data, block);
        for (i, c) in table.crcs.iter().enumerate() {
            put_crc(header, BLOCK_TABLE_AT + 4 * i, *c);
        }
        table.crc()
    } else {
        crc32fast::hash(data)
    };
    put_crc(bytes, 48, crc);
    let hcrc = crc32fast::hash(&bytes[0..52]);
    put_crc(bytes, 52, hcrc);
}

/// Repairs every image of a checkpoint segment.
pub fn repair_images(bytes: &mut [u8]) {
    for (at, len) in images(bytes) {
        repair_chunk(&mut bytes[at..at + CHUNK_HEADER_SIZE + len]);
    }
}

/// Entry CRCs from the chunk images present (by segment epoch and offset), then the trailer.
pub fn repair_manifest(bytes: &mut [u8], chunk_crcs: &[((u64, u64), u32)]) {
    const HEAD: usize = 48;
    const ENTRY: usize = 32;
    if bytes.len() < HEAD + 4 {
        return;
    }
    let count = u64::from_le_bytes(bytes[40..48].try_into().unwrap());
    for i in 0..count.min(((bytes.len() - HEAD - 4) / ENTRY) as u64) as usize {
        let at = HEAD + ENTRY * i;
        let epoch = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let offset = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        if let Some(&(_, crc)) = chunk_crcs.iter().find(|(key, _)| *key == (epoch, offset)) {
            put_crc(bytes, at + 24, crc);
        }
    }
    let body = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..body]);
    put_crc(bytes, body, crc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip() {
        let files = vec![
            (FileKind::Segment { partition: 1, seq: 3 }, vec![1, 2, 3]),
            (FileKind::Manifest { epoch: 2 }, vec![]),
            (FileKind::Images { epoch: 4 }, vec![9; 10]),
        ];
        assert_eq!(parse_image(&encode_image(true, &files)), (true, files));
    }

    /// The fuzzers start from images of real stores: an image taken of a store directory
    /// and written back (with or without checksum repair) recovers every commit.
    #[test]
    fn a_store_survives_the_trip_through_an_image() {
        let src = tempfile::tempdir().unwrap();
        let store = tusk::Store::open(src.path(), store_options()).unwrap();
        let (p, _) = store
            .transact(tusk::Commit::Sync, |tx| {
                let p = tx.alloc(64)?;
                tx.write_u64(p, 42)?;
                tx.set_root("x", p)?;
                Ok(p)
            })
            .unwrap();
        store.checkpoint().unwrap();
        store.transact(tusk::Commit::Sync, |tx| tx.write_u64(p, 43)).unwrap();
        store.close().unwrap();
        let files = read_store_dir(src.path()).unwrap();
        assert!(files.iter().any(|(k, _)| matches!(k, FileKind::Manifest { .. })));
        for repair in [false, true] {
            let dst = tempfile::tempdir().unwrap();
            write_image(&encode_image(repair, &files), dst.path()).unwrap();
            let store = tusk::Store::open(dst.path(), store_options()).unwrap();
            let (v, _) = store.transact(tusk::Commit::Async, |tx| tx.read_u64(p)).unwrap();
            assert_eq!(v, 43);
            store.close().unwrap();
        }
    }
}
