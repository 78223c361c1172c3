//! Reopening on demand (`HeapLoad::OnDemand`, issue 32): the heap a store reopens with reads
//! each chunk of the checkpoint when first used. It must hold exactly what a whole load
//! holds, after a close and after a crash; a damaged image met while opening falls back as a
//! whole load does, and one met later fails only the accesses of its chunk; the checkpointer,
//! snapshots and writers work while chunks are still absent.

mod common;

use std::path::Path;

use tusk::{Commit, Error, FileKind, HeapLoad, HeapPtr, Options, SnapshotMode, Store};

const CHUNK: u64 = 64 << 10;
/// 4 MiB of data: 64 chunks.
const WORDS: u64 = 512 * 1024;

fn options(load: HeapLoad, background: bool) -> Options {
    Options {
        heap_capacity: 64 << 20,
        chunk_size: CHUNK,
        segment_bytes: 1 << 20,
        checkpoint_interval: None,
        heap_load: load,
        load_in_background: background,
        ..Options::default()
    }
}

fn fill(store: &Store, p: HeapPtr, words: std::ops::Range<u64>, f: impl Fn(u64) -> u64) {
    common::fill_words(store, p, words, 4096, f)
}

fn read_all(store: &Store) -> Vec<u64> {
    store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("root");
            (0..WORDS).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<_>, _>>()
        })
        .unwrap()
        .0
}

fn expected(i: u64) -> u64 {
    if i % 1000 == 7 {
        i ^ 0xABCD
    } else {
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// A store with a checkpoint of every word and a log tail after it that rewrote some.
fn store_with_tail(dir: &Path) -> (Store, HeapPtr) {
    let store = Store::open(dir, options(HeapLoad::Whole, true)).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    fill(&store, p, 0..WORDS, |i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    store.checkpoint().unwrap();
    store
        .transact(Commit::Sync, |tx| {
            for i in (7..WORDS).step_by(1000) {
                tx.write_u64_at(p, i * 8, i ^ 0xABCD)?;
            }
            Ok(())
        })
        .unwrap();
    (store, p)
}

#[test]
fn a_reopen_on_demand_reads_what_a_whole_load_reads_after_a_close_and_after_a_crash() {
    for crash in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store_with_tail(dir.path());
        if crash {
            store.crash();
        } else {
            store.close().unwrap();
        }
        let twin = tempfile::tempdir().unwrap();
        common::copy_dir(dir.path(), twin.path());

        let lazy = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
        let report = lazy.recovery_report();
        assert_eq!(report.heap_load, HeapLoad::OnDemand);
        assert!(report.records_replayed > 0, "the log's tail was replayed");
        let chunks = report.checkpoint.as_ref().unwrap().manifest.chunks.len() as u64;
        // Chunks with a block not read yet: all of them but those wholly beyond the heap's
        // use (the superblock's chunk has only its first blocks in).
        assert!(report.chunks_absent > 0 && report.chunks_absent <= chunks, "crash {crash}: {} of {chunks} absent", report.chunks_absent);
        let whole = Store::open(twin.path(), options(HeapLoad::Whole, true)).unwrap();
        assert_eq!(whole.recovery_report().heap_load, HeapLoad::Whole);
        assert_eq!(whole.recovery_report().chunks_absent, 0);
        let read = read_all(&lazy);
        assert_eq!(read, read_all(&whole), "crash {crash}");
        assert!(read.iter().enumerate().all(|(i, &w)| w == expected(i as u64)), "crash {crash}");
    }
}

#[test]
fn background_loaders_bring_every_chunk_in() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_tail(dir.path());
    store.close().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, true)).unwrap();
    let started = std::time::Instant::now();
    while store.chunks_absent() > 0 {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{} chunks still absent", store.chunks_absent());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(read_all(&store).iter().enumerate().all(|(i, &w)| w == expected(i as u64)));
}

/// A closed store whose words all hold `expected`, in one checkpoint (its epoch).
fn closed_after_a_checkpoint() -> (tempfile::TempDir, HeapPtr, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::Whole, true)).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    fill(&store, p, 0..WORDS, expected);
    let epoch = store.checkpoint().unwrap().epoch;
    store.close().unwrap();
    (dir, p, epoch)
}

/// Where the image of the chunk holding word `word` lies in the newest checkpoint.
fn image_of_word(dir: &Path, p: HeapPtr, word: u64, epoch: u64) -> (std::path::PathBuf, u64) {
    let (path, offset, _) = common::image_location(dir, epoch, (p.offset() + 8 * word) / CHUNK);
    (path, offset)
}

#[test]
fn damage_found_after_opening_fails_its_block_only_and_checkpoints_keep_its_image() {
    let (dir, p, epoch) = closed_after_a_checkpoint();
    let victim_word = WORDS / 2;
    let (victim, image) = image_of_word(dir.path(), p, victim_word, epoch);
    // The block (a page of the chunk) that holds the word is damaged, and only it.
    let block = (p.offset() + 8 * victim_word) / 4096 * 4096;
    let offset = image + 4096 + block % CHUNK;
    common::flip_byte(&victim, offset + 100, 0x10);
    let damaged = block..block + 4096;
    let in_damaged = |i: u64| damaged.contains(&(p.offset() + 8 * i));
    // A word of the same chunk in another block: it reads and writes as any other.
    let same_chunk = (0..WORDS).find(|&i| !in_damaged(i) && (p.offset() + 8 * i) / CHUNK == block / CHUNK).unwrap();

    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
    assert_eq!(store.recovery_report().heap_load, HeapLoad::OnDemand, "nothing at open reads that chunk");
    let err = store.transact(Commit::Async, |tx| tx.read_u64_at(p, victim_word * 8)).unwrap_err();
    match &err {
        Error::Corrupt { kind: FileKind::CheckpointImage, path, offset: Some(at), .. } => {
            assert_eq!(path, &victim);
            assert_eq!(*at, offset);
            assert!(err.to_string().contains("the store stays open"), "{err}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A write there fails too (the next checkpoint would pass the zeros off as data)...
    assert!(matches!(store.transact(Commit::Sync, |tx| tx.write_u64_at(p, victim_word * 8, 1)), Err(Error::Corrupt { .. })));
    // ...and everything else reads and writes as before, the rest of that chunk included (its
    // write lives in the log, which the damaged image's old chunk LSN keeps).
    let outside = same_chunk;
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, outside * 8, 42)).unwrap();
    store
        .transact(Commit::Async, |tx| {
            for i in (0..WORDS).filter(|&i| !in_damaged(i)) {
                let want = if i == outside { 42 } else { expected(i) };
                assert_eq!(tx.read_u64_at(p, i * 8)?, want, "word {i}");
            }
            Ok(())
        })
        .unwrap();
    assert!(store.snapshot(SnapshotMode::Fork).is_err(), "a fork needs every chunk");
    // A checkpoint keeps the damaged image as it is, and the store reopens to the same state.
    let again = store.checkpoint().unwrap();
    let (still, _) = image_of_word(dir.path(), p, victim_word, again.epoch);
    assert_eq!(still, victim, "the damaged image stays referenced");
    store.close().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, true)).unwrap();
    assert!(matches!(store.transact(Commit::Async, |tx| tx.read_u64_at(p, victim_word * 8)), Err(Error::Corrupt { .. })));
    assert_eq!(store.transact(Commit::Async, |tx| tx.read_u64_at(p, outside * 8)).unwrap().0, 42);
}

/// A damaged image header found at a chunk's first use, whether that use reads the header
/// with its block (a block near the image's start) or alone (a block further in), fails every
/// block of the chunk, naming the header's offset; other chunks serve.
#[test]
fn a_damaged_header_fails_its_chunk_whether_read_with_a_block_or_alone() {
    let (dir, p, epoch) = closed_after_a_checkpoint();
    let chunk_of = |i: u64| (p.offset() + 8 * i) / CHUNK;
    let word_at = |chunk: u64, block: u64| (chunk * CHUNK + block * 4096 - p.offset()) / 8;
    let (near, far) = (chunk_of(WORDS / 4), chunk_of(WORDS / 2));
    assert!(near != far && chunk_of(0) < near && far < chunk_of(WORDS - 1));
    let mut headers = Vec::new();
    for chunk in [near, far] {
        let (path, offset, _) = common::image_location(dir.path(), epoch, chunk);
        // A byte of the header's epoch field: the header no longer matches the manifest.
        common::flip_byte(&path, offset + 24, 0x40);
        headers.push((path, offset));
    }
    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
    assert_eq!(store.recovery_report().heap_load, HeapLoad::OnDemand);
    let read = |i: u64| store.transact(Commit::Async, |tx| tx.read_u64_at(p, i * 8)).map(|(w, _)| w);
    // `near` is first used at its second block (read with the header), `far` at its last
    // (the header read alone first); then each at the other end.
    for (k, (chunk, first, then)) in [(near, 1, 15), (far, 15, 1)].into_iter().enumerate() {
        for block in [first, then] {
            match read(word_at(chunk, block)) {
                Err(Error::Corrupt { kind: FileKind::CheckpointImage, path, offset: Some(at), .. }) => {
                    assert_eq!((path, at), headers[k].clone(), "chunk {chunk} block {block}");
                }
                other => panic!("chunk {chunk} block {block}: expected Corrupt, got {other:?}"),
            }
        }
    }
    for i in [0, WORDS / 8, 3 * WORDS / 4, WORDS - 1] {
        assert_eq!(read(i).unwrap(), expected(i), "word {i}");
    }
}

/// A failed read of a header with its first blocks is read again apart: the damage names
/// the blocks' offset where they are what fails (the header is fine and kept).
#[test]
fn a_failed_read_of_a_header_with_its_blocks_names_what_failed() {
    let (dir, p, epoch) = closed_after_a_checkpoint();
    let chunk = (p.offset() + 8 * (WORDS / 4)) / CHUNK;
    let (path, image, _) = common::image_location(dir.path(), epoch, chunk);
    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
    // The segment now ends after the chunk's header and its first block.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(image + 2 * 4096).unwrap();
    let word = (chunk * CHUNK + 4096 - p.offset()) / 8;
    match store.transact(Commit::Async, |tx| tx.read_u64_at(p, word * 8)) {
        Err(Error::Corrupt { kind: FileKind::CheckpointImage, path: at_path, offset: Some(at), reason, .. }) => {
            assert_eq!((at_path, at), (path.clone(), image + 2 * 4096), "{reason}");
            assert!(reason.contains("short read"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The header was read and kept, the first block is whole: it serves.
    let first = (chunk * CHUNK - p.offset()) / 8;
    assert_eq!(store.transact(Commit::Async, |tx| tx.read_u64_at(p, first * 8)).unwrap().0, expected(first));
}

#[test]
fn damage_met_while_opening_loads_whole_and_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::Whole, true)).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    fill(&store, p, 0..WORDS, |i| i);
    store.checkpoint().unwrap();
    fill(&store, p, 1000..2000, |i| i + 1);
    let second = store.checkpoint().unwrap().epoch;
    // The log's tail writes into the chunk whose image gets damaged: the replay reads it.
    fill(&store, p, 1500..1600, |i| i + 2);
    store.close().unwrap();
    let (victim, offset) = image_of_word(dir.path(), p, 1500, second);
    assert!(victim.ends_with(format!("seg-{second:010}.ckpt")));
    common::flip_byte(&victim, offset + 4096 + 8, 0x01);

    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, true)).unwrap();
    let report = store.recovery_report();
    assert_eq!(report.heap_load, HeapLoad::Whole);
    let why = report.loaded_whole_because.as_deref().expect("says why it loaded whole");
    assert!(why.contains(&victim.display().to_string()), "{why}");
    let loaded = report.checkpoint.as_ref().unwrap();
    assert_eq!(loaded.manifest.epoch, second - 1, "fell back to the previous checkpoint");
    assert_eq!(loaded.fallback.as_ref().unwrap().path, victim);
    let read = read_all(&store);
    for (i, &w) in read.iter().enumerate().take(4096) {
        let i = i as u64;
        let want = match i {
            1500..1600 => i + 2,
            1000..2000 => i + 1,
            _ => i,
        };
        assert_eq!(w, want, "word {i}");
    }
}

/// While chunks are absent the checkpointer writes what changed, collects garbage and makes
/// no spare of a segment (a file being read is never written over): every chunk read
/// afterwards still checks, through three checkpoints and a reopen.
#[test]
fn checkpoints_while_chunks_are_absent_overwrite_no_image_still_needed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = store_with_tail(dir.path());
    store.checkpoint().unwrap();
    store.close().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
    let absent_at_open = store.chunks_absent();
    for round in 0..3u64 {
        // A few chunks change each round; most stay absent.
        fill(&store, p, 50_000 + round * 100_000..50_000 + round * 100_000 + 2000, |i| expected(i) + round + 1);
        let report = store.checkpoint().unwrap();
        assert_eq!(report.spare_bytes, 0, "round {round}: no segment kept to be written over");
        assert!(store.chunks_absent() > 0 && store.chunks_absent() < absent_at_open, "round {round}: {} absent of {absent_at_open}; {report:?}", store.chunks_absent());
    }
    let want = |i: u64| match (0..3u64).rev().find(|r| (50_000 + r * 100_000..50_000 + r * 100_000 + 2000).contains(&i)) {
        Some(r) => expected(i) + r + 1,
        None => expected(i),
    };
    assert!(read_all(&store).iter().enumerate().all(|(i, &w)| w == want(i as u64)));
    store.close().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::OnDemand, true)).unwrap();
    assert!(read_all(&store).iter().enumerate().all(|(i, &w)| w == want(i as u64)));
}

#[test]
fn snapshots_of_a_heap_with_absent_chunks_see_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options(HeapLoad::Whole, true)).unwrap();
    store
        .transact(Commit::Sync, |tx| {
            let mut t = tx.btree("t")?;
            for k in 0..50_000u64 {
                t.insert(k * 7, k)?;
            }
            Ok(())
        })
        .unwrap();
    store.checkpoint().unwrap();
    store.close().unwrap();
    for mode in [SnapshotMode::Memcpy, SnapshotMode::Fork] {
        let store = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
        assert!(store.chunks_absent() > 0);
        let snap = store.snapshot(mode).unwrap();
        let tree = snap.btree("t").unwrap();
        for k in (0..50_000u64).step_by(97) {
            assert_eq!(tree.get(k * 7).unwrap(), Some(k), "{mode:?}: key {}", k * 7);
        }
    }
}

/// A store whose images an earlier build wrote in image version 2 (one checksum over the
/// chunk, no block checksums) reopens on demand to the same state as loaded whole: such an
/// image is read and checked whole at its first use, and a flipped byte in one still fails
/// its whole chunk.
#[test]
fn images_of_version_2_are_read_whole_on_demand() {
    use tusk_storage::checkpoint_format::{manifest_path, ChunkHeader, Manifest, CHUNK_HEADER_SIZE};
    let (dir, p, epoch) = closed_after_a_checkpoint();
    // Every image rewritten as version 2, each manifest entry's checksum to match.
    let manifest_file = manifest_path(dir.path(), epoch);
    let mut manifest = Manifest::decode(&std::fs::read(&manifest_file).unwrap()).unwrap();
    for (index, entry) in manifest.chunks.iter_mut().enumerate() {
        let (path, offset, size) = common::image_location(dir.path(), epoch, index as u64);
        let mut segment = std::fs::read(&path).unwrap();
        let image = &mut segment[offset as usize..(offset + size) as usize];
        let v3 = ChunkHeader::decode(image).unwrap();
        assert!(v3.blocks.is_some(), "this build writes block checksums");
        let crc = crc32fast::hash(&image[CHUNK_HEADER_SIZE..]);
        ChunkHeader { crc, blocks: None, ..v3 }.encode_into(image);
        entry.crc = crc;
        std::fs::write(&path, &segment).unwrap();
    }
    std::fs::write(&manifest_file, manifest.encode()).unwrap();
    let twin = tempfile::tempdir().unwrap();
    common::copy_dir(dir.path(), twin.path());

    let lazy = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
    assert_eq!(lazy.recovery_report().heap_load, HeapLoad::OnDemand);
    let read = read_all(&lazy);
    assert!(read.iter().enumerate().all(|(i, &w)| w == expected(i as u64)));
    assert_eq!(read, read_all(&Store::open(twin.path(), options(HeapLoad::Whole, true)).unwrap()));
    drop(lazy);

    // Damage in a version-2 image is found whole: every word of its chunk fails.
    let word = WORDS / 2;
    let (victim, offset) = image_of_word(dir.path(), p, word, epoch);
    common::flip_byte(&victim, offset + 4096 + 100, 0x10);
    let lazy = Store::open(dir.path(), options(HeapLoad::OnDemand, false)).unwrap();
    let chunk_start = (p.offset() + 8 * word) / CHUNK * CHUNK;
    let first_in_chunk = (chunk_start.max(p.offset()) - p.offset()) / 8;
    for i in [first_in_chunk, word] {
        assert!(matches!(lazy.transact(Commit::Async, |tx| tx.read_u64_at(p, i * 8)), Err(Error::Corrupt { .. })), "word {i}");
    }
}
