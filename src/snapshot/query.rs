//! The read verbs of a snapshot as data: a [`Query`] is answered by [`serve`] on any
//! [`HeapRead`] image — in this process for memcpy snapshots, in the child for fork
//! snapshots, where queries and answers cross the shared memory in the small binary form of
//! [`Query::encode`] / [`Answer::encode`].

use std::ops::Bound;

use tusk_index::heap::HeapRead;
use tusk_index::{Art, ArtStats, BTree, IndexError};
use tusk_index::btree::TreeStats;
use tusk_storage::HeapPtr;

use crate::Error;

/// u64 keys, borrowed as numbers (this process) or as the bytes of a message (the child).
#[derive(Clone, Copy, Debug)]
pub enum Keys<'a> {
    Numbers(&'a [u64]),
    Bytes(&'a [u8]),
}

impl Keys<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Keys::Numbers(k) => k.len(),
            Keys::Bytes(b) => b.len() / 8,
        }
    }

    pub(super) fn get(&self, i: usize) -> u64 {
        match self {
            Keys::Numbers(k) => k[i],
            Keys::Bytes(b) => u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes")),
        }
    }
}

/// Byte-string keys packed as (u32 length, bytes)*.
#[derive(Clone, Copy, Debug)]
pub struct ByteKeys<'a>(pub &'a [u8]);

impl<'a> ByteKeys<'a> {
    pub fn pack(keys: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for k in keys {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
        }
        out
    }

    fn iter(self) -> impl Iterator<Item = &'a [u8]> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            let key = rest.get(4..4 + len)?;
            rest = &rest[4 + len..];
            Some(key)
        })
    }
}

/// One read of a snapshot. `meta` is an index descriptor's heap offset.
#[derive(Clone, Debug)]
pub enum Query<'a> {
    Root(&'a str),
    Read { off: u64, len: u64 },
    OpenBTree(u64),
    OpenArt(u64),
    BTreeLen(u64),
    BTreeGet { meta: u64, keys: Keys<'a> },
    BTreeCount { meta: u64, range: (Bound<u64>, Bound<u64>) },
    BTreeSum { meta: u64, range: (Bound<u64>, Bound<u64>) },
    BTreePage { meta: u64, range: (Bound<u64>, Bound<u64>), max: u64 },
    BTreeCheck(u64),
    ArtLen(u64),
    ArtGet { meta: u64, keys: ByteKeys<'a> },
    ArtCount { meta: u64, range: (Bound<&'a [u8]>, Bound<&'a [u8]>) },
    ArtSum { meta: u64, range: (Bound<&'a [u8]>, Bound<&'a [u8]>) },
    ArtCountPrefix { meta: u64, prefix: &'a [u8] },
    ArtSumPrefix { meta: u64, prefix: &'a [u8] },
    /// Entries of `range` (or, with `prefix`, of the keys starting with it) from its start,
    /// at most `max_bytes` of keys and values.
    ArtPage { meta: u64, range: (Bound<&'a [u8]>, Bound<&'a [u8]>), max_bytes: u64 },
    ArtCheck(u64),
}

/// The answer to a [`Query`].
#[derive(Debug)]
pub enum Answer {
    Ptr(Option<HeapPtr>),
    Bytes(Vec<u8>),
    Unit,
    U64(u64),
    U128(u128),
    Values(Vec<Option<u64>>),
    /// A page of a range and whether more entries follow it.
    BTreePage(Vec<(u64, u64)>, bool),
    ArtPage(Vec<(Vec<u8>, u64)>, bool),
    BTreeStats(TreeStats),
    ArtStats(ArtStats),
    Failed(Error),
}

/// Answers `query` on `heap` (an image no one writes to).
pub fn serve<H: HeapRead>(heap: &mut H, query: &Query<'_>) -> Answer {
    match answer(heap, query) {
        Ok(a) => a,
        Err(e) => Answer::Failed(e),
    }
}

fn answer<H: HeapRead>(heap: &mut H, query: &Query<'_>) -> Result<Answer, Error> {
    let btree = |heap: &mut H, meta: u64| BTree::open(heap, HeapPtr(meta));
    let art = |heap: &mut H, meta: u64| Art::open(heap, HeapPtr(meta));
    Ok(match *query {
        Query::Root(name) => Answer::Ptr(tusk_txn::roots::lookup(|off| heap.load(off), name)?),
        Query::Read { off, len } => {
            if !heap.contains(off, len) {
                return Err(Error::InvalidPointer(off));
            }
            let mut out = vec![0u8; len as usize];
            let first = off & !7;
            let mut word = first;
            while word < off + len {
                let bytes = heap.load(word)?.to_le_bytes();
                for (i, b) in bytes.iter().enumerate() {
                    let at = word + i as u64;
                    if at >= off && at < off + len {
                        out[(at - off) as usize] = *b;
                    }
                }
                word += 8;
            }
            Answer::Bytes(out)
        }
        Query::OpenBTree(meta) => btree(heap, meta).map(|_| Answer::Unit)?,
        Query::OpenArt(meta) => art(heap, meta).map(|_| Answer::Unit)?,
        Query::BTreeLen(meta) => Answer::U64(btree(heap, meta)?.len(heap)?),
        Query::BTreeGet { meta, keys } => {
            let tree = btree(heap, meta)?;
            let numbers: Vec<u64>;
            let keys = match keys {
                Keys::Numbers(k) => k,
                Keys::Bytes(_) => {
                    numbers = (0..keys.len()).map(|i| keys.get(i)).collect();
                    &numbers
                }
            };
            Answer::Values(tree.get_many(heap, keys)?)
        }
        Query::BTreeCount { meta, range } => Answer::U64(btree(heap, meta)?.count(heap, range)?),
        Query::BTreeSum { meta, range } => Answer::U128(btree(heap, meta)?.sum(heap, range)?),
        Query::BTreePage { meta, range, max } => {
            let tree = btree(heap, meta)?;
            let mut iter = tree.range(heap, range)?;
            let page = iter.by_ref().take(max as usize).collect::<Result<Vec<_>, IndexError>>()?;
            let more = iter.next().is_some();
            Answer::BTreePage(page, more)
        }
        Query::BTreeCheck(meta) => Answer::BTreeStats(btree(heap, meta)?.check(heap)?),
        Query::ArtLen(meta) => Answer::U64(art(heap, meta)?.len(heap)?),
        Query::ArtGet { meta, keys } => {
            let keys: Vec<&[u8]> = keys.iter().collect();
            Answer::Values(art(heap, meta)?.get_many(heap, &keys)?)
        }
        Query::ArtCount { meta, range } => Answer::U64(art(heap, meta)?.count::<H, &[u8]>(heap, range)?),
        Query::ArtSum { meta, range } => Answer::U128(art(heap, meta)?.sum::<H, &[u8]>(heap, range)?),
        Query::ArtCountPrefix { meta, prefix } => Answer::U64(art(heap, meta)?.count_prefix(heap, prefix)?),
        Query::ArtSumPrefix { meta, prefix } => Answer::U128(art(heap, meta)?.sum_prefix(heap, prefix)?),
        Query::ArtPage { meta, range, max_bytes } => {
            let tree = art(heap, meta)?;
            let mut iter = tree.range::<H, &[u8]>(heap, range)?;
            let (mut page, mut bytes, mut more) = (Vec::new(), 0u64, false);
            for entry in iter.by_ref() {
                let (key, value) = entry?;
                bytes += key.len() as u64 + 12;
                page.push((key, value));
                if bytes >= max_bytes {
                    more = true;
                    break;
                }
            }
            // A page that ended exactly at the range's end says "more": the next (empty) page
            // settles it.
            Answer::ArtPage(page, more)
        }
        Query::ArtCheck(meta) => Answer::ArtStats(art(heap, meta)?.check(heap)?),
    })
}
