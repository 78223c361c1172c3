//! Syncs that upload while the host copy runs, straight from the host image.
//!
//! The host image (the consistent copy's target) is registered with the device as mapped
//! page-locked memory, so the device reads its pages in place: the `tusk_scatter_mapped`
//! kernel copies each listed piece from the image to the same offset of the device heap. No
//! staging copy on the host, no separate copy on the device, and no wait for the whole host
//! copy: the image copy hands over each portion as soon as it is in the image
//! (`ImageTarget::copy_runs_streamed`) and the portion's kernel is launched at once, so the
//! bus carries one portion while the host threads copy the next.
//!
//! Every launch goes to one stream, in the order the portions were copied. A page copied
//! twice (written during the copy's open pass, so copied again under the closed gate) is
//! therefore scattered twice in that order, and the second, consistent copy is the one left
//! on the device even if the first read a page being rewritten.
//!
//! Registration pins the image's pages (64 MiB at a time, as the extent grows); it can fail
//! (a memory-lock limit, a platform without mapped memory): then this mirror says why in
//! [`CudaMirror::streamed_uploads`] and syncs through the pinned staging buffers instead.

use std::ffi::c_void;
use std::ops::Range;

use cudarc::driver::result as cu;
use cudarc::driver::sys;

use super::raw::driver;
use super::{err_slot, CudaMirror, BLOCK, ERR_BYTES, PIECE};
use crate::mirror::MirrorError;

/// Image bytes registered at a time, beyond the extent that needs them.
const REGISTER_GRANULE: u64 = 64 << 20;
/// Words per table entry: heap offset, device address of the image bytes, length.
const ENTRY_WORDS: usize = 3;

/// One registered range of the host image: image bytes [start, end) are readable by the
/// device at `dev + (offset - start)`.
struct Registered {
    host: *mut c_void,
    start: u64,
    end: u64,
    dev: u64,
}

/// The host image as the device sees it.
pub(crate) struct MappedImage {
    base: *const u8,
    capacity: u64,
    ranges: Vec<Registered>,
}

impl MappedImage {
    fn registered_end(&self) -> u64 {
        self.ranges.last().map_or(0, |r| r.end)
    }

    /// The device address of image offset `off` (registered).
    fn device_addr(&self, off: u64) -> u64 {
        let i = self.ranges.partition_point(|r| r.end <= off);
        let r = &self.ranges[i];
        assert!(r.start <= off && off < r.end, "image offset {off} is not registered");
        r.dev + (off - r.start)
    }

    /// Registers the image up to at least `end`.
    fn register_to(&mut self, end: u64) -> Result<(), MirrorError> {
        let start = self.registered_end();
        if end <= start {
            return Ok(());
        }
        let stop = end.next_multiple_of(REGISTER_GRANULE).min(self.capacity).max(end);
        assert!(stop <= self.capacity, "image offset {end} beyond its {} reserved bytes", self.capacity);
        let host = self.base.wrapping_add(start as usize) as *mut c_void;
        let len = (stop - start) as usize;
        // SAFETY: [start, stop) lies inside the image's mapping (checked against its reserved
        // size), which lives until the mirror unregisters it (Mirror drops its device first).
        unsafe { sys::cuMemHostRegister_v2(host, len, sys::CU_MEMHOSTREGISTER_DEVICEMAP) }
            .result()
            .map_err(|e| driver(&format!("cuMemHostRegister of {len} image bytes"), e))?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just registered with DEVICEMAP; a valid out-pointer.
        if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }.result() {
            // SAFETY: registered just above, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(host) };
            return Err(driver("cuMemHostGetDevicePointer", e));
        }
        self.ranges.push(Registered { host, start, end: stop, dev });
        Ok(())
    }

    /// Unregisters every range (the context must be current, nothing may still read them).
    pub(crate) fn unregister(&mut self) {
        for r in self.ranges.drain(..) {
            // SAFETY: registered by register_to, unregistered once; the owner synchronized
            // every stream that read it.
            let _ = unsafe { sys::cuMemHostUnregister(r.host) };
        }
    }
}

impl CudaMirror {
    /// Why syncs go through the staging buffers instead of streaming from the image (None:
    /// they stream).
    pub fn streamed_uploads(&self) -> Option<&str> {
        self.mapped_refused.as_deref()
    }

    /// Starts a streamed sync of an image at `image` (its first byte and reserved bytes) whose
    /// extent is about `extent_hint`: grows the device heap and registers the image that far.
    /// Returns false when this mirror cannot stream (then [`CudaMirror::upload`] it is).
    pub(crate) fn begin_streamed(&mut self, image: (*const u8, u64), extent_hint: u64) -> Result<bool, MirrorError> {
        if self.mapped_refused.is_some() {
            return Ok(false);
        }
        self.bind()?;
        let (base, capacity) = image;
        if let Some(m) = &self.mapped {
            assert!(m.base == base && m.capacity == capacity, "a mirror streams from one image");
        }
        let m = self.mapped.get_or_insert_with(|| MappedImage { base, capacity, ranges: Vec::new() });
        if let Err(e) = m.register_to(extent_hint.min(capacity)) {
            // Not possible here: say why, and sync through the staging buffers from now on.
            m.unregister();
            self.mapped = None;
            self.mapped_refused = Some(format!("streaming from the image is refused ({e}); staging instead"));
            return Ok(false);
        }
        self.grow(extent_hint)?;
        for s in &mut self.staging {
            s.in_flight = false;
        }
        Ok(true)
    }

    /// Uploads `runs` of the image (copied into it already) on the sync stream, without
    /// waiting for them.
    pub(crate) fn upload_streamed(&mut self, runs: &[Range<u64>]) -> Result<(), MirrorError> {
        let Some(end) = runs.iter().map(|r| r.end).max() else { return Ok(()) };
        self.bind()?;
        self.mapped.as_mut().expect("begin_streamed registered the image").register_to(end)?;
        self.grow(end)?;
        let per_buffer = self.staging[0].pinned.as_slice().len() / (8 * ENTRY_WORDS);
        let mut pieces = runs.iter().flat_map(|r| (r.start..r.end).step_by(PIECE).map(move |off| (off, (r.end - off).min(PIECE as u64))));
        let mut next = 0usize;
        loop {
            let i = next % self.staging.len();
            next += 1;
            if self.staging[i].in_flight {
                self.staging[i].done.sync()?;
                self.staging[i].in_flight = false;
            }
            let mapped = self.mapped.as_ref().expect("registered above");
            let table = self.staging[i].pinned.as_mut_slice();
            let mut count = 0usize;
            for (off, len) in pieces.by_ref().take(per_buffer) {
                let entry = [off, mapped.device_addr(off), len];
                for (w, v) in entry.iter().enumerate() {
                    let at = 8 * (ENTRY_WORDS * count + w);
                    table[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                count += 1;
            }
            if count == 0 {
                return Ok(());
            }
            self.launch_mapped(i, count)?;
        }
    }

    /// Copies table `i`'s `count` entries to the device and scatters them, on the sync stream
    /// (staging buffer 0's), recording table `i`'s `done` after.
    fn launch_mapped(&mut self, i: usize, count: usize) -> Result<(), MirrorError> {
        let heap = self.heap.as_ref().expect("grown before streaming");
        let (mut a_heap, mut a_extent) = (heap.ptr(), heap.bytes() as u64);
        let kernel = self.kernels.scatter_mapped;
        let stream = &self.staging[0].stream;
        let s = &self.staging[i];
        let bytes = 8 * ENTRY_WORDS * count;
        // SAFETY: the table's bytes lie in the pinned buffer and its device twin (same size);
        // the pinned bytes stay untouched until `done` completes (waited for before reuse).
        unsafe { sys::cuMemcpyHtoDAsync_v2(s.dev.ptr(), s.pinned.ptr(), bytes, stream.raw()) }.result().map_err(|e| driver("cuMemcpyHtoDAsync (sync table)", e))?;
        let (mut a_table, mut a_n, mut a_err) = (s.dev.ptr(), count as u64, self.staging[0].err.ptr());
        let mut params = [
            &mut a_heap as *mut u64 as *mut c_void,
            &mut a_extent as *mut u64 as *mut c_void,
            &mut a_table as *mut u64 as *mut c_void,
            &mut a_n as *mut u64 as *mut c_void,
            &mut a_err as *mut u64 as *mut c_void,
        ];
        let blocks = (count as u32).min(kernel.blocks).max(1);
        // SAFETY: the parameters match tusk_scatter_mapped; the table holds `count` entries
        // whose sources are registered image bytes (device addresses from the driver) and whose
        // destinations the kernel checks against the heap buffer's size.
        unsafe { cu::launch_kernel(kernel.f, (blocks, 1, 1), (BLOCK, 1, 1), 0, stream.raw(), &mut params) }.map_err(|e| driver("launching tusk_scatter_mapped", e))?;
        s.done.record(stream)?;
        self.staging[i].in_flight = true;
        Ok(())
    }

    /// Ends a streamed sync: waits for every upload, checks the scatter's error slot, and
    /// answers for heap bytes [0, extent) from now on.
    pub(crate) fn end_streamed(&mut self, extent: u64) -> Result<(), MirrorError> {
        self.bind()?;
        self.staging[0].stream.sync()?;
        for s in &mut self.staging {
            s.in_flight = false;
        }
        let err = &self.staging[0].err;
        let mut slot = [0u8; ERR_BYTES];
        // SAFETY: the slot holds ERR_BYTES bytes; its stream is idle.
        unsafe { cu::memcpy_dtoh_sync(&mut slot, err.ptr()) }.map_err(|e| driver("cuMemcpyDtoH", e))?;
        let (code, at) = err_slot(&slot);
        if code != 0 {
            // SAFETY: as above; clears the slot for the next sync.
            unsafe { cu::memset_d8_sync(err.ptr(), 0, ERR_BYTES) }.map_err(|e| driver("cuMemsetD8", e))?;
            return Err(MirrorError::Driver(format!("sync scatter refused a piece at heap offset {at} (code {code})")));
        }
        self.grow(extent)?;
        self.extent = extent;
        Ok(())
    }
}
