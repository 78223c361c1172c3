//! Named roots: a fixed table in the heap mapping names (≤ 64 bytes) to heap pointers, so
//! that an application finds its data again after a restart.

use tusk_storage::layout::{MAX_ROOTS, ROOTS_OFF, ROOT_ENTRY_SIZE, ROOT_NAME_MAX};
use tusk_storage::HeapPtr;

use crate::transaction::Transaction;
use crate::TxnError;

fn entry(i: u64) -> u64 {
    ROOTS_OFF + i * ROOT_ENTRY_SIZE
}

fn check_name(name: &str) -> Result<(), TxnError> {
    if name.is_empty() {
        return Err(TxnError::RootNameEmpty);
    }
    if name.len() > ROOT_NAME_MAX {
        return Err(TxnError::RootNameTooLong { len: name.len(), max: ROOT_NAME_MAX });
    }
    Ok(())
}

impl Transaction<'_> {
    /// Finds the table slot holding `name`, and the first free slot.
    fn find_root(&mut self, name: &str) -> Result<(Option<u64>, Option<u64>), TxnError> {
        let mut free = None;
        let mut stored = [0u8; ROOT_NAME_MAX];
        for i in 0..MAX_ROOTS {
            let len = self.load(entry(i))?;
            if len == 0 {
                free.get_or_insert(i);
                continue;
            }
            if len as usize != name.len() {
                continue;
            }
            self.read_raw(entry(i) + 8, &mut stored[..name.len()])?;
            if &stored[..name.len()] == name.as_bytes() {
                return Ok((Some(i), free));
            }
        }
        Ok((None, free))
    }

    /// Points the root `name` at `p`, creating it if needed.
    pub fn set_root(&mut self, name: &str, p: HeapPtr) -> Result<(), TxnError> {
        check_name(name)?;
        let (found, free) = self.find_root(name)?;
        let slot = match (found, free) {
            (Some(i), _) => i,
            (None, Some(i)) => {
                self.store(entry(i), name.len() as u64)?;
                let mut padded = [0u8; ROOT_NAME_MAX];
                padded[..name.len()].copy_from_slice(name.as_bytes());
                self.write_raw(entry(i) + 8, &padded)?;
                i
            }
            (None, None) => return Err(TxnError::RootTableFull(MAX_ROOTS)),
        };
        self.store(entry(slot) + 8 + ROOT_NAME_MAX as u64, p.offset())
    }

    /// The pointer stored under `name`, if any.
    pub fn root(&mut self, name: &str) -> Result<Option<HeapPtr>, TxnError> {
        check_name(name)?;
        match self.find_root(name)?.0 {
            Some(i) => Ok(Some(HeapPtr(self.load(entry(i) + 8 + ROOT_NAME_MAX as u64)?))),
            None => Ok(None),
        }
    }

    /// Removes the root `name`; returns whether it existed.
    pub fn remove_root(&mut self, name: &str) -> Result<bool, TxnError> {
        check_name(name)?;
        match self.find_root(name)?.0 {
            Some(i) => {
                self.store(entry(i), 0)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// The root `name` of a heap image read word by word through `load` (a snapshot: the same
/// table [`Transaction::root`] reads, without a transaction).
pub fn lookup(mut load: impl FnMut(u64) -> Result<u64, TxnError>, name: &str) -> Result<Option<HeapPtr>, TxnError> {
    check_name(name)?;
    let mut stored = [0u8; ROOT_NAME_MAX];
    for i in 0..MAX_ROOTS {
        if load(entry(i))? != name.len() as u64 {
            continue;
        }
        for (w, chunk) in stored.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&load(entry(i) + 8 + 8 * w as u64)?.to_le_bytes());
        }
        if &stored[..name.len()] == name.as_bytes() {
            return Ok(Some(HeapPtr(load(entry(i) + 8 + ROOT_NAME_MAX as u64)?)));
        }
    }
    Ok(None)
}

/// Every named root of a heap that nobody writes to (a recovered heap being inspected), in
/// table order. Entries with a damaged length are skipped: the table is read, not trusted.
pub fn list(heap: &tusk_storage::Heap) -> Vec<(String, HeapPtr)> {
    let mut out = Vec::new();
    if !heap.contains(ROOTS_OFF, MAX_ROOTS * ROOT_ENTRY_SIZE) {
        return out;
    }
    for i in 0..MAX_ROOTS {
        let len = heap.load_word(entry(i)) as usize;
        if len == 0 || len > ROOT_NAME_MAX {
            continue;
        }
        let mut name = [0u8; ROOT_NAME_MAX];
        heap.read_bytes(entry(i) + 8, &mut name);
        let ptr = heap.load_word(entry(i) + 8 + ROOT_NAME_MAX as u64);
        out.push((String::from_utf8_lossy(&name[..len]).into_owned(), HeapPtr(ptr)));
    }
    out
}
