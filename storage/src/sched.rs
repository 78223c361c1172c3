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
}
