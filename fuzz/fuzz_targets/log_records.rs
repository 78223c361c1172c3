//! Log-record parsing: segment headers, frames (records and pads), the re-decode that replay
//! uses, and the search past damage for a later flush. Never a panic; and the replay decoder
//! agrees with the validating one on every frame that validates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tusk_storage::log_format::{decode_frame, decode_validated, later_flush_after, Frame, SegmentHeader};

fuzz_target!(|input: &[u8]| {
    let Some((&flags, data)) = input.split_first() else { return };
    let mut data = data.to_vec();
    if flags & 1 != 0 {
        tusk_fuzz::repair_segment(&mut data);
    }
    let _ = SegmentHeader::decode(&data);
    // Walk as recovery's scan does: from every frame boundary, and on damage, look past it.
    let start = if flags & 2 != 0 { 0 } else { tusk_storage::log_format::SEGMENT_HEADER_SIZE.min(data.len()) };
    let mut at = start;
    let mut steps = 0;
    while steps < 10_000 {
        steps += 1;
        match decode_frame(&data, at) {
            Frame::Record(view, next) => {
                let again = decode_validated(&data, at).expect("a validated record decodes again");
                assert_eq!(again.header, view.header);
                assert!(again.writes().eq(view.writes()), "replay decodes other writes than the scan validated");
                assert_eq!(view.writes().count(), view.write_count() as usize);
                assert!(next > at && next <= data.len());
                at = next;
            }
            Frame::Pad(next) => {
                assert!(next > at && next <= data.len());
                at = next;
            }
            Frame::End | Frame::Zeros => break,
            Frame::Invalid(_) => match later_flush_after(&data, at) {
                Some(next) => {
                    assert!(next > at && next < data.len());
                    at = next;
                }
                None => break,
            },
        }
    }
    // The replay decoder also meets positions the scan never validated (it must not panic).
    for at in (0..data.len().min(256)).step_by(8) {
        if let Some(view) = decode_validated(&data, at) {
            let _ = view.writes().take(64).count();
        }
    }
});
