// Adaptive Radix Tree kernels over the heap mirror: batched point lookups and prefix
// count/sum, reading the CPU tree's per-kind slabs in place (index-gpu/src/art):
//
// - links (link.rs): kind in the high byte, 1-based slab index in the low 56 bits, 0 = null;
//   kinds 0..3 are N4, N16, N48, N256, kinds 4.. leaves by key-size class (8 << (kind - 4)).
// - slabs (slab.rs): index i of a kind lives in chunk c = floor(log2(i - 1 + 2^base)) - base
//   at slot x - 2^(base + c); the 32 chunk offsets per kind are in the descriptor (meta.rs,
//   layout version 2: byte 960 + kind * 256). Slot sizes and base exponents come from the host (taken from
//   the Rust definitions), so they cannot drift from the CPU's.
// - inner nodes (node.rs): word 0 count (bits 0..16) | prefix length (bits 32..64), word 1 the
//   first 8 prefix bytes, word 2 the terminal link; N4 keys at 24, children at 32; N16 keys at
//   24 (two words), children at 40; N48 index bytes at 64, children at 320; N256 children at 64.
// - leaves (leaf.rs): word 0 key length, word 1 value, key bytes from byte 16, zero-padded.
//
// Query keys (at most 32 bytes, TUSK_ART_MAX_KEY) arrive packed little-endian 8 bytes to a
// word, zero-padded, as leaf.rs packs them: either all of one length (`fixed_len` >= 0, key q at
// word q * ceil(fixed_len / 8)) or with per-key word offsets and lengths.
//
// Measured on an H100 (16 M random 8-byte big-endian keys, shuffled lookups, kernel alone):
// 9.45 G lookups/s, with or without the speculative child load (the top levels of such a tree
// sit in L2; a lookup reads about four random sectors below them).

#define ART_KINDS 14
#define ART_CHUNKS 32
#define ART_N4 0u
#define ART_N16 1u
#define ART_N48 2u
#define ART_N256 3u
#define ART_LEAF0 4u
#define ART_INDEX_MASK ((1ull << 56) - 1ull)
#define ART_ROOT 8ull
#define ART_CHUNK_TABLES_OFF 960ull
#define ART_CHUNK_TABLE_SIZE 256ull
#define ART_META_SIZE 14784ull
#define TUSK_ART_MAX_KEY 32u
// Frames of the prefix walk's stack, per warp (nodes nested below the covering node).
#define ART_STACK 48
#define ART_WARPS_PER_BLOCK 8

// The per-block copy of the descriptor's chunk tables and the kinds' slot geometry.
struct ArtShared {
    u64 chunks[ART_KINDS * ART_CHUNKS];
    u64 slot[ART_KINDS];
    u32 base[ART_KINDS];
};

// Fills `s` (every thread of the block calls it; it ends with a barrier) and `dmeta`, the
// descriptor's device offset. `geom` holds the slot sizes then the base exponents, ART_KINDS
// words each. False if the descriptor lies outside the mirror (then nothing may be read
// through it).
//
// The chunk offsets are kept as device offsets: a chunk is one object, contiguous on the
// device (common.cuh), so every slot's device offset is its chunk's plus its place in it, and
// the walks below need no page lookups. From here on the kernels bounds-check device offsets
// against `v.bytes`. A chunk not allocated (0) or not mirrored becomes ART_NO_CHUNK, whose
// slots fail every bounds check.
#define ART_NO_CHUNK (1ull << 63)
__device__ __forceinline__ bool art_load_shared(ArtShared& s, const View& v, u64 meta, const u64* __restrict__ geom,
                                                u64& dmeta) {
    const bool ok = (meta & 7ull) == 0 && tusk_map(v, meta, ART_META_SIZE, dmeta);
    for (u32 i = threadIdx.x; i < ART_KINDS * ART_CHUNKS; i += blockDim.x) {
        const u32 kind = i / ART_CHUNKS, c = i % ART_CHUNKS;
        const u64 chunk = ok ? tusk_ld(v.base, dmeta + ART_CHUNK_TABLES_OFF + kind * ART_CHUNK_TABLE_SIZE + 8ull * c) : 0;
        u64 at = ART_NO_CHUNK;
        if (chunk == 0 || !tusk_map(v, chunk, 8, at)) at = ART_NO_CHUNK;
        s.chunks[i] = at;
    }
    if (threadIdx.x < ART_KINDS) {
        s.slot[threadIdx.x] = geom[threadIdx.x];
        s.base[threadIdx.x] = (u32)geom[ART_KINDS + threadIdx.x];
    }
    __syncthreads();
    return ok;
}

// Device offset of the slot `link` names (slab.rs: offset). False for a link no valid tree holds.
__device__ __forceinline__ bool art_locate(const ArtShared& s, u64 link, u32& kind, u64& off) {
    kind = (u32)(link >> 56);
    const u64 index = link & ART_INDEX_MASK;
    if (kind >= ART_KINDS || index == 0) return false;
    const u32 base = s.base[kind];
    const u64 x = index - 1 + (1ull << base);
    const u32 top = 63u - (u32)__clzll((i64)x);
    const u32 c = top - base;
    if (c >= ART_CHUNKS) return false;
    off = s.chunks[kind * ART_CHUNKS + c] + (x - (1ull << top)) * s.slot[kind];
    return true;
}

// A query key of at most 32 bytes in four words (no arrays: a run-time index would move them
// to local memory).
struct Key {
    u64 w0, w1, w2, w3;
    u32 len;
    __device__ __forceinline__ u64 word(u32 i) const {
        return i == 0 ? w0 : i == 1 ? w1 : i == 2 ? w2 : i == 3 ? w3 : 0ull;
    }
    // Byte `d` (d < len).
    __device__ __forceinline__ u32 byte(u32 d) const {
        return (u32)(word(d >> 3) >> (8 * (d & 7))) & 0xffu;
    }
    // Eight bytes from `d`, zero past the end (leaf.rs: key_word).
    __device__ __forceinline__ u64 word_at(u32 d) const {
        const u32 s = 8 * (d & 7);
        const u64 lo = word(d >> 3);
        if (s == 0) return lo;
        return (lo >> s) | (word((d >> 3) + 1) << (64 - s));
    }
};

__device__ __forceinline__ Key art_key(const u64* __restrict__ words, const u32* __restrict__ offs,
                                       const u8* __restrict__ lens, int fixed_len, u64 q) {
    Key k;
    u64 at;
    if (fixed_len >= 0) {
        k.len = (u32)fixed_len;
        at = q * (u64)((fixed_len + 7) / 8);
    } else {
        k.len = lens[q];
        at = offs[q];
    }
    const u32 nw = (k.len + 7) / 8;
    k.w0 = nw > 0 ? words[at] : 0;
    k.w1 = nw > 1 ? words[at + 1] : 0;
    k.w2 = nw > 2 ? words[at + 2] : 0;
    k.w3 = nw > 3 ? words[at + 3] : 0;
    return k;
}

// Mask of the low n bytes (n <= 8).
__device__ __forceinline__ u64 art_bytes_mask(u64 n) {
    return n >= 8 ? ~0ull : ((1ull << (8 * n)) - 1ull);
}

// Position of byte b among the first n (<= 8) bytes of `word`, or -1 (node.rs: find_byte).
__device__ __forceinline__ int art_find_byte(u64 word, u32 b, u32 n) {
    const u64 ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    const u64 x = word ^ (ones * b);
    u64 z = (x - ones) & ~x & highs;
    if (n < 8) z &= (1ull << (8 * n)) - 1ull;
    return z ? (__ffsll((i64)z) - 1) / 8 : -1;
}

// Whether the leaf of kind `kind` at `off` holds exactly `key` (search.rs: leaf_value): one
// round trip for length, value and key words. Reads no further than the leaf's class holds
// (a key longer than the class cannot be the leaf's), after checking that span is mirrored.
// Returns 1 (value set), 0, or -1 after reporting an error.
__device__ __forceinline__ int art_leaf_is(const u8* __restrict__ heap, u64 extent, u32 kind, u64 off, const Key& key,
                                           u64& value, u64* err) {
    const u32 nw = (key.len + 7) / 8;
    const u32 cap_words = 1u << (kind - ART_LEAF0);
    const u32 nr = nw < cap_words ? nw : cap_words;
    if ((off & 7ull) != 0 || !tusk_in_heap(extent, off, 16ull + 8ull * nr)) {
        tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
        return -1;
    }
    const u64 len = tusk_ld(heap, off);
    value = tusk_ld(heap, off + 8);
    bool same = len == (u64)key.len && nw <= cap_words;
    if (nr > 0) same = same && tusk_ld(heap, off + 16) == key.w0;
    if (nr > 1) same = same && tusk_ld(heap, off + 24) == key.w1;
    if (nr > 2) same = same && tusk_ld(heap, off + 32) == key.w2;
    if (nr > 3) same = same && tusk_ld(heap, off + 40) == key.w3;
    return same ? 1 : 0;
}

// Point lookup (search.rs: get) by one thread. Returns 1 found (value set), 0 absent, -1 after
// reporting an error. With SPEC, the child slot for the byte at the current depth is loaded
// together with the node's header (right whenever the node has no compressed prefix), so an
// N256 level costs one round trip and an N48 level two.
template <bool SPEC>
__device__ __forceinline__ int art_get_one(const u8* __restrict__ heap, u64 extent, const ArtShared& s,
                                           u64 root, const Key& key, u64& value, u64* err) {
    u64 link = root;
    u32 depth = 0;
    const u32 max_steps = 2 * key.len + 8;  // a valid tree needs at most len + 2
    for (u32 step = 0; step < max_steps; ++step) {
        if (link == 0) return 0;
        u32 kind;
        u64 off;
        if (!art_locate(s, link, kind, off)) {
            tusk_fail(err, TUSK_ERR_BAD_LINK, link);
            return -1;
        }
        if (kind >= ART_LEAF0) return art_leaf_is(heap, extent, kind, off, key, value, err);
        if ((off & 63ull) != 0 || !tusk_in_heap(extent, off, s.slot[kind])) {
            tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
            return -1;
        }
        // Loads that do not depend on the header, issued with it.
        const bool more = depth < key.len;
        const u32 b0 = more ? key.byte(depth) : 0;
        u64 s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0;
        if (kind == ART_N4) {
            s0 = tusk_ld(heap, off + 24);  // keys, then the four children
            s1 = tusk_ld(heap, off + 32);
            s2 = tusk_ld(heap, off + 40);
            s3 = tusk_ld(heap, off + 48);
            s4 = tusk_ld(heap, off + 56);
        } else if (kind == ART_N16) {
            s0 = tusk_ld(heap, off + 24);
            s1 = tusk_ld(heap, off + 32);
        } else if (SPEC && more) {
            s0 = kind == ART_N256 ? tusk_ld(heap, off + 64 + 8ull * b0) : tusk_ld(heap, off + 64 + 8ull * (b0 >> 3));
        }
        const u64 hdr = tusk_ld(heap, off);
        const u64 prefix = tusk_ld(heap, off + 8);
        const u64 terminal = tusk_ld(heap, off + 16);
        const u32 count = (u32)(hdr & 0xffffu);
        const u64 plen = hdr >> 32;
        if (plen > 0) {
            if ((u64)key.len < (u64)depth + plen) return 0;
            if (((prefix ^ key.word_at(depth)) & art_bytes_mask(plen)) != 0) return 0;
            depth += (u32)plen;
        }
        if (depth >= key.len) {
            link = terminal;
            continue;
        }
        const u32 b = key.byte(depth);
        const bool spec_ok = SPEC && plen == 0;
        if (kind == ART_N4) {
            const int i = art_find_byte(s0, b, count < 4 ? count : 4);
            if (i < 0) return 0;
            link = i == 0 ? s1 : i == 1 ? s2 : i == 2 ? s3 : s4;
        } else if (kind == ART_N16) {
            int i = art_find_byte(s0, b, count < 8 ? count : 8);
            if (i < 0 && count > 8) {
                i = art_find_byte(s1, b, count - 8 < 8 ? count - 8 : 8);
                if (i >= 0) i += 8;
            }
            if (i < 0) return 0;
            link = tusk_ld(heap, off + 40 + 8ull * (u32)i);
        } else if (kind == ART_N48) {
            const u64 w = spec_ok ? s0 : tusk_ld(heap, off + 64 + 8ull * (b >> 3));
            const u64 i = (w >> (8 * (b & 7))) & 0xffull;
            if (i == 0) return 0;
            link = tusk_ld(heap, off + 320 + 8ull * ((i - 1) % 48));
        } else {
            link = spec_ok ? s0 : tusk_ld(heap, off + 64 + 8ull * b);
        }
        depth += 1;
    }
    tusk_fail(err, TUSK_ERR_LOOP, root);
    return -1;
}

template <bool SPEC>
__device__ __forceinline__ void art_get(const View& v, u64 meta, const u64* __restrict__ geom,
                                        const u64* __restrict__ words, const u32* __restrict__ offs,
                                        const u8* __restrict__ lens, int fixed_len, u64 n, u64* __restrict__ vals,
                                        u8* __restrict__ found, u64* err) {
    __shared__ ArtShared s;
    u64 dmeta;
    if (!art_load_shared(s, v, meta, geom, dmeta)) {
        if (tusk_thread() == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, meta);
        return;
    }
    const u8* __restrict__ heap = v.base;
    const u64 extent = v.bytes;  // device offsets from here on
    const u64 root = tusk_ld(heap, dmeta + ART_ROOT);
    for (u64 q = tusk_thread(); q < n; q += tusk_threads()) {
        const Key key = art_key(words, offs, lens, fixed_len, q);
        u64 value = 0;
        const int r = art_get_one<SPEC>(heap, extent, s, root, key, value, err);
        vals[q] = r > 0 ? value : 0;
        found[q] = r > 0 ? 1 : 0;
    }
}

#define TUSK_ART_GET(NAME, SPEC)                                                                            \
    extern "C" __global__ void __launch_bounds__(256)                                                       \
    NAME(const u8* __restrict__ heap, u64 extent, const u32* __restrict__ pages, u64 bytes, u64 meta,       \
         const u64* __restrict__ geom, const u64* __restrict__ words, const u32* __restrict__ offs,         \
         const u8* __restrict__ lens, int fixed_len, u64 n, u64* __restrict__ vals, u8* __restrict__ found,  \
         u64* err) {                                                                                        \
        art_get<SPEC>(View{heap, extent, pages, bytes}, meta, geom, words, offs, lens, fixed_len, n, vals,  \
                      found, err);                                                                          \
    }

TUSK_ART_GET(tusk_art_get, true)
TUSK_ART_GET(tusk_art_get_nospec, false)

// ---- prefix count/sum ----

// Slots of an inner node's child list as the walk enumerates them: N4/N16 their sorted entries
// (at most count), N48 and N256 the 256 byte values.
__device__ __forceinline__ u32 art_slots(u32 kind, u32 count) {
    if (kind == ART_N4) return count < 4 ? count : 4;
    if (kind == ART_N16) return count < 16 ? count : 16;
    return 256;
}

// The child link in slot j of the inner node at `off` (0 when none): node.rs next_child's view.
__device__ __forceinline__ u64 art_slot_link(const u8* __restrict__ heap, u32 kind, u64 off, u32 count, u32 j) {
    if (j >= art_slots(kind, count)) return 0;
    if (kind == ART_N4) return tusk_ld(heap, off + 32 + 8ull * j);
    if (kind == ART_N16) return tusk_ld(heap, off + 40 + 8ull * j);
    if (kind == ART_N48) {
        const u64 i = heap[off + 64 + j];
        return i ? tusk_ld(heap, off + 320 + 8ull * ((i - 1) % 48)) : 0;
    }
    return tusk_ld(heap, off + 64 + 8ull * j);
}

// Adds the leaf `link` to (cnt, lo, hi). False after reporting an error.
__device__ __forceinline__ bool art_add_leaf(const u8* __restrict__ heap, u64 extent, const ArtShared& s, u64 link,
                                             u64& cnt, u64& lo, u64& hi, u64* err) {
    u32 kind;
    u64 off;
    if (!art_locate(s, link, kind, off)) {
        tusk_fail(err, TUSK_ERR_BAD_LINK, link);
        return false;
    }
    if ((off & 7ull) != 0 || !tusk_in_heap(extent, off, 16)) {
        tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
        return false;
    }
    cnt += 1;
    tusk_add128(lo, hi, tusk_ld(heap, off + 8));
    return true;
}

// Whether the leaf at `off` has a key starting with the prefix `p`: its length first, then
// only as many key words as the prefix spans (all inside the key, hence inside the leaf).
__device__ __forceinline__ bool art_leaf_starts_with(const u8* __restrict__ heap, u64 extent, u64 off, const Key& p,
                                                     u64* err, bool& failed) {
    const u32 nw = (p.len + 7) / 8;
    if ((off & 7ull) != 0 || !tusk_in_heap(extent, off, 16)) {
        tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
        failed = true;
        return false;
    }
    if (tusk_ld(heap, off) < (u64)p.len) return false;
    if (!tusk_in_heap(extent, off, 16ull + 8ull * nw)) {
        tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
        failed = true;
        return false;
    }
    for (u32 i = 0; i < nw; ++i) {
        const u64 m = art_bytes_mask(p.len - 8 * i);
        if (((tusk_ld(heap, off + 16 + 8ull * i) ^ p.word(i)) & m) != 0) return false;
    }
    return true;
}

struct ArtFrame {
    u64 off;
    u32 kind;
    u32 count;
    u32 win;      // first slot of the current 32-slot window
    u32 pending;  // inner children of the window not yet descended into (lane bits)
};

// One 32-slot window of a node, by the whole warp: lane l looks at slot win + l, adds a leaf
// child to its own sums and reports an inner child in the returned mask.
__device__ __forceinline__ u32 art_window(const u8* __restrict__ heap, u64 extent, const ArtShared& s, u32 kind, u64 off,
                                          u32 count, u32 win, u64& cnt, u64& lo, u64& hi, u64* err, bool& failed) {
    const u32 lane = threadIdx.x & 31;
    const u64 l = art_slot_link(heap, kind, off, count, win + lane);
    bool inner = false;
    if (l != 0) {
        if ((l >> 56) >= ART_LEAF0) {
            if (!art_add_leaf(heap, extent, s, l, cnt, lo, hi, err)) failed = true;
        } else {
            inner = true;
        }
    }
    failed = __any_sync(0xffffffffu, failed);
    return __ballot_sync(0xffffffffu, inner);
}

// Enters the inner node `link`: counts its terminal leaf (lane 0), then its first window.
// Lane 0 writes the frame. False after reporting an error.
__device__ __forceinline__ bool art_enter(const u8* __restrict__ heap, u64 extent, const ArtShared& s, u64 link,
                                          ArtFrame* frame, u64& cnt, u64& lo, u64& hi, u64* err) {
    const u32 lane = threadIdx.x & 31;
    u32 kind;
    u64 off;
    if (!art_locate(s, link, kind, off) || kind >= ART_LEAF0) {
        if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_LINK, link);
        return false;
    }
    if ((off & 63ull) != 0 || !tusk_in_heap(extent, off, s.slot[kind])) {
        if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
        return false;
    }
    const u32 count = (u32)(tusk_ld(heap, off) & 0xffffu);
    const u64 terminal = tusk_ld(heap, off + 16);
    bool failed = false;
    if (terminal != 0 && lane == 0) {
        if ((terminal >> 56) < ART_LEAF0) {
            tusk_fail(err, TUSK_ERR_BAD_TERMINAL, link);
            failed = true;
        } else if (!art_add_leaf(heap, extent, s, terminal, cnt, lo, hi, err)) {
            failed = true;
        }
    }
    failed = __any_sync(0xffffffffu, failed);
    if (failed) return false;
    const u32 pending = art_window(heap, extent, s, kind, off, count, 0, cnt, lo, hi, err, failed);
    if (failed) return false;
    if (lane == 0) {
        frame->off = off;
        frame->kind = kind;
        frame->count = count;
        frame->win = 0;
        frame->pending = pending;
    }
    __syncwarp();
    return true;
}

// Some child of an inner node (by the warp): the walk only needs one leaf below a node, and every
// leaf below it carries the node's full path.
__device__ __forceinline__ u64 art_any_child(const u8* __restrict__ heap, u32 kind, u64 off, u32 count) {
    const u32 lane = threadIdx.x & 31;
    const u32 slots = art_slots(kind, count);
    for (u32 win = 0; win < slots; win += 32) {
        const u64 l = art_slot_link(heap, kind, off, count, win + lane);
        const u32 m = __ballot_sync(0xffffffffu, l != 0);
        if (m) return __shfl_sync(0xffffffffu, l, __ffs(m) - 1);
    }
    return 0;
}

// Count and sum of the values of the keys starting with each prefix, one warp per prefix
// (range.rs: aggregate over Bounds::prefix). The warp descends to the node covering the prefix
// (comparing stored prefix bytes; bytes beyond the 8 stored ones are checked against one leaf
// below, as every leaf below carries the full path), then adds up its subtree with an explicit
// stack of frames in shared memory, each node's children taken 32 at a time by the lanes.
// out[3q] = count, out[3q+1..3q+3] = sum (lo, hi words). Launch with 256 threads per block.
extern "C" __global__ void __launch_bounds__(256)
tusk_art_count_sum_prefix(const u8* __restrict__ base, u64 heap_extent, const u32* __restrict__ pages, u64 bytes,
                          u64 meta, const u64* __restrict__ geom, const u64* __restrict__ words,
                          const u32* __restrict__ offs, const u8* __restrict__ lens, int fixed_len, u64 n,
                          u64* __restrict__ out, u64* err) {
    __shared__ ArtShared s;
    __shared__ ArtFrame stacks[ART_WARPS_PER_BLOCK][ART_STACK];
    u64 dmeta;
    if (!art_load_shared(s, View{base, heap_extent, pages, bytes}, meta, geom, dmeta)) {
        if (tusk_thread() == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, meta);
        return;
    }
    const u8* __restrict__ heap = base;
    const u64 extent = bytes;  // device offsets from here on (art_load_shared)
    const u32 lane = threadIdx.x & 31;
    ArtFrame* stack = stacks[(threadIdx.x / 32) % ART_WARPS_PER_BLOCK];
    const u64 root = tusk_ld(heap, dmeta + ART_ROOT);
    const u64 warps = tusk_threads() / 32;
    for (u64 q = tusk_thread() / 32; q < n; q += warps) {
        const Key p = art_key(words, offs, lens, fixed_len, q);
        u64 cnt = 0, lo = 0, hi = 0;
        bool failed = false;
        // 1. Descent to the node covering the prefix (every lane the same, broadcast loads).
        u64 link = root, cover = 0;
        u32 depth = 0;
        bool unverified = false;
        for (u32 step = 0;; ++step) {
            if (link == 0) break;
            if (step > 2 * TUSK_ART_MAX_KEY + 8) {
                if (lane == 0) tusk_fail(err, TUSK_ERR_LOOP, root);
                failed = true;
                break;
            }
            u32 kind;
            u64 off;
            if (!art_locate(s, link, kind, off)) {
                if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_LINK, link);
                failed = true;
                break;
            }
            if (kind >= ART_LEAF0) {
                bool bad = false;
                const bool hit = art_leaf_starts_with(heap, extent, off, p, err, bad);
                if (bad) {
                    failed = true;
                } else if (hit && lane == 0) {
                    cnt = 1;
                    lo = tusk_ld(heap, off + 8);
                }
                break;
            }
            if ((off & 63ull) != 0 || !tusk_in_heap(extent, off, s.slot[kind])) {
                if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
                failed = true;
                break;
            }
            const u64 hdr = tusk_ld(heap, off);
            const u64 prefix = tusk_ld(heap, off + 8);
            const u32 count = (u32)(hdr & 0xffffu);
            const u64 plen = hdr >> 32;
            if ((u64)depth + plen >= (u64)p.len) {
                // The prefix ends inside (or right after) this node's compressed path.
                const u64 rest = p.len - depth;  // bytes of the prefix in this node's path
                const u64 m = rest < 8 ? rest : 8;
                if (((prefix ^ p.word_at(depth)) & art_bytes_mask(m)) != 0) break;
                if (rest > 8) unverified = true;
                cover = link;
                break;
            }
            if (plen > 0) {
                if (((prefix ^ p.word_at(depth)) & art_bytes_mask(plen)) != 0) break;
                if (plen > 8) unverified = true;
                depth += (u32)plen;
            }
            const u32 b = p.byte(depth);
            u64 child = 0;
            if (kind == ART_N4 || kind == ART_N16) {
                const u64 w0 = tusk_ld(heap, off + 24);
                int i;
                if (kind == ART_N4) {
                    i = art_find_byte(w0, b, count < 4 ? count : 4);
                } else {
                    i = art_find_byte(w0, b, count < 8 ? count : 8);
                    if (i < 0 && count > 8) {
                        i = art_find_byte(tusk_ld(heap, off + 32), b, count - 8 < 8 ? count - 8 : 8);
                        if (i >= 0) i += 8;
                    }
                }
                if (i >= 0) child = tusk_ld(heap, off + (kind == ART_N4 ? 32 : 40) + 8ull * (u32)i);
            } else if (kind == ART_N48) {
                const u64 i = heap[off + 64 + b];
                if (i) child = tusk_ld(heap, off + 320 + 8ull * ((i - 1) % 48));
            } else {
                child = tusk_ld(heap, off + 64 + 8ull * b);
            }
            link = child;
            depth += 1;
        }
        // 2. Bytes skipped on the way: one leaf below the covering node settles them.
        if (!failed && cover != 0 && unverified) {
            u64 l = cover;
            for (u32 step = 0;; ++step) {
                u32 kind;
                u64 off;
                if (step > 4096 + 2 || l == 0 || !art_locate(s, l, kind, off)) {
                    if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_LINK, l);
                    failed = true;
                    break;
                }
                if (kind >= ART_LEAF0) {
                    bool bad = false;
                    if (!art_leaf_starts_with(heap, extent, off, p, err, bad)) cover = 0;
                    failed = bad;
                    break;
                }
                if ((off & 63ull) != 0 || !tusk_in_heap(extent, off, s.slot[kind])) {
                    if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, off);
                    failed = true;
                    break;
                }
                const u64 terminal = tusk_ld(heap, off + 16);
                l = terminal != 0 ? terminal : art_any_child(heap, kind, off, (u32)(tusk_ld(heap, off) & 0xffffu));
            }
        }
        // 3. The covering node's subtree.
        if (!failed && cover != 0) {
            int sp = 0;
            if (art_enter(heap, extent, s, cover, &stack[0], cnt, lo, hi, err)) {
                sp = 1;
            } else {
                failed = true;
            }
            while (sp > 0) {
                const ArtFrame f = stack[sp - 1];
                __syncwarp();
                if (f.pending != 0) {
                    const u32 l = __ffs(f.pending) - 1;
                    const u64 child = art_slot_link(heap, f.kind, f.off, f.count, f.win + l);
                    if (lane == 0) stack[sp - 1].pending = f.pending & (f.pending - 1);
                    __syncwarp();
                    if (sp == ART_STACK) {
                        if (lane == 0) tusk_fail(err, TUSK_ERR_TOO_DEEP, q);
                        failed = true;
                        break;
                    }
                    if (!art_enter(heap, extent, s, child, &stack[sp], cnt, lo, hi, err)) {
                        failed = true;
                        break;
                    }
                    sp += 1;
                } else {
                    const u32 win = f.win + 32;
                    if (win >= art_slots(f.kind, f.count)) {
                        sp -= 1;
                    } else {
                        const u32 pending = art_window(heap, extent, s, f.kind, f.off, f.count, win, cnt, lo, hi, err, failed);
                        if (failed) break;
                        if (lane == 0) {
                            stack[sp - 1].win = win;
                            stack[sp - 1].pending = pending;
                        }
                        __syncwarp();
                    }
                }
            }
        }
        const u64 total = tusk_warp_sum64(cnt);
        tusk_warp_sum128(lo, hi);
        if (lane == 0) {
            out[3 * q] = failed ? 0 : total;
            out[3 * q + 1] = failed ? 0 : lo;
            out[3 * q + 2] = failed ? 0 : hi;
        }
    }
}
