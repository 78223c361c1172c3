//! Bad checkpoint files (issue 3, "Bad input and faults"): each gets the documented
//! fallback to the previous checkpoint when the log can stand in for what is lost, and
//! otherwise a clear error naming the file, never a panic or a silent wrong state.

mod common;

use std::path::{Path, PathBuf};

use tusk::{Commit, Error, FileKind, HeapPtr, Options, Store};
use tusk_storage::checkpoint_format::{
    image_segment_path, list_manifests, manifest_path, parse_image_segment_name, Manifest, CHECKPOINT_VERSION,
};

const CHUNK: u64 = 16 << 10;
const WORDS: u64 = 32 * CHUNK / 8; // 32 chunks of data

/// A whole load: these are its fallbacks (tests/on_demand.rs has the on-demand ones).
fn options() -> Options {
    Options { heap_load: tusk::HeapLoad::Whole, ..common::checkpoint_opts(16 << 20, CHUNK) }
}

fn initial(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Words changed after the first checkpoint: two of them, in chunks the second one rewrites.
const CHANGED: [u64; 2] = [3 * CHUNK / 8 + 5, 17 * CHUNK / 8];

fn expected(i: u64) -> u64 {
    if CHANGED.contains(&i) { i + 1_000_000 } else { initial(i) }
}

/// A store with two checkpoints: epoch 1 (everything) and epoch 2 (chunk 0 and the two
/// chunks holding `CHANGED`), closed cleanly. Returns the data's pointer and both epochs.
fn two_checkpoints(dir: &Path) -> (HeapPtr, u64, u64) {
    let store = Store::open(dir, options()).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    for start in (0..WORDS).step_by(1024) {
        store
            .transact(Commit::Sync, |tx| (start..start + 1024).try_for_each(|i| tx.write_u64_at(p, i * 8, initial(i))))
            .unwrap();
    }
    let first = store.checkpoint().unwrap();
    for &i in &CHANGED {
        store.transact(Commit::Sync, |tx| tx.write_u64_at(p, i * 8, expected(i))).unwrap();
    }
    let second = store.checkpoint().unwrap();
    assert!(second.reused > 0 && second.written < first.written, "the second checkpoint is incremental: {second:?}");
    store.close().unwrap();
    (p, first.epoch, second.epoch)
}

/// The image of the heap chunk holding `word` of the data, as the manifest of `epoch` names
/// it: its segment, offset and length.
fn image_of(dir: &Path, p: HeapPtr, word: u64, epoch: u64) -> (PathBuf, u64, u64) {
    common::image_location(dir, epoch, (p.offset() + word * 8) / CHUNK)
}

fn check_data(store: &Store) {
    let (found, _) = store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("data root");
            (0..WORDS).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap();
    for (i, w) in found.iter().enumerate() {
        assert_eq!(*w, expected(i as u64), "word {i}");
    }
}

/// Opens `dir` and checks that recovery fell back from `newest` to `previous` because of
/// `culprit`, and still recovered every word.
fn assert_falls_back(dir: &Path, previous: u64, culprit: &Path) {
    let store = Store::open(dir, options()).unwrap_or_else(|e| panic!("no fallback: {e}"));
    let loaded = store.recovery_report().checkpoint.as_ref().expect("a checkpoint was loaded");
    assert_eq!(loaded.manifest.epoch, previous, "fell back to the previous checkpoint");
    let fallback = loaded.fallback.as_ref().expect("the fallback is reported");
    assert_eq!(fallback.path, culprit, "the report names the unusable file ({})", fallback.reason);
    // What broke, once, and what recovery did about it.
    let said = fallback.describe(loaded.manifest.epoch);
    let kind = if culprit.extension().is_some_and(|e| e == "ckpt") { FileKind::CheckpointImage } else { FileKind::Manifest };
    assert_eq!(fallback.kind, kind, "{said}");
    assert!(said.starts_with(&format!("{kind} {}: ", culprit.display())), "{said}");
    assert_eq!(said.matches(&culprit.display().to_string()).count(), 1, "the path once: {said}");
    assert!(said.ends_with(&format!("; fell back to the previous checkpoint (epoch {previous})")), "{said}");
    assert!(!said.contains("corrupt log"), "{said}");
    check_data(&store);
    store.close().unwrap();
}

#[test]
fn missing_segment_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    let (victim, _, _) = image_of(dir.path(), p, CHANGED[1], second);
    assert_eq!(victim, image_segment_path(dir.path(), second), "the second checkpoint wrote the changed chunk");
    std::fs::remove_file(&victim).unwrap();
    assert_falls_back(dir.path(), first, &victim);
}

#[test]
fn missing_segment_both_checkpoints_share_without_the_log_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    // A clean chunk: the second checkpoint reuses the first one's image, so neither can load.
    let (victim, offset, _) = image_of(dir.path(), p, 10 * CHUNK / 8, second);
    assert_eq!((victim.clone(), offset), { let (v, o, _) = image_of(dir.path(), p, 10 * CHUNK / 8, first); (v, o) });
    std::fs::remove_file(&victim).unwrap();
    match Store::open(dir.path(), options()) {
        Err(Error::Corrupt { path, reason, .. }) => assert_eq!(path, victim, "{reason}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("opened although no checkpoint and no log hold the lost chunk"),
    }
}

/// The replay's first pass runs beside the images' load, for the newest checkpoint. When
/// that checkpoint's image turns out damaged, the pass is made again for the older checkpoint
/// that loads instead: every record written after either checkpoint is replayed.
#[test]
fn a_fallback_replays_the_log_of_both_checkpoints_after_the_first_pass_beside_the_load() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    // Written after the second checkpoint: a word of a chunk it rewrote, one of a chunk it
    // reused from the first, and one of a chunk the first rewrote as well.
    let after = [CHANGED[0] + 1, 10 * CHUNK / 8 + 3, CHANGED[1]];
    let later = |i: u64| i + 2_000_000;
    let store = Store::open(dir.path(), options()).unwrap();
    assert!(store.recovery_report().first_pass_beside_load, "the newest checkpoint loaded: its first pass was used");
    for &i in &after {
        store.transact(Commit::Sync, |tx| tx.write_u64_at(p, i * 8, later(i))).unwrap();
    }
    store.close().unwrap();
    let (victim, offset, image) = image_of(dir.path(), p, CHANGED[0], second);
    common::flip_byte(&victim, offset + image - 1, 0x01);
    let store = Store::open(dir.path(), options()).unwrap();
    let report = store.recovery_report();
    assert_eq!(report.checkpoint.as_ref().unwrap().manifest.epoch, first, "fell back");
    assert!(!report.first_pass_beside_load, "the pass made for the damaged checkpoint was not used");
    let (found, _) = store
        .transact(Commit::Async, |tx| (0..WORDS).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<u64>, _>>())
        .unwrap();
    for (i, w) in found.iter().enumerate() {
        let i = i as u64;
        assert_eq!(*w, if after.contains(&i) { later(i) } else { expected(i) }, "word {i}");
    }
    store.close().unwrap();
}

#[test]
fn truncated_segment_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    let (victim, offset, image) = image_of(dir.path(), p, CHANGED[0], second);
    // Cut inside the image: its header is there, half its chunk is not.
    std::fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(offset + image / 2).unwrap();
    assert_falls_back(dir.path(), first, &victim);
}

#[test]
fn damaged_image_in_a_segment_falls_back_and_the_report_names_where() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    let (victim, offset, image) = image_of(dir.path(), p, CHANGED[1], second);
    common::flip_byte(&victim, offset + image - 1, 0x01);
    assert_falls_back(dir.path(), first, &victim);
    let store = Store::open(dir.path(), options()).unwrap();
    let reason = &store.recovery_report().checkpoint.as_ref().unwrap().fallback.as_ref().unwrap().reason;
    assert!(reason.contains(&format!("offset {offset}")) && reason.contains("checksum"), "{reason}");
    store.close().unwrap();
}

#[test]
fn image_of_another_chunk_in_its_place_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    // Both images are intact and carry valid checksums, only the header says whose they are.
    let (a_path, a, image) = image_of(dir.path(), p, CHANGED[0], second);
    let (b_path, b, _) = image_of(dir.path(), p, CHANGED[1], second);
    assert_eq!(a_path, b_path);
    let mut bytes = std::fs::read(&a_path).unwrap();
    bytes.copy_within(a as usize..(a + image) as usize, b as usize);
    std::fs::write(&b_path, bytes).unwrap();
    assert_falls_back(dir.path(), first, &b_path);
}

/// A store whose newest checkpoint is in format version 1 (one file per chunk image): a
/// typed error naming the manifest, no panic, no silent fallback, nothing changed on disk.
#[test]
fn checkpoint_of_the_old_format_is_a_typed_error_naming_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, second) = two_checkpoints(dir.path());
    let victim = manifest_path(dir.path(), second);
    let current = Manifest::decode(&std::fs::read(&victim).unwrap()).unwrap();
    // Version 1's layout: 24-byte entries [image epoch][chunk LSN][crc32][0], and its images
    // as ckpt/cIIIIIIIIII-eEEEEEEEEE.chunk.
    let mut old = current.encode()[..48].to_vec();
    old[8..12].copy_from_slice(&1u32.to_le_bytes());
    for (i, c) in current.chunks.iter().enumerate() {
        old.extend_from_slice(&c.image_epoch.to_le_bytes());
        old.extend_from_slice(&c.lsn.to_le_bytes());
        old.extend_from_slice(&c.crc.to_le_bytes());
        old.extend_from_slice(&0u32.to_le_bytes());
        std::fs::write(dir.path().join("ckpt").join(format!("c{i:010}-e{:010}.chunk", c.image_epoch)), b"old image").unwrap();
    }
    let crc = crc32fast::hash(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(&victim, &old).unwrap();
    let opened = std::panic::catch_unwind(|| Store::open(dir.path(), options()).map(drop));
    match opened {
        Ok(Err(Error::OldCheckpointFormat { path, version, supported })) => {
            assert_eq!((path, version, supported), (victim.clone(), 1, CHECKPOINT_VERSION));
        }
        other => panic!("expected the old-format error, got {other:?}"),
    }
    let message = Store::open(dir.path(), options()).err().unwrap().to_string();
    assert!(message.contains(&victim.display().to_string()) && message.contains("version 1"), "{message}");
    assert_eq!(std::fs::read(&victim).unwrap(), old, "the old manifest is left as it was");
}

#[test]
fn damaged_newest_manifest_falls_back_to_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (_, first, second) = two_checkpoints(dir.path());
    let victim = manifest_path(dir.path(), second);
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();
    assert_falls_back(dir.path(), first, &victim);
}

/// The only manifest damaged after the log was trimmed behind its checkpoint: the log alone
/// cannot stand in for it, so recovery must refuse, naming the manifest, not come back empty.
#[test]
fn damaged_only_manifest_after_a_trim_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    // More than one log segment (64 KiB each here), so that the checkpoint trims one.
    for start in (0..WORDS).step_by(1024) {
        store
            .transact(Commit::Sync, |tx| (start..start + 1024).try_for_each(|i| tx.write_u64_at(p, i * 8, initial(i))))
            .unwrap();
    }
    let only = store.checkpoint().unwrap();
    assert!(only.trimmed_segments > 0, "the log behind the checkpoint was trimmed: {only:?}");
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, 0, 7)).unwrap();
    store.close().unwrap();
    let manifests = list_manifests(dir.path()).unwrap();
    assert_eq!(manifests.len(), 1, "one checkpoint, one manifest");
    let victim = manifests[0].1.clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[55] ^= 0x80;
    std::fs::write(&victim, bytes).unwrap();
    match Store::open(dir.path(), options()) {
        Err(e) => {
            // Found when tried as a new user would: this read `s2/MANIFEST-… s2/MANIFEST-…:
            // corrupt log at offset 0: manifest checksum mismatch` (the path twice, and "log"
            // for a manifest).
            let message = e.to_string();
            assert!(message.starts_with(&format!("checkpoint manifest {}: ", victim.display())), "{message}");
            assert_eq!(message.matches(&victim.display().to_string()).count(), 1, "the path once: {message}");
            assert!(message.contains("checksum") && message.contains("the log that must stand in for it reaches only LSN 0 (LSN 1 is missing), short of LSN 1"), "{message}");
            assert!(message.ends_with("; refused to open the store"), "{message}");
        }
        Ok(store) => panic!("recovered without the damaged checkpoint: {:?}", store.recovery_report()),
    }
}

#[test]
fn manifest_from_a_newer_format_version_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, second) = two_checkpoints(dir.path());
    // A well-formed manifest (checksum and all) that only a newer build writes.
    let victim = manifest_path(dir.path(), second);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[8..12].copy_from_slice(&(CHECKPOINT_VERSION + 1).to_le_bytes());
    let body = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..body]);
    bytes[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&victim, bytes).unwrap();
    // Falling back to the older checkpoint would silently drop what the newer build wrote.
    match Store::open(dir.path(), options()) {
        Err(Error::Corrupt { path, reason, .. }) => {
            assert_eq!(path, victim);
            assert!(reason.contains("newer") && reason.contains(&format!("{}", CHECKPOINT_VERSION + 1)), "{reason}");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("opened a store written by a newer format"),
    }
}

#[test]
fn heap_capacity_smaller_than_the_checkpoint_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, second) = two_checkpoints(dir.path());
    let small = Options { heap_capacity: 256 << 10, ..options() };
    match Store::open(dir.path(), small) {
        Err(Error::CapacityTooSmall { path, needed, capacity }) => {
            assert_eq!(path, manifest_path(dir.path(), second));
            assert_eq!(capacity, 256 << 10);
            assert!(needed > WORDS * 8, "needs the whole data: {needed}");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("opened a checkpoint larger than the heap"),
    }
    // Nothing was changed: a large enough heap still opens it from the same checkpoint.
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(store.recovery_report().checkpoint.as_ref().unwrap().manifest.epoch, second);
    check_data(&store);
    store.close().unwrap();
}

#[test]
fn only_the_last_two_checkpoints_and_their_images_stay_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = two_checkpoints(dir.path());
    let store = Store::open(dir.path(), options()).unwrap();
    for round in 0..3u64 {
        store.transact(Commit::Sync, |tx| tx.write_u64_at(p, (round * 7 + 1) * CHUNK, round)).unwrap();
        store.checkpoint().unwrap();
    }
    store.close().unwrap();
    let manifests: Vec<Manifest> = list_manifests(dir.path())
        .unwrap()
        .iter()
        .map(|(_, path)| Manifest::decode(&std::fs::read(path).unwrap()).unwrap())
        .collect();
    assert_eq!(manifests.len(), 2, "the newest checkpoint and the one before it");
    let mut referenced: Vec<u64> = manifests.iter().flat_map(|m| m.segments()).collect();
    referenced.sort_unstable();
    referenced.dedup();
    let mut on_disk: Vec<u64> = std::fs::read_dir(dir.path().join("ckpt"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            parse_image_segment_name(&name).unwrap_or_else(|| panic!("stray file {name} in ckpt/"))
        })
        .collect();
    on_disk.sort_unstable();
    assert_eq!(on_disk, referenced, "exactly the segments the kept checkpoints use");
    let stray: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "temp files left: {stray:?}");
}

/// A fallback leaves the unusable checkpoint's manifest behind, and the next checkpoint's
/// garbage collection deletes its own images. When the newest checkpoint fails later too,
/// recovery skips both, and the report must name the newest one's damage, not the stale one's.
#[test]
fn second_fallback_names_the_newest_checkpoints_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (p, first, second) = two_checkpoints(dir.path());
    std::fs::remove_file(image_of(dir.path(), p, CHANGED[0], second).0).unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(store.recovery_report().checkpoint.as_ref().unwrap().manifest.epoch, first);
    store.transact(Commit::Sync, |tx| tx.write_u64_at(p, CHANGED[1] * 8, expected(CHANGED[1]))).unwrap();
    let third = store.checkpoint().unwrap();
    store.close().unwrap();

    let (victim, _, _) = image_of(dir.path(), p, CHANGED[1], third.epoch);
    assert_eq!(victim, image_segment_path(dir.path(), third.epoch));
    std::fs::remove_file(&victim).unwrap();
    assert_falls_back(dir.path(), first, &victim);
}

/// A manifest whose checksum is right but whose fields disagree (more chunks than its
/// covered bytes need, some beyond the heap) is refused like damage, without a panic.
#[test]
fn manifest_with_more_chunks_than_it_covers_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, first, second) = two_checkpoints(dir.path());
    let victim = manifest_path(dir.path(), second);
    let mut bytes = std::fs::read(&victim).unwrap();
    let chunks = Manifest::decode(&bytes).unwrap().chunks.len() as u64;
    assert!(chunks > 8);
    bytes[32..40].copy_from_slice(&(4 * CHUNK).to_le_bytes());
    let body = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..body]);
    bytes[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&victim, bytes).unwrap();
    // A heap that holds the claimed bytes but not the chunks: an error, never a panic.
    let small = Options { heap_capacity: 8 * CHUNK, ..options() };
    let opened = std::panic::catch_unwind(|| Store::open(dir.path(), small).map(drop));
    assert!(matches!(opened, Ok(Err(_))), "{opened:?}");
    assert!(Manifest::decode(&std::fs::read(&victim).unwrap()).is_err(), "decode accepts {chunks} chunks for 4 chunks of bytes");
    assert_falls_back(dir.path(), first, &victim);
}

/// A log that ends below what the checkpoint needs (its chunks were copied at different LSNs,
/// and the records between are gone) is refused with a message naming the log, the LSN it
/// ends at and the one it must reach. Found when tried as a new user would: it read `corrupt
/// at offset 0`, which named neither.
#[test]
fn log_ending_below_the_checkpoint_is_refused_naming_both_lsns() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, second) = two_checkpoints(dir.path());
    let manifest = Manifest::decode(&std::fs::read(manifest_path(dir.path(), second)).unwrap()).unwrap();
    let (min, max) = (manifest.min_lsn(), manifest.max_lsn());
    assert!(min < max, "the incremental checkpoint's chunks are of different LSNs: {min}..={max}");
    let log = dir.path().join("log");
    // The partitions' folders (beside them, a clean close's seal).
    for partition in std::fs::read_dir(&log).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()) {
        for segment in std::fs::read_dir(partition).unwrap() {
            std::fs::remove_file(segment.unwrap().path()).unwrap();
        }
    }
    match Store::open(dir.path(), options()) {
        Err(e @ Error::Corrupt { kind: FileKind::Log, offset: None, .. }) => {
            let message = e.to_string();
            assert_eq!(
                message,
                format!(
                    "log {}: reaches only LSN {min} (LSN {} is missing), short of LSN {max} that the checkpoint needs; refused to open the store",
                    log.display(),
                    min + 1
                )
            );
        }
        Err(e) => panic!("unexpected error: {e:?}"),
        Ok(store) => panic!("recovered without the log the checkpoint needs: {:?}", store.recovery_report()),
    }
}
