//! Child processes of fork snapshots: anonymous shared memory made before the fork, pipes
//! for the wake-ups, the fork itself, and reaping.
//!
//! The child of a multithreaded process inherits only the forking thread; every lock another
//! thread held at that moment stays held forever in the child. [`fork_child`] therefore runs
//! nothing in the child but the caller's body and `_exit` (no destructors, no atexit
//! handlers, no stdio flush), and the body must avoid locks too: it may allocate, because
//! glibc's `fork` takes malloc's locks around the fork and resets them in the child.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

/// Anonymous memory shared between this process and the children it forks afterwards.
pub struct SharedMemory {
    base: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value; access goes through `&self`/`&mut self`.
unsafe impl Send for SharedMemory {}
// SAFETY: as above; shared borrows only read.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    pub fn new(len: usize) -> std::io::Result<SharedMemory> {
        let len = len.max(1);
        // SAFETY: a fresh anonymous shared mapping; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedMemory { base: base as *mut u8, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. The other process writes them only while this one waits for it (the
    /// protocol on top hands the memory back and forth through a pipe, whose system calls
    /// order the accesses).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping covers `len` bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusive through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.len) }
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped (the child has its own mapping of it).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Both ends of a pipe (close-on-exec).
pub struct Pipe {
    pub read: File,
    pub write: File,
}

impl Pipe {
    pub fn new() -> std::io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        Ok(unsafe { Pipe { read: File::from_raw_fd(fds[0]), write: File::from_raw_fd(fds[1]) } })
    }
}

/// How a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for ChildExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildExit::Code(c) => write!(f, "exited with code {c}"),
            ChildExit::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// A forked child; killed and reaped when dropped, so none is left a zombie.
pub struct Child {
    pid: libc::pid_t,
    exit: Option<ChildExit>,
}

/// Forks. In the child, closes every descriptor but 0–2 and `keep` (so the pipes of other
/// children and the store's files are not held open by it), runs `body`, and `_exit`s with
/// its return value (101 if it panicked). See the module note on what `body` may do.
pub fn fork_child(keep: &[RawFd], body: impl FnOnce() -> i32) -> std::io::Result<Child> {
    let mut keep: Vec<RawFd> = keep.to_vec();
    keep.sort_unstable();
    // SAFETY: see the module note: the child runs only `body` and then `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        close_all_but(&keep);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
        // SAFETY: ends the child at once, running nothing the parent's threads might lock.
        unsafe { libc::_exit(code) };
    }
    Ok(Child { pid, exit: None })
}

/// Closes every descriptor above 2 that is not in `keep` (sorted).
fn close_all_but(keep: &[RawFd]) {
    let mut from: u32 = 3;
    for &fd in keep.iter().filter(|&&fd| fd >= 3) {
        if (fd as u32) > from {
            close_range(from, fd as u32 - 1);
        }
        from = fd as u32 + 1;
    }
    close_range(from, u32::MAX);
}

fn close_range(first: u32, last: u32) {
    // SAFETY: close_range only closes descriptors of this (child) process.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
}

impl Child {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// How the child ended, if it has (reaping it).
    pub fn try_wait(&mut self) -> Option<ChildExit> {
        if self.exit.is_none() {
            self.wait(libc::WNOHANG);
        }
        self.exit
    }

    /// Waits up to `timeout` for the child to end by itself; then kills it. Returns how it ended.
    pub fn finish(&mut self, timeout: Duration) -> ChildExit {
        let started = Instant::now();
        while self.try_wait().is_none() && started.elapsed() < timeout {
            std::thread::sleep(Duration::from_micros(200));
        }
        if self.exit.is_none() {
            self.kill();
        }
        while self.exit.is_none() {
            self.wait(0);
        }
        self.exit.expect("reaped")
    }

    /// Sends SIGKILL (nothing if it is already reaped).
    pub fn kill(&self) {
        if self.exit.is_none() {
            // SAFETY: the pid is our unreaped child, so it cannot have been reused.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    fn wait(&mut self, flags: libc::c_int) {
        let mut status = 0;
        // SAFETY: waits for our own child and writes its status into `status`.
        let r = unsafe { libc::waitpid(self.pid, &mut status, flags) };
        if r == self.pid {
            self.exit = Some(if libc::WIFSIGNALED(status) {
                ChildExit::Signal(libc::WTERMSIG(status))
            } else {
                ChildExit::Code(libc::WEXITSTATUS(status))
            });
        } else if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            // Someone else reaped it (a SIGCHLD handler set to ignore): it is gone all the same.
            self.exit = Some(ChildExit::Code(-1));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.kill();
            while self.exit.is_none() {
                self.wait(0);
            }
        }
    }
}

/// A forked child that answers requests over shared memory: the parent writes a request,
/// wakes the child through a pipe, and reads the answer once the child writes a byte back.
/// The child ends when the request pipe reaches end-of-file: when this value is dropped, or
/// when the parent process dies (the kernel closes its descriptors), so it is never orphaned
/// for long. A child that dies is noticed as end-of-file on the answer pipe: an error, not a
/// hang.
pub struct ForkServer {
    child: Child,
    shm: SharedMemory,
    to_child: Option<File>,
    from_child: File,
}

/// Why a call to a [`ForkServer`] got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ForkServerError {
    #[error("the snapshot child process (pid {pid}) is gone: {exit}")]
    ChildGone { pid: i32, exit: ChildExit },
    #[error("talking to the snapshot child process: {0}")]
    Io(#[from] std::io::Error),
}

/// Bytes at the front of the shared memory that hold the length of the message after them.
const LEN_BYTES: usize = 8;

impl ForkServer {
    /// Forks a child that calls `serve(request, answer_buffer)` for each request and sends
    /// back the first bytes of the buffer it returns the length of. `serve` runs in the
    /// child only, over the child's copy-on-write image of this process (see the module note
    /// on what it may do). `shm_bytes` bounds requests and answers.
    pub fn spawn(shm_bytes: usize, mut serve: impl FnMut(&[u8], &mut [u8]) -> usize) -> std::io::Result<ForkServer> {
        let mut shm = SharedMemory::new(shm_bytes.max(LEN_BYTES + 4096))?;
        let (requests, answers) = (Pipe::new()?, Pipe::new()?);
        let (req_fd, ans_fd) = (requests.read.as_raw_fd(), answers.write.as_raw_fd());
        let (base, len) = (shm.as_mut_slice().as_mut_ptr() as usize, shm.len());
        let child = fork_child(&[req_fd, ans_fd], move || {
            use std::io::{Read, Write};
            // SAFETY: in the child: the two descriptors were kept open for it, and the shared
            // mapping stays mapped at the same address; the parent touches it only while it
            // waits for this child's answer byte.
            let (mut requests, mut answers, shm) = unsafe {
                (File::from_raw_fd(req_fd), File::from_raw_fd(ans_fd), std::slice::from_raw_parts_mut(base as *mut u8, len))
            };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while matches!(requests.read(&mut byte), Ok(1)) {
                let n = (u64::from_le_bytes(shm[..LEN_BYTES].try_into().expect("8 bytes")) as usize).min(len - LEN_BYTES);
                request.clear();
                request.extend_from_slice(&shm[LEN_BYTES..LEN_BYTES + n]);
                let answered = serve(&request, &mut shm[LEN_BYTES..]).min(len - LEN_BYTES);
                shm[..LEN_BYTES].copy_from_slice(&(answered as u64).to_le_bytes());
                if answers.write_all(&byte).is_err() {
                    break;
                }
            }
            0
        })?;
        drop(requests.read);
        drop(answers.write);
        Ok(ForkServer { child, shm, to_child: Some(requests.write), from_child: answers.read })
    }

    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// Bytes a request or an answer may take.
    pub fn capacity(&self) -> usize {
        self.shm.len() - LEN_BYTES
    }

    /// Sends the request `write` puts into the buffer (returning its length) and returns
    /// the answer.
    pub fn call(&mut self, write: impl FnOnce(&mut [u8]) -> usize) -> Result<&[u8], ForkServerError> {
        use std::io::{Read, Write};
        if let Some(exit) = self.child.try_wait() {
            return Err(ForkServerError::ChildGone { pid: self.child.pid(), exit });
        }
        let n = write(&mut self.shm.as_mut_slice()[LEN_BYTES..]).min(self.capacity());
        self.shm.as_mut_slice()[..LEN_BYTES].copy_from_slice(&(n as u64).to_le_bytes());
        let sent = match self.to_child.as_mut() {
            Some(pipe) => pipe.write_all(&[1]),
            None => Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        };
        let mut byte = [0u8; 1];
        let answered = sent.and_then(|()| self.from_child.read(&mut byte));
        match answered {
            Ok(1) => {
                let shm = self.shm.as_slice();
                let n = (u64::from_le_bytes(shm[..LEN_BYTES].try_into().expect("8 bytes")) as usize).min(self.capacity());
                Ok(&shm[LEN_BYTES..LEN_BYTES + n])
            }
            // End-of-file or a broken pipe: the child died. Reap it to say how. (Rust programs
            // ignore SIGPIPE, so the write to a dead child fails instead of killing us.)
            Ok(_) => Err(self.gone()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(self.gone()),
            Err(e) => Err(ForkServerError::Io(e)),
        }
    }

    fn gone(&mut self) -> ForkServerError {
        let exit = self.child.finish(Duration::from_secs(1));
        ForkServerError::ChildGone { pid: self.child.pid(), exit }
    }

    /// Tells the child to end (end-of-file on its requests) without waiting for it; dropping
    /// the server then waits for the exit.
    pub fn retire(&mut self) {
        drop(self.to_child.take());
    }

    /// Kills the child (tests of a crashed child).
    pub fn kill(&self) {
        self.child.kill();
    }
}


impl Drop for ForkServer {
    fn drop(&mut self) {
        // End-of-file on its request pipe ends the child; it is killed if it does not.
        drop(self.to_child.take());
        self.child.finish(Duration::from_secs(2));
    }
}

/// The raw descriptor of a pipe end, for [`fork_child`]'s keep list.
pub fn raw(file: &File) -> RawFd {
    file.as_raw_fd()
}

/// Bytes of memory the kernel could still give this process without swapping
/// (MemAvailable of /proc/meminfo), if it can be read.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn child_sees_shared_memory_and_answers_over_a_pipe() {
        let mut shm = SharedMemory::new(4096).unwrap();
        shm.as_mut_slice()[0] = 41;
        let (req, resp) = (Pipe::new().unwrap(), Pipe::new().unwrap());
        let ptr = shm.as_slice().as_ptr() as usize;
        let (req_r, resp_w) = (req.read.as_raw_fd(), resp.write.as_raw_fd());
        let mut child = fork_child(&[req_r, resp_w], || {
            // SAFETY (test): the fd numbers and the mapping are inherited by the child.
            let (mut r, mut w) = unsafe { (File::from_raw_fd(req_r), File::from_raw_fd(resp_w)) };
            let mut b = [0u8; 1];
            while r.read(&mut b).unwrap_or(0) == 1 {
                // SAFETY (test): the shared page stays mapped in the child.
                unsafe { *(ptr as *mut u8) += 1 };
                w.write_all(&b).unwrap();
            }
            7
        })
        .unwrap();
        drop(req.read);
        drop(resp.write);
        let (mut to_child, mut from_child) = (req.write, resp.read);
        for expected in [42u8, 43] {
            to_child.write_all(&[1]).unwrap();
            let mut b = [0u8; 1];
            from_child.read_exact(&mut b).unwrap();
            assert_eq!(shm.as_slice()[0], expected);
        }
        drop(to_child);
        assert_eq!(child.finish(Duration::from_secs(5)), ChildExit::Code(7), "EOF on its pipe ends the child");
    }

    #[test]
    fn killed_child_is_reported_and_reaped() {
        let pipe = Pipe::new().unwrap();
        let r = pipe.read.as_raw_fd();
        let mut child = fork_child(&[r], || {
            // SAFETY (test): inherited descriptor.
            let mut f = unsafe { File::from_raw_fd(r) };
            let _ = f.read(&mut [0u8; 1]);
            0
        })
        .unwrap();
        assert_eq!(child.try_wait(), None);
        child.kill();
        assert_eq!(child.finish(Duration::from_secs(5)), ChildExit::Signal(libc::SIGKILL));
        let pid = child.pid();
        drop(child);
        // SAFETY: probing whether the pid is still our child.
        let gone = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(gone, -1, "no zombie left behind");
    }

    #[test]
    fn fork_server_answers_and_reports_a_dead_child() {
        let offset = 5u8;
        let mut server = ForkServer::spawn(1 << 16, |req, out| {
            for (o, r) in out.iter_mut().zip(req) {
                *o = r + offset;
            }
            req.len()
        })
        .unwrap();
        assert_eq!(server.call(|buf| { buf[..3].copy_from_slice(&[1, 2, 3]); 3 }).unwrap(), &[6, 7, 8]);
        assert_eq!(server.call(|_| 0).unwrap(), &[] as &[u8]);
        let pid = server.pid();
        server.kill();
        match server.call(|_| 0) {
            Err(ForkServerError::ChildGone { pid: p, exit }) => {
                assert_eq!(p, pid);
                assert_eq!(exit, ChildExit::Signal(libc::SIGKILL));
            }
            other => panic!("expected ChildGone, got {other:?}"),
        }
        drop(server);
        // SAFETY: probing whether the pid is still our child.
        assert_eq!(unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) }, -1, "reaped");
    }

    #[test]
    fn available_memory_is_read() {
        assert!(available_memory().unwrap() > 0);
    }
}
