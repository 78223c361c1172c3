//! io_uring backend: each request is a write linked to an fdatasync; a batch is submitted
//! at once, so the partitions' flushes overlap in the device.

use io_uring::{opcode, squeue, types, IoUring};

use super::{IoBackend, WriteSync};

/// Requests per submission (two SQEs each).
const BATCH: usize = 32;

pub struct UringIo {
    ring: IoUring,
}

impl UringIo {
    /// Sets up a ring; fails where io_uring_setup is not permitted (old kernels, seccomp).
    pub fn new() -> std::io::Result<UringIo> {
        Ok(UringIo { ring: IoUring::new((2 * BATCH) as u32)? })
    }

    fn run_batch(&mut self, reqs: &[WriteSync<'_>], results: &mut [std::io::Result<()>]) {
        // Bytes written so far per request: short writes are resubmitted from there.
        let mut done = vec![0usize; reqs.len()];
        let mut pending: Vec<usize> = (0..reqs.len()).collect();
        while !pending.is_empty() {
            {
                let mut sq = self.ring.submission();
                for &i in &pending {
                    let r = &reqs[i];
                    let rest = &r.data[done[i]..];
                    let write = opcode::Write::new(types::Fd(r.fd), rest.as_ptr(), rest.len() as u32)
                        .offset(r.offset + done[i] as u64)
                        .build()
                        .user_data((i * 2) as u64)
                        .flags(squeue::Flags::IO_LINK);
                    let sync = opcode::Fsync::new(types::Fd(r.fd))
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data((i * 2 + 1) as u64);
                    // SAFETY: the buffers in `reqs` outlive this call, which waits for every
                    // completion of the entries pushed here before returning.
                    unsafe {
                        sq.push(&write).expect("ring sized for the batch");
                        sq.push(&sync).expect("ring sized for the batch");
                    }
                }
            }
            let want = pending.len() * 2;
            let mut seen = 0;
            let mut short = Vec::new();
            while seen < want {
                if let Err(e) = self.ring.submit_and_wait(want - seen) {
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    for &i in &pending {
                        results[i] = Err(std::io::Error::new(e.kind(), e.to_string()));
                    }
                    return;
                }
                for cqe in self.ring.completion() {
                    seen += 1;
                    let i = (cqe.user_data() / 2) as usize;
                    let is_write = cqe.user_data() % 2 == 0;
                    let res = cqe.result();
                    if is_write {
                        if res < 0 {
                            results[i] = Err(std::io::Error::from_raw_os_error(-res));
                        } else {
                            done[i] += res as usize;
                            if done[i] < reqs[i].data.len() {
                                if res == 0 {
                                    results[i] = Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
                                } else {
                                    short.push(i);
                                }
                            }
                        }
                    } else if res < 0 && res != -libc::ECANCELED && results[i].is_ok() {
                        results[i] = Err(std::io::Error::from_raw_os_error(-res));
                    }
                }
            }
            pending = short;
        }
    }
}

impl IoBackend for UringIo {
    fn name(&self) -> String {
        "io_uring".into()
    }

    fn write_and_sync(&mut self, reqs: &[WriteSync<'_>]) -> Vec<std::io::Result<()>> {
        let mut results: Vec<std::io::Result<()>> = reqs.iter().map(|_| Ok(())).collect();
        for (chunk, out) in reqs.chunks(BATCH).zip(results.chunks_mut(BATCH)) {
            self.run_batch(chunk, out);
        }
        results
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uring_backend_writes_batches_where_available() {
        match super::UringIo::new() {
            Ok(mut ring) => super::super::backend_tests::batch_writes_land(&mut ring),
            Err(e) => eprintln!("io_uring unavailable here ({e}); the sync backend covers this machine"),
        }
    }
}
