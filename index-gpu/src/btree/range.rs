//! Range reads: one descent to the first leaf, then along the leaf chain by right links.
//!
//! Bounds are normalized to a half-open `[lo, end)` over u128, so that `..=u64::MAX` and an
//! excluded start at u64::MAX need no special cases.

use std::ops::{Bound, RangeBounds};

use super::layout::{self, Header};
use super::search;
use crate::heap::HeapRead;
use crate::IndexError;
use tusk_txn::TxnError;

/// `[lo, end)` of a range over u64 keys; empty when lo ≥ end.
#[derive(Clone, Copy, Debug)]
pub struct KeySpan {
    pub lo: u128,
    pub end: u128,
}

impl KeySpan {
    pub fn of(range: &impl RangeBounds<u64>) -> KeySpan {
        let lo = match range.start_bound() {
            Bound::Included(&k) => k as u128,
            Bound::Excluded(&k) => k as u128 + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&k) => k as u128 + 1,
            Bound::Excluded(&k) => k as u128,
            Bound::Unbounded => 1 << 64,
        };
        KeySpan { lo, end }
    }

    pub fn is_empty(&self) -> bool {
        self.lo >= self.end
    }
}

/// Calls `run(heap, leaf, from, to)`, in the tree at `meta`, for each leaf's slots `from..to` holding keys in `span`,
/// in key order. Leaves entirely inside the span are passed whole without reading their keys,
/// which makes `count` cost one header read per leaf.
pub fn for_each_run<H: HeapRead>(
    heap: &mut H,
    meta: u64,
    span: KeySpan,
    mut run: impl FnMut(&mut H, u64, usize, usize) -> Result<(), TxnError>,
) -> Result<(), TxnError> {
    if span.is_empty() {
        return Ok(());
    }
    let (mut leaf, mut h) = search::descend_tree(heap, meta, span.lo as u64, None)?;
    let mut from = layout::lower_bound(heap, leaf, h.count, span.lo as u64)?;
    loop {
        let inside = matches!(h.high_key, Some(hk) if hk as u128 <= span.end);
        let to = if inside || span.end > u64::MAX as u128 {
            h.count
        } else {
            layout::lower_bound(heap, leaf, h.count, span.end as u64)?
        };
        if from < to {
            run(heap, leaf, from, to)?;
        }
        if !inside || h.right == 0 {
            return Ok(());
        }
        leaf = h.right;
        h = layout::read_header(heap, leaf)?;
        from = 0;
    }
}

/// Iterator over the entries of a range, in key order.
pub struct Range<'h, H: HeapRead> {
    heap: &'h mut H,
    leaf: u64,
    header: Header,
    pos: usize,
    end: u128,
    done: bool,
}

impl<'h, H: HeapRead> Range<'h, H> {
    pub fn new(heap: &'h mut H, meta: u64, span: KeySpan) -> Result<Range<'h, H>, TxnError> {
        let (leaf, header) = search::descend_tree(heap, meta, span.lo.min(u64::MAX as u128) as u64, None)?;
        let pos = layout::lower_bound(heap, leaf, header.count, span.lo.min(u64::MAX as u128) as u64)?;
        Ok(Range { heap, leaf, header, pos, end: span.end, done: span.is_empty() })
    }

    fn step(&mut self) -> Result<Option<(u64, u64)>, TxnError> {
        loop {
            if self.pos < self.header.count {
                let k = layout::key(self.heap, self.leaf, self.pos)?;
                if k as u128 >= self.end {
                    return Ok(None);
                }
                let v = layout::value(self.heap, self.leaf, self.pos)?;
                self.pos += 1;
                return Ok(Some((k, v)));
            }
            let past_end = matches!(self.header.high_key, Some(hk) if hk as u128 >= self.end);
            if self.header.right == 0 || past_end {
                return Ok(None);
            }
            self.leaf = self.header.right;
            self.header = layout::read_header(self.heap, self.leaf)?;
            self.pos = 0;
        }
    }
}

impl<H: HeapRead> Iterator for Range<'_, H> {
    type Item = Result<(u64, u64), IndexError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.step().map_err(IndexError::from).transpose();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}
