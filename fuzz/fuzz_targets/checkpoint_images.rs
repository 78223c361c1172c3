//! The checkpoint formats: manifests, chunk image headers (alone and walked through a segment),
//! and the file names recovery lists. Never a panic; whatever decodes re-encodes to the same
//! value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tusk_storage::checkpoint_format::{parse_image_segment_name, parse_manifest_name, ChunkHeader, Manifest, CHUNK_HEADER_SIZE};

fuzz_target!(|input: &[u8]| {
    let Some((&flags, data)) = input.split_first() else { return };
    let mut data = data.to_vec();
    if flags & 1 != 0 {
        tusk_fuzz::repair_manifest(&mut data, &[]);
    }
    if let Ok(m) = Manifest::decode(&data) {
        let again = Manifest::decode(&m.encode()).expect("an encoded manifest decodes");
        assert_eq!(again, m);
        let _ = (m.min_lsn(), m.max_lsn());
    }
    let mut chunk = input[1..].to_vec();
    if flags & 2 != 0 {
        tusk_fuzz::repair_chunk(&mut chunk);
    }
    if flags & 4 != 0 {
        let mut segment = chunk.clone();
        tusk_fuzz::repair_images(&mut segment);
    }
    if let Ok(h) = ChunkHeader::decode(&chunk) {
        assert_eq!(ChunkHeader::decode(&h.encode()).expect("an encoded header decodes"), h);
        assert!(chunk.len() >= CHUNK_HEADER_SIZE);
    }
    if let Ok(name) = std::str::from_utf8(&input[1..input.len().min(64)]) {
        let _ = (parse_image_segment_name(name), parse_manifest_name(name));
    }
});
