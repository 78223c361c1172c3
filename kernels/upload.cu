// Mirror sync: scatters staged pieces of heap bytes to their heap offsets.
//
// The host packs the dirty runs into a pinned staging buffer in pieces of at most
// TUSK_PIECE bytes (piece i at byte i * TUSK_PIECE) with a table of (heap offset, length)
// pairs, copies both to the device in one go per buffer, and launches this kernel: one block
// per piece, 16-byte stores where the piece allows. Many small runs thus cost one copy and one
// launch per staging buffer instead of one copy each.

#define TUSK_PIECE 4096ull

extern "C" __global__ void __launch_bounds__(256)
tusk_scatter(u8* __restrict__ heap, u64 extent, const u64* __restrict__ table,
             const u8* __restrict__ data, u64 pieces, u64* err) {
    for (u64 p = blockIdx.x; p < pieces; p += gridDim.x) {
        const u64 dst = table[2 * p];
        const u64 len = table[2 * p + 1];
        if (len > TUSK_PIECE || !tusk_in_heap(extent, dst, len) || ((dst | len) & 7ull) != 0) {
            if (threadIdx.x == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, dst);
            continue;
        }
        const u8* src = data + p * TUSK_PIECE;
        if (((dst | len) & 15ull) == 0) {
            for (u64 i = (u64)threadIdx.x * 16; i < len; i += (u64)blockDim.x * 16) {
                *reinterpret_cast<ulonglong2*>(heap + dst + i) = *reinterpret_cast<const ulonglong2*>(src + i);
            }
        } else {
            for (u64 i = (u64)threadIdx.x * 8; i < len; i += (u64)blockDim.x * 8) {
                *reinterpret_cast<u64*>(heap + dst + i) = *reinterpret_cast<const u64*>(src + i);
            }
        }
    }
}

