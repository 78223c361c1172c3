//! Replay's last step: writing the records to apply, in LSN order, into the heap on all
//! cores.
//!
//! The log's writes land at random heap offsets, so writing them in LSN order would miss
//! the cache on nearly every word. Instead, two passes:
//!
//! 1. **Bucket.** The records are split into one contiguous LSN range per worker. Each
//!    worker decodes its records and sorts their writes into buckets by heap region, in LSN
//!    order, dropping writes older than their chunk's image (a write is split at chunk
//!    boundaries: each piece lies in one chunk).
//! 2. **Apply.** Workers take whole regions; a region's buckets are applied in worker order,
//!    which is LSN order.
//!
//! A region is [`REGION_BYTES`] of whole chunks (16 chunks of the default 1 MiB; a part of
//! a chunk when chunks are larger, and pieces are then split at region boundaries too). Fewer,
//! longer buckets make pass 1's scatter cheaper (it appends to one bucket per region)
//! while pass 2 misses the cache more on a region larger than the cache. On a 1 GiB heap +
//! 1 GiB log, regions of 1, 4, 16, 32 and 64 chunks took 0.95 / 0.88 / 0.77 / 0.74 / 0.71 s
//! to bucket and 0.15 / 0.16 / 0.19 / 0.22 / 0.23 s to apply.
//!
//! The result equals applying every write in LSN order (tested against that below): for
//! any heap byte, the writes to it all fall in its region, and within the region they are
//! applied in LSN order.

use std::sync::atomic::{AtomicUsize, Ordering};

use tusk_storage::{DeferredWrite, Heap};

/// One write of a record, or the part of it that falls in one chunk.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Piece {
    value: u64,
    /// Offset in the region; [`BYTES`] set when `value` indexes the worker's spans.
    at: u32,
}

const BYTES: u32 = 1 << 31;

/// Why a record cannot be applied: recovery stops with an error naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unappliable {
    /// A write reaches past the heap; `needed` is where it ends (u64::MAX on overflow).
    TooFar { record: usize, needed: u64 },
    /// The record's write list does not parse (see [`Writes::check_end`]).
    Malformed { record: usize, reason: String },
}

impl Unappliable {
    /// Index of the record in the input.
    pub fn record(&self) -> usize {
        match self {
            Unappliable::TooFar { record, .. } | Unappliable::Malformed { record, .. } => *record,
        }
    }
}

/// A record's writes, and once they are walked, whether the list held exactly them.
pub trait Writes<'a>: Iterator<Item = (u64, &'a [u8])> {
    fn check_end(&self) -> Result<(), String>;
}

impl<'a> Writes<'a> for tusk_storage::log_format::WriteIter<'a> {
    fn check_end(&self) -> Result<(), String> {
        tusk_storage::log_format::WriteIter::check_end(self)
    }
}

/// Records per bucketing worker at least, and pieces per writing worker: a short log (a
/// reopen after a close replays a few thousand records) is done on the calling thread
/// sooner than 2 x 16 threads start (2.4 ms on the 16-core device host). Small in the unit
/// tests, whose few thousand records must still cross workers.
const RECORDS_PER_WORKER: usize = if cfg!(test) { 64 } else { 4096 };
const PIECES_PER_WORKER: usize = if cfg!(test) { 256 } else { 1 << 16 };

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Bytes of heap a bucket covers at most.
pub const REGION_BYTES: u64 = 16 << 20;

/// The region size for chunks of `chunk_size` bytes: as many whole chunks as fit in
/// [`REGION_BYTES`], or [`REGION_BYTES`] itself when a chunk is larger (a piece's offset in
/// its region must fit the 31 bits a bucketed piece keeps for it).
pub fn region_bytes(chunk_size: u64) -> u64 {
    if chunk_size <= REGION_BYTES {
        REGION_BYTES / chunk_size * chunk_size
    } else {
        REGION_BYTES
    }
}

/// One worker's buckets: per region, its pieces in LSN order.
struct Buckets<'a> {
    regions: Vec<Vec<Piece>>,
    /// Per chunk: whether a piece landed in it.
    touched: Vec<bool>,
    /// Bytes of the writes that are not one aligned word.
    spans: Vec<&'a [u8]>,
    /// The worker's first record that cannot be applied; it stops there.
    unappliable: Option<Unappliable>,
}

/// Applies `count` records to `heap`. `record(i)` returns record `i`'s LSN and writes (in
/// LSN order of `i`); a write lands only where its chunk's image (`chunk_lsn`) is older
/// than the record. Buckets cover `region_bytes` each ([`region_bytes`]). Returns,
/// per chunk, whether anything was written there, or the first record (in LSN order) that
/// cannot be applied, with the heap left unwritten.
pub fn apply<'a, W>(
    count: usize,
    record: impl Fn(usize) -> (u64, W) + Sync,
    heap: &Heap,
    chunk_size: u64,
    chunk_lsn: &[u64],
    region_bytes: u64,
) -> Result<Vec<bool>, Unappliable>
where
    W: Writes<'a>,
{
    Ok(Bucketed::new(count, record, heap.capacity(), chunk_size, chunk_lsn, region_bytes)?.write_into(heap))
}

/// Pass 1's result for a heap of some capacity: every record's writes in buckets, ready to be
/// written (pass 2). Made without the heap, so that it can be made while the checkpoint's
/// images load into it.
pub struct Bucketed<'a> {
    buckets: Vec<Buckets<'a>>,
    capacity: u64,
    chunk_size: u64,
    region_bytes: u64,
}

impl<'a> Bucketed<'a> {
    /// Pass 1 over `count` records (see [`apply`]) for a heap of `capacity` bytes: the first
    /// record that cannot be applied, if any.
    pub fn new<W>(
        count: usize,
        record: impl Fn(usize) -> (u64, W) + Sync,
        capacity: u64,
        chunk_size: u64,
        chunk_lsn: &[u64],
        region_bytes: u64,
    ) -> Result<Bucketed<'a>, Unappliable>
    where
        W: Writes<'a>,
    {
        assert!(chunk_size.is_multiple_of(8) && chunk_size > 0, "chunks hold whole words");
        let chunks = capacity.div_ceil(chunk_size) as usize;
        assert_eq!(chunk_lsn.len(), chunks, "one image LSN per chunk");
        assert!(region_bytes > 0 && region_bytes.is_multiple_of(8) && region_bytes <= u64::from(BYTES), "regions of whole words, offsets in 31 bits");
        let workers = cores().min(count.div_ceil(RECORDS_PER_WORKER)).max(1);
        let per_worker = count.div_ceil(workers);
        let range = |w: usize| (w * per_worker).min(count)..((w + 1) * per_worker).min(count);
        let buckets: Vec<Buckets<'a>> = if workers == 1 {
            vec![bucket(range(0), &record, capacity, chunk_size, chunk_lsn, region_bytes)]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..workers)
                    .map(|w| {
                        let (record, range) = (&record, range(w));
                        s.spawn(move || bucket(range, record, capacity, chunk_size, chunk_lsn, region_bytes))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("replay worker panicked")).collect()
            })
        };
        if let Some(first) = buckets.iter().filter_map(|b| b.unappliable.as_ref()).min_by_key(|u| u.record()) {
            return Err(first.clone());
        }
        Ok(Bucketed { buckets, capacity, chunk_size, region_bytes })
    }

    /// Pass 2: writes the buckets into `heap` (of the capacity they were made for) on all
    /// cores. Returns, per chunk, whether anything was written there.
    pub fn write_into(self, heap: &Heap) -> Vec<bool> {
        assert_eq!(heap.capacity(), self.capacity, "buckets made for a heap of another size");
        let Bucketed { buckets, capacity, chunk_size, region_bytes } = self;
        let regions = capacity.div_ceil(region_bytes) as usize;
        let pieces: usize = buckets.iter().flat_map(|b| b.regions.iter().map(Vec::len)).sum();
        let workers = cores().min(regions).min(pieces.div_ceil(PIECES_PER_WORKER)).max(1);
        let next_region = AtomicUsize::new(0);
        let work = || loop {
            let region = next_region.fetch_add(1, Ordering::Relaxed);
            if region >= regions {
                return;
            }
            if buckets.iter().all(|b| b.regions[region].is_empty()) {
                continue;
            }
            let base = region as u64 * region_bytes;
            let mut deferred = Deferred::new(base, chunk_size, region_bytes);
            for b in &buckets {
                write_pieces(heap, base, &b.regions[region], &b.spans, &mut deferred);
            }
            deferred.hand_over(heap);
        };
        if workers == 1 {
            work();
        } else {
            std::thread::scope(|s| {
                for _ in 0..workers {
                    s.spawn(work);
                }
            });
        }
        let mut touched = vec![false; capacity.div_ceil(chunk_size) as usize];
        for b in &buckets {
            for (t, &mine) in touched.iter_mut().zip(&b.touched) {
                *t |= mine;
            }
        }
        touched
    }
}

/// Pass 1 for the records in `range`.
fn bucket<'a, W>(
    range: std::ops::Range<usize>,
    record: &impl Fn(usize) -> (u64, W),
    capacity: u64,
    chunk_size: u64,
    chunk_lsn: &[u64],
    region_bytes: u64,
) -> Buckets<'a>
where
    W: Writes<'a>,
{
    // Chunks are powers of two unless a store was made with another size: shift then.
    let shift = chunk_size.is_power_of_two().then(|| chunk_size.trailing_zeros());
    let chunk_of = |at: u64| shift.map_or(at / chunk_size, |shift| at >> shift) as usize;
    // A division per piece would cost more than the rest of its bucketing: shift then too.
    let region_shift = region_bytes.is_power_of_two().then(|| region_bytes.trailing_zeros());
    let region_of = |at: u64| region_shift.map_or(at / region_bytes, |shift| at >> shift) as usize;
    let region_base = |at: u64| region_of(at) as u64 * region_bytes;
    let regions = capacity.div_ceil(region_bytes) as usize;
    let mut out = Buckets {
        regions: (0..regions).map(|_| Vec::new()).collect(),
        touched: vec![false; chunk_lsn.len()],
        spans: Vec::new(),
        unappliable: None,
    };
    for i in range {
        let (lsn, mut writes) = record(i);
        for (offset, bytes) in writes.by_ref() {
            let end = offset.checked_add(bytes.len() as u64);
            if end.is_none_or(|end| end > capacity) {
                out.unappliable = Some(Unappliable::TooFar { record: i, needed: end.unwrap_or(u64::MAX) });
                return out;
            }
            // The common case: one aligned word (the Hathi workload writes nothing else).
            if bytes.len() == 8 && offset % 8 == 0 {
                let chunk = chunk_of(offset);
                if lsn > chunk_lsn[chunk] {
                    let value = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
                    out.touched[chunk] = true;
                    out.regions[region_of(offset)].push(Piece { value, at: (offset - region_base(offset)) as u32 });
                }
                continue;
            }
            let mut at = offset;
            let mut rest = bytes;
            while !rest.is_empty() {
                // Each piece lies in one chunk (its image LSN decides) and in one region.
                let chunk = chunk_of(at);
                let end = ((chunk as u64 + 1) * chunk_size).min(region_base(at) + region_bytes);
                let take = (end - at).min(rest.len() as u64) as usize;
                if lsn > chunk_lsn[chunk] {
                    out.touched[chunk] = true;
                    out.regions[region_of(at)].push(Piece { value: out.spans.len() as u64, at: (at - region_base(at)) as u32 | BYTES });
                    out.spans.push(&rest[..take]);
                }
                at += take as u64;
                rest = &rest[take..];
            }
        }
        // Pieces of a malformed record may be in the buckets already: nothing is applied
        // once any worker reports one.
        if let Err(reason) = writes.check_end() {
            out.unappliable = Some(Unappliable::Malformed { record: i, reason });
            return out;
        }
    }
    out
}

/// How many pieces ahead pass 2 prefetches the heap line a piece writes.
const PREFETCH_AHEAD: usize = 8;

/// One region's writes to absent chunks (a reopen on demand), per chunk in LSN order, handed
/// to the heap once the region is done: one lock per chunk, not per piece.
struct Deferred {
    base: u64,
    chunk_size: u64,
    chunks: Vec<Vec<DeferredWrite>>,
}

impl Deferred {
    fn new(base: u64, chunk_size: u64, region_bytes: u64) -> Deferred {
        Deferred { base, chunk_size, chunks: (0..region_bytes.div_ceil(chunk_size).max(1)).map(|_| Vec::new()).collect() }
    }

    fn push(&mut self, off: u64, write: DeferredWrite) {
        self.chunks[((off - self.base) / self.chunk_size) as usize].push(write);
    }

    fn hand_over(self, heap: &Heap) {
        for writes in self.chunks.into_iter().filter(|w| !w.is_empty()) {
            heap.defer_writes(writes);
        }
    }
}

fn write_pieces(heap: &Heap, base: u64, pieces: &[Piece], spans: &[&[u8]], deferred: &mut Deferred) {
    for (i, piece) in pieces.iter().enumerate() {
        if let Some(ahead) = pieces.get(i + PREFETCH_AHEAD) {
            heap.prefetch(base + u64::from(ahead.at & !BYTES));
        }
        let (at, value) = (piece.at, piece.value);
        let off = base + u64::from(at & !BYTES);
        // A chunk a reopen on demand left absent gets its writes when it is brought in: the
        // replay reads no image (pieces lie within one chunk).
        if heap.is_absent(off) {
            deferred.push(
                off,
                match at & BYTES {
                    0 => DeferredWrite::Word { at: off, value },
                    _ => DeferredWrite::Bytes { at: off, bytes: spans[value as usize].into() },
                },
            );
        } else if at & BYTES == 0 {
            heap.store_word(off, value);
        } else {
            heap.write_bytes(off, spans[value as usize]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Record = (u64, Vec<(u64, Vec<u8>)>);

    /// Test records' writes: listed, so always whole (`malformed` makes one that is not).
    struct Listed<'a> {
        writes: std::slice::Iter<'a, (u64, Vec<u8>)>,
        malformed: bool,
    }

    impl<'a> Iterator for Listed<'a> {
        type Item = (u64, &'a [u8]);
        fn next(&mut self) -> Option<Self::Item> {
            self.writes.next().map(|(o, b)| (*o, b.as_slice()))
        }
    }

    impl<'a> Writes<'a> for Listed<'a> {
        fn check_end(&self) -> Result<(), String> {
            if self.malformed {
                Err("write runs past the record".into())
            } else {
                Ok(())
            }
        }
    }

    fn listed(record: &Record) -> (u64, Listed<'_>) {
        (record.0, Listed { writes: record.1.iter(), malformed: false })
    }

    /// A small deterministic generator (the recovery crate has no rand dependency).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Records with aligned words, unaligned byte runs and runs that cross chunks.
    fn records(seed: u64, count: usize, capacity: u64) -> Vec<Record> {
        let mut rng = Lcg(seed);
        (0..count)
            .map(|i| {
                let mut writes = Vec::new();
                let mut at = rng.below(capacity / 4);
                for _ in 0..1 + rng.below(5) {
                    let len = match rng.below(3) {
                        0 => 8,
                        1 => 1 + rng.below(20),
                        _ => 1 + rng.below(3000),
                    };
                    let offset = if len == 8 { (at + 7) & !7 } else { at };
                    if offset + len > capacity {
                        break;
                    }
                    writes.push((offset, (0..len).map(|_| rng.next() as u8).collect()));
                    at = offset + len + rng.below(capacity / 8);
                }
                (i as u64 + 1, writes)
            })
            .collect()
    }

    fn sequential(records: &[Record], heap: &Heap, chunk_size: u64, chunk_lsn: &[u64]) {
        for (lsn, writes) in records {
            for (offset, bytes) in writes {
                for (k, &b) in bytes.iter().enumerate() {
                    let at = offset + k as u64;
                    if *lsn > chunk_lsn[(at / chunk_size) as usize] {
                        heap.write_bytes(at, &[b]);
                    }
                }
            }
        }
    }

    fn contents(heap: &Heap) -> Vec<u8> {
        let mut out = vec![0u8; heap.capacity() as usize];
        heap.read_bytes(0, &mut out);
        out
    }

    #[test]
    fn bucketed_replay_equals_sequential_replay() {
        // Regions of one chunk, of three (the last one short), of a part of a chunk (pieces
        // then split at region boundaries too), and one region for all.
        let cases = (0..8).flat_map(|seed| [1.0, 3.0, 0.25, 16.0].map(|regions_of| (seed, regions_of)));
        for (seed, regions_of) in cases {
            let capacity = 1 << 16;
            // Odd seeds: chunks that are not a power of two (a store made with such a size).
            let chunk_size = if seed % 2 == 0 { 1 << 12 } else { 3 << 10 };
            let recs = records(seed, 2000, capacity);
            let mut rng = Lcg(seed + 100);
            // Some chunks have images newer than some of the records.
            let chunk_lsn: Vec<u64> = (0..capacity.div_ceil(chunk_size)).map(|_| if rng.below(2) == 0 { 0 } else { rng.below(2000) }).collect();
            let (fast, slow) = (Heap::new(capacity).unwrap(), Heap::new(capacity).unwrap());
            let region_bytes = (chunk_size as f64 * regions_of) as u64;
            let touched = apply(recs.len(), |i| listed(&recs[i]), &fast, chunk_size, &chunk_lsn, region_bytes).unwrap();
            sequential(&recs, &slow, chunk_size, &chunk_lsn);
            assert!(contents(&fast) == contents(&slow), "seed {seed}, regions of {region_bytes} bytes: heaps differ");
            for (chunk, &t) in touched.iter().enumerate() {
                let written = recs.iter().any(|(lsn, writes)| {
                    writes.iter().any(|(o, b)| {
                        (*o..*o + b.len() as u64).any(|at| at / chunk_size == chunk as u64 && *lsn > chunk_lsn[chunk])
                    })
                });
                assert_eq!(t, written, "seed {seed}: chunk {chunk} touched");
            }
        }
    }

    #[test]
    fn regions_are_whole_chunks_up_to_16_mib_and_parts_of_larger_chunks() {
        assert_eq!(region_bytes(1 << 20), 16 << 20);
        assert_eq!(region_bytes(4096), 16 << 20);
        assert_eq!(region_bytes(3 << 20), 15 << 20);
        assert_eq!(region_bytes(16 << 20), 16 << 20);
        assert_eq!(region_bytes(5 << 30), 16 << 20, "a 5 GiB chunk: 16 MiB parts of it");
    }

    #[test]
    fn the_first_write_past_the_heap_in_lsn_order_is_reported() {
        let capacity = 1 << 14;
        let heap = Heap::new(capacity).unwrap();
        let mut recs = records(7, 500, capacity);
        recs[120].1.push((capacity - 4, vec![1; 8]));
        recs[400].1.push((u64::MAX - 2, vec![1; 8]));
        let err = apply(recs.len(), |i| listed(&recs[i]), &heap, 1 << 12, &[0; 4], 2 << 12).unwrap_err();
        assert_eq!(err, Unappliable::TooFar { record: 120, needed: capacity + 4 });
    }

    /// A record whose write list does not parse stops replay with the first such record in
    /// LSN order (whichever worker finds it, and before a later write past the heap), and
    /// the heap stays unwritten.
    #[test]
    fn the_first_malformed_record_in_lsn_order_is_reported_and_nothing_applied() {
        let capacity = 1 << 14;
        let heap = Heap::new(capacity).unwrap();
        let mut recs = records(9, 600, capacity);
        recs[500].1.push((u64::MAX - 2, vec![1; 8]));
        let bad = [450, 90];
        let err = apply(
            recs.len(),
            |i| (recs[i].0, Listed { writes: recs[i].1.iter(), malformed: bad.contains(&i) }),
            &heap,
            1 << 12,
            &[0; 4],
            2 << 12,
        )
        .unwrap_err();
        assert_eq!(err, Unappliable::Malformed { record: 90, reason: "write runs past the record".into() });
        assert!(contents(&heap).iter().all(|&b| b == 0), "nothing applied");
    }
}
