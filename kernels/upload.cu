// Mirror sync: scatters staged pieces of heap bytes to their heap offsets.
//
// The host packs the dirty runs into a pinned staging buffer in pieces of at most
// TUSK_PIECE bytes (piece i at byte i * TUSK_PIECE) with a table of (heap offset, length)
// pairs, copies both to the device in one go per buffer, and launches this kernel: one block
// per piece, 16-byte stores where the piece allows. Many small runs thus cost one copy and one
// launch per staging buffer instead of one copy each.

#define TUSK_PIECE 4096ull

//
// With `pages` (the index-only layout's page table of `page_count` entries, common.cuh), a
// piece is one heap page at most, its offset a heap offset: it goes to the device page the
// table names, and a page the table does not hold is skipped (each GPU of a mirror holds the
// trees it was given, so one staged buffer feeds GPUs with different tables).
extern "C" __global__ void __launch_bounds__(256)
tusk_scatter(u8* __restrict__ heap, u64 extent, const u32* __restrict__ pages, u64 page_count,
             const u64* __restrict__ table, const u8* __restrict__ data, u64 pieces, u64* err) {
    for (u64 p = blockIdx.x; p < pieces; p += gridDim.x) {
        u64 dst = table[2 * p];
        const u64 len = table[2 * p + 1];
        if (pages != nullptr) {
            const u64 page = dst >> TUSK_PAGE_SHIFT;
            const u32 to = page < page_count ? pages[page] : TUSK_NO_PAGE;
            if (to == TUSK_NO_PAGE) continue;
            if (((dst & ((1ull << TUSK_PAGE_SHIFT) - 1ull)) + len) > (1ull << TUSK_PAGE_SHIFT)) {
                if (threadIdx.x == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, dst);
                continue;
            }
            dst = ((u64)to << TUSK_PAGE_SHIFT) | (dst & ((1ull << TUSK_PAGE_SHIFT) - 1ull));
        }
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

