//! Indexes under named roots: the one rule both kinds share (open the descriptor the root
//! points at, or create an empty tree and point the root at it, in the same transaction).

use tusk_storage::HeapPtr;
use tusk_txn::Transaction;

use crate::IndexError;

/// The index under root `name`: `open`ed if the root exists, else `create`d and the root set.
pub fn open_or_create<'e, T>(
    tx: &mut Transaction<'e>,
    name: &str,
    open: fn(&mut Transaction<'e>, HeapPtr) -> Result<T, IndexError>,
    create: fn(&mut Transaction<'e>) -> Result<T, IndexError>,
    ptr: fn(&T) -> HeapPtr,
) -> Result<T, IndexError> {
    match tx.root(name)? {
        Some(p) => open(tx, p),
        None => {
            let index = create(tx)?;
            tx.set_root(name, ptr(&index))?;
            Ok(index)
        }
    }
}
