//! The synchronisation primitives of the lock-free protocols (commit, stripe locks, durable
//! watermark, group commit, log-space stall, dirty epochs): std atomics and parking_lot in
//! normal builds, loom's under `--cfg loom` (see .ci/loom). Normal builds get plain
//! re-exports, so the switch costs nothing; under loom, thin wrappers give loom's types
//! parking_lot's API so the protocol code reads the same in both builds.

#[cfg(not(loom))]
pub use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU64};
#[cfg(not(loom))]
pub use self::herd::{HerdCondvar, HerdGuard, HerdMutex};

/// Backs off in a spin-wait loop. Under loom it yields, so the model checker schedules the
/// thread being waited for instead of exploring the spin.
#[cfg(not(loom))]
#[inline]
pub fn spin_loop() {
    std::hint::spin_loop();
}

/// Waits a moment for another thread to finish something short it holds (a flush slot).
/// Under loom it yields, as [`spin_loop`] does.
#[cfg(not(loom))]
pub fn nap() {
    std::thread::sleep(std::time::Duration::from_micros(50));
}

#[cfg(loom)]
pub fn nap() {
    loom::thread::yield_now();
}

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU64};
#[cfg(loom)]
pub use self::model::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub use self::model::{Condvar as HerdCondvar, Mutex as HerdMutex, MutexGuard as HerdGuard};

#[cfg(loom)]
pub fn spin_loop() {
    loom::thread::yield_now();
}

#[cfg(loom)]
mod model {
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    /// loom's mutex with parking_lot's API (no poisoning in the models: a panic fails them).
    #[derive(Default, Debug)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap()))
        }
    }

    /// `Option` so that [`Condvar::wait`] can hand the guard to loom and back through `&mut`.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().unwrap()
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().unwrap()
        }
    }

    #[derive(Default, Debug)]
    pub struct Condvar(loom::sync::Condvar);

    /// parking_lot's result of a timed wait.
    pub struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        pub fn timed_out(&self) -> bool {
            self.0
        }
    }

    impl Condvar {
        pub fn new() -> Condvar {
            Condvar(loom::sync::Condvar::new())
        }

        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let inner = guard.0.take().unwrap();
            guard.0 = Some(self.0.wait(inner).unwrap());
        }

        /// loom never times out: a model that needs the timeout to make progress deadlocks,
        /// which is how the models find a wake-up that only a poll would rescue.
        pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> WaitTimeoutResult {
            let inner = guard.0.take().unwrap();
            let (inner, result) = self.0.wait_timeout(inner, timeout).unwrap();
            guard.0 = Some(inner);
            WaitTimeoutResult(result.timed_out())
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }

        pub fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}

/// A mutex and condition variable for rendezvous where a whole herd of waiters returns at
/// once (the committers a group-commit flush made durable): std's futex condvar, whose
/// `notify_all` wakes every waiter at the same time. parking_lot's moves the waiters onto the
/// mutex's queue instead and wakes them one after another, each only when the one before
/// has taken and released the mutex: with 32 committers per partition on 2 cores that chain
/// of wake-ups took longer than the flush itself. Same API as parking_lot's, so the protocol
/// code (and its loom build, where these are loom's types) reads the same.
#[cfg(not(loom))]
mod herd {
    use std::ops::{Deref, DerefMut};
    use std::sync::PoisonError;

    #[derive(Default, Debug)]
    pub struct HerdMutex<T>(std::sync::Mutex<T>);

    /// `Option` so that [`HerdCondvar::wait`] can hand the guard to std and back through
    /// `&mut`.
    pub struct HerdGuard<'a, T>(Option<std::sync::MutexGuard<'a, T>>);

    impl<T> HerdMutex<T> {
        pub fn new(value: T) -> HerdMutex<T> {
            HerdMutex(std::sync::Mutex::new(value))
        }

        /// Poisoning is ignored: what these mutexes guard stays consistent whatever a
        /// panicking holder did (a wake-up token, no data).
        pub fn lock(&self) -> HerdGuard<'_, T> {
            HerdGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }
    }

    impl<T> Deref for HerdGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("a guard is only empty inside wait")
        }
    }

    impl<T> DerefMut for HerdGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("a guard is only empty inside wait")
        }
    }

    #[derive(Default, Debug)]
    pub struct HerdCondvar(std::sync::Condvar);

    impl HerdCondvar {
        pub fn new() -> HerdCondvar {
            HerdCondvar(std::sync::Condvar::new())
        }

        pub fn wait<T>(&self, guard: &mut HerdGuard<'_, T>) {
            let inner = guard.0.take().expect("a guard is only empty inside wait");
            guard.0 = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }

        pub fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}
