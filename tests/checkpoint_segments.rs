//! Checkpoint segments (issue 13): one segment file per checkpoint, clean chunks reuse
//! images of older segments, and compaction bounds the space that partly used old segments
//! pin.

mod common;

use tusk::{Commit, Store};
use tusk_storage::checkpoint_format::{image_size, list_image_segments, list_manifests, spare_segment_path, Manifest};
use tusk_txn::checkpoint::COMPACT_BELOW;

const CHUNK: u64 = 16 << 10;
const DATA_CHUNKS: u64 = 32;
const WORDS: u64 = DATA_CHUNKS * CHUNK / 8;

fn value(i: u64, round: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round
}

#[test]
fn one_segment_per_checkpoint_and_compaction_bounds_dead_images() {
    let dir = tempfile::tempdir().unwrap();
    let options = common::checkpoint_opts(16 << 20, CHUNK);
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let p = common::alloc_data_root(&store, WORDS * 8);
    let mut model: Vec<u64> = (0..WORDS).map(|i| value(i, 0)).collect();
    for start in (0..WORDS).step_by(1024) {
        store.transact(Commit::Sync, |tx| (start..start + 1024).try_for_each(|i| tx.write_u64_at(p, i * 8, model[i as usize]))).unwrap();
    }
    let full = store.checkpoint().unwrap();
    let image = image_size(CHUNK);
    assert_eq!(full.bytes_written, full.written * image, "one image per written chunk, nothing else");
    let mut compacted = 0;
    for round in 1..=40u64 {
        // One word in one chunk per round: each checkpoint writes chunk 0 and that chunk,
        // and reuses the rest.
        let word = (round * 7 % DATA_CHUNKS) * CHUNK / 8 + round;
        model[word as usize] = value(word, round);
        store.transact(Commit::Sync, |tx| tx.write_u64_at(p, word * 8, model[word as usize])).unwrap();
        let r = store.checkpoint().unwrap();
        compacted += r.rewritten_for_space;
        assert!(r.written <= 3 + r.rewritten_for_space + r.rewritten_for_log, "round {round}: {r:?}");

        let newest = Manifest::decode(&std::fs::read(&list_manifests(dir.path()).unwrap()[0].1).unwrap()).unwrap();
        assert_eq!(newest.epoch, r.epoch);
        let segments = list_image_segments(dir.path()).unwrap();
        for s in newest.segments().into_iter().filter(|&s| s != r.epoch) {
            let live = newest.chunks.iter().filter(|c| c.image_epoch == s).count() as f64;
            let path = &segments.iter().find(|(e, _)| *e == s).expect("a used segment is on disk").1;
            let slots = (std::fs::metadata(path).unwrap().len() / image) as f64;
            assert!(live >= COMPACT_BELOW * slots, "round {round}: segment {s} holds {slots} images, the newest checkpoint uses {live}");
        }
        let on_disk: u64 = segments.iter().map(|(_, path)| std::fs::metadata(path).unwrap().len()).sum();
        assert_eq!(on_disk, r.segment_bytes);
        // At most one unused segment stays, as the spare the next checkpoint writes over: no
        // larger than a full checkpoint of the covered heap.
        let spare = std::fs::metadata(spare_segment_path(dir.path())).map_or(0, |m| m.len());
        assert_eq!(spare, r.spare_bytes);
        assert!(spare <= newest.chunks.len() as u64 * image, "round {round}: a spare of {spare} bytes");
        // The newest checkpoint's segments are at least half live, the previous one's too:
        // dead images never pin more than that.
        let bound = 2.0 / COMPACT_BELOW * 2.0 * (newest.chunks.len() as u64 * image) as f64;
        assert!((on_disk as f64) <= bound, "round {round}: {on_disk} bytes of segments for {} chunks", newest.chunks.len());
    }
    assert!(compacted > 0, "some segment fell below the threshold and was compacted");
    store.close().unwrap();

    let store = Store::open(dir.path(), options).unwrap();
    let (found, _) = store
        .transact(Commit::Async, |tx| {
            let p = tx.root("data")?.expect("data root");
            (0..WORDS).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<u64>, _>>()
        })
        .unwrap();
    assert!(found == model, "the recovered words differ from the model");
    store.close().unwrap();
}
