//! Chunks of the heap brought in from a checkpoint when first used instead of at open
//! (issue 32): a store opens in the time its log's tail takes to replay, whatever the size of
//! its heap, and background loaders bring in the rest.
//!
//! Every chunk the checkpoint covers starts *absent*, a block at a time (a page of the default
//! 1 MiB chunk: [`crate::checkpoint_format::block_size`]). The first access of the heap that
//! reaches an absent block loads it on the accessing thread: it claims the block (absent →
//! loading), reads it through the [`ChunkSource`] (the chunk's image header once, then the
//! block), checks it against the header's block checksum, copies it in and marks it
//! *present*; others reaching the block meanwhile wait for that. So a first read costs a few
//! 4 KiB reads, not a 1 MiB image per chunk it touches. Background loaders read whole images
//! and claim every block still absent. A block that fails its checks stays *damaged* for good:
//! its bytes stay zero and are never served as data, [`crate::Heap::ready`] names the file and
//! offset to whoever asks, and every other block stays usable. Once every block is present,
//! one flag turns the check off.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
// Held for a push or a take only, with no atomic of the model inside: std's under loom too.
use std::sync::Mutex;

use crate::checkpoint_format::BlockTable;
use crate::sync::{AtomicU64, AtomicU8};

/// Part of one chunk's image, read by a [`ChunkSource`].
pub struct Image<'a> {
    /// Where `bytes` start in the chunk: a multiple of the block size.
    pub from: u64,
    /// The bytes read (up to the chunk's end; a short last block included).
    pub bytes: &'a [u8],
    /// The checksums the heap checks each block against before it uses it; `None` where the
    /// source checked all of `bytes` already (an image without block checksums, read whole).
    pub blocks: Option<&'a BlockTable>,
    /// The image's file and where the chunk's data starts in it, for damage reports.
    pub path: &'a Path,
    pub data_offset: u64,
}

/// What a [`ChunkSource`] hands each image it read to: the chunk and its bytes, or why not.
pub type TakeImage<'t> = dyn FnMut(u64, Result<Image<'_>, ChunkDamage>) + 't;

/// Where the images of absent chunks come from (the recovery crate's checkpoint reader).
pub trait ChunkSource: Send + Sync {
    /// Reads the whole images of `run` (chunks whose images lie next to each other, as
    /// [`ChunkSource::runs`] groups them) and hands each to `take` once, its header checked:
    /// all its bytes, or what is wrong with it.
    fn read(&self, run: &[u64], take: &mut TakeImage<'_>);

    /// Reads bytes `range` (block-aligned) of `chunk`'s image and hands them to `take` once:
    /// at least that range (an image without block checksums is read and checked whole), or
    /// what is wrong with the image.
    fn read_blocks(&self, chunk: u64, range: Range<u64>, take: &mut TakeImage<'_>);

    /// Every chunk, in runs that one sequential read of the files takes together.
    fn runs(&self) -> Vec<Vec<u64>>;
}

/// A chunk image, or a block of it, that failed its checks: the file, the offset in it, why,
/// and the heap bytes it was to fill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkDamage {
    pub path: PathBuf,
    pub offset: u64,
    pub reason: String,
    pub heap: std::ops::Range<u64>,
}

/// A write the log's replay made to an absent chunk: kept until the chunk is brought in,
/// then applied over its image (so that opening never reads an image for the log's sake).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeferredWrite {
    /// One aligned word.
    Word { at: u64, value: u64 },
    /// Bytes at any offset, within the chunk.
    Bytes { at: u64, bytes: Box<[u8]> },
}

impl DeferredWrite {
    /// Where the write starts.
    pub fn at(&self) -> u64 {
        match self {
            DeferredWrite::Word { at, .. } | DeferredWrite::Bytes { at, .. } => *at,
        }
    }

    /// Where it ends (exclusive).
    pub fn end(&self) -> u64 {
        match self {
            DeferredWrite::Word { at, .. } => at + 8,
            DeferredWrite::Bytes { at, bytes } => at + bytes.len().max(1) as u64,
        }
    }

    /// The part of the write that falls in `range`, if any (a word lies in one block whole;
    /// an empty write writes nothing anywhere).
    pub fn within(&self, range: &Range<u64>) -> Option<DeferredWrite> {
        let written = match self {
            DeferredWrite::Word { at, .. } => *at..at + 8,
            DeferredWrite::Bytes { at, bytes } => *at..at + bytes.len() as u64,
        };
        let (from, to) = (written.start.max(range.start), written.end.min(range.end));
        if from >= to {
            return None;
        }
        Some(match self {
            DeferredWrite::Word { .. } => self.clone(),
            DeferredWrite::Bytes { at, bytes } => DeferredWrite::Bytes { at: from, bytes: bytes[(from - at) as usize..(to - at) as usize].into() },
        })
    }
}

const ABSENT: u8 = 0;
const LOADING: u8 = 1;
const PRESENT: u8 = 2;
const DAMAGED: u8 = 3;

/// The heap's chunks while some of their blocks are not present yet.
pub(crate) struct OnDemand {
    pub(crate) chunk_size: u64,
    pub(crate) block_size: u64,
    blocks_per_chunk: u64,
    /// Heap bytes the chunks cover (the last chunk may pass the heap's end).
    covered: u64,
    /// Per block (chunk `c`'s block `b` at `c * blocks_per_chunk + b`).
    states: Box<[AtomicU8]>,
    /// Per chunk: its blocks neither present nor damaged.
    unsettled: Box<[AtomicU64]>,
    /// Chunks with a block neither present nor damaged.
    absent: AtomicU64,
    /// Damaged blocks.
    damage: Mutex<Vec<(u64, ChunkDamage)>>,
    source: Box<dyn ChunkSource>,
    /// Per chunk, the replay's writes to it in LSN order, until all its blocks are in.
    deferred: Box<[Mutex<DeferredChunk>]>,
    /// Loads under way that an access waits for: background loaders hold their next read
    /// back while there are any. A hint for scheduling only, which nothing's correctness
    /// rests on.
    access_loads: AtomicU64,
}

/// An access's load under way (see [`OnDemand::access_load`]).
pub(crate) struct AccessLoad<'a>(&'a AtomicU64);

impl Drop for AccessLoad<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A chunk's deferred writes: as the replay left them, then, once a block of the chunk
/// loads, sorted by block.
#[derive(Default)]
struct DeferredChunk {
    writes: Vec<DeferredWrite>,
    by_block: Option<Vec<Vec<DeferredWrite>>>,
}

/// What a claim of a block found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The caller now loads it.
    Won,
    /// Present already.
    Present,
    Damaged,
    /// Another thread loads it.
    Loading,
}

impl OnDemand {
    /// `chunks` chunks of `chunk_size` in blocks of `block_size` over a heap of `capacity`
    /// bytes: blocks past the heap's end are present from the start.
    pub(crate) fn new(chunk_size: u64, block_size: u64, chunks: u64, capacity: u64, source: Box<dyn ChunkSource>) -> OnDemand {
        assert!(chunk_size > 0 && chunk_size.is_multiple_of(crate::PAGE_SIZE), "chunk size {chunk_size}");
        assert!(block_size > 0 && block_size.is_multiple_of(crate::PAGE_SIZE) && block_size <= chunk_size, "block size {block_size}");
        let blocks_per_chunk = chunk_size.div_ceil(block_size);
        let covered = (chunks * chunk_size).min(capacity);
        // Only the last chunk can pass the heap's end: the blocks there are present from the
        // start. One pass of plain stores for the rest (4 M blocks for a 16 GiB heap).
        let states: Box<[AtomicU8]> = (0..chunks * blocks_per_chunk).map(|_| AtomicU8::new(ABSENT)).collect();
        let unsettled: Box<[AtomicU64]> = (0..chunks).map(|_| AtomicU64::new(blocks_per_chunk)).collect();
        let last = chunks - 1;
        for b in 0..blocks_per_chunk {
            if last * chunk_size + b * block_size >= covered {
                states[(last * blocks_per_chunk + b) as usize].store(PRESENT, Ordering::Relaxed);
                unsettled[last as usize].fetch_sub(1, Ordering::Relaxed);
            }
        }
        assert!(unsettled[last as usize].load(Ordering::Relaxed) > 0, "the last chunk starts within the heap");
        let absent = chunks;
        OnDemand {
            chunk_size,
            block_size,
            blocks_per_chunk,
            covered,
            states,
            unsettled,
            absent: AtomicU64::new(absent),
            damage: Mutex::new(Vec::new()),
            source,
            deferred: (0..chunks).map(|_| Mutex::new(DeferredChunk::default())).collect(),
            access_loads: AtomicU64::new(0),
        }
    }

    /// Marks a load that an access waits for as under way, until the guard drops.
    pub(crate) fn access_load(&self) -> AccessLoad<'_> {
        self.access_loads.fetch_add(1, Ordering::Relaxed);
        AccessLoad(&self.access_loads)
    }

    pub(crate) fn access_loads(&self) -> u64 {
        self.access_loads.load(Ordering::Relaxed)
    }

    pub(crate) fn chunks(&self) -> u64 {
        self.unsettled.len() as u64
    }

    /// Heap bytes the chunks cover.
    pub(crate) fn covered(&self) -> u64 {
        self.covered
    }

    /// Chunks with a block not brought in yet.
    pub(crate) fn absent(&self) -> u64 {
        self.absent.load(Ordering::Acquire)
    }

    /// The blocks of `chunk` (ids) that bytes `range` of the heap, within that chunk, touch.
    pub(crate) fn blocks_of(&self, chunk: u64, range: Range<u64>) -> Range<u64> {
        let base = chunk * self.chunk_size;
        debug_assert!(range.start >= base && range.end <= base + self.chunk_size && range.start < range.end);
        let first = chunk * self.blocks_per_chunk;
        first + (range.start - base) / self.block_size..first + (range.end - base).div_ceil(self.block_size)
    }

    /// Every block of `chunk` (ids).
    pub(crate) fn blocks_of_chunk(&self, chunk: u64) -> Range<u64> {
        chunk * self.blocks_per_chunk..(chunk + 1) * self.blocks_per_chunk
    }

    /// Where block `id` ends in its chunk's image (a block past the heap's end included):
    /// what a read must take for the block's checksum.
    pub(crate) fn block_image_end(&self, id: u64) -> u64 {
        let chunk_start = id / self.blocks_per_chunk * self.chunk_size;
        let start = chunk_start + id % self.blocks_per_chunk * self.block_size;
        (start + self.block_size).min(chunk_start + self.chunk_size)
    }

    /// The heap bytes of block `id` (up to the heap's end).
    pub(crate) fn block_range(&self, id: u64) -> Range<u64> {
        let start = id / self.blocks_per_chunk * self.chunk_size + id % self.blocks_per_chunk * self.block_size;
        let chunk_end = (id / self.blocks_per_chunk + 1) * self.chunk_size;
        start..(start + self.block_size).min(chunk_end).min(self.covered)
    }

    pub(crate) fn claim(&self, block: u64) -> Claim {
        let state = &self.states[block as usize];
        // A plain load first: present blocks are read by every access while others load,
        // and a compare-and-swap would bounce their line between the cores.
        let seen = match state.load(Ordering::Acquire) {
            ABSENT => state.compare_exchange(ABSENT, LOADING, Ordering::Acquire, Ordering::Acquire),
            other => Err(other),
        };
        match seen {
            Ok(_) => Claim::Won,
            Err(PRESENT) => Claim::Present,
            Err(DAMAGED) => Claim::Damaged,
            Err(_) => Claim::Loading,
        }
    }

    pub(crate) fn is_present(&self, block: u64) -> bool {
        self.states[block as usize].load(Ordering::Acquire) == PRESENT
    }

    /// Ends a claim: the block's bytes are in the heap (or it is damaged). Returns whether
    /// it was the last block not brought in.
    pub(crate) fn settle(&self, block: u64, damage: Option<ChunkDamage>) -> bool {
        let state = &self.states[block as usize];
        debug_assert_eq!(state.load(Ordering::Relaxed), LOADING, "block {block} settled without its claim");
        match damage {
            None => state.store(PRESENT, Ordering::Release),
            Some(d) => {
                self.damage.lock().expect("damage list").push((block, d));
                state.store(DAMAGED, Ordering::Release);
            }
        }
        let chunk = block / self.blocks_per_chunk;
        if self.unsettled[chunk as usize].fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        // The chunk is in: its deferred writes are all applied.
        drop(std::mem::take(&mut *self.deferred[chunk as usize].lock().expect("deferred writes")));
        self.absent.fetch_sub(1, Ordering::AcqRel) == 1
    }

    pub(crate) fn damage_of(&self, block: u64) -> ChunkDamage {
        let damage = self.damage.lock().expect("damage list");
        damage.iter().find(|(b, _)| *b == block).map(|(_, d)| d.clone()).expect("a damaged block has its damage listed")
    }

    /// The damaged blocks' chunks and damage.
    pub(crate) fn damaged(&self) -> Vec<(u64, ChunkDamage)> {
        self.damage.lock().expect("damage list").iter().map(|(b, d)| (b / self.blocks_per_chunk, d.clone())).collect()
    }

    /// Whether some block of `chunk` is not brought in yet.
    pub(crate) fn is_absent(&self, chunk: u64) -> bool {
        self.unsettled[chunk as usize].load(Ordering::Acquire) > 0
    }

    /// Keeps `writes` for `chunk`: the caller is the replay, before anything but the replay
    /// uses the heap.
    pub(crate) fn defer(&self, chunk: u64, writes: Vec<DeferredWrite>) {
        let mut kept = self.deferred[chunk as usize].lock().expect("deferred writes");
        // Writes kept after the chunk's writes were sorted into blocks would be lost.
        assert!(kept.by_block.is_none(), "writes are deferred before any block of their chunk loads");
        if kept.writes.is_empty() {
            kept.writes = writes;
        } else {
            kept.writes.extend(writes);
        }
    }

    /// Takes the deferred writes of `chunk` that fall in block `block` (an id), cut to it, in
    /// order (its loader applies them). The first take in a chunk sorts all its writes into
    /// their blocks, once: a chunk's blocks come in one at a time, and a pass over all its
    /// writes per block made a heap's load 4x slower behind a 16 MiB log.
    pub(crate) fn take_deferred(&self, chunk: u64, block: u64) -> Vec<DeferredWrite> {
        let mut kept = self.deferred[chunk as usize].lock().expect("deferred writes");
        if kept.writes.is_empty() && kept.by_block.is_none() {
            return Vec::new();
        }
        let first = chunk * self.blocks_per_chunk;
        if kept.by_block.is_none() {
            let mut by_block: Vec<Vec<DeferredWrite>> = (0..self.blocks_per_chunk).map(|_| Vec::new()).collect();
            for w in std::mem::take(&mut kept.writes) {
                let blocks = self.blocks_of(chunk, w.at()..w.end());
                if blocks.end - blocks.start == 1 {
                    by_block[(blocks.start - first) as usize].push(w);
                    continue;
                }
                for b in blocks {
                    if let Some(part) = w.within(&self.block_range(b)) {
                        by_block[(b - first) as usize].push(part);
                    }
                }
            }
            kept.by_block = Some(by_block);
        }
        std::mem::take(&mut kept.by_block.as_mut().expect("sorted above")[(block - first) as usize])
    }

    pub(crate) fn source(&self) -> &dyn ChunkSource {
        &*self.source
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;
    use crate::{Heap, PAGE_SIZE};

    /// Pages per chunk in these tests: four blocks of a page each.
    const CHUNK: u64 = 4 * PAGE_SIZE;

    /// Images made up in memory: chunk `c`'s word `w` is `c << 32 | w + 1` for two words of
    /// every 256 (the rest zero, which the fill skips: the loom model stays small), but for
    /// all-zero chunks (every third). Chunk `bad_header`'s image is unreadable; block 2 of
    /// chunk `bad_block` holds a flipped byte its checksum does not match. Counts its reads
    /// per block.
    struct Images {
        chunk: u64,
        chunks: u64,
        bad_header: Option<u64>,
        bad_block: Option<u64>,
        /// Reads of blocks alone in this chunk fail (whole images read).
        failing_reads: Option<u64>,
        reads: Arc<Vec<AtomicUsize>>,
    }

    fn word_of(chunk: u64, w: u64) -> u64 {
        if chunk % 3 == 2 || w % 256 >= 2 {
            0
        } else {
            chunk << 32 | (w + 1)
        }
    }

    impl Images {
        fn data(&self, c: u64) -> (Vec<u8>, BlockTable) {
            let mut bytes: Vec<u8> = (0..self.chunk / 8).flat_map(|w| word_of(c, w).to_le_bytes()).collect();
            let table = BlockTable::of(&bytes, crate::checkpoint_format::block_size(self.chunk));
            if Some(c) == self.bad_block {
                bytes[2 * PAGE_SIZE as usize + 9] ^= 0x10;
            }
            (bytes, table)
        }

        fn hand(&self, c: u64, range: Range<u64>, take: &mut TakeImage<'_>) {
            let blocks_per_chunk = self.chunk / PAGE_SIZE;
            for b in range.start / PAGE_SIZE..range.end / PAGE_SIZE {
                self.reads[(c * blocks_per_chunk + b) as usize].fetch_add(1, Ordering::Relaxed);
            }
            if Some(c) == self.bad_header {
                let heap = c * self.chunk..(c + 1) * self.chunk;
                return take(c, Err(ChunkDamage { path: "images".into(), offset: c * 4096, reason: "made up".into(), heap }));
            }
            let (bytes, table) = self.data(c);
            let image = Image { from: range.start, bytes: &bytes[range.start as usize..range.end as usize], blocks: Some(&table), path: Path::new("images"), data_offset: c << 20 };
            take(c, Ok(image));
        }
    }

    impl ChunkSource for Images {
        fn read(&self, run: &[u64], take: &mut TakeImage<'_>) {
            for &c in run {
                self.hand(c, 0..self.chunk, take);
            }
        }

        fn read_blocks(&self, chunk: u64, range: Range<u64>, take: &mut TakeImage<'_>) {
            if Some(chunk) == self.failing_reads {
                let heap = chunk * self.chunk + range.start..chunk * self.chunk + range.end;
                return take(chunk, Err(ChunkDamage { path: "images".into(), offset: range.start, reason: "read failed".into(), heap }));
            }
            self.hand(chunk, range, take);
        }

        fn runs(&self) -> Vec<Vec<u64>> {
            (0..self.chunks).collect::<Vec<_>>().chunks(4).map(<[u64]>::to_vec).collect()
        }
    }

    fn heap_on_demand(chunk: u64, chunks: u64, bad_header: Option<u64>, bad_block: Option<u64>) -> (Heap, Arc<Vec<AtomicUsize>>) {
        let heap = Heap::new(chunks * chunk).unwrap();
        let reads = Arc::new((0..chunks * chunk / PAGE_SIZE).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        heap.load_on_demand(chunk, chunks, Box::new(Images { chunk, chunks, bad_header, bad_block, failing_reads: None, reads: reads.clone() }));
        (heap, reads)
    }

    /// Readers on four threads and a background loader bring blocks in at the same time:
    /// every word reads as its image plus the deferred writes, every block is read at most
    /// twice (alone by an access, and in its loader's whole image), and once all are in the
    /// heap stops checking. A chunk whose header is damaged fails `ready` in every block; a
    /// block that fails its checksum fails alone, the rest of its chunk serves; both keep the
    /// heap checking.
    #[cfg(not(loom))]
    #[test]
    fn blocks_come_in_with_their_deferred_writes_whoever_reaches_them_first() {
        const CHUNKS: u64 = 64;
        for (bad_header, bad_block) in [(None, None), (Some(17), Some(30))] {
            let (heap, reads) = heap_on_demand(CHUNK, CHUNKS, bad_header, bad_block);
            let deferred = |c: u64| c * CHUNK + PAGE_SIZE * (c % 4) + 8 * (c % 7);
            for c in (0..CHUNKS).step_by(2) {
                assert!(heap.is_absent(deferred(c)));
                heap.defer_writes(vec![DeferredWrite::Word { at: deferred(c), value: 1000 + c }]);
                heap.defer_writes(vec![DeferredWrite::Bytes { at: deferred(c) + 3, bytes: vec![0xEE; 2].into() }]);
            }
            let damaged = |off: u64| {
                let c = off / CHUNK;
                Some(c) == bad_header || (Some(c) == bad_block && off % CHUNK / PAGE_SIZE == 2)
            };
            let want = |off: u64| {
                let (c, w) = (off / CHUNK, off % CHUNK / 8);
                if c % 2 == 0 && off == deferred(c) {
                    (1000 + c) & !(0xFFFF << 24) | 0xEEEE << 24
                } else {
                    word_of(c, w)
                }
            };
            std::thread::scope(|s| {
                s.spawn(|| {
                    for run in heap.absent_runs() {
                        heap.load_run(&run);
                    }
                });
                for t in 0..4u64 {
                    let heap = &heap;
                    s.spawn(move || {
                        let mut x = t + 1;
                        for _ in 0..2000 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                            let off = (x >> 20) % (CHUNKS * CHUNK) / 8 * 8;
                            match heap.ready(off, 8) {
                                Ok(()) => assert_eq!(heap.load_word(off), want(off), "word at {off}"),
                                Err(d) => {
                                    assert!(damaged(off), "{off} reported damaged: {d:?}");
                                    assert!(d.heap.contains(&off) && d.heap.end - d.heap.start == PAGE_SIZE, "{d:?}");
                                }
                            }
                        }
                    });
                }
            });
            assert!(heap.load_all().is_err() == bad_header.is_some());
            assert_eq!(heap.absent_chunks(), 0);
            assert_eq!(heap.is_pending(), bad_header.is_some(), "checks stop once every block is in");
            // A chunk whose header fails is damaged whole by its first read, alone or whole.
            let blocks_per_chunk = (CHUNK / PAGE_SIZE) as usize;
            let read_once_or_twice = |(b, r): (usize, &AtomicUsize)| Some((b / blocks_per_chunk) as u64) == bad_header || (1..=2).contains(&r.load(Ordering::Relaxed));
            assert!(reads.iter().enumerate().all(read_once_or_twice), "each block read once or twice");
            assert_eq!(heap.damaged_chunks().len(), usize::from(bad_header.is_some()) * 4 + usize::from(bad_block.is_some()));
            for off in (0..CHUNKS * CHUNK).step_by(8) {
                if damaged(off) {
                    assert!(heap.ready(off, 8).is_err());
                } else {
                    assert_eq!(heap.load_word(off), want(off), "word at {off}");
                }
            }
        }
    }

    /// Blocks of two pages (chunks over 4 MiB) and a heap that ends inside a block: the block
    /// is read to its end in the image, where its checksum ends, and copied up to the heap's.
    #[cfg(not(loom))]
    #[test]
    fn a_block_the_heap_ends_inside_checks_against_all_its_image() {
        let chunk = (crate::checkpoint_format::MAX_BLOCKS + 1) * PAGE_SIZE;
        assert_eq!(crate::checkpoint_format::block_size(chunk), 2 * PAGE_SIZE);
        let heap = Heap::new(3 * PAGE_SIZE).unwrap();
        let reads = Arc::new((0..chunk / PAGE_SIZE).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        heap.load_on_demand(chunk, 1, Box::new(Images { chunk, chunks: 1, bad_header: None, bad_block: None, failing_reads: None, reads }));
        heap.ready(2 * PAGE_SIZE, 8).unwrap();
        assert_eq!(heap.load_word(2 * PAGE_SIZE), word_of(0, 2 * PAGE_SIZE / 8));
        heap.ready(0, 8).unwrap();
        assert!(!heap.is_pending(), "both blocks in the heap are in");
    }

    /// A failed read of blocks alone damages those blocks, not their chunk: the rest of it
    /// comes in with the loaders' whole image.
    #[cfg(not(loom))]
    #[test]
    fn a_failed_block_read_damages_its_blocks_only() {
        let heap = Heap::new(2 * CHUNK).unwrap();
        let reads = Arc::new((0..2 * CHUNK / PAGE_SIZE).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        heap.load_on_demand(CHUNK, 2, Box::new(Images { chunk: CHUNK, chunks: 2, bad_header: None, bad_block: None, failing_reads: Some(1), reads }));
        let err = heap.ready(CHUNK + PAGE_SIZE + 8, 8).unwrap_err();
        assert_eq!(err.heap, CHUNK + PAGE_SIZE..CHUNK + 2 * PAGE_SIZE);
        assert!(heap.load_all().is_err());
        assert_eq!(heap.damaged_chunks().len(), 1);
        for b in [0, 2, 3] {
            heap.ready(CHUNK + b * PAGE_SIZE, 8).unwrap();
            assert_eq!(heap.load_word(CHUNK + b * PAGE_SIZE), word_of(1, b * PAGE_SIZE / 8));
        }
    }

    /// An access reads the blocks it touches and nothing else of the chunk.
    #[cfg(not(loom))]
    #[test]
    fn a_first_access_reads_its_block_not_the_chunk() {
        let (heap, reads) = heap_on_demand(CHUNK, 4, None, None);
        let off = CHUNK + PAGE_SIZE + 16;
        heap.ready(off, 8).unwrap();
        assert_eq!(heap.load_word(off), word_of(1, (PAGE_SIZE + 16) / 8));
        let read: Vec<usize> = reads.iter().map(|r| r.load(Ordering::Relaxed)).collect();
        assert_eq!(read.iter().sum::<usize>(), 1);
        assert_eq!(read[(CHUNK / PAGE_SIZE + 1) as usize], 1);
        // Across a block boundary: both blocks, in one read.
        heap.ready(2 * CHUNK + PAGE_SIZE - 8, 16).unwrap();
        assert_eq!(reads.iter().map(|r| r.load(Ordering::Relaxed)).sum::<usize>(), 3);
        assert!(heap.is_absent(CHUNK) && heap.is_pending());
    }

    /// A heap that ends inside its last chunk: the blocks past its end are never read, and
    /// the heap stops checking once the ones before it are in.
    #[cfg(not(loom))]
    #[test]
    fn blocks_past_the_heap_end_count_as_in() {
        let heap = Heap::new(2 * CHUNK + 2 * PAGE_SIZE).unwrap();
        let reads = Arc::new((0..3 * CHUNK / PAGE_SIZE).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        heap.load_on_demand(CHUNK, 3, Box::new(Images { chunk: CHUNK, chunks: 3, bad_header: None, bad_block: None, failing_reads: None, reads: reads.clone() }));
        assert_eq!(heap.absent_chunks(), 3);
        heap.ready(2 * CHUNK, 2 * PAGE_SIZE).unwrap();
        assert_eq!(heap.absent_chunks(), 2, "the last chunk's two blocks in the heap are all it has");
        assert_eq!(reads[(2 * CHUNK / PAGE_SIZE + 2) as usize].load(Ordering::Relaxed), 0, "a block past the end is not read");
        heap.load_all().unwrap();
        assert!(!heap.is_pending());
        assert_eq!(heap.load_word(2 * CHUNK + 8), word_of(2, 1));
    }

    /// The replay's writes to a chunk some of whose blocks are in (the superblock's chunk)
    /// land now in those blocks, and with the others when they come in.
    #[cfg(not(loom))]
    #[test]
    fn writes_deferred_to_a_partly_present_chunk_land_in_its_present_blocks_at_once() {
        let (heap, _) = heap_on_demand(CHUNK, 2, None, None);
        heap.ready(0, PAGE_SIZE).unwrap();
        assert!(heap.is_absent(0), "a chunk is absent until all its blocks are in");
        let across = PAGE_SIZE - 4;
        heap.defer_writes(vec![DeferredWrite::Bytes { at: across, bytes: vec![0xAB; 8].into() }, DeferredWrite::Word { at: 16, value: 77 }]);
        assert_eq!(heap.load_word(16), 77);
        assert_eq!(heap.load_word(PAGE_SIZE - 8) >> 32, 0xABAB_ABAB);
        assert_eq!(heap.load_word(PAGE_SIZE) & 0xFFFF_FFFF, 0xABAB_ABAB, "brought in with its part of the write");
        assert_eq!(heap.load_word(PAGE_SIZE) >> 32, word_of(0, PAGE_SIZE / 8) >> 32);
    }

    /// The claim protocol under loom: a reader of block 0 and a background loader of the
    /// whole chunk race (with a deferred write in each block); each block is settled once,
    /// the reader sees its block with its write, and the heap stops checking once both
    /// blocks are in.
    #[cfg(loom)]
    #[test]
    fn loom_a_block_is_settled_once_and_seen_whole_by_whoever_waits_for_it() {
        loom::model(|| {
            let (heap, _) = heap_on_demand(2 * PAGE_SIZE, 1, None, None);
            heap.defer_writes(vec![DeferredWrite::Word { at: 8, value: 5 }, DeferredWrite::Word { at: PAGE_SIZE + 8, value: 6 }]);
            let heap = Arc::new(heap);
            let loader = {
                let heap = heap.clone();
                loom::thread::spawn(move || heap.load_run(&[0]))
            };
            heap.ready(0, 16).unwrap();
            assert_eq!(heap.load_word(0), word_of(0, 0));
            assert_eq!(heap.load_word(8), 5);
            loader.join().unwrap();
            heap.ready(PAGE_SIZE, 16).unwrap();
            assert_eq!(heap.load_word(PAGE_SIZE + 8), 6);
            assert!(!heap.is_pending());
        });
    }
}
