//! Whether bytes are all zero, at memory speed: the log's scan checks every flush's pad and
//! a segment's unwritten tail this way, and a reopen on demand every line of an image.

/// Bytes per step: an OR over a fixed-size block, which the compiler turns into a few
/// vector instructions instead of a compare and branch per byte.
const BLOCK: usize = 64;

/// Whether every byte of `bytes` is zero.
pub fn all_zero(bytes: &[u8]) -> bool {
    let blocks = bytes.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    for block in blocks {
        if block.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_set_bit_anywhere_is_seen() {
        for len in [0usize, 1, 7, 63, 64, 65, 127, 128, 200, 4096] {
            assert!(all_zero(&vec![0u8; len]), "{len} zeros");
            for at in 0..len {
                for bit in [0x01u8, 0x80] {
                    let mut bytes = vec![0u8; len];
                    bytes[at] = bit;
                    assert!(!all_zero(&bytes), "bit {bit:#x} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn unaligned_slices_are_checked_whole() {
        let mut bytes = vec![0u8; 300];
        bytes[299] = 1;
        for start in 0..64 {
            assert!(!all_zero(&bytes[start..]), "from {start}");
            assert!(all_zero(&bytes[start..299]), "from {start} to the set byte");
        }
    }
}
