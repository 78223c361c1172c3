//! Scheduling of the store's background threads.

/// Nice value of background work (checkpoints): on a machine whose cores all run
/// transactions, the checkpointer takes the cycles they leave instead of a fair share.
pub const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to `nice` (Linux keeps the nice value per thread;
/// threads it starts inherit it). Raising it back needs privileges, so this is one-way.
pub fn lower_current_thread_priority(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority only reads its integer arguments.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Asks the scheduler to give the calling thread short slices (`slice_ns`, EEVDF's custom
/// slice, Linux 6.12 and later; no privileges needed): a thread that sleeps most of the time
/// and must run soon after it wakes then gets a core within about that long even while every
/// core is busy, instead of after a whole default slice.
pub fn shorten_current_thread_slice(slice_ns: u64) -> std::io::Result<()> {
    let attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: slice_ns,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_setattr reads `attr` (of the size it is told) for the calling thread (0).
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const libc::sched_attr, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowers_only_the_calling_thread() {
        std::thread::spawn(|| {
            lower_current_thread_priority(BACKGROUND_NICE).unwrap();
            // SAFETY: as above.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            assert_eq!(nice, BACKGROUND_NICE);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        let here = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        assert!(here < BACKGROUND_NICE, "the calling test thread keeps its priority");
    }

    /// The slice asked for is the thread's own. Kernels that report fair threads' slices
    /// (6.12 and later: the default, 1.4 ms here) show it; older ones accept the call and
    /// report none.
    #[test]
    fn shortens_only_the_calling_threads_slice() {
        fn runtime() -> u64 {
            let mut attr = libc::sched_attr {
                size: 0,
                sched_policy: 0,
                sched_flags: 0,
                sched_nice: 0,
                sched_priority: 0,
                sched_runtime: 0,
                sched_deadline: 0,
                sched_period: 0,
            };
            let size = std::mem::size_of::<libc::sched_attr>() as u32;
            // SAFETY: sched_getattr writes at most `size` bytes into `attr` for this thread.
            let rc = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut libc::sched_attr, size, 0) };
            assert_eq!(rc, 0, "sched_getattr: {}", std::io::Error::last_os_error());
            attr.sched_runtime
        }
        let before = runtime();
        let set = std::thread::spawn(|| {
            shorten_current_thread_slice(100_000).unwrap();
            runtime()
        })
        .join()
        .unwrap();
        if before == 0 {
            assert_eq!(set, 0, "a kernel without custom slices reports none");
        } else {
            assert_eq!(set, 100_000, "the slice asked for");
        }
        assert_eq!(runtime(), before, "the calling test thread keeps its slice");
    }
}
