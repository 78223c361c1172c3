// tusk kernels: shared definitions. Compiled by NVRTC as one translation unit together with
// upload.cu, btree.cu, art.cu and answers.cu (tusk-kernels concatenates them in that order): no include
// directives and no system headers, so the fixed-width types are our own.
//
// The heap mirror, in one of two layouts (index-gpu/src/mirror/index_pages.rs):
// - the whole heap: one device buffer holding heap bytes [0, extent) at their heap offsets;
// - the indexes only: a device buffer of the pages holding the trees' nodes and descriptors,
//   and `pages`, one u32 per heap page of the extent giving the device page that holds it
//   (TUSK_NO_PAGE: not mirrored). Every object (a slab chunk, a descriptor) sits on whole heap
//   pages of its own and its pages are consecutive on the device too, so a node that starts
//   on a mirrored page continues on the device pages after it.
// Every kernel bounds-checks each offset it follows (tusk_map) before it loads, so a damaged
// link ends as an error report (see tusk_fail) and never as an out-of-bounds access, which
// would poison the whole CUDA context.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// Error codes written to the first word of a kernel's error slot (0 = no error); the second
// word holds the heap offset (or link) at fault. The first error of a launch wins.
#define TUSK_ERR_BAD_OFFSET 1ull   // an offset outside the mirrored extent, or misaligned
#define TUSK_ERR_LOOP 2ull         // a descent longer than any valid tree's (a cycle)
#define TUSK_ERR_BAD_LINK 3ull     // an ART link of an unknown kind, index 0 or beyond 32 chunks
#define TUSK_ERR_TOO_DEEP 4ull     // an ART subtree deeper than the walk's stack: answer on the CPU
#define TUSK_ERR_BAD_TERMINAL 5ull // an ART terminal link that is not a leaf

__device__ __forceinline__ void tusk_fail(u64* err, u64 code, u64 where) {
    if (atomicCAS(err, 0ull, code) == 0ull) {
        err[1] = where;
    }
}

// [off, off + len) lies inside the mirrored extent (no overflow).
__device__ __forceinline__ bool tusk_in_heap(u64 extent, u64 off, u64 len) {
    return off <= extent && len <= extent - off;
}

#define TUSK_NO_PAGE 0xffffffffu
#define TUSK_PAGE_SHIFT 12

// Where the kernels find heap bytes: `base` holds `bytes` bytes; heap offsets below `extent`
// are valid; `pages` is null for the whole-heap layout (device offset = heap offset).
struct View {
    const u8* __restrict__ base;
    u64 extent;
    const u32* __restrict__ pages;
    u64 bytes;
};

// The device offset `at` of heap bytes [off, off + len), if the heap holds them and the
// mirror has them; false otherwise (nothing may be loaded then).
__device__ __forceinline__ bool tusk_map(const View& v, u64 off, u64 len, u64& at) {
    if (!tusk_in_heap(v.extent, off, len)) return false;
    if (v.pages == nullptr) {
        at = off;
        return true;
    }
    const u32 page = __ldg(v.pages + (off >> TUSK_PAGE_SHIFT));
    if (page == TUSK_NO_PAGE) return false;
    at = ((u64)page << TUSK_PAGE_SHIFT) | (off & ((1ull << TUSK_PAGE_SHIFT) - 1ull));
    return tusk_in_heap(v.bytes, at, len);
}

// Read-only loads through the non-coherent cache: the heap never changes during a launch.
__device__ __forceinline__ u64 tusk_ld(const u8* __restrict__ heap, u64 off) {
    return __ldg(reinterpret_cast<const u64*>(heap + off));
}

__device__ __forceinline__ ulonglong2 tusk_ld2(const u8* __restrict__ heap, u64 off) {
    return __ldg(reinterpret_cast<const ulonglong2*>(heap + off));
}

// 128-bit sums as (lo, hi) pairs: exact for any number of u64 addends below 2^64.
__device__ __forceinline__ void tusk_add128(u64& lo, u64& hi, u64 x) {
    u64 t = lo + x;
    hi += (t < lo) ? 1ull : 0ull;
    lo = t;
}

// Sum of (lo, hi) over a full warp; lane 0 holds the total. Every lane must call it.
__device__ __forceinline__ void tusk_warp_sum128(u64& lo, u64& hi) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 l2 = __shfl_down_sync(0xffffffffu, lo, o);
        u64 h2 = __shfl_down_sync(0xffffffffu, hi, o);
        u64 t = lo + l2;
        hi += h2 + ((t < lo) ? 1ull : 0ull);
        lo = t;
    }
}

__device__ __forceinline__ u64 tusk_warp_sum64(u64 x) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_down_sync(0xffffffffu, x, o);
    }
    return x;
}

// A thread group of T lanes (T a power of two, 1..32) inside a warp, aligned to T lanes.
template <int T>
struct Tile {
    u32 mask;  // the warp-lane bits of this tile
    int tl;    // this lane's index in the tile
    __device__ __forceinline__ Tile() {
        const int lane = threadIdx.x & 31;
        tl = lane & (T - 1);
        mask = (T == 32) ? 0xffffffffu : (((1u << T) - 1u) << (lane & ~(T - 1)));
    }
    __device__ __forceinline__ u32 sum(u32 v) const {
        if (T == 1) return v;
        return __reduce_add_sync(mask, v);
    }
    __device__ __forceinline__ u64 bcast(u64 v, int src) const {
        if (T == 1) return v;
        return __shfl_sync(mask, v, src, T);
    }
};

// Grid-stride helpers: the global thread index and the number of threads in the grid.
__device__ __forceinline__ u64 tusk_thread() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 tusk_threads() {
    return (u64)gridDim.x * blockDim.x;
}
