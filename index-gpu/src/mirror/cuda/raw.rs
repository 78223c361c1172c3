//! Thin owners of CUDA driver objects (device and pinned host memory, streams, events, a
//! module), each released on drop. Every driver call's result is checked and turned into a
//! [`MirrorError`]; out-of-memory gets its own variant with the size asked for.
//!
//! The owners assume the mirror's context is current on the calling thread: `CudaMirror`
//! binds it at the start of every method and in its `Drop` before the fields are dropped.

use std::ffi::c_void;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::DriverError;

use crate::mirror::MirrorError;

/// A driver error as a mirror error, naming the call that failed.
pub(crate) fn driver(what: &str, e: DriverError) -> MirrorError {
    MirrorError::Driver(format!("{what}: {e}"))
}

/// Like [`driver`], but out-of-memory becomes [`MirrorError::OutOfMemory`] for `bytes`.
pub(crate) fn alloc_error(what: &str, bytes: usize, e: DriverError) -> MirrorError {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        MirrorError::OutOfMemory { bytes: bytes as u64 }
    } else {
        driver(what, e)
    }
}

/// Device memory from `cuMemAlloc`.
pub(crate) struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// `bytes` of uninitialized device memory (at least 256: the driver refuses 0).
    pub(crate) fn alloc(bytes: usize) -> Result<DeviceBuffer, MirrorError> {
        let bytes = bytes.max(256);
        // SAFETY: a plain allocation; the memory is only read after something wrote it (the
        // mirror zero-fills its heap buffer; query buffers are written before each launch).
        let ptr = unsafe { cu::malloc_sync(bytes) }.map_err(|e| alloc_error("cuMemAlloc", bytes, e))?;
        Ok(DeviceBuffer { ptr, bytes })
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Device address of byte `off` (≤ the size).
    pub(crate) fn at(&self, off: usize) -> u64 {
        assert!(off <= self.bytes, "offset {off} beyond a device buffer of {} bytes", self.bytes);
        self.ptr + off as u64
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc and is freed once; every stream that used it was
        // synchronized by its owner before the owner let go of it.
        let _ = unsafe { cu::free_sync(self.ptr) };
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, so that async copies really are async and
/// run at the bus's rate.
pub(crate) struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: page-locked host memory is plain memory, usable from any thread; the owner moves it
// between threads only while no copy uses it (a streamed sync hands idle buffers to the
// threads that fill them and takes them back before it copies them).
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub(crate) fn alloc(bytes: usize) -> Result<PinnedBuffer, MirrorError> {
        let bytes = bytes.max(8);
        // SAFETY: a plain allocation; zeroed below before any read.
        // Portable: every device's copies may read and write it (several GPUs split batches
        // over one set of caller buffers).
        let ptr = unsafe { cu::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }.map_err(|e| alloc_error("cuMemHostAlloc", bytes, e))? as *mut u8;
        // SAFETY: ptr points to `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(PinnedBuffer { ptr, bytes })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `bytes` initialized bytes for the buffer's lifetime; the
        // borrow of self keeps the host side from writing meanwhile (device writes into it
        // only happen between a copy's launch and its completion, which the owner awaits
        // before reading).
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with an exclusive borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    pub(crate) fn ptr(&self) -> *const c_void {
        self.ptr as *const c_void
    }

    pub(crate) fn mut_ptr(&mut self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemHostAlloc and is freed once, after its copies completed.
        let _ = unsafe { cu::free_host(self.ptr as *mut c_void) };
    }
}

/// A non-blocking stream.
pub(crate) struct Stream(sys::CUstream);

impl Stream {
    pub(crate) fn new() -> Result<Stream, MirrorError> {
        cu::stream::create(cu::stream::StreamKind::NonBlocking).map(Stream).map_err(|e| driver("cuStreamCreate", e))
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.0
    }

    pub(crate) fn sync(&self) -> Result<(), MirrorError> {
        // SAFETY: the stream is live.
        unsafe { cu::stream::synchronize(self.0) }.map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Work queued on this stream after this call waits for `event`'s recorded work.
    pub(crate) fn wait(&self, event: &Event) -> Result<(), MirrorError> {
        // SAFETY: stream and event are live.
        unsafe { cu::stream::wait_event(self.0, event.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }.map_err(|e| driver("cuStreamWaitEvent", e))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream is live and destroyed once; pending work still completes.
        let _ = unsafe { cu::stream::destroy(self.0) };
    }
}

/// An event, with timing.
pub(crate) struct Event(sys::CUevent);

impl Event {
    pub(crate) fn new() -> Result<Event, MirrorError> {
        cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map(Event).map_err(|e| driver("cuEventCreate", e))
    }

    /// An event for ordering only (cheaper to record and wait for).
    pub(crate) fn untimed() -> Result<Event, MirrorError> {
        cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map(Event).map_err(|e| driver("cuEventCreate", e))
    }

    pub(crate) fn record(&self, stream: &Stream) -> Result<(), MirrorError> {
        // SAFETY: event and stream are live.
        unsafe { cu::event::record(self.0, stream.raw()) }.map_err(|e| driver("cuEventRecord", e))
    }

    /// Whether the work recorded before the event has completed.
    pub(crate) fn done(&self) -> Result<bool, MirrorError> {
        // SAFETY: the event is live.
        match unsafe { sys::cuEventQuery(self.0) } {
            sys::cudaError_enum::CUDA_SUCCESS => Ok(true),
            sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(driver("cuEventQuery", DriverError(e))),
        }
    }

    pub(crate) fn sync(&self) -> Result<(), MirrorError> {
        // SAFETY: the event is live.
        unsafe { cu::event::synchronize(self.0) }.map_err(|e| driver("cuEventSynchronize", e))
    }

    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub(crate) fn elapsed_ms(&self, end: &Event) -> Result<f64, MirrorError> {
        // SAFETY: both events are live and were recorded.
        unsafe { cu::event::elapsed(self.0, end.0) }.map(f64::from).map_err(|e| driver("cuEventElapsedTime", e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is live and destroyed once.
        let _ = unsafe { cu::event::destroy(self.0) };
    }
}

/// A loaded module.
pub(crate) struct Module(sys::CUmodule);

impl Module {
    /// Loads NUL-terminated PTX (the driver compiles it for the device).
    pub(crate) fn load(ptx: &[u8]) -> Result<Module, MirrorError> {
        assert_eq!(ptx.last(), Some(&0), "PTX must end in NUL");
        // SAFETY: ptx is NUL-terminated PTX text that outlives the call.
        unsafe { cu::module::load_data(ptx.as_ptr() as *const c_void) }
            .map(Module)
            .map_err(|e| MirrorError::Compile(format!("loading the PTX: {e}")))
    }

    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction, MirrorError> {
        let cname = std::ffi::CString::new(name).expect("kernel names hold no NUL");
        // SAFETY: the module is live; the function handle lives as long as the module, which
        // the mirror keeps until it drops its function handles.
        unsafe { cu::module::get_function(self.0, cname) }.map_err(|e| MirrorError::Compile(format!("kernel {name}: {e}")))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module is live and unloaded once, after all launches completed.
        let _ = unsafe { cu::module::unload(self.0) };
    }
}

/// A batch's host memory, in u64 words: page-locked with the CUDA backend, so that its copies
/// to and from the device run at the bus's rate straight from and into it (no staging copy);
/// ordinary memory with the CPU backend.
pub enum HostMemory {
    Pinned { buffer: PinnedBuffer, words: usize },
    Plain(Vec<u64>),
}

impl HostMemory {
    /// `words` zeroed words of pinned memory (every page touched now, not at the first batch).
    pub(crate) fn pinned(words: usize) -> Result<HostMemory, MirrorError> {
        Ok(HostMemory::Pinned { buffer: PinnedBuffer::alloc(8 * words)?, words })
    }

    pub(crate) fn plain(words: usize) -> HostMemory {
        HostMemory::Plain(vec![0; words])
    }

    pub(crate) fn words(&self) -> &[u64] {
        match self {
            // SAFETY: cuMemHostAlloc memory is page-aligned and holds at least 8 * words
            // initialized (zeroed at allocation) bytes; the borrow of self orders host access as
            // PinnedBuffer::as_slice says.
            HostMemory::Pinned { buffer, words } => unsafe { std::slice::from_raw_parts(buffer.ptr as *const u64, *words) },
            HostMemory::Plain(v) => v,
        }
    }

    pub(crate) fn words_mut(&mut self) -> &mut [u64] {
        match self {
            // SAFETY: as in `words`, with an exclusive borrow.
            HostMemory::Pinned { buffer, words } => unsafe { std::slice::from_raw_parts_mut(buffer.ptr as *mut u64, *words) },
            HostMemory::Plain(v) => v,
        }
    }

    /// Words as their bytes in memory.
    pub(crate) fn word_bytes(words: &[u64]) -> &[u8] {
        // SAFETY: any u64 is 8 initialized bytes; same memory and borrow, 8 bytes per word.
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, 8 * words.len()) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let words = self.words_mut();
        // SAFETY: any bytes are valid u64 words and the other way round; same memory, same
        // exclusive borrow, 8 bytes per word.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, 8 * words.len()) }
    }

    /// The pinned buffer's address, for the device's copies (None: ordinary memory).
    pub(crate) fn pinned_addr(&self) -> Option<u64> {
        match self {
            HostMemory::Pinned { buffer, .. } => Some(buffer.ptr as u64),
            HostMemory::Plain(_) => None,
        }
    }
}
