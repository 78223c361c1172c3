//! The GPU mirror of the indexes (docs/ARCHITECTURE.md): device memory holding the heap's used extent at
//! the same offsets, or only the indexes' pages with a page table (`index_pages.rs`), synced by
//! copying only the pages dirtied since the last sync, and batch kernels for B-link lookups and
//! range count/sum and ART lookups and prefix count/sum.

pub mod buffers;
pub mod cpu;
pub mod devices;
pub mod cuda;
pub mod engine;
pub mod index_pages;

pub use buffers::{ArtLookupBuffers, LookupBuffers, RangeBuffers};
pub use cuda::{BusRates, CudaMirror};
pub use devices::{Devices, StageTiming};
pub use engine::{CpuEngine, Mirror, SyncReport, DEVICE_MAX_KEY};

/// How a mirror is made.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Which backend: `Auto` uses CUDA when a usable device is present, else the CPU.
    pub backend: Backend,
    /// Which CUDA devices mirror the heap: each holds a replica, and a batch is split across
    /// them (each answer exact at the one LSN of the last sync).
    pub devices: GpuDevices,
    /// Pinned staging buffers for syncs, and the bytes of each.
    pub staging_buffers: usize,
    pub staging_bytes: usize,
    /// CPU backend threads (0: one per core).
    pub cpu_threads: usize,
    /// What device memory holds: the whole heap, or only the indexes.
    pub contents: MirrorContents,
    /// Most bytes of device memory the mirrored heap (or the index pages and their page
    /// table) may take on each GPU; `None`: as much as the GPU has. A sync that needs more
    /// fails with [`MirrorError::OverLimit`].
    pub device_memory_limit: Option<u64>,
}

/// What the mirror's device memory holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MirrorContents {
    /// The heap's whole used extent at its offsets: every tree answers, named or not.
    #[default]
    WholeHeap,
    /// Only the pages of the indexes under named roots (their descriptors and slab chunks),
    /// with a page table the kernels translate heap offsets through: a heap far larger than
    /// device memory whose indexes fit. Queries name trees by their roots; trees made before
    /// B-link slabs listed their chunks are refused (`MirrorError::Unsupported`).
    Indexes,
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions {
            backend: Backend::Auto,
            devices: GpuDevices::One(0),
            staging_buffers: 4,
            staging_bytes: 8 << 20,
            cpu_threads: 0,
            contents: MirrorContents::WholeHeap,
            device_memory_limit: None,
        }
    }
}

/// The CUDA devices of a mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuDevices {
    /// This device ordinal.
    One(usize),
    /// These ordinals (distinct).
    List(Vec<usize>),
    /// Every device of the host.
    All,
}

impl GpuDevices {
    /// The ordinals, given how many devices the host has; an error names one that is not
    /// there, a repeated one, or an empty list.
    pub fn ordinals(&self, present: usize) -> Result<Vec<usize>, MirrorError> {
        let list = match self {
            GpuDevices::One(d) => vec![*d],
            GpuDevices::List(l) => l.clone(),
            GpuDevices::All => (0..present).collect(),
        };
        if list.is_empty() {
            return Err(MirrorError::NoDevice(format!("no CUDA device named ({present} present)")));
        }
        for (i, d) in list.iter().enumerate() {
            if *d >= present {
                return Err(MirrorError::NoDevice(format!("device {d} asked for, {present} present")));
            }
            if list[..i].contains(d) {
                return Err(MirrorError::NoDevice(format!("device {d} named twice")));
            }
        }
        Ok(list)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto,
    Cuda,
    Cpu,
}

/// Why a mirror could not be made or answer.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// No CUDA driver library (libcuda.so.1) on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver is there but no device (or not the one asked for).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// NVRTC (libnvrtc) is missing or failed to compile a kernel.
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    /// Device memory exhausted.
    #[error("out of device memory: {bytes} bytes requested")]
    OutOfMemory { bytes: u64 },
    /// The mirror would need more device memory than [`GpuOptions::device_memory_limit`].
    #[error("the mirror needs {bytes} bytes of device memory, over its limit of {limit} (GpuOptions::device_memory_limit; MirrorContents::Indexes mirrors only the indexes)")]
    OverLimit { bytes: u64, limit: u64 },
    /// An index-only mirror was asked about a tree it does not hold.
    #[error("the index-only mirror holds no tree at heap offset {0}: it mirrors the trees under named roots as of its last sync")]
    NotMirrored(u64),
    /// A query the device does not answer: an ART key or prefix longer than the kernels take
    /// (32 bytes), or an ART subtree deeper than the prefix walk's stack. The caller answers it
    /// on the CPU.
    #[error("not answered on the GPU: {0}")]
    Unsupported(String),
    /// The mirror's last sync failed (the reason follows): its answers could mix states, so it
    /// answers nothing until a sync succeeds.
    #[error("the mirror's last sync failed, sync again before querying: {0}")]
    SyncFailed(String),
    /// Any other CUDA driver error.
    #[error("CUDA: {0}")]
    Driver(String),
    #[error(transparent)]
    Txn(#[from] tusk_txn::TxnError),
    #[error(transparent)]
    Index(#[from] crate::IndexError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_name_devices_that_are_there_once() {
        assert_eq!(GpuDevices::All.ordinals(3).unwrap(), [0, 1, 2]);
        assert_eq!(GpuDevices::One(1).ordinals(2).unwrap(), [1]);
        assert_eq!(GpuDevices::List(vec![2, 0]).ordinals(3).unwrap(), [2, 0]);
        for (bad, why) in [(GpuDevices::One(2), "asked for"), (GpuDevices::List(vec![]), "no CUDA device"), (GpuDevices::List(vec![0, 0]), "twice"), (GpuDevices::All, "no CUDA device")] {
            let present = if bad == GpuDevices::All { 0 } else { 2 };
            match bad.ordinals(present) {
                Err(MirrorError::NoDevice(e)) => assert!(e.contains(why), "{bad:?}: {e}"),
                other => panic!("{bad:?} with {present} devices: {other:?}"),
            }
        }
    }
}
