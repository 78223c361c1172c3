//! The heap: one anonymous, lazily touched memory region addressed by u64 offsets.
//!
//! All access is word-atomic (`AtomicU64`, relaxed): the STM in tusk-txn provides ordering
//! through its stripe locks, and atomic words keep concurrent readers and write-back free
//! of data races. Byte-granular helpers are built from word operations.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use crate::on_demand::{ChunkDamage, ChunkSource, Claim, DeferredWrite, Image, OnDemand};
#[cfg(not(loom))]
use crate::region::AnonRegion;
use crate::region::AtomicWords;
use crate::sync::{AtomicBool, AtomicU64};
use crate::StorageError;

/// Page ranges this long and longer are scanned for dirty pages by several threads.
pub const PARALLEL_SCAN_PAGES: u64 = 1 << 18;
/// Most threads of one scan.
pub const MAX_SCAN_THREADS: usize = 16;

/// Size of a dirty-tracking page.
pub const PAGE_SIZE: u64 = 4096;

/// A position in the heap: a byte offset from its base. Never a raw pointer, so that the
/// heap image stays valid when copied (snapshots, checkpoints, the GPU mirror).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HeapPtr(pub u64);

impl HeapPtr {
    /// The null pointer (offset 0 is the superblock, never handed out by the allocator).
    pub const NULL: HeapPtr = HeapPtr(0);

    /// The raw offset.
    pub fn offset(self) -> u64 {
        self.0
    }

    /// Whether this is [`HeapPtr::NULL`].
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// One anonymous mmap region, reserved with MAP_NORESERVE and touched lazily.
pub struct Heap {
    #[cfg(not(loom))]
    data: AnonRegion,
    /// Under loom the heap's words are loom atomics (see [`AtomicWords`]).
    #[cfg(loom)]
    data: AtomicWords,
    capacity: u64,
    /// Per page: the dirty epoch of the last commit write-back that touched it.
    epochs: AtomicWords,
    /// Some chunk is not present yet (see [`crate::on_demand`]): accesses check their chunks
    /// first. Cleared once every chunk is present, and the check costs one load.
    pending: AtomicBool,
    on_demand: OnceLock<OnDemand>,
}

impl Heap {
    /// Reserves `capacity` bytes (rounded up to a page). Pages are zero until written.
    pub fn new(capacity: u64) -> Result<Heap, StorageError> {
        let capacity = capacity.div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE;
        #[cfg(not(loom))]
        let data = AnonRegion::reserve(capacity)?;
        #[cfg(loom)]
        let data = AtomicWords::new(capacity / 8)?;
        let epochs = AtomicWords::new(capacity / PAGE_SIZE)?;
        Ok(Heap { data, capacity, epochs, pending: AtomicBool::new(false), on_demand: OnceLock::new() })
    }

    /// Leaves the chunks of `[0, chunks × chunk_size)` absent, to be read from `source` when
    /// first used or by [`Heap::load_run`] (see [`crate::on_demand`]). For a fresh (zero)
    /// heap that no other thread uses yet; once per heap.
    pub fn load_on_demand(&self, chunk_size: u64, chunks: u64, source: Box<dyn ChunkSource>) {
        let chunks = chunks.min(self.capacity.div_ceil(chunk_size));
        if chunks == 0 {
            return;
        }
        let block_size = crate::checkpoint_format::block_size(chunk_size);
        let set = self.on_demand.set(OnDemand::new(chunk_size, block_size, chunks, self.capacity, source));
        assert!(set.is_ok(), "a heap loads on demand once");
        self.pending.store(true, Ordering::Release);
    }

    /// Brings the chunks under `[off, off+len)` into the heap where they are still absent:
    /// afterwards those bytes are the checkpoint's (plus whatever was written since). Fails,
    /// naming the image, where one of them is damaged; their bytes are then not data and must
    /// not be used or written. One load when every chunk is present.
    #[inline]
    pub fn ready(&self, off: u64, len: u64) -> Result<(), ChunkDamage> {
        if !self.pending.load(Ordering::Acquire) {
            return Ok(());
        }
        self.bring_in(off, len)
    }

    /// The accessors' own check: brings absent chunks in; a damaged chunk reads as zeros
    /// (callers that must not see them ask [`Heap::ready`] first, as transactions do).
    #[inline]
    fn guard(&self, off: u64, len: u64) {
        #[cfg(not(loom))]
        if self.pending.load(Ordering::Acquire) {
            let _ = self.bring_in(off, len);
        }
        #[cfg(loom)]
        let _ = (off, len);
    }

    #[cold]
    #[inline(never)]
    fn bring_in(&self, off: u64, len: u64) -> Result<(), ChunkDamage> {
        let Some(od) = self.on_demand.get() else { return Ok(()) };
        let end = off.saturating_add(len).min(od.covered());
        let mut result = Ok(());
        let mut at = off;
        while at < end {
            let chunk = at / od.chunk_size;
            let chunk_end = ((chunk + 1) * od.chunk_size).min(end);
            let blocks = od.blocks_of(chunk, at..chunk_end);
            if let Err(damage) = self.bring_in_blocks(od, chunk, blocks) {
                result = result.and(Err(damage));
            }
            at = chunk_end;
        }
        result
    }

    /// Brings `blocks` of `chunk` in: claims the absent ones and reads them (one read from
    /// the first claimed to the last), then waits for any that others load.
    fn bring_in_blocks(&self, od: &OnDemand, chunk: u64, blocks: std::ops::Range<u64>) -> Result<(), ChunkDamage> {
        if blocks.clone().all(|b| od.is_present(b)) {
            return Ok(());
        }
        let won: Vec<u64> = blocks.clone().filter(|&b| od.claim(b) == Claim::Won).collect();
        if !won.is_empty() {
            let _waited_for = od.access_load();
            self.load_blocks(od, chunk, &won);
        }
        let mut result = Ok(());
        for block in blocks {
            loop {
                match od.claim(block) {
                    Claim::Present => break,
                    Claim::Damaged => {
                        result = result.and(Err(od.damage_of(block)));
                        break;
                    }
                    Claim::Won => self.load_blocks(od, chunk, &[block]),
                    // Another thread reads it: a 4 KiB read, or a loader's run.
                    Claim::Loading => crate::sync::yield_now(),
                }
            }
        }
        result
    }

    /// Reads the blocks `won` (claimed by the caller, ascending, of `chunk`) and settles them.
    fn load_blocks(&self, od: &OnDemand, chunk: u64, won: &[u64]) {
        // To the last block's end in the image, past the heap's end too: its checksum covers it.
        let (first, last) = (od.block_range(won[0]).start, od.block_image_end(won[won.len() - 1]));
        let base = chunk * od.chunk_size;
        let mut settled = 0;
        od.source().read_blocks(chunk, first - base..last - base, &mut |c, image| {
            debug_assert_eq!(c, chunk);
            settled += self.settle_blocks(od, chunk, image, |b| won.binary_search(&b).is_ok());
        });
        // A block left loading would hold every thread that reaches it for ever.
        assert_eq!(settled, won.len(), "the chunk source hands over every block it was asked for");
    }

    /// Settles, from what a source read of `chunk`, the blocks `mine` says the caller has
    /// claimed and any other absent block the read covers (claimed here): each checked, copied
    /// in with the replay's writes to it, or marked damaged. Returns how many of `mine` it
    /// settled.
    fn settle_blocks(&self, od: &OnDemand, chunk: u64, image: Result<Image<'_>, ChunkDamage>, mine: impl Fn(u64) -> bool) -> usize {
        let base = chunk * od.chunk_size;
        let (mut settled, mut last) = (0, false);
        let blocks = match &image {
            Ok(i) => od.blocks_of(chunk, base + i.from..(base + i.from + i.bytes.len() as u64).min(od.covered())),
            Err(_) => od.blocks_of_chunk(chunk),
        };
        for block in blocks {
            let claimed = mine(block);
            // Damage marks the blocks it names (a header's: the chunk; a failed read: the
            // blocks it was for), beyond those the caller claimed.
            let named = match &image {
                Err(d) => d.heap.contains(&od.block_range(block).start),
                Ok(_) => true,
            };
            let ours = claimed || (named && od.claim(block) == Claim::Won);
            if !ours {
                continue;
            }
            let range = od.block_range(block);
            let damage = match &image {
                Err(d) => Some(ChunkDamage { heap: range.clone(), ..d.clone() }),
                Ok(i) => {
                    let at = (range.start - base - i.from) as usize;
                    let bytes = &i.bytes[at..(at + od.block_size as usize).min(i.bytes.len())];
                    let local = ((range.start - base) / od.block_size) as usize;
                    match i.blocks {
                        Some(table) if !table.holds(local, bytes) => Some(ChunkDamage {
                            path: i.path.to_path_buf(),
                            offset: i.data_offset + (range.start - base),
                            reason: format!("chunk {chunk}: block {local} checksum mismatch"),
                            heap: range.clone(),
                        }),
                        _ => {
                            self.fill_absent(range.start, &bytes[..(range.end - range.start) as usize]);
                            for write in od.take_deferred(chunk, block) {
                                self.apply_deferred(write);
                            }
                            None
                        }
                    }
                }
            };
            last |= od.settle(block, damage);
            settled += usize::from(claimed);
        }
        if last && od.damaged().is_empty() {
            self.pending.store(false, Ordering::Release);
        }
        settled
    }

    fn apply_deferred(&self, write: DeferredWrite) {
        match write {
            DeferredWrite::Word { at, value } => self.word_unguarded(at).store(value, Ordering::Relaxed),
            DeferredWrite::Bytes { at, bytes } => self.write_bytes_with(at, &bytes, |off| self.word_unguarded(off)),
        }
    }

    /// Copies a loaded block into the heap, where it is zero and claimed by this thread (no
    /// other access reaches it): runs of non-zero lines, so that the zero parts of an image
    /// leave their pages unbacked.
    fn fill_absent(&self, off: u64, bytes: &[u8]) {
        let len = (bytes.len() as u64).min(self.capacity - off);
        let bytes = &bytes[..len as usize];
        let zero = crate::zeros::all_zero;
        let mut at = 0;
        while at < bytes.len() {
            if zero(&bytes[at..(at + 64).min(bytes.len())]) {
                at += 64;
                continue;
            }
            let start = at;
            while at < bytes.len() && !zero(&bytes[at..(at + 64).min(bytes.len())]) {
                at += 64;
            }
            let end = at.min(bytes.len());
            self.copy_in_unguarded(off + start as u64, &bytes[start..end]);
        }
    }

    /// Whether the chunk holding `off` is not wholly present: the log's replay then defers
    /// its writes there ([`Heap::defer_writes`]) instead of reading the chunk's image at open.
    /// Chunk-wide, not per block, so that the replay never brings a block in while writes to
    /// it with lower LSNs are still on their way to the chunk's deferred list.
    #[inline]
    pub fn is_absent(&self, off: u64) -> bool {
        if !self.pending.load(Ordering::Acquire) {
            return false;
        }
        self.on_demand.get().is_some_and(|od| off < od.covered() && od.is_absent(off / od.chunk_size))
    }

    /// Keeps writes to one chunk not wholly present ([`Heap::is_absent`]), in LSN order, for
    /// when its blocks are brought in (after any kept before); the parts that fall in blocks
    /// present already (the superblock's, read beside the log's scan) are written now. Only
    /// for the log's replay, before anything else uses the heap; every write lies within that
    /// chunk.
    pub fn defer_writes(&self, writes: Vec<DeferredWrite>) {
        let od = self.on_demand.get().expect("writes are deferred on a heap that loads on demand");
        let Some(first) = writes.first() else { return };
        let chunk = first.at() / od.chunk_size;
        for w in &writes {
            assert!(w.at() / od.chunk_size == chunk && (w.end() - 1) / od.chunk_size == chunk, "deferred writes lie within one chunk");
        }
        for range in od.blocks_of_chunk(chunk).filter(|&b| od.is_present(b)).map(|b| od.block_range(b)) {
            for w in writes.iter().filter_map(|w| w.within(&range)) {
                self.apply_deferred(w);
            }
        }
        od.defer(chunk, writes);
    }

    /// Loads the absent blocks of `run` (one of [`Heap::absent_runs`]) with one read of their
    /// chunks' images; blocks already present, loading or damaged are left as they are.
    pub fn load_run(&self, run: &[u64]) {
        let Some(od) = self.on_demand.get() else { return };
        if !run.iter().any(|&c| od.is_absent(c)) {
            return;
        }
        od.source().read(run, &mut |chunk, image| {
            self.settle_blocks(od, chunk, image, |_| false);
        });
    }

    /// Brings every absent chunk in now, in the source's runs, on this thread (with any
    /// other thread loading too); fails naming a damaged one. For what cannot wait for a
    /// chunk later: a forked child has neither the loaders nor the image files.
    pub fn load_all(&self) -> Result<(), ChunkDamage> {
        if !self.is_pending() {
            return Ok(());
        }
        for run in self.absent_runs() {
            self.load_run(&run);
        }
        self.ready(0, self.capacity)
    }

    /// The source's runs of chunks that hold an absent one, in the order one sequential
    /// read of the files takes them (for background loaders).
    pub fn absent_runs(&self) -> Vec<Vec<u64>> {
        let Some(od) = self.on_demand.get() else { return Vec::new() };
        let mut runs = od.source().runs();
        runs.retain(|run| run.iter().any(|&c| c < od.chunks() && od.is_absent(c)));
        for run in &mut runs {
            run.retain(|&c| c < od.chunks());
        }
        runs
    }

    /// Loads of chunks under way that accesses wait for (the background loaders let these
    /// go first).
    pub fn access_loads(&self) -> u64 {
        self.on_demand.get().map_or(0, |od| od.access_loads())
    }

    /// Chunks not brought in yet (0 for a heap loaded whole).
    pub fn absent_chunks(&self) -> u64 {
        self.on_demand.get().map_or(0, |od| od.absent())
    }

    /// Chunks found damaged when brought in, with their images.
    pub fn damaged_chunks(&self) -> Vec<(u64, ChunkDamage)> {
        self.on_demand.get().map_or(Vec::new(), |od| od.damaged())
    }

    /// Whether some chunk is absent or damaged (accesses check their chunks).
    pub fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    #[inline]
    fn epoch_slot(&self, page: u64) -> &AtomicU64 {
        self.epochs.get(page)
    }

    /// Size of the region in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    #[inline]
    fn word(&self, off: u64) -> &AtomicU64 {
        self.guard(off, 8);
        self.word_unguarded(off)
    }

    #[inline]
    fn word_unguarded(&self, off: u64) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.capacity, "heap word {off} out of range");
        #[cfg(loom)]
        return self.data.get(off / 8);
        #[cfg(not(loom))]
        // SAFETY: in bounds and 8-aligned (checked above); the mapping lives as long as self;
        // AtomicU64 has the same layout as u64 and all access to heap words is atomic.
        unsafe {
            &*(self.data.base().add(off as usize) as *const AtomicU64)
        }
    }

    /// The `count` words from `off` (8-aligned).
    #[cfg(not(loom))]
    #[inline]
    fn words(&self, off: u64, count: usize) -> &[AtomicU64] {
        let end = off.checked_add(8 * count as u64).expect("heap range overflow");
        assert!(off.is_multiple_of(8) && end <= self.capacity, "heap words {off}..{end} out of range");
        self.guard(off, end - off);
        // SAFETY: in bounds and 8-aligned (checked above); the mapping lives as long as self;
        // AtomicU64 has the same layout as u64 and all access to heap words is atomic.
        unsafe { std::slice::from_raw_parts(self.data.base().add(off as usize) as *const AtomicU64, count) }
    }

    /// Loads the 8-byte word at `off` (8-aligned).
    #[inline]
    pub fn load_word(&self, off: u64) -> u64 {
        self.word(off).load(Ordering::Relaxed)
    }

    /// Loads the `out.len()` words from `off` (8-aligned), each word atomically (relaxed), with
    /// one bounds check for the run instead of one per word (index nodes: a header and a key
    /// array read together).
    #[inline]
    pub fn load_words(&self, off: u64, out: &mut [u64]) {
        #[cfg(not(loom))]
        {
            let words = self.words(off, out.len());
            for (w, a) in out.iter_mut().zip(words) {
                *w = a.load(Ordering::Relaxed);
            }
        }
        #[cfg(loom)]
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.load_word(off + 8 * i as u64);
        }
    }

    /// Stores the 8-byte word at `off` (8-aligned).
    #[inline]
    pub fn store_word(&self, off: u64, value: u64) {
        self.word(off).store(value, Ordering::Relaxed)
    }

    /// Stores the bytes of `value` selected by `mask` (bit i = byte i, little-endian) into the
    /// word at `off`. The caller must be the only writer of that word (it holds its stripe lock,
    /// or recovery runs single-writer).
    #[inline]
    pub fn store_word_masked(&self, off: u64, value: u64, mask: u8) {
        if mask == 0xFF {
            self.store_word(off, value);
            return;
        }
        merge_masked(self.word(off), value, mask);
    }

    /// Copies `buf.len()` bytes at `off` into `buf` (no transactional guarantees).
    pub fn read_bytes(&self, off: u64, buf: &mut [u8]) {
        self.check_range(off, buf.len() as u64);
        if off.is_multiple_of(8) && buf.len().is_multiple_of(8) {
            // The common case (chunk copies, whole words): one word load per 8 bytes.
            #[cfg(not(loom))]
            for (word, out) in self.words(off, buf.len() / 8).iter().zip(buf.chunks_exact_mut(8)) {
                out.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
            #[cfg(loom)]
            for (i, out) in buf.chunks_exact_mut(8).enumerate() {
                out.copy_from_slice(&self.load_word(off + 8 * i as u64).to_le_bytes());
            }
            return;
        }
        let mut pos = 0usize;
        while pos < buf.len() {
            let at = off + pos as u64;
            let word_off = at & !7;
            let skip = (at - word_off) as usize;
            let take = (8 - skip).min(buf.len() - pos);
            let bytes = self.load_word(word_off).to_le_bytes();
            buf[pos..pos + take].copy_from_slice(&bytes[skip..skip + take]);
            pos += take;
        }
    }

    /// Copies `dst.len()` heap bytes at `off` into `dst` with a plain `memcpy`, at full memory
    /// bandwidth (word-by-word atomic loads cannot use the wide or non-temporal moves).
    /// Bytes written concurrently may come out torn: callers copy either while no commit
    /// write-back runs (the snapshot gate is closed) or re-copy every page dirtied meanwhile
    /// under the closed gate before anyone reads the copy (txn's consistent page copy).
    pub fn copy_out(&self, off: u64, dst: &mut [u8]) {
        self.check_range(off, dst.len() as u64);
        self.guard(off, dst.len() as u64);
        #[cfg(not(loom))]
        // SAFETY: the source range lies in the mapping (checked above) and cannot overlap
        // `dst`, which the caller borrows exclusively. The copy reads words other threads may
        // store to atomically at the same time; such bytes are never trusted (see above), and
        // memcpy through libc is opaque to the compiler, which therefore cannot assume the
        // absence of that race.
        unsafe {
            libc::memcpy(dst.as_mut_ptr() as *mut libc::c_void, self.data.base().add(off as usize) as *const libc::c_void, dst.len());
        }
        #[cfg(loom)]
        self.read_bytes(off, dst);
    }

    /// [`Heap::copy_out`] with non-temporal stores (`region::copy_streaming`): for copies of
    /// whole lines into memory nobody reads soon. Other lengths and alignments take the plain
    /// copy. The stores are ordered before later ones only by `region::streaming_fence`.
    pub fn copy_out_streaming(&self, off: u64, dst: &mut [u8]) {
        use crate::region::STREAM_STEP;
        let aligned = (off as usize | dst.as_ptr() as usize | dst.len()).is_multiple_of(STREAM_STEP);
        if cfg!(loom) || !aligned {
            return self.copy_out(off, dst);
        }
        self.check_range(off, dst.len() as u64);
        self.guard(off, dst.len() as u64);
        #[cfg(not(loom))]
        // SAFETY: the source range lies in the mapping (checked above), `dst` is borrowed
        // exclusively, and both are line-aligned with a length of whole lines (checked above);
        // the source may be written meanwhile, as with `copy_out`.
        unsafe {
            crate::region::copy_streaming(dst.as_mut_ptr(), self.data.base().add(off as usize), dst.len());
        }
    }

    /// Copies `src` into the heap at `off` with a plain `memcpy` (wide moves instead of one
    /// atomic store per word). Only for a heap no other thread reads or writes in that range
    /// meanwhile: recovery loading checkpoint images into a fresh heap.
    pub fn copy_in(&self, off: u64, src: &[u8]) {
        self.guard(off, src.len() as u64);
        self.copy_in_unguarded(off, src);
    }

    fn copy_in_unguarded(&self, off: u64, src: &[u8]) {
        self.check_range(off, src.len() as u64);
        #[cfg(not(loom))]
        // SAFETY: the destination range lies in the mapping (checked above) and cannot overlap
        // `src`, a shared borrow of other memory. The caller guarantees no concurrent access
        // to these heap bytes, so the non-atomic write races with nothing.
        unsafe {
            libc::memcpy(self.data.base().add(off as usize) as *mut libc::c_void, src.as_ptr() as *const libc::c_void, src.len());
        }
        #[cfg(loom)]
        self.write_bytes(off, src);
    }

    /// Appends to `out` the byte ranges of the runs of pages in `pages` whose dirty epoch is
    /// above `since` (adjacent dirty pages form one run), and returns how many pages that is.
    /// Ranges of at least [`PARALLEL_SCAN_PAGES`] pages are scanned by the worker pool (at most
    /// [`MAX_SCAN_THREADS`] parts): one thread scans a 4 GiB heap's epochs in about 0.9 ms, a
    /// cost a sync or a snapshot pays twice, once under the closed commit gate.
    pub fn dirty_runs(&self, pages: std::ops::Range<u64>, since: u64, out: &mut Vec<std::ops::Range<u64>>) -> u64 {
        let end = pages.end.min(self.pages());
        let count = end.saturating_sub(pages.start);
        if cfg!(loom) || count < PARALLEL_SCAN_PAGES {
            return self.dirty_runs_serial(pages.start..end, since, out);
        }
        let threads = crate::workers::threads().min(MAX_SCAN_THREADS) as u64;
        let per = count.div_ceil(threads);
        let parts: Vec<(Vec<std::ops::Range<u64>>, u64)> = crate::workers::pool().install(|| {
            use rayon::prelude::*;
            (0..threads)
                .into_par_iter()
                .map(|t| {
                    let part = (pages.start + t * per).min(end)..(pages.start + (t + 1) * per).min(end);
                    let mut runs = Vec::new();
                    let dirty = self.dirty_runs_serial(part, since, &mut runs);
                    (runs, dirty)
                })
                .collect()
        });
        let mut dirty = 0;
        for (runs, n) in parts {
            dirty += n;
            for run in runs {
                // A run cut at a part's edge joins its other half.
                match out.last_mut() {
                    Some(last) if last.end == run.start => last.end = run.end,
                    _ => out.push(run),
                }
            }
        }
        dirty
    }

    fn dirty_runs_serial(&self, pages: std::ops::Range<u64>, since: u64, out: &mut Vec<std::ops::Range<u64>>) -> u64 {
        let end = pages.end.min(self.pages());
        let mut dirty = 0;
        let mut page = pages.start;
        while page < end {
            if self.page_epoch(page) <= since {
                page += 1;
                continue;
            }
            let first = page;
            while page < end && self.page_epoch(page) > since {
                page += 1;
            }
            dirty += page - first;
            out.push(first * PAGE_SIZE..page * PAGE_SIZE);
        }
        dirty
    }

    /// Writes `data` at `off` (single writer per word assumed, see [`Heap::store_word_masked`]).
    pub fn write_bytes(&self, off: u64, data: &[u8]) {
        self.write_bytes_with(off, data, |at| self.word(at))
    }

    /// [`Heap::write_bytes`] through `word` (guarded or not).
    fn write_bytes_with<'w>(&'w self, off: u64, data: &[u8], word: impl Fn(u64) -> &'w AtomicU64) {
        self.check_range(off, data.len() as u64);
        let mut pos = 0usize;
        while pos < data.len() {
            let at = off + pos as u64;
            let word_off = at & !7;
            let skip = (at - word_off) as usize;
            let take = (8 - skip).min(data.len() - pos);
            let mut bytes = [0u8; 8];
            bytes[skip..skip + take].copy_from_slice(&data[pos..pos + take]);
            let mask = (((1u16 << take) - 1) << skip) as u8;
            merge_masked(word(word_off), u64::from_le_bytes(bytes), mask);
            pos += take;
        }
    }

    fn check_range(&self, off: u64, len: u64) {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.capacity), "heap range {off}+{len} out of range");
    }

    /// Whether `[off, off+len)` lies inside the heap.
    pub fn contains(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.capacity)
    }

    /// Hints the CPU to bring the line holding heap offset `off` into cache.
    #[inline]
    pub fn prefetch(&self, off: u64) {
        #[cfg(not(loom))]
        if off < self.capacity {
            crate::region::prefetch_ptr(self.data.base().wrapping_add(off as usize));
        }
        #[cfg(loom)]
        let _ = off;
    }

    /// [`Heap::prefetch`] for every line of `[off, off+len)` inside the heap.
    #[inline]
    pub fn prefetch_range(&self, off: u64, len: u64) {
        let end = off.saturating_add(len).min(self.capacity);
        let mut line = off & !63;
        while line < end {
            self.prefetch(line);
            line += 64;
        }
    }

    /// Bytes of `[off, off+len)` (whole pages) backed by memory now (mincore): what was
    /// touched or populated. 0 where the kernel cannot tell.
    pub fn resident_bytes(&self, off: u64, len: u64) -> u64 {
        self.check_range(off, len);
        let start = off / PAGE_SIZE * PAGE_SIZE;
        let end = (off + len).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let mut pages = vec![0u8; ((end - start) / PAGE_SIZE) as usize];
        #[cfg(not(loom))]
        {
            // SAFETY: the range lies inside our mapping (checked above, rounded to pages
            // within it) and `pages` holds one byte per page of it.
            let done = unsafe { libc::mincore(self.data.base().add(start as usize) as *mut libc::c_void, (end - start) as usize, pages.as_mut_ptr()) };
            if done != 0 {
                return 0;
            }
        }
        pages.iter().filter(|&&p| p & 1 == 1).count() as u64 * PAGE_SIZE
    }

    /// Backs `[off, off+len)` with memory now (MADV_POPULATE_WRITE), so that first touches
    /// inside a measurement do not page-fault. Falls back to doing nothing where the kernel
    /// lacks the advice (pages are then populated on first write, as usual).
    pub fn prefault(&self, off: u64, len: u64) {
        self.check_range(off, len);
        let start = off / PAGE_SIZE * PAGE_SIZE;
        let end = (off + len).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        #[cfg(not(loom))]
        // SAFETY: the range lies inside our mapping (checked above, rounded to pages within
        // it); populating does not change contents.
        unsafe {
            libc::madvise(self.data.base().add(start as usize) as *mut libc::c_void, (end - start) as usize, MADV_POPULATE_WRITE);
        }
        #[cfg(loom)]
        let _ = (start, end, MADV_POPULATE_WRITE);
    }

    /// Hints the CPU to fetch the dirty-epoch word of the page holding `off` (a commit stamps
    /// it after its locks and validation).
    #[inline]
    pub fn prefetch_dirty_stamp(&self, off: u64) {
        self.epochs.prefetch(off / PAGE_SIZE);
    }

    /// Stamps every page overlapping `[off, off+len)` with `epoch` (commit write-back).
    #[inline]
    pub fn stamp_dirty(&self, off: u64, len: u64, epoch: u64) {
        if len == 0 {
            return;
        }
        let first = off / PAGE_SIZE;
        let last = (off + len - 1) / PAGE_SIZE;
        for page in first..=last {
            let slot = self.epoch_slot(page);
            // Skip the store when unchanged: keeps the line shared between cores.
            if slot.load(Ordering::Relaxed) < epoch {
                slot.fetch_max(epoch, Ordering::Relaxed);
            }
        }
    }

    /// The dirty epoch of page `page`.
    pub fn page_epoch(&self, page: u64) -> u64 {
        self.epoch_slot(page).load(Ordering::Relaxed)
    }

    /// Number of dirty-tracking pages.
    pub fn pages(&self) -> u64 {
        self.capacity / PAGE_SIZE
    }
}

/// Stores the bytes of `value` that `mask` selects into `slot`, keeping the others (one
/// writer per word, see [`Heap::store_word_masked`]).
#[inline]
fn merge_masked(slot: &AtomicU64, value: u64, mask: u8) {
    let bits = mask_bits(mask);
    let old = slot.load(Ordering::Relaxed);
    slot.store((old & !bits) | (value & bits), Ordering::Relaxed);
}

/// [`mask_bits`] of every byte mask. A transaction's reads overlay its buffered writes word
/// by word through this; the loop it replaces, a branch per byte, was most of the time of
/// the descents of an 8-thread B-link load on the 16-core device host.
const MASK_BITS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut mask = 0;
    while mask < 256 {
        let mut i = 0;
        while i < 8 {
            if mask & (1 << i) != 0 {
                table[mask] |= 0xFF << (8 * i);
            }
            i += 1;
        }
        mask += 1;
    }
    table
};

/// The u64 bit mask selecting the bytes named by `mask`.
#[inline]
pub fn mask_bits(mask: u8) -> u64 {
    MASK_BITS[mask as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_selects_the_named_bytes() {
        for mask in 0..=255u8 {
            let bytes = mask_bits(mask).to_le_bytes();
            for (i, byte) in bytes.iter().enumerate() {
                assert_eq!(*byte, if mask & (1 << i) != 0 { 0xFF } else { 0 }, "mask {mask:#010b}, byte {i}");
            }
        }
    }

    #[test]
    fn bytes_round_trip_across_word_boundaries() {
        let heap = Heap::new(1 << 20).unwrap();
        let data: Vec<u8> = (0..37u8).collect();
        heap.write_bytes(5, &data);
        let mut back = vec![0u8; 37];
        heap.read_bytes(5, &mut back);
        assert_eq!(back, data);
        let mut around = [0u8; 5];
        heap.read_bytes(0, &mut around);
        assert_eq!(around, [0; 5], "bytes before the write stay zero");
        heap.read_bytes(42, &mut around);
        assert_eq!(around, [0; 5], "bytes after the write stay zero");
    }

    #[test]
    fn masked_store_keeps_unselected_bytes() {
        let heap = Heap::new(PAGE_SIZE).unwrap();
        heap.store_word(8, u64::MAX);
        heap.store_word_masked(8, 0, 0b0000_0110);
        assert_eq!(heap.load_word(8), 0xFFFF_FFFF_FF00_00FF);
    }

    #[test]
    fn dirty_epochs_cover_every_touched_page() {
        let heap = Heap::new(16 * PAGE_SIZE).unwrap();
        heap.stamp_dirty(PAGE_SIZE - 1, 2, 7);
        assert_eq!(heap.page_epoch(0), 7);
        assert_eq!(heap.page_epoch(1), 7);
        assert_eq!(heap.page_epoch(2), 0);
        heap.stamp_dirty(PAGE_SIZE, 1, 3);
        assert_eq!(heap.page_epoch(1), 7, "epochs never go back");
    }

    #[test]
    fn dirty_runs_join_adjacent_pages() {
        let heap = Heap::new(16 * PAGE_SIZE).unwrap();
        for page in [1, 2, 3, 7, 15] {
            heap.stamp_dirty(page * PAGE_SIZE, 8, 5);
        }
        heap.stamp_dirty(9 * PAGE_SIZE, 8, 2);
        let mut runs = Vec::new();
        assert_eq!(heap.dirty_runs(0..16, 4, &mut runs), 5);
        let pages: Vec<(u64, u64)> = runs.iter().map(|r| (r.start / PAGE_SIZE, r.end / PAGE_SIZE)).collect();
        assert_eq!(pages, [(1, 4), (7, 8), (15, 16)]);
        runs.clear();
        assert_eq!(heap.dirty_runs(2..10, 1, &mut runs), 4, "the range and the epoch both bound the scan");
        runs.clear();
        assert_eq!(heap.dirty_runs(0..100, 0, &mut runs), 6, "an end past the heap stops at its last page");
    }

    /// Scans long enough to run on several threads find exactly the serial scan's runs, with
    /// runs that cross the threads' part edges joined.
    #[test]
    fn parallel_dirty_scans_equal_the_serial_scan() {
        let pages = 3 * PARALLEL_SCAN_PAGES + 5;
        let heap = Heap::new(pages * PAGE_SIZE).unwrap();
        let mut x = 7u64;
        for _ in 0..5000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            heap.stamp_dirty((x >> 20) % pages * PAGE_SIZE, 8, 1 + (x >> 60) % 3);
        }
        // Long runs over every possible part edge, for any thread count up to 16.
        for t in 1..=16u64 {
            let edge = pages * t / 16;
            heap.stamp_dirty(edge.saturating_sub(3).min(pages - 6) * PAGE_SIZE, 6 * PAGE_SIZE, 3);
        }
        heap.stamp_dirty(0, PAGE_SIZE, 3);
        heap.stamp_dirty((pages - 1) * PAGE_SIZE, 8, 3);
        for since in [0, 1, 2] {
            for range in [0..pages, 17..pages - 9, 0..pages + 100] {
                let (mut fast, mut slow) = (Vec::new(), Vec::new());
                let n = heap.dirty_runs(range.clone(), since, &mut fast);
                assert_eq!(n, heap.dirty_runs_serial(range.clone(), since, &mut slow), "pages since {since} in {range:?}");
                assert_eq!(fast, slow, "runs since {since} in {range:?}");
            }
        }
    }

    /// Times a scan of a 4 GiB heap's epochs with 1% of its pages dirty, on several threads
    /// and on one (run on a many-core host: `--ignored --nocapture scan_timing`).
    #[test]
    #[ignore = "a timing, not a check: run it where the cores are"]
    fn scan_timing() {
        let pages = 1u64 << 20;
        let heap = Heap::new(pages * PAGE_SIZE).unwrap();
        let mut x = 7u64;
        for _ in 0..pages / 100 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            heap.stamp_dirty((x >> 20) % pages * PAGE_SIZE, 8, 2);
        }
        let time = |f: &dyn Fn() -> u64| {
            let mut ms: Vec<f64> = (0..7)
                .map(|_| {
                    let t = std::time::Instant::now();
                    std::hint::black_box(f());
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            ms.sort_by(f64::total_cmp);
            ms[3]
        };
        let parallel = time(&|| heap.dirty_runs(0..pages, 1, &mut Vec::new()));
        let serial = time(&|| heap.dirty_runs_serial(0..pages, 1, &mut Vec::new()));
        let spawn = time(&|| std::thread::scope(|s| (0..16).map(|_| s.spawn(|| 1u64)).map(|h| h.join().unwrap()).sum()));
        eprintln!("scan of {pages} pages: {parallel:.3} ms on {} workers, {serial:.3} ms on one thread; 16 spawns and joins {spawn:.3} ms", crate::workers::threads().min(MAX_SCAN_THREADS));
    }

    #[test]
    fn copy_out_equals_read_bytes() {
        let heap = Heap::new(4 * PAGE_SIZE).unwrap();
        for i in 0..(4 * PAGE_SIZE / 8) {
            heap.store_word(i * 8, i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        let (mut fast, mut slow) = (vec![0u8; 9000], vec![0u8; 9000]);
        heap.copy_out(13, &mut fast);
        heap.read_bytes(13, &mut slow);
        assert_eq!(fast, slow);
    }

    /// The streaming copy equals the plain one, aligned (non-temporal moves) or not (the plain
    /// copy it falls back to).
    #[test]
    fn copy_out_streaming_equals_copy_out() {
        let heap = Heap::new(4 * PAGE_SIZE).unwrap();
        for i in 0..(4 * PAGE_SIZE / 8) {
            heap.store_word(i * 8, i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        let mut backing = vec![0u8; 3 * PAGE_SIZE as usize + 64];
        let lead = backing.as_ptr().align_offset(64);
        let bytes = &mut backing[lead..];
        for (off, len) in [(PAGE_SIZE, 2 * PAGE_SIZE as usize), (64, 640), (13, 900), (128, 100)] {
            let mut plain = vec![0u8; len];
            heap.copy_out(off, &mut plain);
            let dst = &mut bytes[..len];
            dst.fill(0xEE);
            heap.copy_out_streaming(off, dst);
            crate::region::streaming_fence();
            assert!(dst == plain.as_slice(), "{len} bytes at {off}");
        }
    }

    #[test]
    fn copy_in_equals_write_bytes() {
        let (fast, slow) = (Heap::new(4 * PAGE_SIZE).unwrap(), Heap::new(4 * PAGE_SIZE).unwrap());
        let src: Vec<u8> = (0..9000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        fast.copy_in(13, &src);
        slow.write_bytes(13, &src);
        let (mut a, mut b) = (vec![0u8; 4 * PAGE_SIZE as usize], vec![0u8; 4 * PAGE_SIZE as usize]);
        fast.read_bytes(0, &mut a);
        slow.read_bytes(0, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn huge_reservation_is_lazy() {
        let heap = Heap::new(64 << 30).unwrap();
        heap.store_word((64 << 30) - 8, 1);
        assert_eq!(heap.load_word((64 << 30) - 8), 1);
    }
}

/// Loom models of the heap's own atomics (run by .ci/loom; the commit protocol that uses
/// them is modelled in tusk-txn).
#[cfg(all(test, loom))]
mod loom_models {
    use std::sync::Arc;

    use loom::thread;

    use super::*;

    /// Concurrent write-backs stamping one page with different epochs leave the larger one
    /// (the skip-if-unchanged load never loses a stamp), and masked stores to different words
    /// of a page do not disturb each other.
    #[test]
    fn loom_dirty_stamps_keep_the_newest_epoch() {
        loom::model(|| {
            let heap = Arc::new(Heap::new(PAGE_SIZE).unwrap());
            let old = {
                let heap = heap.clone();
                thread::spawn(move || {
                    heap.store_word_masked(8, 0xAA, 0x01);
                    heap.stamp_dirty(8, 8, 5);
                })
            };
            heap.store_word_masked(16, 0xBB00, 0x02);
            heap.stamp_dirty(16, 8, 7);
            old.join().unwrap();
            assert_eq!(heap.page_epoch(0), 7);
            assert_eq!(heap.load_word(8), 0xAA);
            assert_eq!(heap.load_word(16), 0xBB00);
        });
    }
}
