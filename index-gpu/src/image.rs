//! A plain, read-only heap image: the bytes of a heap from offset 0, as a memcpy snapshot,
//! a loaded checkpoint or a GPU fallback holds them. It implements [`HeapRead`] with no STM,
//! so every index read path (`get`, `range`, `prefix`, `count`, `sum`, `check`) runs on it
//! unchanged and gives the answers the heap had when the image was taken.
//!
//! A [`Heap`] that nobody writes to (one recovery filled for `tusk inspect`) reads the same
//! way, without a copy.

use tusk_storage::Heap;
use tusk_txn::TxnError;

use crate::heap::HeapRead;

/// The bytes of a heap, heap offset i at index i.
#[derive(Clone, Copy, Debug)]
pub struct HeapImage<'a> {
    bytes: &'a [u8],
}

impl<'a> HeapImage<'a> {
    pub fn new(bytes: &'a [u8]) -> HeapImage<'a> {
        HeapImage { bytes }
    }
}

impl HeapRead for HeapImage<'_> {
    /// An offset beyond the image (a damaged link) is an error, not a panic.
    #[inline]
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        let at = usize::try_from(off).map_err(|_| TxnError::InvalidPointer(off))?;
        match self.bytes.get(at..at.wrapping_add(8)) {
            Some(word) if off.is_multiple_of(8) => Ok(u64::from_le_bytes(word.try_into().expect("8 bytes"))),
            _ => Err(TxnError::InvalidPointer(off)),
        }
    }

    /// One bounds check for the run (a node's keys), then the words.
    #[inline]
    fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        let bytes = usize::try_from(off)
            .ok()
            .filter(|_| off.is_multiple_of(8))
            .and_then(|at| self.bytes.get(at..at.checked_add(8 * out.len())?))
            .ok_or(TxnError::InvalidPointer(off))?;
        for (w, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
        Ok(())
    }

    /// Descents prefetch the node they go to next (`get_many` overlaps them this way).
    #[inline]
    fn prefetch(&self, off: u64, len: u64) {
        let start = usize::try_from(off).unwrap_or(usize::MAX).min(self.bytes.len());
        let end = usize::try_from(off.saturating_add(len)).unwrap_or(usize::MAX).min(self.bytes.len());
        tusk_storage::region::prefetch_lines(&self.bytes[start..end]);
    }

    fn contains(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.bytes.len() as u64)
    }
}

/// A heap read directly: only for a heap no transaction writes to (words are read without
/// stripe validation).
impl HeapRead for &Heap {
    #[inline]
    fn load(&mut self, off: u64) -> Result<u64, TxnError> {
        if off.is_multiple_of(8) && Heap::contains(self, off, 8) {
            Ok(self.load_word(off))
        } else {
            Err(TxnError::InvalidPointer(off))
        }
    }

    #[inline]
    fn load_words(&mut self, off: u64, out: &mut [u64]) -> Result<(), TxnError> {
        if off.is_multiple_of(8) && Heap::contains(self, off, 8 * out.len() as u64) {
            Heap::load_words(self, off, out);
            Ok(())
        } else {
            Err(TxnError::InvalidPointer(off))
        }
    }

    #[inline]
    fn prefetch(&self, off: u64, len: u64) {
        Heap::prefetch_range(self, off, len);
    }

    fn contains(&self, off: u64, len: u64) -> bool {
        Heap::contains(self, off, len)
    }
}
