//! The binary form of queries and answers between a process and its fork snapshot's child:
//! a tag byte, then fixed-size little-endian numbers and length-prefixed byte strings.
//! Both ends are the same binary, so the format needs no version; a message that does not
//! decode is an error, never a panic.

use std::ops::Bound;

use tusk_index::btree::TreeStats;
use tusk_index::ArtStats;
use tusk_storage::HeapPtr;

use super::query::{Answer, ByteKeys, Keys, Query};
use crate::Error;

#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u128(&mut self, v: u128) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }
    fn bound_u64(&mut self, b: Bound<u64>) -> &mut Self {
        match b {
            Bound::Included(k) => self.u8(1).u64(k),
            Bound::Excluded(k) => self.u8(2).u64(k),
            Bound::Unbounded => self.u8(0),
        }
    }
    fn bound_bytes(&mut self, b: Bound<&[u8]>) -> &mut Self {
        match b {
            Bound::Included(k) => self.u8(1).bytes(k),
            Bound::Excluded(k) => self.u8(2).bytes(k),
            Bound::Unbounded => self.u8(0),
        }
    }
}

struct In<'a>(&'a [u8]);

type Decoded<T> = Option<T>;

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Decoded<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Decoded<u8> {
        Some(self.take(1)?[0])
    }
    fn u64(&mut self) -> Decoded<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn u128(&mut self) -> Decoded<u128> {
        Some(u128::from_le_bytes(self.take(16)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Decoded<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }
    fn bound_u64(&mut self) -> Decoded<Bound<u64>> {
        Some(match self.u8()? {
            0 => Bound::Unbounded,
            1 => Bound::Included(self.u64()?),
            2 => Bound::Excluded(self.u64()?),
            _ => return None,
        })
    }
    fn bound_bytes(&mut self) -> Decoded<Bound<&'a [u8]>> {
        Some(match self.u8()? {
            0 => Bound::Unbounded,
            1 => Bound::Included(self.bytes()?),
            2 => Bound::Excluded(self.bytes()?),
            _ => return None,
        })
    }
}

impl Query<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::default();
        match self {
            Query::Root(name) => o.u8(1).bytes(name.as_bytes()),
            Query::Read { off, len } => o.u8(2).u64(*off).u64(*len),
            Query::OpenBTree(m) => o.u8(3).u64(*m),
            Query::OpenArt(m) => o.u8(4).u64(*m),
            Query::BTreeLen(m) => o.u8(5).u64(*m),
            Query::BTreeGet { meta, keys } => {
                o.u8(6).u64(*meta).u64(keys.len() as u64);
                for i in 0..keys.len() {
                    o.u64(keys.get(i));
                }
                &mut o
            }
            Query::BTreeCount { meta, range } => o.u8(7).u64(*meta).bound_u64(range.0).bound_u64(range.1),
            Query::BTreeSum { meta, range } => o.u8(8).u64(*meta).bound_u64(range.0).bound_u64(range.1),
            Query::BTreePage { meta, range, max } => o.u8(9).u64(*meta).bound_u64(range.0).bound_u64(range.1).u64(*max),
            Query::BTreeCheck(m) => o.u8(10).u64(*m),
            Query::ArtLen(m) => o.u8(11).u64(*m),
            Query::ArtGet { meta, keys } => o.u8(12).u64(*meta).bytes(keys.0),
            Query::ArtCount { meta, range } => o.u8(13).u64(*meta).bound_bytes(range.0).bound_bytes(range.1),
            Query::ArtSum { meta, range } => o.u8(14).u64(*meta).bound_bytes(range.0).bound_bytes(range.1),
            Query::ArtCountPrefix { meta, prefix } => o.u8(15).u64(*meta).bytes(prefix),
            Query::ArtSumPrefix { meta, prefix } => o.u8(16).u64(*meta).bytes(prefix),
            Query::ArtPage { meta, range, max_bytes } => o.u8(17).u64(*meta).bound_bytes(range.0).bound_bytes(range.1).u64(*max_bytes),
            Query::ArtCheck(m) => o.u8(18).u64(*m),
        };
        o.0
    }

    pub fn decode(bytes: &[u8]) -> Option<Query<'_>> {
        let mut i = In(bytes);
        let q = match i.u8()? {
            1 => Query::Root(std::str::from_utf8(i.bytes()?).ok()?),
            2 => Query::Read { off: i.u64()?, len: i.u64()? },
            3 => Query::OpenBTree(i.u64()?),
            4 => Query::OpenArt(i.u64()?),
            5 => Query::BTreeLen(i.u64()?),
            6 => {
                let meta = i.u64()?;
                let n = usize::try_from(i.u64()?).ok()?;
                Query::BTreeGet { meta, keys: Keys::Bytes(i.take(n.checked_mul(8)?)?) }
            }
            7 => Query::BTreeCount { meta: i.u64()?, range: (i.bound_u64()?, i.bound_u64()?) },
            8 => Query::BTreeSum { meta: i.u64()?, range: (i.bound_u64()?, i.bound_u64()?) },
            9 => Query::BTreePage { meta: i.u64()?, range: (i.bound_u64()?, i.bound_u64()?), max: i.u64()? },
            10 => Query::BTreeCheck(i.u64()?),
            11 => Query::ArtLen(i.u64()?),
            12 => Query::ArtGet { meta: i.u64()?, keys: ByteKeys(i.bytes()?) },
            13 => Query::ArtCount { meta: i.u64()?, range: (i.bound_bytes()?, i.bound_bytes()?) },
            14 => Query::ArtSum { meta: i.u64()?, range: (i.bound_bytes()?, i.bound_bytes()?) },
            15 => Query::ArtCountPrefix { meta: i.u64()?, prefix: i.bytes()? },
            16 => Query::ArtSumPrefix { meta: i.u64()?, prefix: i.bytes()? },
            17 => Query::ArtPage { meta: i.u64()?, range: (i.bound_bytes()?, i.bound_bytes()?), max_bytes: i.u64()? },
            18 => Query::ArtCheck(i.u64()?),
            _ => return None,
        };
        Some(q)
    }
}

impl Answer {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::default();
        match self {
            Answer::Ptr(p) => o.u8(1).u64(p.map_or(0, |p| p.offset())).u8(p.is_some() as u8),
            Answer::Bytes(b) => o.u8(2).bytes(b),
            Answer::Unit => o.u8(3),
            Answer::U64(v) => o.u8(4).u64(*v),
            Answer::U128(v) => o.u8(5).u128(*v),
            Answer::Values(vs) => {
                o.u8(6).u64(vs.len() as u64);
                for v in vs {
                    o.u8(v.is_some() as u8).u64(v.unwrap_or(0));
                }
                &mut o
            }
            Answer::BTreePage(page, more) => {
                o.u8(7).u8(*more as u8).u64(page.len() as u64);
                for &(k, v) in page {
                    o.u64(k).u64(v);
                }
                &mut o
            }
            Answer::ArtPage(page, more) => {
                o.u8(8).u8(*more as u8).u64(page.len() as u64);
                for (k, v) in page {
                    o.bytes(k).u64(*v);
                }
                &mut o
            }
            Answer::BTreeStats(s) => o.u8(9).u64(s.levels as u64).u64(s.nodes).u64(s.leaves).u64(s.keys).u64(s.free_nodes),
            Answer::ArtStats(s) => o
                .u8(10)
                .u64(s.keys)
                .u64(s.n4)
                .u64(s.n16)
                .u64(s.n48)
                .u64(s.n256)
                .u64(s.leaves)
                .u64(s.overflow_leaves)
                .u64(s.free_slots)
                .u64(s.bytes)
                .u64(s.depth_max),
            Answer::Failed(e) => encode_error(&mut o, e),
        };
        o.0
    }

    pub fn decode(bytes: &[u8]) -> Option<Answer> {
        let mut i = In(bytes);
        let a = match i.u8()? {
            1 => {
                let p = i.u64()?;
                Answer::Ptr((i.u8()? == 1).then_some(HeapPtr(p)))
            }
            2 => Answer::Bytes(i.bytes()?.to_vec()),
            3 => Answer::Unit,
            4 => Answer::U64(i.u64()?),
            5 => Answer::U128(i.u128()?),
            6 => {
                let n = i.u64()?;
                let mut vs = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    let some = i.u8()? == 1;
                    let v = i.u64()?;
                    vs.push(some.then_some(v));
                }
                Answer::Values(vs)
            }
            7 => {
                let more = i.u8()? == 1;
                let n = i.u64()?;
                let mut page = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    page.push((i.u64()?, i.u64()?));
                }
                Answer::BTreePage(page, more)
            }
            8 => {
                let more = i.u8()? == 1;
                let n = i.u64()?;
                let mut page = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    page.push((i.bytes()?.to_vec(), i.u64()?));
                }
                Answer::ArtPage(page, more)
            }
            9 => Answer::BTreeStats(TreeStats {
                levels: u32::try_from(i.u64()?).ok()?,
                nodes: i.u64()?,
                leaves: i.u64()?,
                keys: i.u64()?,
                free_nodes: i.u64()?,
            }),
            10 => Answer::ArtStats(ArtStats {
                keys: i.u64()?,
                n4: i.u64()?,
                n16: i.u64()?,
                n48: i.u64()?,
                n256: i.u64()?,
                leaves: i.u64()?,
                overflow_leaves: i.u64()?,
                free_slots: i.u64()?,
                bytes: i.u64()?,
                depth_max: i.u64()?,
            }),
            11 => Answer::Failed(decode_error(&mut i)?),
            _ => return None,
        };
        Some(a)
    }
}

/// The errors a query can end in, by kind; anything else travels as its message.
fn encode_error<'o>(o: &'o mut Out, e: &Error) -> &'o mut Out {
    o.u8(11);
    match e {
        Error::NotAnIndex { offset, kind } => o.u8(1).u64(*offset).u64((*kind == crate::index::ART_KIND) as u64),
        Error::IndexDamaged { node, what } => o.u8(2).u64(*node).bytes(what.as_bytes()),
        Error::KeyTooLong { len, max } => o.u8(3).u64(*len as u64).u64(*max as u64),
        Error::InvalidPointer(p) => o.u8(4).u64(*p),
        Error::RootNameTooLong { len, max } => o.u8(5).u64(*len as u64).u64(*max as u64),
        Error::RootNameEmpty => o.u8(6),
        other => o.u8(0).bytes(other.to_string().as_bytes()),
    }
}

fn decode_error(i: &mut In<'_>) -> Option<Error> {
    Some(match i.u8()? {
        1 => Error::NotAnIndex { offset: i.u64()?, kind: if i.u64()? == 1 { crate::index::ART_KIND } else { crate::index::BTREE_KIND } },
        2 => Error::IndexDamaged { node: i.u64()?, what: String::from_utf8_lossy(i.bytes()?).into_owned() },
        3 => Error::KeyTooLong { len: i.u64()? as usize, max: i.u64()? as usize },
        4 => Error::InvalidPointer(i.u64()?),
        5 => Error::RootNameTooLong { len: i.u64()? as usize, max: i.u64()? as usize },
        6 => Error::RootNameEmpty,
        0 => Error::SnapshotQuery(String::from_utf8_lossy(i.bytes()?).into_owned()),
        _ => return None,
    })
}
