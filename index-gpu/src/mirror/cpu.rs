//! The CPU engine of the mirror: the same batch queries as the kernels, answered by the
//! trees' read paths over the mirror's host image on several threads. It is the backend
//! without a GPU, the engine GPU answers are checked against, and where the CUDA backend
//! sends what its kernels do not take (ART keys and prefixes over 32 bytes, as CuART does).

use tusk_storage::HeapPtr;

use crate::image::HeapImage;
use crate::{Art, BTree, IndexError};

/// Batches smaller than this run on the calling thread alone.
const PARALLEL_BATCH: usize = 4096;

/// Threads for a batch of `items` queries: one below [`PARALLEL_BATCH`].
fn threads_for(items: usize, threads: usize) -> usize {
    if items < PARALLEL_BATCH { 1 } else { threads.max(1) }
}

/// Answers `f(image, item)` for every item, on `threads` threads, in order.
fn map_batch<I: Sync, O: Send>(
    image: &[u8],
    items: &[I],
    threads: usize,
    f: impl Fn(&mut HeapImage<'_>, &I) -> Result<O, IndexError> + Sync,
) -> Result<Vec<O>, IndexError> {
    let run = |part: &[I]| -> Result<Vec<O>, IndexError> {
        let mut heap = HeapImage::new(image);
        part.iter().map(|item| f(&mut heap, item)).collect()
    };
    if threads <= 1 || items.len() <= 1 {
        return run(items);
    }
    let per = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks(per).map(|part| s.spawn(move || run(part))).collect();
        let mut out = Vec::with_capacity(items.len());
        for part in parts {
            out.extend(part.join().expect("a query thread does not panic")?);
        }
        Ok(out)
    })
}

/// Answers `f(image, part)` for parts of up to [`LOOKUP_PART`] items, on up to `threads`
/// threads, in order: for the batched lookups (`get_many`), which overlap the misses of a
/// part's descents.
fn map_parts<I: Sync, O: Send>(
    image: &[u8],
    items: &[I],
    threads: usize,
    f: impl Fn(&mut HeapImage<'_>, &[I]) -> Result<Vec<O>, IndexError> + Sync,
) -> Result<Vec<O>, IndexError> {
    let parts: Vec<&[I]> = items.chunks(LOOKUP_PART).collect();
    let answers = map_batch(image, &parts, threads_for(items.len(), threads), |heap, part| f(heap, part))?;
    Ok(answers.into_iter().flatten().collect())
}

/// Keys per `get_many` call of the CPU engine.
const LOOKUP_PART: usize = 256;

pub fn btree_get(image: &[u8], threads: usize, meta: u64, keys: &[u64]) -> Result<Vec<Option<u64>>, IndexError> {
    let tree = BTree::open(&mut HeapImage::new(image), HeapPtr(meta))?;
    map_parts(image, keys, threads, |heap, part| tree.get_many(heap, part))
}

pub fn btree_count_sum(image: &[u8], threads: usize, meta: u64, ranges: &[(u64, u64)]) -> Result<Vec<(u64, u128)>, IndexError> {
    let tree = BTree::open(&mut HeapImage::new(image), HeapPtr(meta))?;
    map_batch(image, ranges, threads_for(ranges.len(), threads), |heap, &(lo, hi)| {
        if lo > hi {
            return Ok((0, 0));
        }
        Ok((tree.count(heap, lo..=hi)?, tree.sum(heap, lo..=hi)?))
    })
}

pub fn art_get(image: &[u8], threads: usize, meta: u64, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, IndexError> {
    let tree = Art::open(&mut HeapImage::new(image), HeapPtr(meta))?;
    map_parts(image, keys, threads, |heap, part| tree.get_many(heap, part))
}

pub fn art_count_sum_prefix(image: &[u8], threads: usize, meta: u64, prefixes: &[&[u8]]) -> Result<Vec<(u64, u128)>, IndexError> {
    let tree = Art::open(&mut HeapImage::new(image), HeapPtr(meta))?;
    map_batch(image, prefixes, threads_for(prefixes.len(), threads), |heap, p| Ok((tree.count_prefix(heap, p)?, tree.sum_prefix(heap, p)?)))
}
