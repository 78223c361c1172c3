//! The GPU mirror of the indexes: `store.gpu_mirror(GpuOptions::default())`.
//!
//! Device memory holds the heap's used extent at the same offsets, so the kernels follow the
//! trees' heap offsets unchanged, or, with [`MirrorContents::Indexes`], only the pages of the
//! trees under named roots and a page table the kernels translate offsets through (a heap far
//! larger than GPU memory whose indexes fit; with several GPUs, trees replicated where they
//! fit and spread over the GPUs where they do not). [`GpuMirror::sync`] brings it to the
//! committed state at one LSN by copying only the pages dirtied since the previous sync (the
//! dirty epochs and the consistent incremental copy that snapshots use), through a host image
//! at that LSN. Batch
//! queries go to the GPU; every answer carries the LSN it is exact for. Without a usable GPU
//! (no driver, no device, no NVRTC), `GpuOptions::default()` runs the same API on CPU threads
//! over the host image and [`GpuMirror::backend`] says so and why; asking for
//! `GpuBackend::Cuda` explicitly makes that an error instead.

use tusk_index::mirror::{Mirror, MirrorError};
use tusk_storage::HeapPtr;

pub use tusk_index::mirror::{ArtLookupBuffers, Backend as GpuBackend, GpuDevices, GpuOptions, LookupBuffers, MirrorContents, RangeBuffers, StageTiming, SyncReport};

use crate::{Error, Store};

/// Answers of one batch, and the LSN they are exact for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answers<T> {
    /// One answer per query, in order.
    pub values: Vec<T>,
    /// The mirror's LSN: the answers equal the trees' after exactly the commits up to it.
    pub lsn: u64,
}

/// A mirror of the store's indexes on the GPU (or its CPU engine); see the module docs.
pub struct GpuMirror {
    inner: Mirror,
}

impl Store {
    /// Opens a mirror of the heap's indexes and syncs it once.
    ///
    /// ```
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// use tusk::{Commit, GpuOptions, Store};
    /// let store = Store::open(dir.path(), tusk::Options::default())?;
    /// store.transact(Commit::Async, |tx| tx.btree("orders")?.bulk_load((0..1000u64).map(|k| (k, 2 * k)), 1.0))?;
    /// let mut mirror = store.gpu_mirror(GpuOptions::default())?;   // CPU threads where no GPU
    /// let orders = mirror.btree("orders")?;
    /// let found = orders.get_batch(&[7, 5000])?;
    /// assert_eq!(found.values, vec![Some(14), None]);
    /// let ranges = orders.count_sum_batch(&[(10, 19)])?;            // inclusive bounds
    /// assert_eq!(ranges.values, vec![(10, 290)]);
    /// store.transact(Commit::Async, |tx| tx.btree("orders")?.insert(5000, 1).map(|_| ()))?;
    /// mirror.sync()?;                                                // ships the dirty pages
    /// assert_eq!(mirror.btree("orders")?.get_batch(&[5000])?.values, vec![Some(1)]);
    /// # Ok(()) }
    /// ```
    pub fn gpu_mirror(&self, options: GpuOptions) -> Result<GpuMirror, Error> {
        Ok(GpuMirror { inner: Mirror::open(self.engine().clone(), &options)? })
    }
}

impl GpuMirror {
    /// `"cuda (device name)"`, or `"cpu (N threads; no GPU: why)"`.
    pub fn backend(&self) -> &str {
        self.inner.backend()
    }

    /// Whether batches run on the GPU.
    pub fn on_gpu(&self) -> bool {
        self.inner.on_gpu()
    }

    /// The LSN every answer is exact for, until the next sync.
    pub fn lsn(&self) -> u64 {
        self.inner.lsn()
    }

    /// Brings the mirror to the current committed state, copying only the pages dirtied since
    /// the last sync; returns what it did (its `lsn` is the new [`GpuMirror::lsn`]).
    pub fn sync(&mut self) -> Result<SyncReport, Error> {
        Ok(self.inner.sync()?)
    }

    /// Buffers for batches of up to `capacity` B-link lookups, reused by every
    /// [`MirrorBTree::get_into`]: set up once (on the GPU, page-locked host memory and its
    /// device twin), so that a batch allocates nothing and its keys and answers cross the bus
    /// straight from and into them, overlapped with the kernels.
    ///
    /// ```
    /// # fn main() -> Result<(), tusk::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// use tusk::{Commit, GpuOptions, Store};
    /// let store = Store::open(dir.path(), tusk::Options::default())?;
    /// store.transact(Commit::Async, |tx| tx.btree("orders")?.bulk_load((0..1000u64).map(|k| (k, 2 * k)), 1.0))?;
    /// let mirror = store.gpu_mirror(GpuOptions::default())?;
    /// let mut batch = mirror.lookup_buffers(1 << 16)?;      // once
    /// batch.load_keys(&[7, 5000]);                           // or fill batch.keys_mut() in place
    /// let lsn = mirror.btree("orders")?.get_into(&mut batch)?;
    /// assert_eq!(lsn, mirror.lsn());
    /// assert_eq!(batch.values(), &[14, 0]);                  // 0 where absent: see found
    /// assert!(batch.found(0) && !batch.found(1));
    /// assert_eq!(batch.answers().collect::<Vec<_>>(), vec![Some(14), None]);
    /// # Ok(()) }
    /// ```
    pub fn lookup_buffers(&self, capacity: usize) -> Result<LookupBuffers, Error> {
        Ok(self.inner.lookup_buffers(capacity)?)
    }

    /// Buffers for batches of up to `capacity` B-link range counts and sums
    /// ([`MirrorBTree::count_sum_into`]).
    pub fn range_buffers(&self, capacity: usize) -> Result<RangeBuffers, Error> {
        Ok(self.inner.range_buffers(capacity)?)
    }

    /// Buffers for batches of up to `capacity` ART lookups of keys of exactly `key_len` bytes,
    /// 1 to 32 ([`MirrorArt::get_into`]; longer keys: [`MirrorArt::get_batch`]).
    pub fn art_lookup_buffers(&self, capacity: usize, key_len: usize) -> Result<ArtLookupBuffers, Error> {
        Ok(self.inner.art_lookup_buffers(capacity, key_len)?)
    }

    fn root(&self, name: &str) -> Result<HeapPtr, Error> {
        let mut image = tusk_index::image::HeapImage::new(self.inner.image());
        use tusk_index::heap::HeapRead;
        tusk_txn::roots::lookup(|off| image.load(off), name)?.ok_or_else(|| Error::NoSuchRoot(name.to_string()))
    }

    /// The B-link tree under root `name` at the mirror's LSN.
    pub fn btree(&self, name: &str) -> Result<MirrorBTree<'_>, Error> {
        let ptr = self.root(name)?;
        tusk_index::BTree::open(&mut tusk_index::image::HeapImage::new(self.inner.image()), ptr)?;
        Ok(MirrorBTree { mirror: self, meta: ptr.offset() })
    }

    /// The ART under root `name` at the mirror's LSN.
    pub fn art(&self, name: &str) -> Result<MirrorArt<'_>, Error> {
        let ptr = self.root(name)?;
        tusk_index::Art::open(&mut tusk_index::image::HeapImage::new(self.inner.image()), ptr)?;
        Ok(MirrorArt { mirror: self, meta: ptr.offset() })
    }

    /// The mirror's inner engine (benchmarks: device-resident timings, the CPU engine).
    #[doc(hidden)]
    pub fn inner(&self) -> &Mirror {
        &self.inner
    }
}

/// A B-link tree of the mirror: batch reads.
pub struct MirrorBTree<'m> {
    mirror: &'m GpuMirror,
    meta: u64,
}

impl MirrorBTree<'_> {
    /// The tree's descriptor offset (benchmarks).
    pub fn ptr(&self) -> HeapPtr {
        HeapPtr(self.meta)
    }

    /// The value under each key (`None`: absent).
    pub fn get_batch(&self, keys: &[u64]) -> Result<Answers<Option<u64>>, Error> {
        Ok(Answers { values: self.mirror.inner.btree_get(self.meta, keys)?, lsn: self.mirror.lsn() })
    }

    /// The value under each key of `buffers` ([`GpuMirror::lookup_buffers`]), into its values
    /// and found bits; returns the LSN the answers are exact for. Allocates nothing.
    pub fn get_into(&self, buffers: &mut LookupBuffers) -> Result<u64, Error> {
        self.mirror.inner.btree_get_into(self.meta, buffers)?;
        Ok(self.mirror.lsn())
    }

    /// Count and sum of each range of `buffers` ([`GpuMirror::range_buffers`]); returns the
    /// LSN the answers are exact for. Allocates nothing.
    pub fn count_sum_into(&self, buffers: &mut RangeBuffers) -> Result<u64, Error> {
        self.mirror.inner.btree_count_sum_into(self.meta, buffers)?;
        Ok(self.mirror.lsn())
    }

    /// Count and sum of the values of the keys in each `[lo, hi]` (inclusive; empty when lo > hi).
    pub fn count_sum_batch(&self, ranges: &[(u64, u64)]) -> Result<Answers<(u64, u128)>, Error> {
        Ok(Answers { values: self.mirror.inner.btree_count_sum(self.meta, ranges)?, lsn: self.mirror.lsn() })
    }
}

/// An ART of the mirror: batch reads.
pub struct MirrorArt<'m> {
    mirror: &'m GpuMirror,
    meta: u64,
}

impl MirrorArt<'_> {
    /// The tree's descriptor offset (benchmarks).
    pub fn ptr(&self) -> HeapPtr {
        HeapPtr(self.meta)
    }

    /// The value under each key. Keys over 32 bytes are answered by the CPU engine, at the
    /// same LSN.
    pub fn get_batch(&self, keys: &[&[u8]]) -> Result<Answers<Option<u64>>, Error> {
        Ok(Answers { values: self.mirror.inner.art_get(self.meta, keys)?, lsn: self.mirror.lsn() })
    }

    /// The value under each key of `buffers` ([`GpuMirror::art_lookup_buffers`]), into its
    /// values and found bits; returns the LSN the answers are exact for. Allocates nothing.
    pub fn get_into(&self, buffers: &mut ArtLookupBuffers) -> Result<u64, Error> {
        self.mirror.inner.art_get_into(self.meta, buffers)?;
        Ok(self.mirror.lsn())
    }

    /// Count and sum of the values of the keys starting with each prefix.
    pub fn count_prefix_batch(&self, prefixes: &[&[u8]]) -> Result<Answers<(u64, u128)>, Error> {
        Ok(Answers { values: self.mirror.inner.art_count_sum_prefix(self.meta, prefixes)?, lsn: self.mirror.lsn() })
    }
}

impl From<MirrorError> for Error {
    fn from(e: MirrorError) -> Error {
        match e {
            MirrorError::Txn(e) => e.into(),
            MirrorError::Index(e) => e.into(),
            MirrorError::OutOfMemory { bytes } => Error::GpuOutOfMemory { bytes },
            MirrorError::OverLimit { bytes, limit } => Error::GpuOverLimit { bytes, limit },
            e @ (MirrorError::NoDriver(_) | MirrorError::NoDevice(_) | MirrorError::Compile(_)) => Error::GpuUnavailable(e.to_string()),
            MirrorError::Driver(what) => Error::Gpu(what),
            MirrorError::Unsupported(what) => Error::Gpu(what),
            e @ (MirrorError::SyncFailed(_) | MirrorError::NotMirrored(_)) => Error::Gpu(e.to_string()),
        }
    }
}
