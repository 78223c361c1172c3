// B-link tree kernels over the heap mirror: batched point lookups and range count/sum.
//
// They read the CPU tree's nodes in place (index-gpu/src/btree/layout.rs), 512 bytes each:
//   byte   0  level (low 32 bits, 0 = leaf) | count (high 32 bits)
//   byte   8  high key (meaningful only when the right link is not 0)
//   byte  16  right link (0 for the rightmost node of a level)
//   byte  64  keys[28], ascending, `count` valid
//   byte 288  values[28] (internal nodes: children; child i covers [keys[i], keys[i+1]))
// and answer exactly as the CPU read paths (search.rs, range.rs) do.
//
// Point lookups (WCWS, "warp-cooperative work sharing"): a tile of T lanes serves one query
// at a time. At each node the tile loads the header (broadcast) and the key array in one
// coalesced read, each lane KPL = 32 / T keys as 16-byte pairs, issued together with the
// header so that a level costs one memory round trip, then counts the keys below the query
// with a tile reduction. Lehman–Yao: a key at or beyond the high key moves right. With VALS,
// an internal node's children are loaded with its keys (its level is known from the parent),
// so the child pointer comes from a register shuffle instead of a second round trip.
//
// Measured on an H100 (64 M keys, full nodes, shuffled lookups, kernel alone): T = 1 3.24 G/s,
// T = 4 up to 3.29, T = 8 2.76-3.08, T = 32 1.54; VALS 25-35% slower (twice the bytes of every
// internal node for one fewer round trip). The narrow tiles win by keeping more queries in
// flight per multiprocessor. The sector search below beats them all (64 M keys: 5.12 G/s against
// 3.16 for T = 1, same H100, same run) and is the mirror's default (cuda.rs: DEFAULT_BTREE_KERNEL);
// the range kernel still descends with a warp.

#define BT_NODE 512ull
#define BT_CAP 28
#define BT_KEYS 64ull
#define BT_VALUES 288ull

// What a descent hands back: the leaf holding (or that would hold) the key, its header, and
// the key's lower bound in it (lt: keys < key; le: keys <= key; found iff le > lt).
struct BtLeaf {
    u64 node;
    u64 at;  // the node's device offset
    u64 high;
    u64 right;
    u32 count;
    u32 lt;
    u32 le;
};

// The child of an internal node to descend to, from the key's lower bounds in it (lt: keys <
// key, le: keys <= key): layout.rs child_slot, keys[lt] == key ? lt : lt - 1 (keys[0] is the
// node's low bound).
__device__ __forceinline__ u32 bt_child_slot(u32 lt, u32 le) {
    return (le > lt) ? lt : (lt > 0 ? lt - 1 : 0);
}

// The most nodes a descent or chain walk can visit in a mirror of `extent` bytes: every node
// at most once (a longer walk follows a cycle in damaged data and is reported).
__device__ __forceinline__ u64 bt_max_steps(u64 extent) {
    return extent / BT_NODE + 2;
}

// The device offset of the node at heap offset `node`, if it is a mirrored, aligned node.
__device__ __forceinline__ bool bt_node(const View& v, u64 node, u64& at) {
    return (node & 63ull) == 0 && tusk_map(v, node, BT_NODE, at);
}

// The device offset of the node at heap offset `next`, reached from the node at `node` (device
// offset `at`): a node on the same heap page is on the same device page, so only a step to
// another page looks the page table up (consecutive leaves of a chunk share pages, so most
// steps along a leaf chain need no lookup).
__device__ __forceinline__ bool bt_step(const View& v, u64 node, u64 at, u64 next, u64& next_at) {
    if ((next >> TUSK_PAGE_SHIFT) != (node >> TUSK_PAGE_SHIFT)) return bt_node(v, next, next_at);
    next_at = at - node + next;
    return (next & 63ull) == 0 && tusk_in_heap(v.extent, next, BT_NODE) && tusk_in_heap(v.bytes, next_at, BT_NODE);
}

// Lane `tl`'s share of a node's keys (and, if `vals`, children): slots tl*KPL .. tl*KPL+KPL-1.
// Slots past the 28 are not loaded. The loads do not depend on the header, so the compiler
// issues them together with it.
template <int T, bool VALS>
__device__ __forceinline__ void bt_load(const u8* __restrict__ heap, u64 at, int tl, bool vals,
                                        u64 (&k)[32 / T], u64 (&v)[32 / T]) {
    constexpr int KPL = 32 / T;
    const int base = tl * KPL;
    if (KPL == 1) {
        k[0] = 0;
        v[0] = 0;
        if (base < BT_CAP) {
            k[0] = tusk_ld(heap, at + BT_KEYS + 8ull * base);
            if (VALS && vals) v[0] = tusk_ld(heap, at + BT_VALUES + 8ull * base);
        }
    } else {
        #pragma unroll
        for (int m = 0; m < KPL / 2; ++m) {
            const int i = base + 2 * m;
            k[2 * m] = 0;
            k[2 * m + 1] = 0;
            v[2 * m] = 0;
            v[2 * m + 1] = 0;
            if (i < BT_CAP) {
                const ulonglong2 p = tusk_ld2(heap, at + BT_KEYS + 8ull * i);
                k[2 * m] = p.x;
                k[2 * m + 1] = p.y;
                if (VALS && vals) {
                    const ulonglong2 c = tusk_ld2(heap, at + BT_VALUES + 8ull * i);
                    v[2 * m] = c.x;
                    v[2 * m + 1] = c.y;
                }
            }
        }
    }
}

// Descends from `root` to the leaf for `key` (search.rs: descend). Every lane of the tile
// calls it with the same arguments and gets the same answer. False after reporting an error.
template <int T, bool VALS>
__device__ __forceinline__ bool bt_descend(const View& v, u64 root, u64 key,
                                           const Tile<T>& t, u64* err, BtLeaf& out) {
    constexpr int KPL = 32 / T;
    const u8* __restrict__ heap = v.base;
    const u64 max_steps = bt_max_steps(v.extent);
    u64 node = root;
    u64 prev = 0, prev_at = 0;  // the node before `node`, and its device offset
    int expect = -1;  // the level expected at `node` (unknown at the root)
    for (u64 step = 0; step < max_steps; ++step) {
        u64 at;
        if (!(step == 0 ? bt_node(v, node, at) : bt_step(v, prev, prev_at, node, at))) {
            if (t.tl == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, node);
            return false;
        }
        prev = node;
        prev_at = at;
        const bool pre = VALS && expect > 0;
        const u64 lc = tusk_ld(heap, at);
        const u64 high = tusk_ld(heap, at + 8);
        const u64 right = tusk_ld(heap, at + 16);
        u64 k[KPL];
        u64 c[KPL];
        bt_load<T, VALS>(heap, at, t.tl, pre, k, c);
        if (right != 0 && key >= high) {  // Lehman–Yao: the key lies beyond this node
            node = right;
            continue;
        }
        const u32 level = (u32)lc;
        const u32 count = (u32)(lc >> 32);
        const u32 n = count < BT_CAP ? count : BT_CAP;
        u32 lt = 0, le = 0;
        #pragma unroll
        for (int j = 0; j < KPL; ++j) {
            const u32 i = (u32)(t.tl * KPL + j);
            if (i < n) {
                lt += k[j] < key ? 1u : 0u;
                le += k[j] <= key ? 1u : 0u;
            }
        }
        const u32 both = t.sum(lt | (le << 16));
        lt = both & 0xffffu;
        le = both >> 16;
        if (level == 0) {
            out = BtLeaf{node, at, high, right, count, lt, le};
            return true;
        }
        const u32 slot = bt_child_slot(lt, le);
        u64 child;
        if (pre) {
            // Shuffle each of the owner's KPL children and keep the one asked for: selecting
            // from `v` with a run-time index first would move `v` to local memory.
            const int owner = (int)(slot / KPL);
            const u32 j_at = slot % KPL;
            child = 0;
            #pragma unroll
            for (int j = 0; j < KPL; ++j) {
                const u64 b = t.bcast(c[j], owner);
                child = ((u32)j == j_at) ? b : child;
            }
        } else {
            child = tusk_ld(heap, at + BT_VALUES + 8ull * slot);
        }
        expect = (int)level - 1;
        node = child;
    }
    if (t.tl == 0) tusk_fail(err, TUSK_ERR_LOOP, root);
    return false;
}

template <int T, bool VALS>
__device__ __forceinline__ void bt_get(const View& v, u64 meta,
                                       const u64* __restrict__ keys, u64 n, u64* __restrict__ vals,
                                       u8* __restrict__ found, u64* err) {
    const Tile<T> t;
    u64 dmeta;
    if ((meta & 7ull) != 0 || !tusk_map(v, meta, 16, dmeta)) {
        if (tusk_thread() == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, meta);
        return;
    }
    const u64 root = tusk_ld(v.base, dmeta + 8);
    const u64 tiles = tusk_threads() / T;
    for (u64 q = tusk_thread() / T; q < n; q += tiles) {
        const u64 key = keys[q];
        BtLeaf leaf;
        u64 value = 0;
        u8 hit = 0;
        if (bt_descend<T, VALS>(v, root, key, t, err, leaf) && leaf.le > leaf.lt) {
            hit = 1;
            if (t.tl == 0) value = tusk_ld(v.base, leaf.at + BT_VALUES + 8ull * leaf.lt);
        }
        if (t.tl == 0) {
            vals[q] = value;
            found[q] = hit;
        }
    }
}

// MINB: blocks of 256 threads each multiprocessor should hold at once (__launch_bounds__'s
// second argument): it caps registers per thread, trading them for queries in flight.
#define TUSK_BTREE_GET(NAME, T, VALS, MINB)                                                        \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                        \
    NAME(const u8* __restrict__ heap, u64 extent, const u32* __restrict__ pages, u64 bytes,      \
         u64 meta, const u64* __restrict__ keys, u64 n, u64* __restrict__ vals,                    \
         u8* __restrict__ found, u64* err) {                                                       \
        bt_get<T, VALS>(View{heap, extent, pages, bytes}, meta, keys, n, vals, found, err);        \
    }

TUSK_BTREE_GET(tusk_btree_get_t1, 1, false, 1)
TUSK_BTREE_GET(tusk_btree_get_t2, 2, false, 1)
TUSK_BTREE_GET(tusk_btree_get_t4, 4, false, 1)
TUSK_BTREE_GET(tusk_btree_get_t8, 8, false, 1)
TUSK_BTREE_GET(tusk_btree_get_t16, 16, false, 1)
TUSK_BTREE_GET(tusk_btree_get_t32, 32, false, 1)
TUSK_BTREE_GET(tusk_btree_get_t4v, 4, true, 1)
TUSK_BTREE_GET(tusk_btree_get_t8v, 8, true, 1)
TUSK_BTREE_GET(tusk_btree_get_t16v, 16, true, 1)
TUSK_BTREE_GET(tusk_btree_get_t32v, 32, true, 1)
// Register-capped variants: more resident queries per multiprocessor (t1 with 3 blocks: 80
// registers, a few spilled bytes; t2 with 4: 64 registers, none spilled; tighter caps spill more).
TUSK_BTREE_GET(tusk_btree_get_t1_o3, 1, false, 3)
TUSK_BTREE_GET(tusk_btree_get_t2_o4, 2, false, 4)

// Sector search: one thread per query reads a node's keys one 32-byte sector (four keys) at a
// time instead of all 28 at once. The profile of the scan (BENCHMARKS.md, issue 30) showed it
// waiting on memory with a quarter of the warps a multiprocessor holds, each thread keeping 28
// keys in registers, and reading about 670 bytes a lookup at 64 M keys. A sector search keeps
// four keys live and reads the header's sector and three or fewer key sectors a node, at the
// price of dependent round trips; GUESS starts each child at the sector its key's place in the
// parent's separators predicts (the keys are spread evenly between separators unless the data
// is skewed, and a wrong guess only costs a round trip), so most nodes need one or two.
#define BT_SECTOR_KEYS 4u

__device__ __forceinline__ void bt_sector(const u8* __restrict__ heap, u64 at, u32 s, u64 (&k)[4]) {
    const ulonglong2 a = tusk_ld2(heap, at + BT_KEYS + 32ull * s);
    const ulonglong2 b = tusk_ld2(heap, at + BT_KEYS + 32ull * s + 16ull);
    k[0] = a.x;
    k[1] = a.y;
    k[2] = b.x;
    k[3] = b.y;
}

// The key's lower bounds among the node's first n keys (lt: keys < key, le: keys <= key),
// searching sector by sector. On entry `s` is the sector already loaded into `k` (any value:
// one past the node's sectors is loaded afresh); on return `s` and `k` are the last sector read.
// Invariant of [lo, hi): every key of the sectors before lo is < key, and the first key of
// sector hi (if any) is > key, so the lower bound lies in [4 lo, 4 hi].
template <bool GUESS>
__device__ __forceinline__ void bt_sector_search(const u8* __restrict__ heap, u64 at, u32 n, u64 key,
                                                 u32& s, u64 (&k)[4], u32& lt, u32& le) {
    u32 lo = 0, hi = (n + BT_SECTOR_KEYS - 1) / BT_SECTOR_KEYS;
    if (n == 0) {
        lt = 0;
        le = 0;
        return;
    }
    if (s >= hi) {
        s = hi >> 1;
        bt_sector(heap, at, s, k);
    }
    bool guessed = GUESS;
    for (;;) {
        const u32 valid = min(BT_SECTOR_KEYS, n - BT_SECTOR_KEYS * s);
        u32 below = 0, at_most = 0;
        #pragma unroll
        for (u32 j = 0; j < BT_SECTOR_KEYS; ++j) {
            if (j < valid) {
                below += k[j] < key ? 1u : 0u;
                at_most += k[j] <= key ? 1u : 0u;
            }
        }
        // The bound is inside this sector, or at its start (its first key is the key, or
        // nothing before it is left to search).
        if ((below > 0 && below < valid) || (below == 0 && (at_most > 0 || s == lo))) {
            lt = BT_SECTOR_KEYS * s + below;
            le = BT_SECTOR_KEYS * s + at_most;
            return;
        }
        const bool right = below == valid;
        if (right) {
            lo = s + 1;
            if (lo == hi) {
                // Every key before sector lo is < key and sector lo's first (if any) is > key.
                lt = min(BT_SECTOR_KEYS * lo, n);
                le = lt;
                return;
            }
        } else {
            hi = s;
        }
        // A guess that missed is usually near: try the neighbour first, then halve.
        s = guessed ? (right ? lo : hi - 1) : (lo + hi) >> 1;
        guessed = false;
        bt_sector(heap, at, s, k);
    }
}

// The sector of a child node where `key` probably lies: its place between the child's
// separators keys[slot] and keys[slot + 1] (or the node's high key after the last one) times the
// parent's count (nodes of a level fill alike), when the last sector read holds them; else the
// middle sector.
__device__ __forceinline__ u32 bt_guess(u64 key, u32 slot, u32 n, u32 s, const u64 (&k)[4], u64 high, u64 right) {
    const u32 middle = (BT_CAP / BT_SECTOR_KEYS) / 2;
    const u32 first = BT_SECTOR_KEYS * s;
    if (slot < first || slot >= first + BT_SECTOR_KEYS) return middle;
    u64 lo_key = 0, hi_key = 0;
    #pragma unroll
    for (u32 j = 0; j < BT_SECTOR_KEYS; ++j) {
        if (first + j == slot) lo_key = k[j];
        if (first + j == slot + 1) hi_key = k[j];
    }
    if (slot + 1 == n) {
        if (right == 0) return middle;
        hi_key = high;
    } else if (slot + 1 >= first + BT_SECTOR_KEYS) {
        return middle;
    }
    if (hi_key <= lo_key || key < lo_key) return middle;
    const double f = (double)(key - lo_key) / (double)(hi_key - lo_key);
    const u32 place = (u32)(f * (double)n);
    return min(place / BT_SECTOR_KEYS, BT_CAP / BT_SECTOR_KEYS - 1);
}

// bt_descend with the sector search (one thread per query).
template <bool GUESS>
__device__ __forceinline__ bool bt_descend_sectors(const View& v, u64 root, u64 key, u64* err, BtLeaf& out) {
    const u8* __restrict__ heap = v.base;
    const u64 max_steps = bt_max_steps(v.extent);
    u64 node = root;
    u64 prev = 0, prev_at = 0;
    u32 s = (BT_CAP / BT_SECTOR_KEYS) / 2;  // the sector loaded with the next node's header
    for (u64 step = 0; step < max_steps; ++step) {
        u64 at;
        if (!(step == 0 ? bt_node(v, node, at) : bt_step(v, prev, prev_at, node, at))) {
            tusk_fail(err, TUSK_ERR_BAD_OFFSET, node);
            return false;
        }
        prev = node;
        prev_at = at;
        const u64 lc = tusk_ld(heap, at);
        const u64 high = tusk_ld(heap, at + 8);
        const u64 right = tusk_ld(heap, at + 16);
        u64 k[4];
        bt_sector(heap, at, s, k);
        if (right != 0 && key >= high) {  // Lehman–Yao: the key lies beyond this node
            node = right;
            continue;
        }
        const u32 level = (u32)lc;
        const u32 count = (u32)(lc >> 32);
        const u32 n = count < BT_CAP ? count : BT_CAP;
        u32 lt, le;
        bt_sector_search<GUESS>(heap, at, n, key, s, k, lt, le);
        if (level == 0) {
            out = BtLeaf{node, at, high, right, count, lt, le};
            return true;
        }
        const u32 slot = bt_child_slot(lt, le);
        node = tusk_ld(heap, at + BT_VALUES + 8ull * slot);
        s = GUESS ? bt_guess(key, slot, n, s, k, high, right) : (BT_CAP / BT_SECTOR_KEYS) / 2;
    }
    tusk_fail(err, TUSK_ERR_LOOP, root);
    return false;
}

template <bool GUESS>
__device__ __forceinline__ void bt_get_sectors(const View& v, u64 meta,
                                               const u64* __restrict__ keys, u64 n, u64* __restrict__ vals,
                                               u8* __restrict__ found, u64* err) {
    u64 dmeta;
    if ((meta & 7ull) != 0 || !tusk_map(v, meta, 16, dmeta)) {
        if (tusk_thread() == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, meta);
        return;
    }
    const u64 root = tusk_ld(v.base, dmeta + 8);
    const u64 threads = tusk_threads();
    for (u64 q = tusk_thread(); q < n; q += threads) {
        const u64 key = keys[q];
        BtLeaf leaf;
        u64 value = 0;
        u8 hit = 0;
        if (bt_descend_sectors<GUESS>(v, root, key, err, leaf) && leaf.le > leaf.lt) {
            hit = 1;
            value = tusk_ld(v.base, leaf.at + BT_VALUES + 8ull * leaf.lt);
        }
        vals[q] = value;
        found[q] = hit;
    }
}

#define TUSK_BTREE_GET_SECTORS(NAME, GUESS, MINB)                                                  \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                        \
    NAME(const u8* __restrict__ heap, u64 extent, const u32* __restrict__ pages, u64 bytes,      \
         u64 meta, const u64* __restrict__ keys, u64 n, u64* __restrict__ vals,                    \
         u8* __restrict__ found, u64* err) {                                                       \
        bt_get_sectors<GUESS>(View{heap, extent, pages, bytes}, meta, keys, n, vals, found, err);  \
    }

TUSK_BTREE_GET_SECTORS(tusk_btree_get_s1, false, 1)
TUSK_BTREE_GET_SECTORS(tusk_btree_get_g1, true, 1)
TUSK_BTREE_GET_SECTORS(tusk_btree_get_g1_o4, true, 4)

// Count and sum of the values of the keys in [lo, hi] (inclusive; empty when lo > hi), one warp
// per range: one descent to the leaf holding lo, then along the leaf chain by right links
// (range.rs: for_each_run), each leaf's values summed by the lanes in one coalesced read. A leaf
// whose high key is at most the end is taken whole without reading its keys, as on the CPU.
// out[3q] = count, out[3q+1..3q+3] = sum (lo, hi words).
extern "C" __global__ void __launch_bounds__(256)
tusk_btree_count_sum(const u8* __restrict__ heap, u64 extent, const u32* __restrict__ pages, u64 bytes,
                     u64 meta, const u64* __restrict__ ranges, u64 n, u64* __restrict__ out, u64* err) {
    const Tile<32> t;
    const int lane = t.tl;
    const View v{heap, extent, pages, bytes};
    u64 dmeta;
    if ((meta & 7ull) != 0 || !tusk_map(v, meta, 16, dmeta)) {
        if (tusk_thread() == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, meta);
        return;
    }
    const u64 root = tusk_ld(v.base, dmeta + 8);
    const u64 max_steps = bt_max_steps(extent);
    const u64 warps = tusk_threads() / 32;
    for (u64 q = tusk_thread() / 32; q < n; q += warps) {
        const u64 lo = ranges[2 * q];
        const u64 hi = ranges[2 * q + 1];
        u64 cnt = 0, slo = 0, shi = 0;
        BtLeaf leaf;
        if (lo <= hi && bt_descend<32, false>(v, root, lo, t, err, leaf)) {
            // The range is [lo, end) with end = hi + 1 over u128: end_max stands for 2^64.
            const bool end_max = hi == ~0ull;
            const u64 end = hi + 1;
            u64 node = leaf.node, at = leaf.at, high = leaf.high, right = leaf.right;
            u32 count = leaf.count, from = leaf.lt;
            for (u64 step = 0;; ++step) {
                if (step >= max_steps) {
                    if (lane == 0) tusk_fail(err, TUSK_ERR_LOOP, node);
                    break;
                }
                const u32 m = count < BT_CAP ? count : BT_CAP;
                const bool inside = right != 0 && (end_max || high <= end);
                // The right sibling's device offset, looked up before this leaf's values are
                // read, so that with a page table the lookup overlaps them instead of adding a
                // round trip to every step along the chain.
                u64 right_at = 0;
                const bool right_ok = inside && bt_step(v, node, at, right, right_at);
                u32 to;
                if (inside || end_max) {
                    to = m;
                } else {
                    const u64 k = (u32)lane < m ? tusk_ld(heap, at + BT_KEYS + 8ull * lane) : 0;
                    to = __popc(__ballot_sync(0xffffffffu, (u32)lane < m && k < end));
                }
                if ((u32)lane >= from && (u32)lane < to) {
                    tusk_add128(slo, shi, tusk_ld(heap, at + BT_VALUES + 8ull * lane));
                }
                if (from < to) cnt += to - from;
                if (!inside) break;
                node = right;
                if (!right_ok) {
                    if (lane == 0) tusk_fail(err, TUSK_ERR_BAD_OFFSET, node);
                    break;
                }
                at = right_at;
                const u64 lc = tusk_ld(heap, at);
                high = tusk_ld(heap, at + 8);
                right = tusk_ld(heap, at + 16);
                count = (u32)(lc >> 32);
                from = 0;
            }
        }
        tusk_warp_sum128(slo, shi);
        if (lane == 0) {
            out[3 * q] = cnt;
            out[3 * q + 1] = slo;
            out[3 * q + 2] = shi;
        }
    }
}
