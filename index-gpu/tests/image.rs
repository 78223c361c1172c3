//! The index read paths on a plain heap image answer as the transaction did when the image
//! was taken, and a damaged link in an image is an error, not a panic.

mod common;

use tusk_index::heap::HeapRead;
use tusk_index::image::HeapImage;
use tusk_index::mirror::cpu;
use tusk_index::{Art, BTree};

#[test]
fn btree_reads_on_an_image_match_the_transaction() {
    let engine = common::engine(16 << 20);
    let tree = common::transact(&engine, |tx| {
        let tree = BTree::named(tx, "t").unwrap();
        for k in 0..20_000u64 {
            tree.insert(tx, k * 7 % 20_011, k).unwrap();
        }
        tree
    });
    let mut bytes = vec![0u8; engine.heap().capacity() as usize];
    engine.heap().read_bytes(0, &mut bytes);
    // Later commits do not reach the image.
    common::transact(&engine, |tx| tree.insert(tx, 1 << 40, 1).unwrap());

    let mut image = HeapImage::new(&bytes);
    let stats = tree.check(&mut image).unwrap();
    assert_eq!(stats.keys, 20_000);
    common::transact(&engine, |tx| {
        for k in (0..20_100u64).step_by(13) {
            assert_eq!(tree.get(&mut image, k).unwrap(), tree.get(tx, k).unwrap(), "key {k}");
        }
        let from_image: Vec<_> = tree.range(&mut image, 100..5_000).unwrap().map(Result::unwrap).collect();
        let from_tx: Vec<_> = tree.range(tx, 100..5_000).unwrap().map(Result::unwrap).collect();
        assert_eq!(from_image, from_tx);
        assert_eq!(tree.sum(&mut image, ..).unwrap() + 1, tree.sum(tx, ..).unwrap());
    });
    assert_eq!(tree.get(&mut image, 1 << 40).unwrap(), None);
}

#[test]
fn out_of_image_and_unaligned_loads_are_errors() {
    let bytes = vec![0u8; 64];
    let mut image = HeapImage::new(&bytes);
    assert!(image.load(56).is_ok());
    assert!(image.load(64).is_err());
    assert!(image.load(u64::MAX - 3).is_err());
    assert!(image.load(4).is_err());
    let mut words = [0u64; 2];
    assert!(image.load_words(48, &mut words).is_ok());
    assert!(image.load_words(56, &mut words).is_err(), "a run reaching past the image");
    assert!(image.load_words(u64::MAX - 7, &mut words).is_err());
    assert!(image.load_words(4, &mut words).is_err());
    image.prefetch(u64::MAX - 3, 4096);
    image.prefetch(32, u64::MAX);
}

/// The mirror's CPU engine (the backend without a GPU) answers batches of lookups with
/// `get_many` in parts, on several threads above its parallel threshold: every answer, in
/// order, equals `get`'s.
#[test]
fn cpu_engine_batches_answer_as_get_does() {
    let engine = common::engine(64 << 20);
    let (tree, art) = common::transact(&engine, |tx| {
        let tree = BTree::named(tx, "t").unwrap();
        let art = Art::named(tx, "a").unwrap();
        for k in 0..30_000u64 {
            tree.insert(tx, k * 3, k).unwrap();
            art.insert(tx, &(k * 3).to_be_bytes(), k).unwrap();
        }
        (tree, art)
    });
    let mut bytes = vec![0u8; engine.heap().capacity() as usize];
    engine.heap().read_bytes(0, &mut bytes);
    let mut image = HeapImage::new(&bytes);
    // Present and absent keys, repeated, more than the parallel threshold and not a whole
    // number of parts.
    let keys: Vec<u64> = (0..10_007u64).map(|i| (i * 7_919) % 95_000).collect();
    for threads in [1, 2, 3] {
        let got = cpu::btree_get(&bytes, threads, tree.ptr().0, &keys).unwrap();
        let expected: Vec<Option<u64>> = keys.iter().map(|&k| tree.get(&mut image, k).unwrap()).collect();
        assert_eq!(got, expected, "B-link, {threads} threads");
        let byte_keys: Vec<[u8; 8]> = keys.iter().map(|k| k.to_be_bytes()).collect();
        let refs: Vec<&[u8]> = byte_keys.iter().map(|k| &k[..]).collect();
        let got = cpu::art_get(&bytes, threads, art.ptr().0, &refs).unwrap();
        let expected: Vec<Option<u64>> = refs.iter().map(|k| art.get(&mut image, k).unwrap()).collect();
        assert_eq!(got, expected, "ART, {threads} threads");
        assert_eq!(got.iter().filter(|v| v.is_some()).count(), keys.iter().filter(|&&k| k % 3 == 0 && k < 90_000).count());
    }
}
