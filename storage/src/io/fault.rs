//! Fault injection: fail the Nth write request with a chosen errno (EIO, ENOSPC, ...), or
//! make every sync slow (a disk that lags).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

use super::{IoBackend, WriteSync};

/// When and how to fail. Shared (Arc) so a test can arm it while the store runs.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// Requests still allowed to succeed; `u64::MAX` means never fail.
    allowed: AtomicU64,
    errno: AtomicI32,
    failures: AtomicU64,
    /// How long each sync waits before it is made, in microseconds.
    sync_delay_us: AtomicU64,
}

impl FaultPlan {
    /// A plan that never fails until armed.
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan { allowed: AtomicU64::new(u64::MAX), errno: AtomicI32::new(libc::EIO), failures: AtomicU64::new(0), sync_delay_us: AtomicU64::new(0) })
    }

    /// Lets `successes` more requests succeed, then fails every later one with `errno`.
    pub fn fail_after(&self, successes: u64, errno: i32) {
        self.errno.store(errno, Ordering::SeqCst);
        self.allowed.store(successes, Ordering::SeqCst);
    }

    /// Makes every later sync (and write-and-sync) wait `delay` first (zero: none).
    pub fn slow_syncs(&self, delay: std::time::Duration) {
        self.sync_delay_us.store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    fn lag(&self) {
        let us = self.sync_delay_us.load(Ordering::SeqCst);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
    }

    /// How many requests were failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    /// Counts one I/O step done outside a backend (create, rename, directory sync): Ok while
    /// the plan allows it, the planned error once it does not.
    pub fn check(&self) -> Result<(), std::io::Error> {
        self.admit()
    }

    fn admit(&self) -> Result<(), std::io::Error> {
        let prev = self.allowed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
            u64::MAX => Some(u64::MAX),
            0 => None,
            n => Some(n - 1),
        });
        match prev {
            Ok(_) => Ok(()),
            Err(_) => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                Err(std::io::Error::from_raw_os_error(self.errno.load(Ordering::SeqCst)))
            }
        }
    }
}

/// Wraps a backend; requests the plan refuses are not written at all.
pub struct FaultyIo {
    inner: Box<dyn IoBackend>,
    plan: Arc<FaultPlan>,
}

impl FaultyIo {
    pub fn new(inner: Box<dyn IoBackend>, plan: Arc<FaultPlan>) -> FaultyIo {
        FaultyIo { inner, plan }
    }
}

impl IoBackend for FaultyIo {
    fn name(&self) -> String {
        format!("faulty({})", self.inner.name())
    }

    fn write_and_sync(&mut self, reqs: &[WriteSync<'_>]) -> Vec<std::io::Result<()>> {
        self.plan.lag();
        let verdicts: Vec<Result<(), std::io::Error>> = reqs.iter().map(|_| self.plan.admit()).collect();
        let admitted: Vec<WriteSync> = reqs.iter().zip(&verdicts).filter(|(_, v)| v.is_ok()).map(|(r, _)| *r).collect();
        let mut inner_results = self.inner.write_and_sync(&admitted).into_iter();
        verdicts.into_iter().map(|v| v.and_then(|()| inner_results.next().expect("one result per admitted request"))).collect()
    }

    fn write(&mut self, req: &WriteSync<'_>) -> std::io::Result<()> {
        self.plan.admit()?;
        self.inner.write(req)
    }

    fn sync(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<()> {
        self.plan.lag();
        self.plan.admit()?;
        self.inner.sync(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn fails_exactly_after_the_allowed_requests() {
        let plan = FaultPlan::new();
        let mut io = FaultyIo::new(Box::new(crate::io::sync::SyncIo), plan.clone());
        let file = tempfile::tempfile().unwrap();
        let req = [WriteSync { fd: file.as_raw_fd(), offset: 0, data: b"abc" }];
        assert!(io.write_and_sync(&req)[0].is_ok(), "unarmed plan never fails");
        plan.fail_after(2, libc::ENOSPC);
        let results = io.write_and_sync(&[req[0], req[0], req[0]]);
        assert!(results[0].is_ok() && results[1].is_ok());
        assert_eq!(results[2].as_ref().unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(plan.failures(), 1);
    }
}
