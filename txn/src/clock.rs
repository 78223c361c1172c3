//! The LSN clock: the last LSN drawn, which is also the STM's version clock. Every commit
//! writes it and every begin reads it, so it sits on a cache line of its own: data that
//! shared its line would miss at every commit of every thread (and slow the clock's own
//! line hand-over down with its traffic).

use crate::sync::AtomicU64;

#[repr(align(128))]
pub struct LsnClock(AtomicU64);

impl LsnClock {
    /// A clock whose last LSN drawn is `lsn`.
    pub fn new(lsn: u64) -> LsnClock {
        LsnClock(AtomicU64::new(lsn))
    }
}

impl std::ops::Deref for LsnClock {
    type Target = AtomicU64;

    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}
