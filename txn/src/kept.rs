//! Buffers kept from one use to the next, and when a huge one goes back.
//!
//! A large transaction's lists and its redo record grow to its size. Freeing them after every
//! use makes the next one of that size fault every page in again (a 1 M-upsert batch's 108 MB
//! record: 15% of the batch's time in the kernel zeroing pages); keeping them for good keeps
//! a 64 M-key load's gigabytes with the store. So a buffer is kept while uses of its size
//! follow, and a use that needs under a quarter of a buffer past the kept size gives back
//! the rest.

/// Empties `buf` for its next use. Past `kept_bytes`, a buffer the use just ended filled
/// under a quarter of (an earlier, larger use grew it) shrinks to `kept_bytes` or to twice
/// this use, whichever is more.
pub fn clear_for_reuse<T>(buf: &mut Vec<T>, kept_bytes: usize) {
    let used = buf.len();
    buf.clear();
    let kept = kept_bytes / std::mem::size_of::<T>().max(1);
    if buf.capacity() > kept && used < buf.capacity() / 4 {
        buf.shrink_to(kept.max(2 * used));
    }
}

#[cfg(test)]
mod tests {
    use super::clear_for_reuse;

    #[test]
    fn a_huge_buffer_stays_while_uses_of_its_size_follow_and_goes_with_a_small_one() {
        let kept_bytes = 1 << 16;
        let mut buf: Vec<u64> = Vec::new();
        buf.resize(kept_bytes, 1);
        let huge = buf.capacity();
        clear_for_reuse(&mut buf, kept_bytes);
        assert!(buf.is_empty() && buf.capacity() == huge, "the use that grew it filled it");
        buf.resize(kept_bytes / 2, 1);
        clear_for_reuse(&mut buf, kept_bytes);
        assert_eq!(buf.capacity(), huge, "half of it used: kept");
        buf.resize(10, 1);
        clear_for_reuse(&mut buf, kept_bytes);
        assert_eq!(buf.capacity(), kept_bytes / 8, "a small use: back to the kept bytes");
        buf.resize(kept_bytes / 8, 1);
        clear_for_reuse(&mut buf, kept_bytes);
        assert_eq!(buf.capacity(), kept_bytes / 8, "within the kept bytes: never shrunk");
    }

    #[test]
    fn a_shrunk_buffer_keeps_twice_its_last_use() {
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
        buf.resize(100 << 10, 0);
        clear_for_reuse(&mut buf, 4 << 10);
        assert!(buf.capacity() >= 200 << 10 && buf.capacity() < 1 << 20, "{}", buf.capacity());
    }
}
