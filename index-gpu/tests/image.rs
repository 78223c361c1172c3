//! The index read paths on a plain heap image answer as the transaction did when the image
//! was taken, and a damaged link in an image is an error, not a panic.

mod common;

use tusk_index::heap::HeapRead;
use tusk_index::image::HeapImage;
use tusk_index::BTree;

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
}
