//! The CUDA mirror against the CPU trees: both indexes built through transactions, the heap
//! copied into a host image and uploaded, and every GPU answer compared element for element
//! with the CPU read path over the same image (`HeapImage`). Then rounds of updates (B-link
//! `apply_batch`, ART inserts and removes: splits, merges, node growth and shrink), each
//! followed by an upload of only the pages that changed, and the same comparisons.
//!
//! Key sets are fresh random ones on every run (the seed is printed; `TUSK_SEED` replays one).
//! Without a usable GPU (CI has none) each test prints why it was skipped and returns.
//!
//! `gpu_lookup_timing` (ignored: run it on the device machine with `--ignored`) times lookups
//! over bulk-loaded trees of 16 M and 64 M keys (`TUSK_GPU_MKEYS`, e.g. "16,64") and an ART of
//! 8-byte big-endian keys (`TUSK_GPU_ART_MKEYS`, default "16").

mod common;

use common::Rng;

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Instant;

use tusk_index::heap::{HeapRead, HeapWrite};
use tusk_index::image::HeapImage;
use tusk_index::mirror::cuda::{BTreeGet, CudaMirror, BTREE_KERNELS, DEFAULT_BTREE_KERNEL, GPU_MAX_KEY};
use tusk_index::mirror::{GpuOptions, MirrorError};
use tusk_index::{Art, BTree, Op};
use tusk_storage::layout::BRK_OFF;
use tusk_storage::PAGE_SIZE;
use tusk_txn::{Engine, TxnError};

// ---- helpers ----

/// The mirror, or None after printing why this test is skipped.
fn open(test: &str) -> Option<CudaMirror> {
    match CudaMirror::open(&GpuOptions::default()) {
        Ok(m) => {
            eprintln!("{test}: on {}", m.device_name());
            Some(m)
        }
        Err(e) => {
            eprintln!("{test}: skipped: no usable GPU: {e}");
            None
        }
    }
}

/// The heap's bytes [0, extent), extent = the allocator's break rounded up to a page.
fn image(engine: &Engine) -> Vec<u8> {
    let heap = engine.heap();
    let extent = heap.load_word(BRK_OFF).next_multiple_of(PAGE_SIZE).min(heap.capacity());
    let mut bytes = vec![0u8; extent as usize];
    heap.read_bytes(0, &mut bytes);
    bytes
}

/// Runs of whole pages where `new` differs from `old` (pages past `old`'s end all count).
fn changed_runs(old: &[u8], new: &[u8]) -> Vec<Range<u64>> {
    let page = PAGE_SIZE as usize;
    let mut runs: Vec<Range<u64>> = Vec::new();
    for (i, chunk) in new.chunks(page).enumerate() {
        let at = i * page;
        let same = old.get(at..at + chunk.len()).is_some_and(|o| o == chunk);
        if !same {
            let r = at as u64..(at + chunk.len()) as u64;
            match runs.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => runs.push(r),
            }
        }
    }
    runs
}

/// Uploads what changed since `prev` and makes `prev` the new image; returns the pages sent.
fn sync(mirror: &mut CudaMirror, prev: &mut Vec<u8>, now: Vec<u8>) -> u64 {
    let runs = if prev.is_empty() { changed_runs(&[], &now) } else { changed_runs(prev, &now) };
    mirror.upload(&now, &runs, now.len() as u64).unwrap();
    *prev = now;
    runs.iter().map(|r| (r.end - r.start).div_ceil(PAGE_SIZE)).sum()
}

// ---- B-link tree ----

/// Point lookups (present, absent, edges) and range count/sums (random, empty, single-key,
/// full, u64::MAX edges) compared with the CPU over `img`.
fn check_btree(mirror: &CudaMirror, tree: BTree, img: &[u8], keys: &BTreeSet<u64>, rng: &mut Rng, what: &str) {
    let mut image = HeapImage::new(img);
    let present: Vec<u64> = keys.iter().copied().collect();
    let mut queries = present.clone();
    for &k in present.iter().step_by(7) {
        queries.extend([k.wrapping_add(1), k.wrapping_sub(1)]);
    }
    queries.extend((0..2000).map(|_| rng.next()));
    queries.extend([0, 1, u64::MAX, u64::MAX - 1]);
    rng.shuffle(&mut queries);
    let gpu = mirror.btree_get(tree.ptr().offset(), &queries).unwrap();
    assert_eq!(gpu.len(), queries.len());
    let mut hits = 0;
    for (k, g) in queries.iter().zip(&gpu) {
        let cpu = tree.get(&mut image, *k).unwrap();
        assert_eq!(*g, cpu, "{what}: get({k})");
        hits += cpu.is_some() as usize;
    }
    assert!(hits >= present.len(), "{what}: every present key found");

    let pick = |rng: &mut Rng| if present.is_empty() || rng.below(4) == 0 { rng.next() } else { present[rng.below(present.len() as u64) as usize] };
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for _ in 0..3000 {
        let (a, b) = (pick(rng), pick(rng));
        ranges.push((a.min(b), a.max(b)));
    }
    for _ in 0..300 {
        let k = pick(rng);
        ranges.push((k, k)); // single key (or none)
        ranges.push((k, k.saturating_add(rng.below(100)))); // short
        ranges.push((k.wrapping_add(1 + rng.below(10)), k)); // lo > hi: empty (or wrapped)
    }
    ranges.extend([(0, u64::MAX), (u64::MAX, u64::MAX), (0, 0), (u64::MAX, 0), (u64::MAX - 1, u64::MAX), (1, u64::MAX)]);
    if let (Some(&first), Some(&last)) = (present.first(), present.last()) {
        ranges.extend([(first, last), (first, u64::MAX), (0, last), (last, u64::MAX), (0, first)]);
    }
    let gpu = mirror.btree_count_sum(tree.ptr().offset(), &ranges).unwrap();
    for (&(lo, hi), &(n, s)) in ranges.iter().zip(&gpu) {
        let cpu_n = tree.count(&mut image, lo..=hi).unwrap();
        let cpu_s = tree.sum(&mut image, lo..=hi).unwrap();
        assert_eq!((n, s), (cpu_n, cpu_s), "{what}: count/sum [{lo}, {hi}]");
    }
    eprintln!("{what}: {} keys; {} lookups ({hits} hits) and {} ranges equal", present.len(), queries.len(), ranges.len());
}

#[derive(Clone, Copy, Debug)]
enum Order {
    Shuffled,
    Ascending,
    Gaussian,
    Bulk,
}

fn btree_keys(order: Order, n: usize, rng: &mut Rng) -> Vec<u64> {
    let mut set = BTreeSet::new();
    let center = rng.next();
    let spread = (n as u64 / 2).max(1);
    let base = rng.below(u64::MAX / 2);
    while set.len() < n {
        set.insert(match order {
            Order::Shuffled | Order::Bulk => rng.next(),
            Order::Ascending => base + set.len() as u64 * (1 + rng.below(3)),
            Order::Gaussian => rng.gaussian(center, spread),
        });
    }
    let mut keys: Vec<u64> = set.into_iter().collect();
    if matches!(order, Order::Shuffled | Order::Gaussian) {
        rng.shuffle(&mut keys);
    }
    keys
}

#[test]
fn btree_lookups_and_ranges_match_the_cpu() {
    const TEST: &str = "btree_lookups_and_ranges_match_the_cpu";
    let Some(mut mirror) = open(TEST) else { return };
    let mut rng = Rng::new(TEST);
    for order in [Order::Shuffled, Order::Ascending, Order::Gaussian, Order::Bulk] {
        let engine = common::engine(512 << 20);
        let n = 40_000 + rng.below(20_000) as usize;
        let keys = btree_keys(order, n, &mut rng);
        let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
        let mut model = BTreeSet::new();
        if matches!(order, Order::Bulk) {
            common::transact(&engine, |tx| tree.bulk_load(tx, keys.iter().map(|&k| (k, k ^ 0x55)), 0.5 + rng.below(60) as f64 / 100.0).unwrap());
            model.extend(keys.iter().copied());
        } else {
            for chunk in keys.chunks(4_000) {
                common::transact(&engine, |tx| {
                    for &k in chunk {
                        tree.insert(tx, k, k.rotate_left(17) ^ rng.next() >> 1).unwrap();
                    }
                });
                model.extend(chunk);
            }
        }
        let mut prev = Vec::new();
        let pages = sync(&mut mirror, &mut prev, image(&engine));
        let what = format!("{order:?}");
        eprintln!("{what}: first upload {pages} pages, extent {}", mirror.extent());
        check_btree(&mirror, tree, &prev, &model, &mut rng, &what);

        // Rounds of batches: inserts (splits), removals of most keys in a span (merges,
        // redistributions, root shrinks), updates.
        for round in 0..4 {
            let mut ops = Vec::new();
            let present: Vec<u64> = model.iter().copied().collect();
            for _ in 0..(n / 3) {
                ops.push(Op::Upsert { key: rng.next() >> (rng.below(2) * 8), value: rng.next() });
            }
            if !present.is_empty() {
                let from = rng.below(present.len() as u64) as usize;
                let span = (present.len() / 3).max(1);
                for &k in present.iter().cycle().skip(from).take(span) {
                    if rng.below(10) < 9 {
                        ops.push(Op::Remove { key: k });
                    }
                }
                for _ in 0..n / 10 {
                    let k = present[rng.below(present.len() as u64) as usize];
                    ops.push(Op::Upsert { key: k, value: rng.next() });
                }
            }
            rng.shuffle(&mut ops);
            common::transact(&engine, |tx| tree.apply_batch(tx, &ops).unwrap());
            for op in &ops {
                match *op {
                    Op::Upsert { key, .. } => model.insert(key),
                    Op::Remove { key } => model.remove(&key),
                };
            }
            let total = image(&engine).len() as u64 / PAGE_SIZE;
            let pages = sync(&mut mirror, &mut prev, image(&engine));
            eprintln!("{what} round {round}: {} ops, uploaded {pages} of {total} pages", ops.len());
            check_btree(&mirror, tree, &prev, &model, &mut rng, &format!("{what} round {round}"));
        }
        // A small change sends a few pages only.
        let some: Vec<u64> = model.iter().copied().step_by((model.len() / 5).max(1)).take(5).collect();
        let ops: Vec<Op> = some.iter().map(|&key| Op::Upsert { key, value: rng.next() }).collect();
        common::transact(&engine, |tx| tree.apply_batch(tx, &ops).unwrap());
        let total = image(&engine).len() as u64 / PAGE_SIZE;
        let pages = sync(&mut mirror, &mut prev, image(&engine));
        assert!(pages <= 16 && pages < total, "{what}: 5 updates sent {pages} of {total} pages");
        check_btree(&mirror, tree, &prev, &model, &mut rng, &format!("{what} small round"));
        assert_eq!(common::transact(&engine, |tx| tree.check(tx).unwrap()).keys, model.len() as u64);
    }
}

#[test]
fn empty_and_tiny_trees_and_errors() {
    const TEST: &str = "empty_and_tiny_trees_and_errors";
    let Some(mut mirror) = open(TEST) else { return };
    // Nothing uploaded yet: an error, not a crash.
    assert!(matches!(mirror.btree_get(4096, &[1]), Err(MirrorError::Index(_))));
    let engine = common::engine(64 << 20);
    let (bt, art) = common::transact(&engine, |tx| (BTree::named(tx, "b").unwrap(), Art::named(tx, "a").unwrap()));
    let mut prev = Vec::new();
    sync(&mut mirror, &mut prev, image(&engine));
    assert_eq!(mirror.btree_get(bt.ptr().offset(), &[0, 5, u64::MAX]).unwrap(), [None, None, None]);
    assert_eq!(mirror.btree_count_sum(bt.ptr().offset(), &[(0, u64::MAX)]).unwrap(), [(0, 0)]);
    assert_eq!(mirror.art_get(art.ptr().offset(), &[b"", b"x"]).unwrap(), [None, None]);
    assert_eq!(mirror.art_count_sum_prefix(art.ptr().offset(), &[b""]).unwrap(), [(0, 0)]);
    assert!(mirror.btree_get(bt.ptr().offset(), &[]).unwrap().is_empty());
    // One key each, then the empty ART key and big values whose sum passes 2^64.
    common::transact(&engine, |tx| {
        bt.insert(tx, 7, u64::MAX).unwrap();
        bt.insert(tx, 8, u64::MAX).unwrap();
        art.insert(tx, b"", u64::MAX).unwrap();
        art.insert(tx, b"k", u64::MAX).unwrap();
    });
    sync(&mut mirror, &mut prev, image(&engine));
    assert_eq!(mirror.btree_get(bt.ptr().offset(), &[7, 8, 9]).unwrap(), [Some(u64::MAX), Some(u64::MAX), None]);
    assert_eq!(mirror.btree_count_sum(bt.ptr().offset(), &[(0, u64::MAX), (8, 8), (9, 7)]).unwrap(), [(2, 2 * u64::MAX as u128), (1, u64::MAX as u128), (0, 0)]);
    assert_eq!(mirror.art_get(art.ptr().offset(), &[b"", b"k", b"kk"]).unwrap(), [Some(u64::MAX), Some(u64::MAX), None]);
    assert_eq!(mirror.art_count_sum_prefix(art.ptr().offset(), &[b"", b"k", b"q"]).unwrap(), [(2, 2 * u64::MAX as u128), (1, u64::MAX as u128), (0, 0)]);
    // Keys longer than the kernels take are refused (the caller answers them on the CPU).
    let long = [b'k'; GPU_MAX_KEY + 1];
    assert!(matches!(mirror.art_get(art.ptr().offset(), &[b"k", &long]), Err(MirrorError::Unsupported(_))));
    assert!(matches!(mirror.art_count_sum_prefix(art.ptr().offset(), &[&long]), Err(MirrorError::Unsupported(_))));
    // A descriptor offset outside the mirror is the CPU's error, and the mirror still works.
    let beyond = mirror.extent() + 4096;
    assert!(matches!(mirror.btree_get(beyond, &[1]), Err(MirrorError::Index(tusk_index::IndexError::Txn(TxnError::InvalidPointer(_))))));
    assert!(matches!(mirror.art_get(beyond, &[b"k"]), Err(MirrorError::Index(_))));
    assert_eq!(mirror.btree_get(bt.ptr().offset(), &[7]).unwrap(), [Some(u64::MAX)]);
    // Every kernel variant answers the same.
    for k in BTREE_KERNELS {
        mirror.set_btree_kernel(k).unwrap();
        assert_eq!(mirror.btree_get(bt.ptr().offset(), &[7, 8, 9, 0]).unwrap(), [Some(u64::MAX), Some(u64::MAX), None, None], "{k}");
    }
    assert!(mirror.set_btree_kernel(BTreeGet::scan(3, false, false)).is_err());
    mirror.set_btree_kernel(DEFAULT_BTREE_KERNEL).unwrap();
    // The heap grows past the device buffer: it grows too, keeping what it held.
    let before = mirror.extent();
    let keys: Vec<u64> = (0..200_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    for chunk in keys.chunks(20_000) {
        common::transact(&engine, |tx| {
            for &k in chunk {
                bt.insert(tx, k, k ^ 1).unwrap();
            }
        });
    }
    sync(&mut mirror, &mut prev, image(&engine));
    assert!(mirror.extent() > before + (4 << 20), "extent {} after {before}", mirror.extent());
    let got = mirror.btree_get(bt.ptr().offset(), &keys).unwrap();
    assert!(keys.iter().zip(&got).all(|(&k, &g)| g == Some(k ^ 1) || (k == 7 || k == 8)));
    assert_eq!(mirror.art_get(art.ptr().offset(), &[b"", b"k"]).unwrap(), [Some(u64::MAX), Some(u64::MAX)]);
}

/// Every B-link kernel variant gives the same answers on a multi-level tree.
#[test]
fn btree_kernel_variants_agree() {
    const TEST: &str = "btree_kernel_variants_agree";
    let Some(mut mirror) = open(TEST) else { return };
    let mut rng = Rng::new(TEST);
    let engine = common::engine(256 << 20);
    let keys = btree_keys(Order::Shuffled, 100_000, &mut rng);
    let tree = common::transact(&engine, |tx| BTree::named(tx, "t").unwrap());
    for chunk in keys.chunks(10_000) {
        common::transact(&engine, |tx| {
            for &k in chunk {
                tree.insert(tx, k, !k).unwrap();
            }
        });
    }
    let mut prev = Vec::new();
    sync(&mut mirror, &mut prev, image(&engine));
    let mut queries = keys.clone();
    queries.extend((0..50_000).map(|_| rng.next()));
    rng.shuffle(&mut queries);
    let mut image = HeapImage::new(&prev);
    let cpu: Vec<Option<u64>> = queries.iter().map(|&k| tree.get(&mut image, k).unwrap()).collect();
    for k in BTREE_KERNELS {
        mirror.set_btree_kernel(k).unwrap();
        assert_eq!(mirror.btree_get(tree.ptr().offset(), &queries).unwrap(), cpu, "{k}");
        eprintln!("{TEST}: {k}: {} lookups equal", queries.len());
    }
}

// ---- ART ----

#[derive(Clone, Copy, Debug)]
enum ArtKeys {
    Random8,
    Ascending8,
    Gaussian8,
    /// A shared 20-byte prefix, suffixes of 0..12 bytes: nested keys, long compressed paths.
    SharedLong,
    /// Short strings over a tiny alphabet (keys that prefix others, the empty key) plus a few
    /// long keys (past 32 bytes, in overflow leaves) the GPU walks over but never looks up.
    Nested,
}

fn art_keys(kind: ArtKeys, n: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut set = BTreeSet::new();
    let center = rng.next();
    let spread = n as u64;
    let base = rng.below(u64::MAX / 2);
    let shared: Vec<u8> = (0..20).map(|_| rng.next() as u8).collect();
    let mut guard = 0;
    while set.len() < n && guard < 50 * n {
        guard += 1;
        let k: Vec<u8> = match kind {
            ArtKeys::Random8 => rng.next().to_be_bytes().to_vec(),
            ArtKeys::Ascending8 => (base + set.len() as u64).to_be_bytes().to_vec(),
            ArtKeys::Gaussian8 => rng.gaussian(center, spread).to_be_bytes().to_vec(),
            ArtKeys::SharedLong => {
                let cut = if rng.below(8) == 0 { rng.below(21) as usize } else { 20 };
                let mut k = shared[..cut].to_vec();
                let len = rng.below(13) as usize;
                k.extend((0..len).map(|_| b"ab\x00\xff"[rng.below(4) as usize]));
                k
            }
            ArtKeys::Nested => {
                if rng.below(200) == 0 {
                    let len = 33 + rng.below(40) as usize;
                    (0..len).map(|_| b"ab"[rng.below(2) as usize]).collect()
                } else {
                    let len = rng.below(12) as usize;
                    (0..len).map(|_| b"abc\x00"[rng.below(4) as usize]).collect()
                }
            }
        };
        set.insert(k);
    }
    let mut keys: Vec<Vec<u8>> = set.into_iter().collect();
    if !matches!(kind, ArtKeys::Ascending8) {
        rng.shuffle(&mut keys);
    }
    keys
}

fn check_art(mirror: &CudaMirror, tree: Art, img: &[u8], keys: &BTreeSet<Vec<u8>>, rng: &mut Rng, what: &str) {
    let mut image = HeapImage::new(img);
    let meta = tree.ptr().offset();
    let present: Vec<&Vec<u8>> = keys.iter().collect();
    // Lookups: present keys, their neighbours (one byte longer, shorter, last byte changed),
    // prefixes of them, random keys, the empty key.
    let mut queries: Vec<Vec<u8>> = present.iter().filter(|k| k.len() <= GPU_MAX_KEY).map(|k| k.to_vec()).collect();
    for k in present.iter().step_by(3) {
        let mut longer = k.to_vec();
        longer.push(rng.next() as u8);
        queries.push(longer);
        if !k.is_empty() {
            queries.push(k[..k.len() - 1].to_vec());
            queries.push(k[..rng.below(k.len() as u64) as usize].to_vec());
            let mut other = k.to_vec();
            *other.last_mut().unwrap() ^= 1 + rng.below(255) as u8;
            queries.push(other);
        }
    }
    queries.extend((0..1000).map(|_| rng.next().to_be_bytes()[..rng.below(9) as usize].to_vec()));
    queries.push(Vec::new());
    queries.retain(|q| q.len() <= GPU_MAX_KEY);
    rng.shuffle(&mut queries);
    let refs: Vec<&[u8]> = queries.iter().map(|q| q.as_slice()).collect();
    let gpu = mirror.art_get(meta, &refs).unwrap();
    let mut hits = 0;
    for (q, g) in refs.iter().zip(&gpu) {
        let cpu = tree.get(&mut image, q).unwrap();
        assert_eq!(*g, cpu, "{what}: get({q:?})");
        hits += cpu.is_some() as usize;
    }
    // The same lookups at one fixed length take the packed fixed-length path.
    let eight: Vec<&[u8]> = refs.iter().copied().filter(|q| q.len() == 8).collect();
    if !eight.is_empty() {
        let gpu8 = mirror.art_get(meta, &eight).unwrap();
        for (q, g) in eight.iter().zip(&gpu8) {
            assert_eq!(*g, tree.get(&mut image, q).unwrap(), "{what}: get8({q:?})");
        }
    }

    // Prefixes: every prefix of sampled keys (inside compressed paths too), random ones.
    let mut prefixes: BTreeSet<Vec<u8>> = BTreeSet::new();
    for _ in 0..60.min(present.len()) {
        let k = present[rng.below(present.len() as u64) as usize];
        for len in 0..=k.len().min(GPU_MAX_KEY) {
            prefixes.insert(k[..len].to_vec());
        }
        let mut other = k[..k.len().min(GPU_MAX_KEY)].to_vec();
        other.push(rng.next() as u8);
        other.truncate(GPU_MAX_KEY);
        prefixes.insert(other);
    }
    prefixes.extend((0..200).map(|_| rng.next().to_be_bytes()[..1 + rng.below(4) as usize].to_vec()));
    prefixes.extend([vec![], vec![0xFF], vec![0xFF, 0xFF], vec![0]]);
    let prefixes: Vec<Vec<u8>> = prefixes.into_iter().collect();
    let refs: Vec<&[u8]> = prefixes.iter().map(|p| p.as_slice()).collect();
    let gpu = mirror.art_count_sum_prefix(meta, &refs).unwrap();
    for (p, &(n, s)) in refs.iter().zip(&gpu) {
        let cpu = (tree.count_prefix(&mut image, p).unwrap(), tree.sum_prefix(&mut image, p).unwrap());
        assert_eq!((n, s), cpu, "{what}: count/sum prefix {p:?}");
    }
    assert_eq!(gpu[0].0, keys.len() as u64, "{what}: the empty prefix counts every key");
    eprintln!("{what}: {} keys; {} lookups ({hits} hits) and {} prefixes equal", keys.len(), queries.len(), prefixes.len());
}

#[test]
fn art_lookups_and_prefixes_match_the_cpu() {
    const TEST: &str = "art_lookups_and_prefixes_match_the_cpu";
    let Some(mut mirror) = open(TEST) else { return };
    let mut rng = Rng::new(TEST);
    for kind in [ArtKeys::Random8, ArtKeys::Ascending8, ArtKeys::Gaussian8, ArtKeys::SharedLong, ArtKeys::Nested] {
        let engine = common::engine(512 << 20);
        let n = 20_000 + rng.below(10_000) as usize;
        let keys = art_keys(kind, n, &mut rng);
        let tree = common::transact(&engine, |tx| Art::named(tx, "a").unwrap());
        let mut model = BTreeSet::new();
        for chunk in keys.chunks(4_000) {
            common::transact(&engine, |tx| {
                for k in chunk {
                    tree.insert(tx, k, rng.next()).unwrap();
                }
            });
            model.extend(chunk.iter().cloned());
        }
        let mut prev = Vec::new();
        let pages = sync(&mut mirror, &mut prev, image(&engine));
        let what = format!("{kind:?}");
        eprintln!("{what}: first upload {pages} pages");
        check_art(&mirror, tree, &prev, &model, &mut rng, &what);
        // Rounds: remove a third (nodes shrink, N4s collapse), insert fresh keys (grow), update.
        for round in 0..4 {
            let present: Vec<Vec<u8>> = model.iter().cloned().collect();
            let fresh = art_keys(kind, n / 3, &mut rng);
            common::transact(&engine, |tx| {
                for k in present.iter().filter(|_| rng.below(3) == 0) {
                    tree.remove(tx, k).unwrap();
                    model.remove(k);
                }
                for k in &fresh {
                    tree.insert(tx, k, rng.next()).unwrap();
                    model.insert(k.clone());
                }
                for k in present.iter().step_by(11) {
                    if model.contains(k) {
                        tree.insert(tx, k, rng.next()).unwrap();
                    }
                }
            });
            let total = image(&engine).len() as u64 / PAGE_SIZE;
            let pages = sync(&mut mirror, &mut prev, image(&engine));
            eprintln!("{what} round {round}: uploaded {pages} of {total} pages");
            check_art(&mirror, tree, &prev, &model, &mut rng, &format!("{what} round {round}"));
        }
        // A small change sends a few pages only.
        let some: Vec<Vec<u8>> = model.iter().step_by((model.len() / 5).max(1)).take(5).cloned().collect();
        common::transact(&engine, |tx| {
            for k in &some {
                tree.insert(tx, k, rng.next()).unwrap();
            }
        });
        let total = image(&engine).len() as u64 / PAGE_SIZE;
        let pages = sync(&mut mirror, &mut prev, image(&engine));
        assert!(pages <= 16 && pages < total, "{what}: 5 updates sent {pages} of {total} pages");
        check_art(&mirror, tree, &prev, &model, &mut rng, &format!("{what} small round"));
        assert_eq!(common::transact(&engine, |tx| tree.check(tx).unwrap()).keys, model.len() as u64);
    }
}

// ---- timing (device machine) ----

/// A heap on a plain byte vector with a bump allocator: builds the large trees of the timing
/// test without the STM's write sets.
struct PlainHeap {
    bytes: Vec<u8>,
    top: u64,
}

impl PlainHeap {
    fn new() -> PlainHeap {
        PlainHeap { bytes: vec![0; 1 << 20], top: 4096 }
    }
}

impl HeapRead for PlainHeap {
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        let at = off as usize;
        Ok(u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes")))
    }
}

impl HeapWrite for PlainHeap {
    fn store(&mut self, off: u64, value: u64) -> Result<(), TxnError> {
        let at = off as usize;
        self.bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        Ok(())
    }

    fn alloc(&mut self, len: u64) -> Result<u64, TxnError> {
        let at = self.top.next_multiple_of(64);
        self.top = at + len;
        if self.top as usize > self.bytes.len() {
            let want = (self.top as usize).max(self.bytes.len() * 2).next_multiple_of(PAGE_SIZE as usize);
            self.bytes.resize(want, 0);
        }
        Ok(at)
    }
}

fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn sizes(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var).unwrap_or_else(|_| default.into()).split(',').filter_map(|s| s.trim().parse::<usize>().ok()).map(|m| m << 20).collect()
}

#[test]
#[ignore = "times lookups over trees of tens of millions of keys: run on the device machine"]
fn gpu_lookup_timing() {
    const TEST: &str = "gpu_lookup_timing";
    let Some(mut mirror) = open(TEST) else { return };
    let mut rng = Rng::new(TEST);
    let rounds = 7;
    println!("| tree | keys | kernel | kernel ms | G lookups/s | end-to-end ms | G/s end to end |");
    println!("|---|---|---|---|---|---|---|");
    // Nodes as full as a bulk load makes them, or as `TUSK_GPU_FILL` says (random inserts
    // leave them about 0.7 full).
    let fill: f64 = std::env::var("TUSK_GPU_FILL").ok().and_then(|f| f.parse().ok()).unwrap_or(1.0);
    for n in sizes("TUSK_GPU_MKEYS", "16,64") {
        let t = Instant::now();
        let mut heap = PlainHeap::new();
        let tree = BTree::create(&mut heap).unwrap();
        // Distinct keys: mix is a bijection of u64.
        let mut keys: Vec<u64> = (0..n as u64).map(mix).collect();
        keys.sort_unstable();
        tree.bulk_load(&mut heap, keys.iter().map(|&k| (k, k ^ 0xA5A5)), fill).unwrap();
        rng.shuffle(&mut keys);
        let extent = heap.top.next_multiple_of(PAGE_SIZE);
        let img = &heap.bytes[..extent as usize];
        let built = t.elapsed();
        let t = Instant::now();
        mirror.upload(img, std::slice::from_ref(&(0..extent)), extent).unwrap();
        eprintln!("B-link {n} keys, nodes {fill} full: built in {built:.2?}, {} MB uploaded in {:.2?}", extent >> 20, t.elapsed());
        // A sync of 1% of the pages, scattered (every 100th page).
        let runs: Vec<Range<u64>> = (0..extent / PAGE_SIZE).step_by(100).map(|p| p * PAGE_SIZE..(p + 1) * PAGE_SIZE).collect();
        let t = Instant::now();
        mirror.upload(img, &runs, extent).unwrap();
        eprintln!("B-link {n} keys: sync of {} scattered pages ({} MB) in {:.2?}", runs.len(), (runs.len() as u64 * PAGE_SIZE) >> 20, t.elapsed());
        let meta = tree.ptr().offset();
        // Correctness on a sample first.
        let sample = &keys[..keys.len().min(1 << 20)];
        let got = mirror.btree_get(meta, sample).unwrap();
        let mut image = HeapImage::new(img);
        for (k, g) in sample.iter().zip(&got) {
            assert_eq!(*g, tree.get(&mut image, *k).unwrap());
        }
        for _repeat in 0..2 {
            for k in BTREE_KERNELS {
                mirror.set_btree_kernel(k).unwrap();
                let ms = mirror.time_btree_get_kernel(meta, &keys, rounds).unwrap();
                println!("| B-link | {}M | {k} | {ms:.3} | {:.2} | | |", n >> 20, n as f64 / ms / 1e6);
            }
        }
        let best = DEFAULT_BTREE_KERNEL;
        mirror.set_btree_kernel(best).unwrap();
        let timing = mirror.time_btree_get(meta, &keys, 5).unwrap();
        println!(
            "| B-link | {}M | default {best:?} | {:.3} | {:.2} | {:.1} | {:.2} |",
            n >> 20,
            timing.kernel_ms,
            n as f64 / timing.kernel_ms / 1e6,
            timing.end_to_end_ms,
            n as f64 / timing.end_to_end_ms / 1e6
        );
        // Ranges of about 100 keys each.
        let ranges: Vec<(u64, u64)> = keys[..1 << 20].iter().map(|&k| (k, k.saturating_add(u64::MAX / n as u64 * 100))).collect();
        let timing = mirror.time_btree_count_sum(meta, &ranges, 5).unwrap();
        println!(
            "| B-link count/sum (~100 keys) | {}M | warp | {:.3} | {:.3} | {:.1} | {:.3} |",
            n >> 20,
            timing.kernel_ms,
            ranges.len() as f64 / timing.kernel_ms / 1e6,
            timing.end_to_end_ms,
            ranges.len() as f64 / timing.end_to_end_ms / 1e6
        );
    }
    for n in sizes("TUSK_GPU_ART_MKEYS", "16") {
        let t = Instant::now();
        let mut heap = PlainHeap::new();
        let tree = Art::create(&mut heap).unwrap();
        let mut keys: Vec<[u8; 8]> = (0..n as u64).map(|i| mix(i ^ 0x1234_5678).to_be_bytes()).collect();
        keys.sort_unstable();
        for (i, k) in keys.iter().enumerate() {
            tree.insert(&mut heap, k, i as u64).unwrap();
        }
        rng.shuffle(&mut keys);
        let extent = heap.top.next_multiple_of(PAGE_SIZE);
        let img = &heap.bytes[..extent as usize];
        let built = t.elapsed();
        mirror.upload(img, std::slice::from_ref(&(0..extent)), extent).unwrap();
        eprintln!("ART {n} keys: built in {built:.2?}, {} MB", extent >> 20);
        let meta = tree.ptr().offset();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let sample = &refs[..refs.len().min(1 << 20)];
        let got = mirror.art_get(meta, sample).unwrap();
        let mut image = HeapImage::new(img);
        for (k, g) in sample.iter().zip(&got) {
            assert_eq!(*g, tree.get(&mut image, k).unwrap());
        }
        for spec in [false, true] {
            mirror.set_art_speculation(spec);
            let ms = mirror.time_art_get_kernel(meta, &refs, rounds).unwrap();
            println!("| ART 8-byte | {}M | thread{} | {ms:.3} | {:.2} | | |", n >> 20, if spec { "+speculative child" } else { "" }, n as f64 / ms / 1e6);
        }
        mirror.set_art_speculation(true);
        let timing = mirror.time_art_get(meta, &refs, 5).unwrap();
        println!(
            "| ART 8-byte | {}M | default | {:.3} | {:.2} | {:.1} | {:.2} |",
            n >> 20,
            timing.kernel_ms,
            n as f64 / timing.kernel_ms / 1e6,
            timing.end_to_end_ms,
            n as f64 / timing.end_to_end_ms / 1e6
        );
        let prefixes: Vec<&[u8]> = refs[..1 << 16].iter().map(|k| &k[..5]).collect();
        let timing = mirror.time_art_count_sum_prefix(meta, &prefixes, 5).unwrap();
        println!(
            "| ART prefix count/sum (5 of 8 bytes) | {}M | warp | {:.3} | {:.3} | {:.1} | {:.3} |",
            n >> 20,
            timing.kernel_ms,
            prefixes.len() as f64 / timing.kernel_ms / 1e6,
            timing.end_to_end_ms,
            prefixes.len() as f64 / timing.end_to_end_ms / 1e6
        );
    }
}
