//! The node layout of the B-link tree.
//!
//! Every node, leaf or internal, is one fixed block of [`NODE_SIZE`] = 512 bytes at a
//! 64-byte-aligned heap offset (nodes are carved from the tree's slab, see `slab.rs`):
//!
//! ```text
//! byte   0  word 0   level (low 32 bits; 0 = leaf) | count (high 32 bits)
//! byte   8  word 1   high key: every key in this node's subtree is < high key
//! byte  16  word 2   right link: heap offset of the right sibling, 0 for the rightmost node
//! byte  24  word 3   low key: every key in this node's subtree is ≥ low key (0 for the
//!                    leftmost node of a level); the left sibling's high key
//! byte  32  word 4   owner: the heap offset of the tree's descriptor while the node is in
//!                    the tree, 0 once freed (and in a node never handed out)
//! byte  40  words 5..7 reserved (zero)
//! byte  64  keys[CAPACITY]            ascending, `count` of them valid
//! byte 288  values[CAPACITY]          leaf: the value of keys[i]; internal: the child of keys[i]
//! ```
//!
//! Why this shape:
//! - The header fills exactly one cache line, and the keys start on the next one, so the
//!   28 keys (224 bytes, 3.5 lines) are contiguous and one GPU warp (or a narrowed thread
//!   group) can load them in one coalesced read, then the one value it needs.
//! - A rightmost node (right link 0) has no high key: its range is unbounded above, so the
//!   high-key word is meaningless there and the high key reads as `None`. That keeps the whole
//!   u64 key space usable (no key value is reserved as "infinity").
//! - Internal nodes store, for each child, the *lowest* key the child may hold: child i
//!   covers `[keys[i], keys[i+1])`, the last child `[keys[count-1], high key)`. The leftmost
//!   internal node of each level has keys\[0\] = 0, the smallest u64, so a search never falls
//!   off the left; a split of child i inserts (separator, new child) right after it. Leaves
//!   and internal nodes thus share one layout and one in-node search.
//! - Lehman–Yao: the high key and right link let a reader that arrives at a node after it
//!   split (a GPU mirror reader, a later latch-free CPU path) move right instead of restarting.
//! - The low key and the owner make a leaf prove on its own that it is the one for a key: a
//!   leaf of this tree (owner) whose `[low, high)` holds the key is that key's leaf, however
//!   the descent found it. So a transaction's descent may read the internal nodes without
//!   joining its read set (`search.rs`), and validates only the leaf it lands on.

use crate::heap::{HeapRead, HeapWrite};
use tusk_txn::TxnError;

/// Bytes per node: a power of two.
pub const NODE_SIZE: u64 = 512;
/// Nodes start on cache-line boundaries.
pub const NODE_ALIGN: u64 = 64;
/// Header bytes before the keys: one cache line.
pub const HEADER_SIZE: u64 = 64;
/// Key/value slots per node: what is left after the header, split evenly.
pub const CAPACITY: usize = ((NODE_SIZE - HEADER_SIZE) / 16) as usize;
/// Fewest entries of any node but the root (a split of a full node leaves at least this many
/// on each side). `remove` redistributes or merges below it (`remove.rs`).
pub const MIN_FILL: usize = CAPACITY / 2;

pub const LEVEL_COUNT_OFF: u64 = 0;
pub const HIGH_KEY_OFF: u64 = 8;
pub const RIGHT_LINK_OFF: u64 = 16;
pub const LOW_KEY_OFF: u64 = 24;
pub const OWNER_OFF: u64 = 32;
/// Words of the header a descent reads: level and count, high key, right link, low key, owner.
pub const HEADER_WORDS: usize = 5;
pub const KEYS_OFF: u64 = HEADER_SIZE;
pub const VALUES_OFF: u64 = KEYS_OFF + CAPACITY as u64 * 8;

const _: () = assert!(NODE_SIZE.is_power_of_two());
const _: () = assert!(VALUES_OFF + CAPACITY as u64 * 8 == NODE_SIZE);
const _: () = assert!(KEYS_OFF.is_multiple_of(NODE_ALIGN));

/// Heap offset of keys\[i\] of `node`.
pub fn key_off(node: u64, i: usize) -> u64 {
    node + KEYS_OFF + i as u64 * 8
}

/// Heap offset of values\[i\] (or children\[i\]) of `node`.
pub fn value_off(node: u64, i: usize) -> u64 {
    node + VALUES_OFF + i as u64 * 8
}

/// A node's header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub level: u32,
    pub count: usize,
    /// `None` for the rightmost node of a level (unbounded above).
    pub high_key: Option<u64>,
    /// Heap offset of the right sibling, 0 for none.
    pub right: u64,
    /// The smallest key this node's range may hold (0 for the leftmost node of its level).
    pub low_key: u64,
    /// The tree's descriptor while the node is in the tree, 0 once freed.
    pub owner: u64,
}

impl Header {
    pub fn is_leaf(&self) -> bool {
        self.level == 0
    }

    /// Whether `key` lies beyond this node, so a search must follow the right link.
    pub fn must_move_right(&self, key: u64) -> bool {
        matches!(self.high_key, Some(h) if key >= h)
    }

    /// The header's words, as [`read_header`] reads them.
    pub fn decode(words: [u64; HEADER_WORDS]) -> Header {
        let [lc, high, right, low_key, owner] = words;
        let high_key = if right == 0 { None } else { Some(high) };
        Header { level: lc as u32, count: (lc >> 32) as usize, high_key, right, low_key, owner }
    }
}

pub fn read_header<H: HeapRead>(heap: &mut H, node: u64) -> Result<Header, TxnError> {
    const _: () = assert!(LEVEL_COUNT_OFF == 0 && HIGH_KEY_OFF == 8 && RIGHT_LINK_OFF == 16 && LOW_KEY_OFF == 24 && OWNER_OFF == 32);
    let mut words = [0u64; HEADER_WORDS];
    heap.load_words(node, &mut words)?;
    Ok(Header::decode(words))
}

pub fn write_level_count<H: HeapWrite>(heap: &mut H, node: u64, level: u32, count: usize) -> Result<(), TxnError> {
    heap.store(node + LEVEL_COUNT_OFF, level as u64 | (count as u64) << 32)
}

/// A node's range and tree, as the header's last two words hold them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fences {
    pub low_key: u64,
    pub owner: u64,
}

/// Writes a node's whole header (level and count, high key, right link, low key and owner)
/// as one run of words.
pub fn write_header<H: HeapWrite>(heap: &mut H, node: u64, level: u32, count: usize, high_key: Option<u64>, right: u64, fences: Fences) -> Result<(), TxnError> {
    debug_assert_eq!(high_key.is_some(), right != 0);
    heap.store_words(node, &[level as u64 | (count as u64) << 32, high_key.unwrap_or(0), right, fences.low_key, fences.owner])
}

/// Sets the high key and right link together: they only make sense as a pair.
pub fn write_bound<H: HeapWrite>(heap: &mut H, node: u64, high_key: Option<u64>, right: u64) -> Result<(), TxnError> {
    debug_assert_eq!(high_key.is_some(), right != 0);
    heap.store(node + HIGH_KEY_OFF, high_key.unwrap_or(0))?;
    heap.store(node + RIGHT_LINK_OFF, right)
}

pub fn key<H: HeapRead>(heap: &mut H, node: u64, i: usize) -> Result<u64, TxnError> {
    heap.load(key_off(node, i))
}

pub fn value<H: HeapRead>(heap: &mut H, node: u64, i: usize) -> Result<u64, TxnError> {
    heap.load(value_off(node, i))
}

/// The first slot in `0..count` whose key is ≥ `key` (`count` if none). The key array is read
/// whole (at most four cache lines, validated line by line), then searched in registers: the
/// same shape a GPU thread group uses on its coalesced load.
pub fn lower_bound<H: HeapRead>(heap: &mut H, node: u64, count: usize, key: u64) -> Result<usize, TxnError> {
    Ok(search(heap, node, count, key)?.0)
}

/// [`lower_bound`], and whether the key in that slot is `key` itself: taken from the keys
/// already read, so a lookup reads no key twice.
pub fn search<H: HeapRead>(heap: &mut H, node: u64, count: usize, key: u64) -> Result<(usize, bool), TxnError> {
    let count = count.min(CAPACITY);
    let mut keys = [0u64; CAPACITY];
    heap.load_words(key_off(node, 0), &mut keys[..count])?;
    let i = keys[..count].iter().filter(|&&k| k < key).count();
    Ok((i, i < count && keys[i] == key))
}

/// The child slot of an internal node covering `key`: the last i with keys\[i\] ≤ key.
pub fn child_slot<H: HeapRead>(heap: &mut H, node: u64, count: usize, key: u64) -> Result<usize, TxnError> {
    let (i, hit) = search(heap, node, count, key)?;
    // keys[0] is the node's low bound ≤ key, so i ≥ 1 when it is no hit.
    Ok(if hit { i } else { i.saturating_sub(1) })
}

/// Writes entry i (key and value/child).
pub fn write_entry<H: HeapWrite>(heap: &mut H, node: u64, i: usize, k: u64, v: u64) -> Result<(), TxnError> {
    heap.store(key_off(node, i), k)?;
    heap.store(value_off(node, i), v)
}

/// Moves entries `from..from+len` of `src` to `to..to+len` of `dst` (overlap-safe within one
/// node): the keys and the values are each read as one run of words and written as one.
pub fn move_entries<H: HeapWrite>(heap: &mut H, src: u64, from: usize, dst: u64, to: usize, len: usize) -> Result<(), TxnError> {
    if len <= CAPACITY {
        let (mut keys, mut values) = ([0u64; CAPACITY], [0u64; CAPACITY]);
        heap.load_words(key_off(src, from), &mut keys[..len])?;
        heap.load_words(value_off(src, from), &mut values[..len])?;
        heap.store_words(key_off(dst, to), &keys[..len])?;
        return heap.store_words(value_off(dst, to), &values[..len]);
    }
    // More entries than a node holds (a damaged count): word by word, as far as it goes.
    let copy = |heap: &mut H, j: usize| -> Result<(), TxnError> {
        let k = key(heap, src, from + j)?;
        let v = value(heap, src, from + j)?;
        write_entry(heap, dst, to + j, k, v)
    };
    if src == dst && to > from {
        for j in (0..len).rev() {
            copy(heap, j)?;
        }
    } else {
        for j in 0..len {
            copy(heap, j)?;
        }
    }
    Ok(())
}
