//! The node slab: nodes are carved from large chunks of the heap rather than allocated one by
//! one, because the general allocator puts an 8-byte header before each block (so a 512-byte
//! node would neither be 64-byte aligned nor pack densely), and because a later GPU mirror
//! wants the nodes in few contiguous ranges it can copy wholesale.
//!
//! A chunk is one allocation of [`NODES_PER_CHUNK`] nodes plus alignment slack; the descriptor
//! keeps a cursor into the current chunk. Chunks are allocated through the transaction, so an
//! aborted insert gives its nodes back with everything else.

use super::layout::{NODE_ALIGN, NODE_SIZE};
use super::meta::{NODE_COUNT_OFF, SLAB_CURSOR_OFF, SLAB_END_OFF};
use crate::heap::HeapWrite;
use tusk_txn::TxnError;

/// Nodes per slab chunk: 64 KiB of nodes, a few pages per allocation.
pub const NODES_PER_CHUNK: u64 = 128;

/// Hands out one zeroed, 64-byte-aligned node of the tree whose descriptor is at `meta`.
pub fn alloc_node<H: HeapWrite>(heap: &mut H, meta: u64) -> Result<u64, TxnError> {
    let mut cursor = heap.load(meta + SLAB_CURSOR_OFF)?;
    let mut end = heap.load(meta + SLAB_END_OFF)?;
    if cursor == 0 || cursor + NODE_SIZE > end {
        let chunk = heap.alloc(NODES_PER_CHUNK * NODE_SIZE + NODE_ALIGN)?;
        cursor = chunk.next_multiple_of(NODE_ALIGN);
        end = cursor + NODES_PER_CHUNK * NODE_SIZE;
        heap.store(meta + SLAB_END_OFF, end)?;
    }
    heap.store(meta + SLAB_CURSOR_OFF, cursor + NODE_SIZE)?;
    let nodes = heap.load(meta + NODE_COUNT_OFF)?;
    heap.store(meta + NODE_COUNT_OFF, nodes + 1)?;
    Ok(cursor)
}
