//! Anonymous memory regions: reserved with MAP_NORESERVE (zero until touched) and advised
//! to use transparent huge pages, since everything placed in them is accessed at random.

use crate::sync::AtomicU64;

use crate::StorageError;

#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct AnonRegion {
    base: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; users access it atomically.
unsafe impl Send for AnonRegion {}
// SAFETY: see above.
unsafe impl Sync for AnonRegion {}

#[cfg_attr(loom, allow(dead_code))]
impl AnonRegion {
    pub(crate) fn reserve(bytes: u64) -> Result<AnonRegion, StorageError> {
        let len = usize::try_from(bytes.max(1)).map_err(|_| StorageError::Reserve {
            capacity: bytes,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
        // SAFETY: anonymous private mapping; no file, no aliasing; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(StorageError::Reserve { capacity: bytes, source: std::io::Error::last_os_error() });
        }
        // Random access over large regions is dominated by TLB misses with 4 KiB pages; ask
        // for transparent huge pages (a hint, ignored where THP is off).
        // SAFETY: advice on our own mapping; contents are unaffected.
        unsafe {
            libc::madvise(base, len, libc::MADV_HUGEPAGE);
        }
        Ok(AnonRegion { base: base as *mut u8, len })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for AnonRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mapped in `reserve`; no references outlive it.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

/// A fixed array of atomic words in its own lazily touched region.
#[cfg(not(loom))]
pub struct AtomicWords {
    region: AnonRegion,
    len: u64,
}

#[cfg(not(loom))]
impl AtomicWords {
    /// `len` words, all zero.
    pub fn new(len: u64) -> Result<AtomicWords, StorageError> {
        Ok(AtomicWords { region: AnonRegion::reserve(len * 8)?, len })
    }

    #[inline]
    pub fn get(&self, i: u64) -> &AtomicU64 {
        assert!(i < self.len, "word {i} of {}", self.len);
        // SAFETY: in bounds (checked), 8-aligned (mmap is page-aligned), zero memory is a
        // valid AtomicU64, and the mapping lives as long as self.
        unsafe { &*(self.region.base.add(i as usize * 8) as *const AtomicU64) }
    }

    /// Hints the CPU to bring word `i` into cache (no effect on contents).
    #[inline]
    pub fn prefetch(&self, i: u64) {
        if i < self.len {
            prefetch_ptr(self.region.base.wrapping_add(i as usize * 8));
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Under loom the words are loom atomics (which cannot live in raw memory): a boxed slice
/// with the same interface, so the protocols built on it (stripe locks, dirty epochs, heap
/// words) run unchanged in the models.
#[cfg(loom)]
pub struct AtomicWords {
    words: Box<[AtomicU64]>,
}

#[cfg(loom)]
impl AtomicWords {
    pub fn new(len: u64) -> Result<AtomicWords, StorageError> {
        Ok(AtomicWords { words: (0..len).map(|_| AtomicU64::new(0)).collect() })
    }

    #[inline]
    pub fn get(&self, i: u64) -> &AtomicU64 {
        assert!(i < self.len(), "word {i} of {}", self.len());
        &self.words[i as usize]
    }

    pub fn prefetch(&self, _i: u64) {}

    pub fn len(&self) -> u64 {
        self.words.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// Issues a prefetch for every cache line of `bytes` (a hint: changes nothing).
#[inline]
pub fn prefetch_lines(bytes: &[u8]) {
    let start = bytes.as_ptr() as usize;
    let mut line = start & !63;
    while line < start + bytes.len() {
        prefetch_ptr(line as *const u8);
        line += 64;
    }
}

/// Issues a prefetch for the cache line that holds `value` (a hint).
#[inline]
pub fn prefetch_at<T>(value: &T) {
    prefetch_ptr((value as *const T).cast());
}

/// Issues a prefetch for the cache line at `p` (a hint; never faults).
#[cfg_attr(loom, allow(dead_code))]
#[inline]
pub(crate) fn prefetch_ptr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint and does not fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Bytes a streaming copy moves per step (four 16-byte moves): its lengths and addresses are
/// multiples of this.
pub const STREAM_STEP: usize = 64;

/// Copies `len` bytes from `src` to `dst` with non-temporal stores: the destination's lines
/// are written to memory without first being read into cache, and leave no copy there (a
/// third less memory traffic for a copy nobody reads soon, such as the image and the pinned
/// staging of a GPU mirror's sync). Ordered before later stores only by [`streaming_fence`].
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, both aligned to and `len` a multiple of
/// [`STREAM_STEP`]; `dst` not read or written by anyone else meanwhile (`src` may be: its
/// bytes may come out torn, as with `memcpy`).
#[cfg(not(loom))]
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!((dst as usize | src as usize | len).is_multiple_of(STREAM_STEP));
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        let mut at = 0;
        while at < len {
            // SAFETY: in bounds and 16-byte aligned by the contract above; SSE2 is part of
            // every x86_64 target.
            unsafe {
                let (s, d) = (src.add(at) as *const __m128i, dst.add(at) as *mut __m128i);
                let (a, b, c, e) = (_mm_load_si128(s), _mm_load_si128(s.add(1)), _mm_load_si128(s.add(2)), _mm_load_si128(s.add(3)));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            at += STREAM_STEP;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: valid, non-overlapping ranges by the contract above.
    unsafe {
        libc::memcpy(dst as *mut libc::c_void, src as *const libc::c_void, len);
    }
}

/// Makes this thread's earlier non-temporal stores (`copy_streaming`, [`crate::Heap::copy_out_streaming`]) visible before its later stores (such
/// as the release of a channel send that hands the copy to another thread or a DMA engine).
#[inline]
pub fn streaming_fence() {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: a store fence has no memory-safety preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// A plain byte region reserved like the heap (zero until touched, never moved), for copies
/// of the heap that readers use with ordinary loads: memcpy snapshots. Reserving the heap's
/// whole capacity up front lets a snapshot grow with the heap without moving.
#[cfg(not(loom))]
pub struct ImageRegion {
    region: AnonRegion,
    /// Bytes at the front that may have been written (the rest is still untouched zero).
    touched: u64,
}

#[cfg(not(loom))]
impl ImageRegion {
    pub fn reserve(bytes: u64) -> Result<ImageRegion, StorageError> {
        Ok(ImageRegion { region: AnonRegion::reserve(bytes)?, touched: 0 })
    }

    /// Reserved bytes.
    pub fn capacity(&self) -> u64 {
        self.region.len as u64
    }

    /// Bytes at the front that have been handed out for writing (resident or about to be).
    pub fn touched(&self) -> u64 {
        self.touched
    }

    /// The first `len` bytes.
    pub fn bytes(&self, len: u64) -> &[u8] {
        assert!(len <= self.capacity(), "{len} bytes of a {}-byte region", self.capacity());
        // SAFETY: in bounds (checked); the mapping lives as long as self and is only written
        // through `&mut self`, so no write overlaps this shared borrow.
        unsafe { std::slice::from_raw_parts(self.region.base, len as usize) }
    }

    /// The first `len` bytes, for writing.
    pub fn bytes_mut(&mut self, len: u64) -> &mut [u8] {
        assert!(len <= self.capacity(), "{len} bytes of a {}-byte region", self.capacity());
        self.touched = self.touched.max(len);
        // SAFETY: in bounds (checked); exclusive through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.region.base, len as usize) }
    }
}
