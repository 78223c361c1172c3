// Answers into a caller's buffers: the lookup kernels' found bytes packed into a bitmap (bit
// q % 64 of word q / 64 is query q's), so that the bytes copied back to the host are a value and
// one bit per query instead of a value and a byte. One thread per bitmap word; `found` starts
// at a multiple of 64 queries, so each thread's 64 bytes are one aligned 64-byte line.

extern "C" __global__ void __launch_bounds__(256)
tusk_found_bits(const u8* __restrict__ found, u64 n, u64* __restrict__ bits) {
    const u64 words = (n + 63) / 64;
    for (u64 w = tusk_thread(); w < words; w += tusk_threads()) {
        const u64 first = 64 * w;
        u64 word = 0;
        if (n - first >= 64) {
            const u64* eight = reinterpret_cast<const u64*>(found + first);
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                const u64 b = eight[j];
                #pragma unroll
                for (int i = 0; i < 8; ++i) word |= (u64)(((b >> (8 * i)) & 0xffull) != 0) << (8 * j + i);
            }
        } else {
            for (u64 i = 0; i < n - first; ++i) word |= (u64)(found[first + i] != 0) << i;
        }
        bits[w] = word;
    }
}

// Tests only (CudaMirror::fail_for_tests): a device fault. The context is left unusable, as a
// GPU that faults or falls off the bus leaves it: every later call on it fails.
extern "C" __global__ void tusk_fault() {
    __trap();
}
