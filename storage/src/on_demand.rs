//! Chunks of the heap brought in from a checkpoint when first used instead of at open
//! (issue 32): a store opens in the time its log's tail takes to replay, whatever the size of
//! its heap, and background loaders bring in the rest.
//!
//! Every chunk the checkpoint covers starts *absent*. The first access of the heap that
//! reaches an absent chunk loads it on the accessing thread: it claims the chunk (absent →
//! loading), reads and checks its image through the [`ChunkSource`], copies it in and marks it
//! *present*; others reaching the chunk meanwhile wait for that. An image that fails its
//! checks leaves its chunk *damaged* for good: its bytes stay zero and are never served as
//! data, [`crate::Heap::ready`] names the file and offset to whoever asks, and every other
//! chunk stays usable. Once every chunk is present, one flag turns the check off.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
// Held for a push or a take only, with no atomic of the model inside: std's under loom too.
use std::sync::Mutex;

use crate::sync::{AtomicU64, AtomicU8};

/// What a [`ChunkSource`] hands each image it read to: the chunk and its bytes, or why not.
pub type TakeImage<'t> = dyn FnMut(u64, Result<&[u8], ChunkDamage>) + 't;

/// Where the images of absent chunks come from (the recovery crate's checkpoint reader).
pub trait ChunkSource: Send + Sync {
    /// Reads the images of `run` (chunks whose images lie next to each other, as
    /// [`ChunkSource::runs`] groups them, or a single chunk), checks those whose `wanted`
    /// entry is set, and hands each of those to `take`: its bytes (the chunk's size, or less
    /// for the heap's last chunk) or what is wrong with it.
    fn read(&self, run: &[u64], wanted: &[bool], take: &mut TakeImage<'_>);

    /// Every chunk, in runs that one sequential read of the files takes together.
    fn runs(&self) -> Vec<Vec<u64>>;
}

/// A chunk image that failed its checks: the file, the image's offset in it, why, and the
/// heap bytes it was to fill.
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
}

const ABSENT: u8 = 0;
const LOADING: u8 = 1;
const PRESENT: u8 = 2;
const DAMAGED: u8 = 3;

/// The heap's chunks while some are not present yet.
pub(crate) struct OnDemand {
    pub(crate) chunk_size: u64,
    states: Box<[AtomicU8]>,
    /// Chunks neither present nor damaged.
    absent: AtomicU64,
    damage: Mutex<Vec<(u64, ChunkDamage)>>,
    source: Box<dyn ChunkSource>,
    /// Per chunk, the replay's writes to it in LSN order, while it is absent.
    deferred: Box<[Mutex<Vec<DeferredWrite>>]>,
    /// Loads under way that an access waits for: background loaders hold their next read
    /// back while there are any. A hint for scheduling only, which nothing's correctness
    /// rests on.
    access_loads: AtomicU64,
}

/// An access's load of a chunk under way (see [`OnDemand::access_load`]).
pub(crate) struct AccessLoad<'a>(&'a AtomicU64);

impl Drop for AccessLoad<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a claim of a chunk found.
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
    pub(crate) fn new(chunk_size: u64, chunks: u64, source: Box<dyn ChunkSource>) -> OnDemand {
        assert!(chunk_size > 0 && chunk_size.is_multiple_of(crate::PAGE_SIZE), "chunk size {chunk_size}");
        OnDemand {
            chunk_size,
            states: (0..chunks).map(|_| AtomicU8::new(ABSENT)).collect(),
            absent: AtomicU64::new(chunks),
            damage: Mutex::new(Vec::new()),
            source,
            deferred: (0..chunks).map(|_| Mutex::new(Vec::new())).collect(),
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
        self.states.len() as u64
    }

    pub(crate) fn absent(&self) -> u64 {
        self.absent.load(Ordering::Acquire)
    }

    pub(crate) fn claim(&self, chunk: u64) -> Claim {
        let state = &self.states[chunk as usize];
        // A plain load first: present chunks are read by every access while others load,
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

    /// Ends a claim: the chunk's bytes are in the heap (or it is damaged). Returns whether
    /// it was the last absent chunk.
    pub(crate) fn settle(&self, chunk: u64, damage: Option<ChunkDamage>) -> bool {
        let state = &self.states[chunk as usize];
        debug_assert_eq!(state.load(Ordering::Relaxed), LOADING, "chunk {chunk} settled without its claim");
        match damage {
            None => state.store(PRESENT, Ordering::Release),
            Some(d) => {
                self.damage.lock().expect("damage list").push((chunk, d));
                state.store(DAMAGED, Ordering::Release);
            }
        }
        self.absent.fetch_sub(1, Ordering::AcqRel) == 1
    }

    pub(crate) fn damage_of(&self, chunk: u64) -> ChunkDamage {
        let damage = self.damage.lock().expect("damage list");
        damage.iter().find(|(c, _)| *c == chunk).map(|(_, d)| d.clone()).expect("a damaged chunk has its damage listed")
    }

    pub(crate) fn damaged(&self) -> Vec<(u64, ChunkDamage)> {
        self.damage.lock().expect("damage list").clone()
    }

    pub(crate) fn is_absent(&self, chunk: u64) -> bool {
        self.states[chunk as usize].load(Ordering::Acquire) == ABSENT
    }

    /// Keeps `writes` for `chunk`, absent: the caller is the replay, before anything loads.
    pub(crate) fn defer(&self, chunk: u64, writes: Vec<DeferredWrite>) {
        debug_assert!(self.is_absent(chunk), "writes are deferred only for absent chunks");
        let mut kept = self.deferred[chunk as usize].lock().expect("deferred writes");
        if kept.is_empty() {
            *kept = writes;
        } else {
            kept.extend(writes);
        }
    }

    /// Takes `chunk`'s deferred writes (its loader applies them).
    pub(crate) fn take_deferred(&self, chunk: u64) -> Vec<DeferredWrite> {
        std::mem::take(&mut *self.deferred[chunk as usize].lock().expect("deferred writes"))
    }

    pub(crate) fn source(&self) -> &dyn ChunkSource {
        &*self.source
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::{Heap, PAGE_SIZE};

    /// Images made up in memory: chunk `c`'s word `w` is `c << 32 | w + 1` for two words of
    /// every 256 (the rest zero, which the fill skips: the loom model stays small), but for
    /// all-zero chunks (every third) and the `damaged` one. Counts its reads per chunk.
    struct Images {
        chunk: u64,
        chunks: u64,
        damaged: Option<u64>,
        reads: std::sync::Arc<Vec<AtomicUsize>>,
    }

    fn word_of(chunk: u64, w: u64) -> u64 {
        if chunk % 3 == 2 || w % 256 >= 2 {
            0
        } else {
            chunk << 32 | (w + 1)
        }
    }

    impl ChunkSource for Images {
        fn read(&self, run: &[u64], wanted: &[bool], take: &mut TakeImage<'_>) {
            for (&c, _) in run.iter().zip(wanted).filter(|(_, &w)| w) {
                self.reads[c as usize].fetch_add(1, Ordering::Relaxed);
                if Some(c) == self.damaged {
                    let heap = c * self.chunk..(c + 1) * self.chunk;
                    take(c, Err(ChunkDamage { path: "images".into(), offset: c * 4096, reason: "made up".into(), heap }));
                    continue;
                }
                let bytes: Vec<u8> = (0..self.chunk / 8).flat_map(|w| word_of(c, w).to_le_bytes()).collect();
                take(c, Ok(&bytes));
            }
        }

        fn runs(&self) -> Vec<Vec<u64>> {
            (0..self.chunks).collect::<Vec<_>>().chunks(4).map(<[u64]>::to_vec).collect()
        }
    }

    fn heap_on_demand(chunks: u64, damaged: Option<u64>) -> (Heap, std::sync::Arc<Vec<AtomicUsize>>) {
        let chunk = PAGE_SIZE;
        let heap = Heap::new(chunks * chunk).unwrap();
        let reads = std::sync::Arc::new((0..chunks).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        heap.load_on_demand(chunk, chunks, Box::new(Images { chunk, chunks, damaged, reads: reads.clone() }));
        (heap, reads)
    }

    /// Readers on four threads and a background loader bring chunks in at the same time:
    /// every word reads as its image plus the deferred writes, every chunk is read once, and
    /// once all are in the heap stops checking; the damaged chunk fails `ready` and nothing
    /// else, and keeps the heap checking.
    #[cfg(not(loom))]
    #[test]
    fn chunks_come_in_once_with_their_deferred_writes_whoever_reaches_them_first() {
        const CHUNKS: u64 = 64;
        for damaged in [None, Some(17)] {
            let (heap, reads) = heap_on_demand(CHUNKS, damaged);
            let deferred = |c: u64| c * PAGE_SIZE + 8 * (c % 7);
            for c in (0..CHUNKS).step_by(2) {
                assert!(heap.is_absent(deferred(c)));
                heap.defer_writes(vec![DeferredWrite::Word { at: deferred(c), value: 1000 + c }]);
                heap.defer_writes(vec![DeferredWrite::Bytes { at: deferred(c) + 3, bytes: vec![0xEE; 2].into() }]);
            }
            let want = |off: u64| {
                let (c, w) = (off / PAGE_SIZE, off % PAGE_SIZE / 8);
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
                            let off = (x >> 20) % (CHUNKS * PAGE_SIZE) / 8 * 8;
                            match heap.ready(off, 8) {
                                Ok(()) => assert_eq!(heap.load_word(off), want(off), "word at {off}"),
                                Err(d) => {
                                    assert_eq!(Some(off / PAGE_SIZE), damaged);
                                    assert!(d.heap.contains(&off));
                                }
                            }
                        }
                    });
                }
            });
            assert!(heap.load_all().is_err() == damaged.is_some());
            assert_eq!(heap.absent_chunks(), 0);
            assert_eq!(heap.is_pending(), damaged.is_some(), "checks stop once every chunk is in");
            assert!(reads.iter().all(|r| r.load(Ordering::Relaxed) == 1), "each chunk read once");
            assert_eq!(heap.damaged_chunks().len(), usize::from(damaged.is_some()));
            for off in (0..CHUNKS * PAGE_SIZE).step_by(8).filter(|&o| Some(o / PAGE_SIZE) != damaged) {
                assert_eq!(heap.load_word(off), want(off), "word at {off}");
            }
        }
    }

    /// The claim protocol under loom: a reader and a background loader race for chunk 0
    /// (with a deferred write); the image is read once, the reader sees it with the write, and
    /// the heap stops checking once both chunks are in.
    #[cfg(loom)]
    #[test]
    fn loom_a_chunk_is_read_once_and_seen_whole_by_whoever_waits_for_it() {
        loom::model(|| {
            let (heap, reads) = heap_on_demand(2, None);
            heap.defer_writes(vec![DeferredWrite::Word { at: 8, value: 5 }]);
            let heap = std::sync::Arc::new(heap);
            let loader = {
                let heap = heap.clone();
                loom::thread::spawn(move || heap.load_run(&[0, 1]))
            };
            heap.ready(0, 16).unwrap();
            assert_eq!(heap.load_word(0), word_of(0, 0));
            assert_eq!(heap.load_word(8), 5);
            loader.join().unwrap();
            heap.ready(PAGE_SIZE, 8).unwrap();
            assert_eq!(heap.load_word(PAGE_SIZE), word_of(1, 0));
            assert!(!heap.is_pending());
            assert!(reads.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        });
    }
}
