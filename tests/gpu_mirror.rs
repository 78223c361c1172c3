//! The GPU mirror through the public API: answers equal the trees (BTreeMap models of what
//! was committed) at the mirror's LSN, for fresh random keys of every order and after rounds
//! of batch updates and syncs. The tests run on whatever backend `GpuOptions::default()`
//! finds — the CUDA kernels on the device machine, the CPU engine elsewhere — and say which;
//! the test that needs a GPU prints why it was skipped where there is none.

mod common;

use std::collections::BTreeMap;

use common::small_opts;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{BTreeOp, Commit, Error, GpuBackend, GpuDevices, GpuMirror, GpuOptions, MirrorContents, Options, Store};

fn opts() -> Options {
    Options { heap_capacity: 256 << 20, checkpoint_interval: None, ..small_opts() }
}

#[derive(Clone, Copy, Debug)]
enum Order {
    Shuffled,
    Ascending,
    Dense,
}

fn keys(order: Order, n: usize, rng: &mut SmallRng) -> Vec<u64> {
    match order {
        Order::Shuffled => (0..n).map(|_| rng.random()).collect(),
        Order::Ascending => {
            let mut k: Vec<u64> = (0..n).map(|_| rng.random()).collect();
            k.sort_unstable();
            k
        }
        // A dense band with repeats, around the middle of the key space.
        Order::Dense => (0..n).map(|_| (1u64 << 63) + rng.random_range(0..n as u64 / 2)).collect(),
    }
}

/// ART keys: 8-byte big-endian numbers, short strings that prefix each other, and long keys
/// (over the kernels' 32 bytes) that share long prefixes.
fn art_keys(n: usize, rng: &mut SmallRng) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| match i % 4 {
            0 | 1 => rng.random::<u64>().to_be_bytes().to_vec(),
            2 => format!("user/{}", rng.random_range(0..n / 2)).into_bytes(),
            _ => format!("tenant/{:03}/a-rather-long-shared-path/item-{}", rng.random_range(0..8), rng.random_range(0..n)).into_bytes(),
        })
        .collect()
}

struct Models {
    orders: BTreeMap<u64, u64>,
    users: BTreeMap<Vec<u8>, u64>,
}

fn check_mirror(mirror: &GpuMirror, models: &Models, rng: &mut SmallRng, what: &str) {
    let orders = mirror.btree("orders").unwrap();
    let present: Vec<u64> = models.orders.keys().copied().collect();
    let mut probe: Vec<u64> = (0..2000).map(|_| present[rng.random_range(0..present.len())]).collect();
    probe.extend((0..2000).map(|_| rng.random::<u64>()));
    probe.extend([0, u64::MAX, 1 << 63]);
    let got = orders.get_batch(&probe).unwrap();
    assert_eq!(got.lsn, mirror.lsn());
    let expected: Vec<Option<u64>> = probe.iter().map(|k| models.orders.get(k).copied()).collect();
    assert_eq!(got.values, expected, "{what}: B-link lookups on {}", mirror.backend());

    let mut ranges: Vec<(u64, u64)> = (0..500)
        .map(|_| {
            let a = present[rng.random_range(0..present.len())];
            let b = present[rng.random_range(0..present.len())];
            (a.min(b), a.max(b))
        })
        .collect();
    ranges.extend([(0, u64::MAX), (5, 4), (present[0], present[0]), (u64::MAX, u64::MAX), (0, 0)]);
    let got = orders.count_sum_batch(&ranges).unwrap();
    let expected: Vec<(u64, u128)> = ranges
        .iter()
        .map(|&(lo, hi)| {
            if lo > hi {
                return (0, 0);
            }
            let r = models.orders.range(lo..=hi);
            (r.clone().count() as u64, r.map(|(_, v)| *v as u128).sum())
        })
        .collect();
    assert_eq!(got.values, expected, "{what}: B-link count/sum on {}", mirror.backend());

    let users = mirror.art("users").unwrap();
    let stored: Vec<&Vec<u8>> = models.users.keys().collect();
    let mut probe: Vec<Vec<u8>> = (0..2000).map(|_| stored[rng.random_range(0..stored.len())].clone()).collect();
    probe.extend(art_keys(1000, rng));
    probe.extend([Vec::new(), b"user/".to_vec(), b"tenant/001/a-rather-long-shared-path/".to_vec()]);
    let refs: Vec<&[u8]> = probe.iter().map(Vec::as_slice).collect();
    let got = users.get_batch(&refs).unwrap();
    let expected: Vec<Option<u64>> = probe.iter().map(|k| models.users.get(k).copied()).collect();
    assert_eq!(got.values, expected, "{what}: ART lookups on {}", mirror.backend());

    let mut prefixes: Vec<Vec<u8>> = vec![Vec::new(), b"user/".to_vec(), b"user/1".to_vec(), b"tenant/".to_vec(), b"tenant/003/a-rather-long-shared-path/item-".to_vec(), b"zzz".to_vec()];
    prefixes.extend((0..200).map(|_| {
        let k = stored[rng.random_range(0..stored.len())];
        k[..rng.random_range(0..=k.len())].to_vec()
    }));
    let refs: Vec<&[u8]> = prefixes.iter().map(Vec::as_slice).collect();
    let got = users.count_prefix_batch(&refs).unwrap();
    let expected: Vec<(u64, u128)> = prefixes
        .iter()
        .map(|p| {
            let m = models.users.iter().filter(|(k, _)| k.starts_with(p));
            (m.clone().count() as u64, m.map(|(_, v)| *v as u128).sum())
        })
        .collect();
    assert_eq!(got.values, expected, "{what}: ART prefix count/sum on {}", mirror.backend());
}

/// Commits `ops` to "orders" and inserts of `art` keys (value `round`) to "users" in one
/// transaction, with `more` run in it too, and applies them to the models.
fn commit_round(store: &Store, models: &mut Models, ops: &[BTreeOp], art: &[Vec<u8>], round: u64, mut more: impl FnMut(&mut tusk::Transaction<'_>) -> Result<(), Error>) {
    store
        .transact(Commit::Async, |tx| {
            tx.btree("orders")?.apply_batch(ops)?;
            let mut users = tx.art("users")?;
            for k in art {
                users.insert(k, round)?;
            }
            more(tx)
        })
        .unwrap();
    for op in ops {
        models.orders.insert(op.key(), round);
    }
    for k in art {
        models.users.insert(k.clone(), round);
    }
}

fn load(store: &Store, order: Order, rng: &mut SmallRng) -> Models {
    let mut models = Models { orders: BTreeMap::new(), users: BTreeMap::new() };
    for chunk in keys(order, 30_000, rng).chunks(2000) {
        let ops: Vec<BTreeOp> = chunk.iter().map(|&k| BTreeOp::Upsert { key: k, value: k.rotate_left(7) }).collect();
        store.transact(Commit::Async, |tx| tx.btree("orders")?.apply_batch(&ops).map(|_| ())).unwrap();
        models.orders.extend(chunk.iter().map(|&k| (k, k.rotate_left(7))));
    }
    for chunk in art_keys(20_000, rng).chunks(1000) {
        store
            .transact(Commit::Async, |tx| {
                let mut users = tx.art("users")?;
                for (i, k) in chunk.iter().enumerate() {
                    users.insert(k, k.len() as u64 * 1000 + i as u64)?;
                }
                Ok(())
            })
            .unwrap();
        for (i, k) in chunk.iter().enumerate() {
            models.users.insert(k.clone(), k.len() as u64 * 1000 + i as u64);
        }
    }
    models
}

#[test]
fn mirror_answers_equal_the_trees_for_every_key_order() {
    for (seed, order) in [Order::Shuffled, Order::Ascending, Order::Dense].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts()).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed as u64);
        let models = load(&store, order, &mut rng);
        let mirror = store.gpu_mirror(GpuOptions::default()).unwrap();
        eprintln!("mirror backend: {}", mirror.backend());
        assert_eq!(mirror.lsn(), store.last_lsn());
        check_mirror(&mirror, &models, &mut rng, &format!("{order:?}"));
    }
}

/// Rounds of batch updates that split and merge B-link nodes and grow and shrink ART nodes,
/// each followed by a sync that copies only dirty pages; the mirror equals the models after
/// each, and never shows a commit after its LSN.
#[test]
fn syncs_after_batch_updates_keep_the_mirror_equal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut rng = SmallRng::seed_from_u64(77);
    let mut models = load(&store, Order::Shuffled, &mut rng);
    let mut mirror = store.gpu_mirror(GpuOptions::default()).unwrap();
    let extent_pages = store.heap_used().div_ceil(4096);
    for round in 0..8 {
        // Removes of a third of the keys in some rounds (merges), inserts in others (splits).
        let present: Vec<u64> = models.orders.keys().copied().collect();
        let ops: Vec<BTreeOp> = (0..3000)
            .map(|_| {
                if round % 2 == 1 {
                    BTreeOp::Remove { key: present[rng.random_range(0..present.len())] }
                } else {
                    let k = rng.random::<u64>();
                    BTreeOp::Upsert { key: k, value: round }
                }
            })
            .collect();
        let stored: Vec<Vec<u8>> = models.users.keys().cloned().collect();
        let art_removes: Vec<Vec<u8>> = (0..1500).map(|_| stored[rng.random_range(0..stored.len())].clone()).collect();
        let art_inserts = art_keys(1500, &mut rng);
        store
            .transact(Commit::Async, |tx| {
                tx.btree("orders")?.apply_batch(&ops)?;
                let mut users = tx.art("users")?;
                for k in &art_removes {
                    users.remove(k)?;
                }
                for k in &art_inserts {
                    users.insert(k, round)?;
                }
                Ok(())
            })
            .unwrap();
        // The mirror still answers at its old LSN.
        let before = mirror.lsn();
        let probe: Vec<u64> = ops.iter().map(|o| o.key()).take(50).collect();
        let old: Vec<Option<u64>> = probe.iter().map(|k| models.orders.get(k).copied()).collect();
        assert_eq!(mirror.btree("orders").unwrap().get_batch(&probe).unwrap().values, old, "a commit after the mirror's LSN showed");
        for op in &ops {
            match *op {
                BTreeOp::Upsert { key, value } => models.orders.insert(key, value),
                BTreeOp::Remove { key } => models.orders.remove(&key),
            };
        }
        for k in &art_removes {
            models.users.remove(k);
        }
        for k in &art_inserts {
            models.users.insert(k.clone(), round);
        }
        let report = mirror.sync().unwrap();
        assert!(report.lsn > before && report.lsn == store.last_lsn());
        assert!(report.pages < extent_pages, "round {round}: a sync copied {} of {extent_pages} pages", report.pages);
        check_mirror(&mirror, &models, &mut rng, &format!("round {round}"));
    }
}

#[test]
fn the_cuda_backend_runs_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    match store.gpu_mirror(GpuOptions { backend: GpuBackend::Cuda, ..GpuOptions::default() }) {
        Ok(mirror) => {
            assert!(mirror.on_gpu());
            assert!(mirror.backend().starts_with("cuda"), "{}", mirror.backend());
            eprintln!("GPU present: {}", mirror.backend());
        }
        Err(Error::GpuUnavailable(why)) => {
            eprintln!("SKIPPED the CUDA backend test: no usable GPU here ({why})");
            let auto = store.gpu_mirror(GpuOptions::default()).unwrap();
            assert!(!auto.on_gpu());
            assert!(auto.backend().starts_with("cpu") && auto.backend().contains("no GPU"), "the CPU fallback says why: {}", auto.backend());
        }
        Err(e) => panic!("a missing GPU must be GpuUnavailable, got {e}"),
    }
    let cpu = store.gpu_mirror(GpuOptions { backend: GpuBackend::Cpu, ..GpuOptions::default() }).unwrap();
    assert!(!cpu.on_gpu() && cpu.backend().starts_with("cpu"));
}

#[test]
fn missing_roots_and_wrong_kinds_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.transact(Commit::Sync, |tx| tx.btree("orders").map(|_| ())).unwrap();
    let mirror = store.gpu_mirror(GpuOptions::default()).unwrap();
    assert!(matches!(mirror.btree("nothing"), Err(Error::NoSuchRoot(_))));
    assert!(matches!(mirror.art("orders"), Err(Error::NotAnIndex { .. })));
    let empty = mirror.btree("orders").unwrap();
    assert_eq!(empty.get_batch(&[1, 2]).unwrap().values, vec![None, None]);
    assert_eq!(empty.count_sum_batch(&[(0, u64::MAX)]).unwrap().values, vec![(0, 0)]);
    assert_eq!(empty.get_batch(&[]).unwrap().values, Vec::<Option<u64>>::new());
}

/// Batches into caller buffers answer exactly as the models say, batch after batch on the
/// same buffers (made once), across syncs, and with buffers made by a mirror of the other
/// backend; answers always belong to the last batch.
#[test]
fn caller_buffers_answer_as_the_trees_across_batches_and_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut rng = SmallRng::seed_from_u64(91);
    let mut models = load(&store, Order::Shuffled, &mut rng);
    let mut mirror = store.gpu_mirror(GpuOptions::default()).unwrap();
    let cpu = store.gpu_mirror(GpuOptions { backend: GpuBackend::Cpu, ..GpuOptions::default() }).unwrap();
    // More lookups than one device chunk (1 M) where there is a GPU, so that chunks overlap.
    let lookups = if mirror.on_gpu() { 2_500_000 } else { 20_000 };
    let mut batch = mirror.lookup_buffers(lookups).unwrap();
    let mut ranges = mirror.range_buffers(3000).unwrap();
    let key_len = 9; // "user/NNNN": not a whole number of words
    let mut art = mirror.art_lookup_buffers(4000, key_len).unwrap();
    let mut art8 = cpu.art_lookup_buffers(4000, 8).unwrap();
    for round in 0..3u64 {
        let present: Vec<u64> = models.orders.keys().copied().collect();
        let n = lookups - round as usize * 7; // a different length each round
        batch.set_len(n);
        for (i, k) in batch.keys_mut().iter_mut().enumerate() {
            *k = if i % 2 == 0 { present[rng.random_range(0..present.len())] } else { rng.random() };
        }
        assert!(batch.values().is_empty(), "new keys, no answers yet");
        let lsn = mirror.btree("orders").unwrap().get_into(&mut batch).unwrap();
        assert_eq!(lsn, mirror.lsn());
        let expected: Vec<Option<u64>> = batch.keys().iter().map(|k| models.orders.get(k).copied()).collect();
        assert!(batch.answers().eq(expected.iter().copied()), "round {round}: B-link lookups into buffers on {}", mirror.backend());
        assert_eq!(batch.found_bits().len(), n.div_ceil(64));
        assert!(batch.values().iter().zip(&expected).all(|(v, e)| *v == e.unwrap_or(0)));

        let wanted: Vec<(u64, u64)> = (0..2999)
            .map(|i| {
                let (a, b) = (present[rng.random_range(0..present.len())], present[rng.random_range(0..present.len())]);
                if i == 0 { (5, 4) } else { (a.min(b), a.max(b)) }
            })
            .collect();
        ranges.load_ranges(&wanted);
        mirror.btree("orders").unwrap().count_sum_into(&mut ranges).unwrap();
        let expected: Vec<(u64, u128)> = wanted
            .iter()
            .map(|&(lo, hi)| if lo > hi { (0, 0) } else { models.orders.range(lo..=hi).fold((0, 0), |(c, s), (_, v)| (c + 1, s + *v as u128)) })
            .collect();
        assert!(ranges.answers().eq(expected.iter().copied()), "round {round}: count/sum into buffers on {}", mirror.backend());

        let fixed: Vec<Vec<u8>> = models.users.keys().filter(|k| k.len() == key_len).cloned().collect();
        let mut probe: Vec<Vec<u8>> = (0..3000).map(|_| fixed[rng.random_range(0..fixed.len())].clone()).collect();
        probe.extend((0..1000).map(|i| format!("user/{:04}", 9000 + i).into_bytes()));
        art.load_keys(&probe);
        assert_eq!(art.key(3000), b"user/9000");
        mirror.art("users").unwrap().get_into(&mut art).unwrap();
        let expected: Vec<Option<u64>> = probe.iter().map(|k| models.users.get(k).copied()).collect();
        assert!(art.answers().eq(expected.iter().copied()), "round {round}: ART lookups into buffers on {}", mirror.backend());

        // Buffers of the CPU backend, used with this mirror: the general path answers.
        let eight: Vec<Vec<u8>> = models.users.keys().filter(|k| k.len() == 8).take(2000).cloned().collect();
        art8.load_keys(&eight);
        mirror.art("users").unwrap().get_into(&mut art8).unwrap();
        assert!(art8.answers().eq(eight.iter().map(|k| models.users.get(k).copied())), "round {round}: CPU buffers on {}", mirror.backend());

        // Commits, then a sync: the same buffers see them.
        let ops: Vec<BTreeOp> = (0..2000).map(|_| BTreeOp::Upsert { key: rng.random(), value: round }).collect();
        store.transact(Commit::Async, |tx| tx.btree("orders")?.apply_batch(&ops).map(|_| ())).unwrap();
        for op in &ops {
            models.orders.insert(op.key(), round);
        }
        mirror.sync().unwrap();
    }
    // More ranges than one device chunk: a range batch past its first chunk once addressed the
    // lookups' found flags, which range batches have none of, and panicked.
    let many = if mirror.on_gpu() { 2_200_000 } else { 5_000 };
    let present: Vec<u64> = models.orders.keys().copied().collect();
    let narrow: Vec<(u64, u64)> = (0..many)
        .map(|_| {
            let k = present[rng.random_range(0..present.len())];
            (k, k.saturating_add(1 << 40))
        })
        .collect();
    let mut big = mirror.range_buffers(many).unwrap();
    big.load_ranges(&narrow);
    mirror.btree("orders").unwrap().count_sum_into(&mut big).unwrap();
    let expected = narrow.iter().map(|&(lo, hi)| models.orders.range(lo..=hi).fold((0, 0), |(c, s), (_, v)| (c + 1, s + *v as u128)));
    assert!(big.answers().eq(expected), "{many} ranges into buffers on {}", mirror.backend());
    assert!(matches!(mirror.art_lookup_buffers(10, 0), Err(Error::Gpu(_))), "0-byte keys");
    assert!(matches!(mirror.art_lookup_buffers(10, 33), Err(Error::Gpu(_))), "keys longer than the kernels take");
    let mut empty = mirror.lookup_buffers(0).unwrap();
    mirror.btree("orders").unwrap().get_into(&mut empty).unwrap();
    assert_eq!(empty.answers().len(), 0);
}

/// A sync that fails leaves the mirror refusing queries (its image and device could hold a
/// mix of states) with an error that says so, rather than answering from a torn copy.
#[test]
fn a_failed_sync_refuses_queries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    store.transact(Commit::Sync, |tx| tx.btree("orders")?.insert(1, 10).map(|_| ())).unwrap();
    let mut mirror = store.gpu_mirror(GpuOptions::default()).unwrap();
    let mut batch = mirror.lookup_buffers(4).unwrap();
    batch.load_keys(&[1, 2]);
    assert_eq!(mirror.btree("orders").unwrap().get_batch(&[1]).unwrap().values, vec![Some(10)]);
    store.close().unwrap();
    assert!(mirror.sync().is_err(), "a sync of a closed store fails");
    let orders = mirror.btree("orders").unwrap();
    for e in [orders.get_batch(&[1]).err(), orders.get_into(&mut batch).err(), orders.count_sum_batch(&[(0, 9)]).err()] {
        match e {
            Some(Error::Gpu(why)) => assert!(why.contains("last sync failed"), "{why}"),
            other => panic!("queries after a failed sync must be refused, got {other:?}"),
        }
    }
}

/// Syncs while a writer commits: pages written during a sync's open pass are copied (and, on
/// the GPU, uploaded) twice, and the device must end with the second, consistent copy. After
/// each sync the device answers exactly as the CPU engine over the host image at the same LSN,
/// for every key the tree may hold.
#[test]
fn syncs_beside_a_writer_leave_the_device_equal_to_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let keys: Vec<u64> = (0..200_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    store.transact(Commit::Async, |tx| tx.btree("orders")?.bulk_load(sorted.iter().map(|&k| (k, 0)), 0.7)).unwrap();
    let mut mirror = store.gpu_mirror(GpuOptions::default()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut rng = SmallRng::seed_from_u64(5);
            let mut round = 1u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ops: Vec<BTreeOp> = (0..4000).map(|_| BTreeOp::Upsert { key: keys[rng.random_range(0..keys.len())], value: round }).collect();
                store.transact(Commit::Async, |tx| tx.btree("orders")?.apply_batch(&ops).map(|_| ())).unwrap();
                round += 1;
            }
            round
        });
        let mut last = 0;
        for _ in 0..12 {
            let report = mirror.sync().unwrap();
            assert!(report.lsn >= last);
            last = report.lsn;
            let meta = mirror.btree("orders").unwrap().ptr().offset();
            let device = mirror.btree("orders").unwrap().get_batch(&keys).unwrap().values;
            let image = mirror.inner().cpu().btree_get(meta, &keys).unwrap();
            assert!(device == image, "after a sync to LSN {} on {}, the device differs from the image", report.lsn, mirror.backend());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(writer.join().unwrap() > 12, "the writer committed beside the syncs");
    });
}

/// A mirror on every GPU of the host answers as the trees do: batches cut across the devices
/// (sizes that leave a device a partial or an empty slice included), caller buffers, and
/// after syncs, when every replica must have followed. Where the host has fewer than two
/// GPUs this checks the same answers on what it has and says so.
#[test]
fn every_gpu_of_the_host_answers_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut rng = SmallRng::seed_from_u64(123);
    let mut models = load(&store, Order::Shuffled, &mut rng);
    let mut mirror = store.gpu_mirror(GpuOptions { devices: GpuDevices::All, ..GpuOptions::default() }).unwrap();
    let gpus = mirror.inner().devices().map_or(0, |d| d.len());
    if gpus < 2 {
        eprintln!("SKIPPED the several-GPU split: {gpus} GPUs here ({}); checking answers on what there is", mirror.backend());
    }
    let mut buffers = mirror.lookup_buffers(70_000).unwrap();
    // Three devices cut 200 queries 128 + 72 + 0 but 190 queries 64 + 64 + 62: every queue
    // must hold the longest slice of any batch that fits the buffers.
    let three = store.gpu_mirror(GpuOptions { devices: GpuDevices::List(vec![0, 1, 2]), ..GpuOptions::default() }).unwrap();
    let mut small = three.lookup_buffers(200).unwrap();
    let present: Vec<u64> = models.orders.keys().copied().collect();
    for n in [190, 200, 130, 0, 62] {
        let keys: Vec<u64> = present[..n].to_vec();
        small.load_keys(&keys);
        three.btree("orders").unwrap().get_into(&mut small).unwrap();
        assert!(small.answers().eq(keys.iter().map(|k| models.orders.get(k).copied())), "{n} lookups on {}", three.backend());
    }
    drop(three);
    // Large batches from several threads at once: one takes the mirror's scratch buffers, the
    // others the chunked path; every answer is the model's.
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (mirror, models, present) = (&mirror, &models, &present);
            s.spawn(move || {
                let keys: Vec<u64> = (0..70_000u64).map(|i| present[((i * 7919 + t * 104_729) % present.len() as u64) as usize] ^ (i % 5 == 0) as u64).collect();
                let got = mirror.btree("orders").unwrap().get_batch(&keys).unwrap().values;
                assert!(got.iter().zip(&keys).all(|(g, k)| *g == models.orders.get(k).copied()), "thread {t}: lookups beside other threads' batches");
            });
        }
    });
    for round in 0..3u64 {
        let present: Vec<u64> = models.orders.keys().copied().collect();
        for n in [0, 1, 63, 65, 129, 10_001, 70_000] {
            let keys: Vec<u64> = (0..n).map(|i| if i % 3 == 0 { rng.random() } else { present[rng.random_range(0..present.len())] }).collect();
            let expected: Vec<Option<u64>> = keys.iter().map(|k| models.orders.get(k).copied()).collect();
            let orders = mirror.btree("orders").unwrap();
            assert_eq!(orders.get_batch(&keys).unwrap().values, expected, "round {round}: {n} lookups on {}", mirror.backend());
            buffers.load_keys(&keys);
            orders.get_into(&mut buffers).unwrap();
            assert!(buffers.answers().eq(expected.iter().copied()), "round {round}: {n} lookups into buffers on {}", mirror.backend());
        }
        check_mirror(&mirror, &models, &mut rng, &format!("every GPU, round {round}"));
        let ops: Vec<BTreeOp> = (0..5000).map(|_| BTreeOp::Upsert { key: rng.random(), value: round }).collect();
        store.transact(Commit::Async, |tx| tx.btree("orders")?.apply_batch(&ops).map(|_| ())).unwrap();
        for op in &ops {
            models.orders.insert(op.key(), round);
        }
        mirror.sync().unwrap();
    }
}

/// The index-only mirror (`MirrorContents::Indexes`): a heap of mostly records, more than 8x
/// the device-memory limit, whose indexes fit under it. The whole-heap mirror under the same
/// limit is refused with `GpuOverLimit`; the index-only one answers as the models after rounds
/// of updates and syncs, after a tree is dropped (its pages given back) and another made.
/// Without a GPU the CPU engine answers (it has no device memory to limit) and the device
/// part says it was skipped.
#[test]
fn an_index_only_mirror_answers_for_a_heap_far_beyond_its_device_limit() {
    const LIMIT: u64 = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut rng = SmallRng::seed_from_u64(808);
    let mut models = load(&store, Order::Shuffled, &mut rng);
    // Records: most of the heap, between the trees' chunks.
    let mut records = Vec::new();
    while store.heap_used() < 9 * LIMIT {
        store
            .transact(Commit::Async, |tx| {
                for _ in 0..64 {
                    let p = tx.alloc(1024 + rng.random_range(0..8192))?;
                    tx.write_u64(p, 0xfeed)?;
                    records.push(p);
                }
                let k: u64 = rng.random();
                tx.btree("orders")?.insert(k, 1)?;
                models.orders.insert(k, 1);
                Ok(())
            })
            .unwrap();
    }
    // Every GPU of the host, each with a replica of the index pages (one GPU: the same).
    let options = GpuOptions { contents: MirrorContents::Indexes, device_memory_limit: Some(LIMIT), devices: GpuDevices::All, ..GpuOptions::default() };
    let mut mirror = store.gpu_mirror(options.clone()).unwrap();
    eprintln!("index-only mirror: {} on {} GPUs; heap {} MiB", mirror.backend(), mirror.inner().devices().map_or(0, |d| d.len()), store.heap_used() >> 20);
    check_mirror(&mirror, &models, &mut rng, "index-only, first sync");
    let Some(pages) = mirror.inner().index_pages() else {
        eprintln!("SKIPPED the device part: {} (the CPU engine has no device memory to limit)", mirror.backend());
        return;
    };
    let held = pages.mirrored_bytes(0);
    assert!(held + 4 * pages.table(0).len() as u64 <= LIMIT && store.heap_used() >= 8 * LIMIT, "{held} bytes of index pages for a heap of {}", store.heap_used());
    match store.gpu_mirror(GpuOptions { contents: MirrorContents::WholeHeap, ..options.clone() }) {
        Err(Error::GpuOverLimit { bytes, limit }) => assert!(bytes > limit && limit == LIMIT),
        Err(e) => panic!("the whole heap over the limit: {e}"),
        Ok(_) => panic!("a whole-heap mirror of {} bytes under a limit of {LIMIT}", store.heap_used()),
    }
    for round in 0..4u64 {
        let ops: Vec<BTreeOp> = (0..3000).map(|_| BTreeOp::Upsert { key: rng.random(), value: round }).collect();
        let art_inserts = art_keys(1500, &mut rng);
        commit_round(&store, &mut models, &ops, &art_inserts, round, |tx| {
            for p in records.drain(..records.len().min(50)) {
                tx.free(p)?;
            }
            Ok(())
        });
        let report = mirror.sync().unwrap();
        assert!(report.uploaded < store.heap_used() / 4, "round {round}: a sync uploaded {} bytes", report.uploaded);
        check_mirror(&mirror, &models, &mut rng, &format!("index-only, round {round}"));
    }
    // Drop the ART, then make another under the same name: the old pages go back, the new
    // tree's come.
    let before = mirror.inner().index_pages().unwrap().mirrored_bytes(0);
    store.transact(Commit::Async, |tx| tx.remove_root("users").map(|_| ())).unwrap();
    mirror.sync().unwrap();
    assert!(mirror.inner().index_pages().unwrap().mirrored_bytes(0) < before, "the dropped tree's pages are given back");
    assert!(matches!(mirror.art("users"), Err(Error::NoSuchRoot(_))));
    models.users.clear();
    let fresh = art_keys(4000, &mut rng);
    store
        .transact(Commit::Async, |tx| {
            let mut users = tx.art("users")?;
            for (i, k) in fresh.iter().enumerate() {
                users.insert(k, i as u64)?;
            }
            Ok(())
        })
        .unwrap();
    for (i, k) in fresh.iter().enumerate() {
        models.users.insert(k.clone(), i as u64);
    }
    mirror.sync().unwrap();
    check_mirror(&mirror, &models, &mut rng, "index-only, a new tree in a dropped one's place");
}

/// An index-only mirror on every GPU under a limit that holds either tree but not both: the
/// trees are sharded (no GPU holds both; on more than two GPUs the first tree keeps replicas
/// on the others) and every answer is still the models', through `get_batch`
/// and through caller buffers larger than one GPU's share, across syncs. On one GPU the same
/// limit cannot hold both trees: `GpuOverLimit`, and the sharding part says it was skipped.
#[test]
fn a_sharded_index_mirror_answers_when_the_indexes_exceed_one_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), opts()).unwrap();
    let mut rng = SmallRng::seed_from_u64(909);
    let mut models = load(&store, Order::Shuffled, &mut rng);
    let free = GpuOptions { contents: MirrorContents::Indexes, devices: GpuDevices::All, ..GpuOptions::default() };
    let (limit, orders_meta, users_meta) = {
        let probe = store.gpu_mirror(free.clone()).unwrap();
        let Some(pages) = probe.inner().index_pages() else {
            eprintln!("SKIPPED: {} (no device memory to shard)", probe.backend());
            return;
        };
        let (o, u) = (probe.btree("orders").unwrap().ptr().offset(), probe.art("users").unwrap().ptr().offset());
        let (ob, ub, table) = (pages.tree_bytes(o), pages.tree_bytes(u), 4 * pages.table(0).len() as u64);
        (ob.max(ub) + table + (64 << 10), o, u)
    };
    let gpus = store.gpu_mirror(free.clone()).unwrap().inner().devices().map_or(0, |d| d.len());
    let sharded = GpuOptions { device_memory_limit: Some(limit), ..free };
    if gpus < 2 {
        match store.gpu_mirror(sharded) {
            Err(Error::GpuOverLimit { limit: l, .. }) => assert_eq!(l, limit),
            Err(e) => panic!("two trees over one GPU's limit: {e}"),
            Ok(_) => panic!("two trees under a limit that holds one"),
        }
        eprintln!("SKIPPED the sharding: {gpus} GPU here; both trees over its limit are GpuOverLimit");
        return;
    }
    let mut mirror = store.gpu_mirror(sharded).unwrap();
    let pages = mirror.inner().index_pages().unwrap();
    let (ho, hu) = (pages.holders(orders_meta).to_vec(), pages.holders(users_meta).to_vec());
    eprintln!("sharded on {gpus} GPUs: B-link tree on {ho:?}, ART on {hu:?}");
    assert!(!ho.is_empty() && !hu.is_empty() && ho.iter().all(|d| !hu.contains(d)), "no GPU holds both trees: {ho:?}, {hu:?}");
    let mut buffers = mirror.lookup_buffers(70_000).unwrap();
    for round in 0..3u64 {
        check_mirror(&mirror, &models, &mut rng, &format!("sharded, round {round}"));
        let present: Vec<u64> = models.orders.keys().copied().collect();
        let keys: Vec<u64> = (0..70_000).map(|i| if i % 4 == 0 { rng.random() } else { present[rng.random_range(0..present.len())] }).collect();
        buffers.load_keys(&keys);
        mirror.btree("orders").unwrap().get_into(&mut buffers).unwrap();
        assert!(buffers.answers().eq(keys.iter().map(|k| models.orders.get(k).copied())), "round {round}: 70,000 lookups into buffers on one GPU of {gpus}");
        // Updates that do not grow the trees: new values for present keys.
        let ops: Vec<BTreeOp> = present.iter().take(2000).map(|&k| BTreeOp::Upsert { key: k, value: round }).collect();
        let stored: Vec<Vec<u8>> = models.users.keys().take(500).cloned().collect();
        commit_round(&store, &mut models, &ops, &stored, round, |_| Ok(()));
        mirror.sync().unwrap();
    }
    check_mirror(&mirror, &models, &mut rng, "sharded, after the last sync");
}
