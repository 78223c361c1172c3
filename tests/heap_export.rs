//! A heap exported as checkpoint images and installed as a new store: the same data, every
//! image checked before anything is made, and the file left as it was by the installed
//! store's checkpoints (it is the checkpoint's segment through a hard link).

use std::io::Write;

use tusk::{install_heap, Commit, Error, HeapLoad, HeapShape, Options, Store};

fn options() -> Options {
    Options { heap_capacity: 256 << 20, chunk_size: 64 << 10, log_partitions: 2, ..Options::default() }
}

/// A store with `n` keys in a B-link tree and in an ART.
fn filled(dir: &std::path::Path, n: u64) -> Store {
    let store = Store::open(dir, options()).unwrap();
    for start in (0..n).step_by(1000) {
        store
            .transact(Commit::Async, |tx| {
                for k in start..(start + 1000).min(n) {
                    tx.btree("tree")?.insert(k, k * 3)?;
                    tx.art("art")?.insert(format!("key-{k:08}").as_bytes(), k)?;
                }
                Ok(())
            })
            .unwrap();
    }
    store
}

fn check_contents(store: &Store, n: u64) {
    store
        .transact(Commit::Async, |tx| {
            assert_eq!(tx.btree("tree")?.len()?, n);
            assert_eq!(tx.art("art")?.len()?, n);
            for k in (0..n).step_by(97) {
                assert_eq!(tx.btree("tree")?.get(k)?, Some(k * 3));
                assert_eq!(tx.art("art")?.get(format!("key-{k:08}").as_bytes())?, Some(k));
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn an_exported_heap_installs_as_a_store_with_the_same_data() {
    let work = tempfile::tempdir().unwrap();
    let n = 30_000;
    let source = filled(&work.path().join("source"), n);
    let image = work.path().join("heap.img");
    let mut file = std::fs::File::create(&image).unwrap();
    let export = source.export_heap(&mut file, 64 << 10).unwrap();
    // What follows the images (replication keeps its own trailer there) is left alone.
    file.write_all(b"trailer").unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert_eq!(export.shape.chunk_size, 64 << 10);
    assert!(export.lsn >= 1 && export.shape.covered >= source.heap_used(), "{export:?}");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), export.shape.bytes() + 7);
    let before = std::fs::read(&image).unwrap();

    for load in [HeapLoad::OnDemand, HeapLoad::Whole] {
        let installed = work.path().join(format!("installed-{load:?}"));
        install_heap(&installed, &image, export.shape).unwrap();
        let store = Store::open(&installed, Options { heap_load: load, ..options() }).unwrap();
        check_contents(&store, n);
        // It takes writes, checkpoints and reopens like any store. Every key is written
        // each round, so the installed segment falls out of use, becomes the spare and the
        // next checkpoint's images would be written over it.
        for round in 1..=4u64 {
            for start in (0..n).step_by(5000) {
                store
                    .transact(Commit::Async, |tx| {
                        for k in start..start + 5000 {
                            tx.btree("tree")?.insert(k, k * 3 + round)?;
                            tx.art("art")?.insert(format!("key-{k:08}").as_bytes(), k + round)?;
                        }
                        Ok(())
                    })
                    .unwrap();
            }
            store.checkpoint().unwrap();
        }
        assert!(!installed.join("ckpt/seg-0000000001.ckpt").exists(), "the installed segment fell out of use");
        store.close().unwrap();
        let store = Store::open(&installed, options()).unwrap();
        let (len, last) = store.transact(Commit::Async, |tx| Ok((tx.btree("tree")?.len()?, tx.btree("tree")?.get(n - 1)?))).unwrap().0;
        assert_eq!((len, last), (n, Some((n - 1) * 3 + 4)));
        store.close().unwrap();
    }
    assert!(std::fs::read(&image).unwrap() == before, "the installed stores' checkpoints wrote into the image file");
    source.close().unwrap();
}

#[test]
fn a_damaged_or_short_image_is_refused_and_nothing_is_made() {
    let work = tempfile::tempdir().unwrap();
    let source = filled(&work.path().join("source"), 5_000);
    let image = work.path().join("heap.img");
    let export = source.export_heap(&mut std::fs::File::create(&image).unwrap(), 64 << 10).unwrap();
    source.close().unwrap();
    let shape = export.shape;
    let mut bytes = std::fs::read(&image).unwrap();

    // One bit flipped in the second chunk's data.
    let image_bytes = shape.bytes() / shape.chunks();
    let at = (image_bytes + 4096 + 100) as usize;
    bytes[at] ^= 0x10;
    let damaged = work.path().join("damaged.img");
    std::fs::write(&damaged, &bytes).unwrap();
    let target = work.path().join("from-damaged");
    match install_heap(&target, &damaged, shape) {
        Err(Error::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, Some(image_bytes), "{reason}");
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("a flipped bit installed: {other:?}"),
    }
    assert!(!target.exists() && !tusk::installing_dir(&target).exists());

    // Cut short: fewer bytes than the images.
    bytes[at] ^= 0x10;
    let short = work.path().join("short.img");
    std::fs::write(&short, &bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(install_heap(&target, &short, shape), Err(Error::Corrupt { .. })));
    // Another shape than the file's: the headers disagree.
    let other = HeapShape { chunk_size: 128 << 10, covered: shape.covered };
    assert!(matches!(install_heap(&target, &image, other), Err(Error::Corrupt { .. })));
    assert!(!target.exists());

    // An existing directory is never written over.
    std::fs::create_dir(&target).unwrap();
    assert!(matches!(install_heap(&target, &image, shape), Err(Error::Io { .. })));
}
