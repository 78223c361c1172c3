//! The transactional allocator. Its metadata (free-list heads, carve cursors, brk, block
//! headers) is heap memory written through the transaction, so allocation is logged,
//! checkpointed and recovered like any other write, and an aborted transaction allocates
//! nothing.
//!
//! Small blocks (16 B .. 2 KiB, powers of two) are carved from pages of one class; a block is
//! `[header][user bytes]`. Large allocations take whole pages: `[exact length][header][user
//! bytes]`. Freed blocks go to a free list per class; freed large runs to one first-fit list
//! (the tail of a larger run is split off). Memory handed out is zeroed: reused blocks are
//! cleared, never-used memory is zero already.
//!
//! Large runs that no free run serves come from the thread's arena (`layout.rs`), which takes
//! pages from brk [`arena_step`] at a time. Threads that allocate at once (index slab chunks,
//! in large transactions especially) thus write their own arena's line rather than brk, which
//! a transaction running in place would hold until it ends. The free list is peeked before it
//! is read: while it is empty, as it mostly is, its head joins no read set either. An arena's
//! unused tail goes to the free list when the arena takes its next step.
//!
//! An arena also keeps a reserve: the next step, taken from brk ahead of need by a transaction
//! running in place that took from the arena, as its last writes at its commit
//! (`Transaction::fill_reserve_at_commit`), where it holds brk only for the commit's
//! encoding; a buffered one that took from it does the same just before its commit, while
//! brk's stripe is not locked (`Transaction::fill_reserve_before_commit`), so that brk is in
//! its read set only from then to its validation. A transaction that uses up its arena moves on to the reserve, in its own line, so
//! a large one seldom reads brk while it runs (it did in a third of the conflicts between runs
//! in place side by side, each holding brk to its end).

use tusk_storage::layout::*;
use tusk_storage::{HeapPtr, PAGE_SIZE};

use crate::transaction::Transaction;
use crate::TxnError;

/// Size class for a small allocation of `len` user bytes, if it fits one.
fn small_class(len: u64) -> Option<usize> {
    // checked: a length within 8 of u64::MAX must not wrap around into the smallest class.
    let need = len.checked_add(HEADER_SIZE)?.max(SMALL_MIN_BLOCK);
    (need <= SMALL_MAX_BLOCK).then(|| (need.next_power_of_two() / SMALL_MIN_BLOCK).trailing_zeros() as usize)
}

fn block_size(class: usize) -> u64 {
    SMALL_MIN_BLOCK << class
}

/// Bytes an arena takes from brk at a time, for a heap of `capacity` bytes: 1/256 of it, at
/// most 64 MiB (whole pages; a step is never less than the request it serves). So a heap's
/// extent below brk runs ahead of what is allocated by at most two steps per arena in use (the
/// arena's rest and its reserve).
pub fn arena_step(capacity: u64) -> u64 {
    (capacity / 256).min(64 << 20) / PAGE_SIZE * PAGE_SIZE
}

/// A step for requests of `bytes`: a whole number of them (a slab's chunks leave no tail).
fn step_for(capacity: u64, bytes: u64) -> u64 {
    (arena_step(capacity) / bytes).max(1) * bytes
}

/// An arena's line: its free range `next..end` and its reserve `reserve..reserve_end`
/// (see `layout.rs`), as read by [`Transaction::arena`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Arena {
    next: u64,
    end: u64,
    reserve: u64,
    reserve_end: u64,
}

impl Arena {
    fn words(self) -> [u64; ARENA_WORDS] {
        [self.next, self.end, self.reserve, self.reserve_end]
    }

    fn rest(self) -> u64 {
        self.end - self.next
    }

    fn reserve_len(self) -> u64 {
        self.reserve_end - self.reserve
    }
}

impl Transaction<'_> {
    /// Allocates `len` zeroed bytes.
    pub fn alloc(&mut self, len: u64) -> Result<HeapPtr, TxnError> {
        match small_class(len) {
            Some(c) => self.alloc_small(c, len),
            None => self.alloc_large(len),
        }
    }

    fn exhausted<T>(&self, requested: u64) -> Result<T, TxnError> {
        Err(TxnError::HeapExhausted { requested, capacity: self.engine().heap().capacity() })
    }

    /// Moves brk up by `bytes`; returns the old brk.
    fn take_from_brk(&mut self, bytes: u64, requested: u64) -> Result<u64, TxnError> {
        let brk = self.load(BRK_OFF)?;
        let capacity = self.engine().heap().capacity();
        match brk.checked_add(bytes) {
            Some(end) if end <= capacity => {
                self.store(BRK_OFF, end)?;
                debug_assert!(brk.is_multiple_of(PAGE_SIZE) && bytes.is_multiple_of(PAGE_SIZE), "brk moves by whole pages");
                self.note_fresh(brk, end);
                self.engine().growth().taken(end);
                Ok(brk)
            }
            _ => self.exhausted(requested),
        }
    }

    fn zero(&mut self, from: u64, to: u64) -> Result<(), TxnError> {
        let mut off = from;
        while off < to {
            self.store(off, 0)?;
            off += 8;
        }
        Ok(())
    }

    fn alloc_small(&mut self, c: usize, len: u64) -> Result<HeapPtr, TxnError> {
        let size = block_size(c);
        let head = self.load(small_free_head_off(c))?;
        let block = if head != 0 {
            let next = self.load(head + HEADER_SIZE)?;
            self.store(small_free_head_off(c), next)?;
            self.zero(head + HEADER_SIZE, head + size)?;
            head
        } else {
            let cursor = self.load(small_cursor_off(c))?;
            let block = if cursor != 0 { cursor } else { self.take_from_brk(PAGE_SIZE, len)? };
            let next = block + size;
            self.store(small_cursor_off(c), if next.is_multiple_of(PAGE_SIZE) { 0 } else { next })?;
            block
        };
        let header = BlockHeader { class: c as u8, state: STATE_ALLOCATED, len: len as u32 };
        self.store(block, header.encode())?;
        Ok(HeapPtr(block + HEADER_SIZE))
    }

    fn alloc_large(&mut self, len: u64) -> Result<HeapPtr, TxnError> {
        let Some(pages) = len.checked_add(2 * HEADER_SIZE).map(|n| n.div_ceil(PAGE_SIZE)) else {
            return self.exhausted(len);
        };
        if pages > u32::MAX as u64 {
            return self.exhausted(len);
        }
        let run = match self.take_free_run(pages)? {
            Some(run) => {
                self.zero(run + 2 * HEADER_SIZE, run + pages * PAGE_SIZE)?;
                run
            }
            None => self.take_from_arena(pages * PAGE_SIZE, len)?,
        };
        self.store(run, len)?;
        let header = BlockHeader { class: CLASS_LARGE, state: STATE_ALLOCATED, len: pages as u32 };
        self.store(run + HEADER_SIZE, header.encode())?;
        Ok(HeapPtr(run + 2 * HEADER_SIZE))
    }

    /// `bytes` (whole pages) from the calling thread's arena (or its reserve), which takes its
    /// next step from brk when both have too few left, or, where brk cannot give a whole step,
    /// straight from brk, and once brk has no room at all, from another arena. A step is a
    /// whole number of such requests (a slab's chunks leave no tail), and an arena that ends at
    /// brk grows in place; any other tail goes to the free list.
    fn take_from_arena(&mut self, bytes: u64, requested: u64) -> Result<u64, TxnError> {
        let a = self.engine().thread_slot() as u64 % ARENAS;
        self.arena_request = bytes;
        if let Some(p) = self.carve_arena(a, bytes)? {
            return Ok(p);
        }
        let arena = self.arena(a)?;
        let step = step_for(self.engine().heap().capacity(), bytes);
        let brk = self.load(BRK_OFF)?;
        if brk.checked_add(step).is_none_or(|e| e > self.engine().heap().capacity()) {
            return match self.take_from_brk(bytes, requested) {
                Err(TxnError::HeapExhausted { .. }) => self.take_from_other_arenas(a, bytes, requested),
                taken => taken,
            };
        }
        let region = self.take_from_brk(step, requested)?;
        let next = if arena.next != 0 && arena.end == region {
            arena.next
        } else {
            if arena.next < arena.end {
                self.free_pages(arena.next, arena.rest() / PAGE_SIZE)?;
            }
            region
        };
        self.set_arena(a, Arena { next: next + bytes, end: region + step, ..arena })?;
        self.note_fresh(next, next + bytes);
        Ok(next)
    }

    /// Arena `a`'s line: each of its ranges empty (zeros) where its words make no sense
    /// (`next` past `end` or below the data: a `Partition` record applied beyond a gap may carry
    /// a take whose step was lost; README, Guarantees).
    pub(crate) fn arena(&mut self, a: u64) -> Result<Arena, TxnError> {
        let mut words = [0u64; ARENA_WORDS];
        self.load_words(arena_off(a), &mut words)?;
        let range = |from: u64, to: u64| if from >= DATA_START && from <= to { (from, to) } else { (0, 0) };
        let ((next, end), (reserve, reserve_end)) = (range(words[0], words[1]), range(words[2], words[3]));
        Ok(Arena { next, end, reserve, reserve_end })
    }

    /// Writes arena `a`'s whole line, so that the redo record of every change carries the
    /// arena's whole state.
    fn set_arena(&mut self, a: u64, arena: Arena) -> Result<(), TxnError> {
        self.store_words(arena_off(a), &arena.words())
    }

    /// `bytes` from arena `a`'s free range, or else from its reserve (the free range's tail
    /// going to the free list), if either holds them.
    fn carve_arena(&mut self, a: u64, bytes: u64) -> Result<Option<u64>, TxnError> {
        let arena = self.arena(a)?;
        let from = if arena.next != 0 && bytes <= arena.rest() {
            self.set_arena(a, Arena { next: arena.next + bytes, ..arena })?;
            arena.next
        } else if arena.reserve != 0 && bytes <= arena.reserve_len() {
            if arena.next < arena.end {
                self.free_pages(arena.next, arena.rest() / PAGE_SIZE)?;
            }
            self.set_arena(a, Arena { next: arena.reserve + bytes, end: arena.reserve_end, reserve: 0, reserve_end: 0 })?;
            arena.reserve
        } else {
            return Ok(None);
        };
        self.note_fresh(from, from + bytes);
        Ok(Some(from))
    }

    /// At the commit of a run in place that took requests of `bytes` from its thread's arena:
    /// fills the arena's reserve (see the module docs), if brk's line can be had at once (the
    /// fill is worth no wait and no conflict) and the run's record has room for two more lines.
    pub(crate) fn fill_reserve_at_commit(&mut self) -> Result<(), TxnError> {
        let bytes = self.arena_request;
        if bytes == 0 || !self.in_place_room_for(2) || !self.hold_at_once(BRK_OFF) {
            return Ok(());
        }
        let a = self.engine().thread_slot() as u64 % ARENAS;
        self.fill_reserve(a, bytes).map(|_| ())
    }

    /// Before the commit of a buffered transaction that took requests of `bytes` from its
    /// thread's arena: fills the arena's reserve as a run in place does at its commit, if
    /// brk's stripe is not locked now. Otherwise a thread whose large transactions commit
    /// buffered (while a retry runs in place, first attempts buffer) leaves its arena empty,
    /// and its next one reads brk while it runs, which other threads' steps move before it
    /// commits: most of the conflicts of buffered 100 k-key attempts on the 16-core host. Read
    /// here, brk is validated a moment later with the rest. Only where the fill's two lines fit
    /// below the size at which a transaction changes to in-place mode (and below what a record
    /// holds): a commit past its in-place check must not change mode.
    pub(crate) fn fill_reserve_before_commit(&mut self) -> Result<(), TxnError> {
        let bytes = self.arena_request;
        let stripes = &self.engine().stripes;
        let brk_locked = crate::stripes::is_locked(stripes.load(stripes.index_of(BRK_OFF)));
        if bytes == 0 || brk_locked || !self.buffered_room_for(2) {
            return Ok(());
        }
        let a = self.engine().thread_slot() as u64 % ARENAS;
        self.fill_reserve(a, bytes).map(|_| ())
    }

    /// Fills arena `a`'s reserve with a step for requests of `bytes` taken from brk (or grows
    /// the arena by it where the arena ends at brk), if the reserve is empty, the arena's range
    /// holds less than a step, brk has room, and a step holds at least two such requests.
    /// Returns whether it did.
    fn fill_reserve(&mut self, a: u64, bytes: u64) -> Result<bool, TxnError> {
        let capacity = self.engine().heap().capacity();
        // A request of half a step or more is rare enough (a step holds one at most) that
        // taking another ahead would only leave a heap's extent that much further ahead.
        if bytes > arena_step(capacity) / 2 {
            return Ok(false);
        }
        let arena = self.arena(a)?;
        let step = step_for(capacity, bytes);
        // With a step's worth left, the range serves the next large transaction by itself (and
        // an arena that grows in place has no reserve: without this, each commit would grow it
        // again). Asked before brk is read: a fill not needed reads no brk, so it cannot lose
        // to another thread's step.
        if arena.reserve != 0 || arena.rest() >= step {
            return Ok(false);
        }
        let brk = self.load(BRK_OFF)?;
        if brk.checked_add(step).is_none_or(|e| e > capacity) {
            return Ok(false);
        }
        let region = self.take_from_brk(step, step)?;
        let arena = if arena.next != 0 && arena.end == region {
            Arena { end: region + step, ..arena }
        } else {
            Arena { reserve: region, reserve_end: region + step, ..arena }
        };
        self.set_arena(a, arena)?;
        Ok(true)
    }

    /// With brk at the capacity: `bytes` from the first other arena whose range or reserve
    /// holds them (reading their lines, which only a heap this full makes worth it), else
    /// exhausted.
    fn take_from_other_arenas(&mut self, mine: u64, bytes: u64, requested: u64) -> Result<u64, TxnError> {
        for a in (0..ARENAS).filter(|&a| a != mine) {
            if let Some(p) = self.carve_arena(a, bytes)? {
                return Ok(p);
            }
        }
        self.exhausted(requested)
    }

    /// Notes `[from, to)`, never handed out before, as taken by this transaction (zero, so a
    /// run in place keeps no before-image of it): the ranges taken are contiguous within a
    /// brk step, and a later range elsewhere replaces the one noted.
    fn note_fresh(&mut self, from: u64, to: u64) {
        self.fresh = if self.fresh.1 == from && self.fresh.0 != self.fresh.1 { (self.fresh.0, to) } else { (from, to) };
    }

    /// Puts the `pages` pages at `run` on the free list of large runs.
    fn free_pages(&mut self, run: u64, pages: u64) -> Result<(), TxnError> {
        let freed = BlockHeader { class: CLASS_LARGE, state: STATE_FREE, len: pages as u32 };
        self.store(run + HEADER_SIZE, freed.encode())?;
        let head = self.load(LARGE_FREE_HEAD_OFF)?;
        self.store(run + 2 * HEADER_SIZE, head)?;
        self.store(LARGE_FREE_HEAD_OFF, run)
    }

    /// First fit over the free runs: an exact run is unlinked, a larger one gives its tail.
    fn take_free_run(&mut self, pages: u64) -> Result<Option<u64>, TxnError> {
        let mut link = LARGE_FREE_HEAD_OFF;
        let mut peeked = [0u64];
        if self.peek_words(link, &mut peeked) && peeked[0] == 0 {
            return Ok(None);
        }
        let mut run = self.load(link)?;
        while run != 0 {
            let header = BlockHeader::decode(self.load(run + HEADER_SIZE)?).ok_or(TxnError::InvalidPointer(run))?;
            let have = header.len as u64;
            let next = self.load(run + 2 * HEADER_SIZE)?;
            if have == pages {
                self.store(link, next)?;
                return Ok(Some(run));
            }
            if have > pages {
                let keep = have - pages;
                let shrunk = BlockHeader { class: CLASS_LARGE, state: STATE_FREE, len: keep as u32 };
                self.store(run + HEADER_SIZE, shrunk.encode())?;
                return Ok(Some(run + keep * PAGE_SIZE));
            }
            link = run + 2 * HEADER_SIZE;
            run = next;
        }
        Ok(None)
    }

    /// Frees the allocation at `p`.
    pub fn free(&mut self, p: HeapPtr) -> Result<(), TxnError> {
        let ptr = p.offset();
        if !ptr.is_multiple_of(8) || ptr < DATA_START + HEADER_SIZE || !self.engine().heap().contains(ptr, 0) {
            return Err(TxnError::InvalidPointer(ptr));
        }
        let header = BlockHeader::decode(self.load(ptr - HEADER_SIZE)?).ok_or(TxnError::InvalidPointer(ptr))?;
        if header.state == STATE_FREE {
            return Err(TxnError::DoubleFree(ptr));
        }
        self.forget_bounds(p);
        if header.class == CLASS_LARGE {
            self.free_pages(ptr - 2 * HEADER_SIZE, header.len as u64)?;
        } else {
            let c = header.class as usize;
            let block = ptr - HEADER_SIZE;
            let freed = BlockHeader { class: header.class, state: STATE_FREE, len: 0 };
            self.store(block, freed.encode())?;
            let head = self.load(small_free_head_off(c))?;
            self.store(block + HEADER_SIZE, head)?;
            self.store(small_free_head_off(c), block)?;
        }
        Ok(())
    }

    /// Writes a fresh heap's superblock (the first transaction of every store).
    pub fn format_heap(&mut self) -> Result<(), TxnError> {
        self.store(MAGIC_OFF, MAGIC)?;
        self.store(VERSION_OFF, FORMAT_VERSION)?;
        self.store(CAPACITY_OFF, self.engine().heap().capacity())?;
        self.store(BRK_OFF, DATA_START)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::in_place::IN_PLACE_FROM;
    use crate::{Commit, Engine, EngineConfig};
    use tusk_storage::Heap;

    fn engine(heap: u64) -> Engine {
        let config = EngineConfig { stripes_log2: 20, log: None, existing_segments: Vec::new() };
        let engine = Engine::start(config, Heap::new(heap).unwrap(), 0).unwrap();
        {
            let mut tx = engine.begin();
            tx.format_heap().unwrap();
            tx.commit(Commit::Async).unwrap();
        }
        engine
    }

    /// Allocates `len` bytes in a transaction of its own; returns the offset.
    fn alloc_one(engine: &Engine, len: u64) -> u64 {
        let mut tx = engine.begin();
        let p = tx.alloc(len).unwrap().offset();
        tx.commit(Commit::Async).unwrap();
        p
    }

    /// A heap whose brk reached the capacity still serves large allocations from other
    /// threads' arena tails before it reports itself exhausted: the tails are not lost.
    #[test]
    fn a_full_heap_hands_out_the_other_arenas_tails() {
        const LARGE: u64 = 64 << 10;
        let engine = engine(64 << 20);
        // Another thread takes one block; its arena keeps the rest of its step.
        let theirs = std::thread::scope(|s| {
            s.spawn(|| {
                alloc_one(&engine, LARGE);
                engine.thread_slot() as u64 % ARENAS
            })
            .join()
            .unwrap()
        });
        let tail = |engine: &Engine| engine.heap().load_word(arena_off(theirs) + 8) - engine.heap().load_word(arena_off(theirs));
        assert!(tail(&engine) >= 2 * LARGE, "a step of several blocks");
        loop {
            let mut tx = engine.begin();
            match tx.alloc(LARGE) {
                Ok(_) => tx.commit(Commit::Async).map(|_| ()).unwrap(),
                Err(TxnError::HeapExhausted { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(tail(&engine) < LARGE + 2 * HEADER_SIZE, "{} bytes left in the other arena", tail(&engine));
    }

    /// A thread's large allocations come from its own arena: beside another thread's run in
    /// place, which allocated and holds every line it touched until it ends, a transaction
    /// allocating a large block commits at its first attempt (they share no allocator line),
    /// and the blocks do not overlap.
    #[test]
    fn large_allocations_beside_a_run_in_place_do_not_conflict() {
        const LARGE: u64 = 64 << 10;
        let engine = engine(64 << 20);
        let lines = IN_PLACE_FROM as u64 + 8;
        let area = alloc_one(&engine, lines * 64);
        alloc_one(&engine, LARGE);
        let (opened, commit) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            let other = s.spawn(|| {
                // The other thread's arena gets its first step before the run starts.
                let before = alloc_one(&engine, LARGE);
                opened.wait();
                let mut tx = engine.begin();
                let attempt = tx.alloc(LARGE).and_then(|p| {
                    tx.store(p.offset(), 7)?;
                    tx.commit(Commit::Async)?;
                    Ok(p.offset())
                });
                commit.wait();
                (before, attempt)
            });
            let mut run = engine.begin();
            for i in 0..lines {
                run.store(area + 64 * i, i).unwrap();
            }
            assert!(run.is_in_place());
            let mine = run.alloc(LARGE).unwrap().offset();
            run.store(mine, 9).unwrap();
            opened.wait();
            commit.wait();
            run.commit(Commit::Async).unwrap();
            let (before, attempt) = other.join().unwrap();
            let theirs = attempt.expect("the allocation beside the run commits at once");
            for (a, b) in [(mine, theirs), (mine, before), (theirs, before)] {
                assert!(a.abs_diff(b) >= LARGE, "blocks at {a} and {b} overlap");
            }
        });
        let mut tx = engine.begin();
        assert_eq!(tx.load(area + 64 * 5).unwrap(), 5);
    }

    /// A run in place that took from its arena fills the arena's reserve at its commit. The
    /// next run that uses up its arena's range moves on to the reserve and never reads brk,
    /// which it would hold to its end, stopping every other thread's step.
    #[test]
    fn a_run_in_place_moves_to_its_arenas_reserve_without_reading_brk() {
        const LARGE: u64 = 64 << 10;
        let engine = engine(64 << 20);
        let lines = IN_PLACE_FROM as u64 + 8;
        let area = alloc_one(&engine, lines * 64);
        let a = engine.thread_slot() as u64 % ARENAS;
        let word = |i: u64| engine.heap().load_word(arena_off(a) + 8 * i);
        // A large block's request is whole pages, its two header words included.
        let step = step_for(engine.heap().capacity(), (LARGE + 2 * HEADER_SIZE).next_multiple_of(PAGE_SIZE));
        alloc_one(&engine, LARGE);
        assert_eq!(word(2), 0, "an arena ending at brk grows rather than keeping a reserve");
        assert!(word(1) - word(0) >= step, "the buffered commit took the next step ahead");
        // Another thread's step: this arena no longer ends at brk, so the fill below is a
        // reserve rather than the arena growing in place.
        on_another_arena(&engine, || alloc_one(&engine, LARGE));
        let in_place_allocating = |until: &dyn Fn(u64) -> bool| {
            let mut run = engine.begin();
            for i in 0..lines {
                run.store(area + 64 * i, i).unwrap();
            }
            assert!(run.is_in_place());
            let mut took = Vec::new();
            while took.last().is_none_or(|&p| !until(p)) {
                assert!(took.len() < 64, "the run never got where it should");
                let p = run.alloc(LARGE).unwrap().offset();
                run.store(p, 1).unwrap();
                took.push(p);
            }
            (run, took)
        };
        // Down to less than a step left: the commit then takes the next one ahead.
        let (mut run, _) = in_place_allocating(&|_| word(1) - word(0) < step);
        run.commit(Commit::Async).unwrap();
        let (reserve, reserve_end) = (word(2), word(3));
        assert!(reserve != 0 && reserve_end - reserve >= LARGE, "the run's commit filled the reserve");
        let brk = engine.heap().load_word(BRK_OFF);
        let (mut run, took) = in_place_allocating(&|p| (reserve..reserve_end).contains(&p));
        let brk_stripe = engine.stripes.index_of(BRK_OFF);
        assert!(!crate::stripes::is_locked(engine.stripes.load(brk_stripe)), "the run holds brk");
        assert_eq!(engine.heap().load_word(BRK_OFF), brk, "the run took no step from brk");
        assert_eq!(word(2), 0, "the reserve is the run's range now");
        run.commit(Commit::Async).unwrap();
        // The arena now ends at brk: the fill grew it in place rather than filling the reserve.
        assert!(word(2) != 0 || word(1) > reserve_end, "the run's commit took the next step ahead");
        let mut tx = engine.begin();
        for p in took {
            assert_eq!(tx.load(p).unwrap(), 1);
        }
    }

    /// Runs `f` on a new thread whose arena is not the calling thread's (a thread's slot, and
    /// so its arena, comes from a counter: the next thread's differs).
    fn on_another_arena<T: Send>(engine: &Engine, f: impl Fn() -> T + Sync) -> T {
        let mine = engine.thread_slot() as u64 % ARENAS;
        for _ in 0..4 {
            let (theirs, out) = std::thread::scope(|s| s.spawn(|| (engine.thread_slot() as u64 % ARENAS, f())).join().unwrap());
            if theirs != mine {
                return out;
            }
        }
        panic!("four new threads on this thread's arena");
    }

    /// A buffered transaction that took from its arena fills the arena's reserve just before
    /// its commit, so the thread's next one that uses up its range moves on to the reserve and
    /// reads brk only at its own commit: another thread's step from brk while it runs does not
    /// make it conflict.
    #[test]
    fn a_buffered_transaction_moves_to_its_arenas_reserve_without_reading_brk_as_it_runs() {
        const LARGE: u64 = 64 << 10;
        let engine = engine(64 << 20);
        let a = engine.thread_slot() as u64 % ARENAS;
        let word = |i: u64| engine.heap().load_word(arena_off(a) + 8 * i);
        let another_threads_step = || on_another_arena(&engine, || alloc_one(&engine, LARGE));
        alloc_one(&engine, LARGE);
        // This arena no longer ends at brk: its commits fill a reserve rather than grow it.
        another_threads_step();
        let mut commits = 0;
        while word(2) == 0 {
            assert!(commits < 64, "no commit filled the reserve");
            alloc_one(&engine, LARGE);
            commits += 1;
        }
        let (reserve, reserve_end) = (word(2), word(3));
        let mut tx = engine.begin();
        let mut took = Vec::new();
        while took.last().is_none_or(|&p| !(reserve..reserve_end).contains(&p)) {
            assert!(took.len() < 64, "the transaction never reached the reserve");
            let p = tx.alloc(LARGE).unwrap().offset();
            tx.store(p, 3).unwrap();
            took.push(p);
        }
        let brk = engine.heap().load_word(BRK_OFF);
        on_another_arena(&engine, || alloc_one(&engine, 4 * LARGE));
        assert!(engine.heap().load_word(BRK_OFF) > brk, "the other thread moved brk");
        tx.commit(Commit::Async).expect("brk was read only at the commit");
        assert!(word(2) != 0, "the commit filled the reserve again");
        let mut tx = engine.begin();
        for p in took {
            assert_eq!(tx.load(p).unwrap(), 3);
        }
    }

    /// A buffered transaction whose write set is at the size where transactions change to
    /// in-place mode commits buffered, with every write, and leaves the fill its commit would
    /// do: the fill's two lines changed it to in-place mode inside its commit, after the
    /// commit had chosen the buffered path, and the writes were undone though the commit
    /// returned an LSN.
    #[test]
    fn a_fill_at_the_in_place_size_is_left_and_the_commit_keeps_its_writes() {
        const LARGE: u64 = 64 << 10;
        let engine = engine(64 << 20);
        let a = engine.thread_slot() as u64 % ARENAS;
        let step = step_for(engine.heap().capacity(), (LARGE + 2 * HEADER_SIZE).next_multiple_of(PAGE_SIZE));
        let area = alloc_one(&engine, (IN_PLACE_FROM as u64 + 8) * 64);
        alloc_one(&engine, LARGE);
        on_another_arena(&engine, || alloc_one(&engine, LARGE));
        let mut tx = engine.begin();
        let mut took = Vec::new();
        // Down to an arena whose commit would fill it: no reserve, less than a step left.
        loop {
            let arena = tx.arena(a).unwrap();
            if arena.reserve == 0 && arena.rest() < step && !took.is_empty() {
                break;
            }
            assert!(took.len() < 64, "the arena never needed a fill");
            let p = tx.alloc(LARGE).unwrap().offset();
            tx.store(p, 5).unwrap();
            took.push(p);
        }
        let mut i = 0;
        while tx.buffered_lines() < IN_PLACE_FROM {
            tx.store(area + 64 * i, i + 1).unwrap();
            i += 1;
        }
        assert!(!tx.is_in_place() && tx.buffered_lines() == IN_PLACE_FROM);
        tx.commit(Commit::Async).unwrap();
        let mut tx = engine.begin();
        for j in 0..i {
            assert_eq!(tx.load(area + 64 * j).unwrap(), j + 1, "line {j} of the committed transaction");
        }
        for p in took {
            assert_eq!(tx.load(p).unwrap(), 5);
        }
        assert_eq!(tx.arena(a).unwrap().reserve, 0, "the fill was left");
    }

    #[test]
    fn classes_fit_their_lengths() {
        assert_eq!(small_class(0), Some(0));
        assert_eq!(small_class(8), Some(0));
        assert_eq!(small_class(9), Some(1));
        assert_eq!(small_class(2040), Some(7));
        assert_eq!(small_class(2041), None);
        assert_eq!(small_class(u64::MAX), None);
        assert_eq!(small_class(u64::MAX - 7), None);
        for len in 0..2041 {
            let c = small_class(len).unwrap();
            assert!(block_size(c) >= len + HEADER_SIZE);
            assert!(c == 0 || block_size(c - 1) < len + HEADER_SIZE);
        }
    }
}
