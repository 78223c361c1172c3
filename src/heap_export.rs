//! A whole heap moved between stores as a checkpoint: [`Store::export_heap`] writes a
//! consistent image of the heap (every commit up to one LSN, none after) as chunk images in
//! the checkpoint segment format, each with its header and checksums; [`install_heap`] makes
//! a new store directory whose one checkpoint is that file, checking every image first.
//! Opening the directory then recovers the heap as from any checkpoint (on demand by
//! default), with no log to replay. `tusk-replica` sends followers that are far behind such
//! an image instead of the group's log.

use std::io::{Read, Write};
use std::path::Path;

use tusk_recovery::FileKind;
use tusk_storage::checkpoint_format::{checkpoint_dir, image_segment_path, image_size, manifest_path, ChunkEntry, ChunkHeader, Manifest, CHUNK_HEADER_SIZE};
use tusk_storage::layout::{REPLICA_OFF, REPLICA_WORDS};
use tusk_storage::log_files::sync_dir;
use tusk_storage::PAGE_SIZE;
use tusk_txn::snapshot::image::ImageTarget;
use tusk_txn::Lsn;

use crate::replication::ReplicaWords;
use crate::{Error, Store};

/// The checkpoint epoch of an installed heap's one segment and manifest.
const INSTALLED_EPOCH: u64 = 1;
/// The chunk LSN of every installed image: the installed store has no log, and its own LSNs
/// start after this.
const INSTALLED_LSN: u64 = 1;

/// The shape of an exported heap: enough to install it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapShape {
    /// Bytes of each chunk (a multiple of 4096).
    pub chunk_size: u64,
    /// Bytes of heap the images cover (the used extent, rounded up to a page).
    pub covered: u64,
}

impl HeapShape {
    /// Images in the file: every chunk the covered bytes touch (at least one).
    pub fn chunks(&self) -> u64 {
        self.covered.div_ceil(self.chunk_size).max(1)
    }

    /// Bytes of the images together.
    pub fn bytes(&self) -> u64 {
        self.chunks() * image_size(self.chunk_size)
    }
}

/// What [`Store::export_heap`] wrote.
#[derive(Clone, Copy, Debug)]
pub struct HeapExport {
    /// Its chunk size and the bytes it covers.
    pub shape: HeapShape,
    /// The image holds every commit up to this LSN (this store's) and none after.
    pub lsn: Lsn,
    /// The replica line as the image holds it.
    pub replica: ReplicaWords,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

impl Store {
    /// Writes a consistent image of the heap to `out`: chunk images of `chunk_size` bytes
    /// (rounded up to a page), in order from chunk 0, as a checkpoint segment holds them.
    /// Writers pause only as a memcpy snapshot makes them; the copy needs memory for the
    /// heap's used extent.
    pub fn export_heap(&self, out: &mut dyn Write, chunk_size: u64) -> Result<HeapExport, Error> {
        let chunk_size = chunk_size.next_multiple_of(PAGE_SIZE).max(PAGE_SIZE);
        let engine = self.engine();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut target = ImageTarget::new(engine.heap().capacity(), threads)?;
        let (_, report) = engine.copy_pages_consistent(None, &mut target)?;
        let bytes = target.bytes();
        let shape = HeapShape { chunk_size, covered: report.extent.min(bytes.len() as u64) };
        let mut data = vec![0u8; chunk_size as usize];
        for index in 0..shape.chunks() {
            let start = (index * chunk_size) as usize;
            let present = bytes.len().saturating_sub(start).min(chunk_size as usize);
            data[..present].copy_from_slice(&bytes[start..start + present]);
            data[present..].fill(0);
            let header = ChunkHeader::of(index, INSTALLED_EPOCH, INSTALLED_LSN, &data);
            let out_err = |source| Error::Io { path: "<heap export>".into(), source };
            out.write_all(&header.encode()).map_err(out_err)?;
            out.write_all(&data).map_err(out_err)?;
        }
        let mut replica = [0u64; REPLICA_WORDS];
        for (i, word) in replica.iter_mut().enumerate() {
            let at = REPLICA_OFF as usize + 8 * i;
            *word = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("a word"));
        }
        Ok(HeapExport { shape, lsn: report.lsn, replica })
    }
}

/// Makes `dir` (which must not exist) a store directory whose checkpoint is the heap
/// `images` holds from its start, as [`Store::export_heap`] wrote it with `shape` (the file
/// may go on past the images). Every image's header and checksums are checked first: a
/// damaged one fails the call, leaving `dir` absent. The file becomes the checkpoint's
/// segment as a hard link (no copy): the store's checkpoints never write into a segment
/// another name shares. `dir` and its files are synced before it returns.
pub fn install_heap(dir: &Path, images: &Path, shape: HeapShape) -> Result<(), Error> {
    if dir.exists() {
        return Err(Error::Io { path: dir.to_path_buf(), source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "installing a heap makes a new store directory") });
    }
    let entries = check_images(images, shape)?;
    let building = installing_dir(dir);
    if building.exists() {
        std::fs::remove_dir_all(&building).map_err(io_error(&building))?;
    }
    let ckpt = checkpoint_dir(&building);
    std::fs::create_dir_all(&ckpt).map_err(io_error(&ckpt))?;
    let segment = image_segment_path(&building, INSTALLED_EPOCH);
    std::fs::hard_link(images, &segment).map_err(io_error(&segment))?;
    let manifest = Manifest { epoch: INSTALLED_EPOCH, chunk_size: shape.chunk_size, covered: shape.covered, chunks: entries };
    let path = manifest_path(&building, INSTALLED_EPOCH);
    let mut file = std::fs::File::create(&path).map_err(io_error(&path))?;
    file.write_all(&manifest.encode()).map_err(io_error(&path))?;
    file.sync_all().map_err(io_error(&path))?;
    sync_dir(&ckpt)?;
    sync_dir(&building)?;
    std::fs::rename(&building, dir).map_err(io_error(dir))?;
    sync_dir(dir.parent().unwrap_or(Path::new(".")))?;
    Ok(())
}

/// Where [`install_heap`] makes `dir` before it renames it into place (`DIR.installing`):
/// what a crash leaves there is garbage, removed by the next install to `dir`.
pub fn installing_dir(dir: &Path) -> std::path::PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".installing");
    dir.with_file_name(name)
}

/// Reads and checks every image of `images`; their manifest entries.
fn check_images(images: &Path, shape: HeapShape) -> Result<Vec<ChunkEntry>, Error> {
    let corrupt = |offset: u64, reason: String| Error::Corrupt { kind: FileKind::CheckpointImage, path: images.to_path_buf(), offset: Some(offset), reason };
    let file = std::fs::File::open(images).map_err(io_error(images))?;
    let len = file.metadata().map_err(io_error(images))?.len();
    if len < shape.bytes() {
        return Err(Error::Corrupt {
            kind: FileKind::CheckpointImage,
            path: images.to_path_buf(),
            offset: None,
            reason: format!("{len} bytes, too short for {} images of {} byte chunks", shape.chunks(), shape.chunk_size),
        });
    }
    let image = image_size(shape.chunk_size) as usize;
    let mut reader = std::io::BufReader::with_capacity(8 << 20, file);
    let mut buf = vec![0u8; image];
    let mut entries = Vec::with_capacity(shape.chunks() as usize);
    for index in 0..shape.chunks() {
        let at = index * image as u64;
        reader.read_exact(&mut buf).map_err(io_error(images))?;
        let header = ChunkHeader::decode(&buf).map_err(|r| corrupt(at, r))?;
        if header.index != index || header.epoch != INSTALLED_EPOCH || header.len != shape.chunk_size {
            return Err(corrupt(at, format!("image of chunk {} ({} bytes, epoch {}) where chunk {index} belongs", header.index, header.len, header.epoch)));
        }
        header.check_data(&buf[CHUNK_HEADER_SIZE..]).map_err(|r| corrupt(at, r))?;
        entries.push(ChunkEntry { image_epoch: INSTALLED_EPOCH, offset: at, lsn: header.lsn, crc: header.crc });
    }
    Ok(entries)
}
