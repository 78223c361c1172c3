use std::time::Duration;

use tusk_recovery::HeapLoad;
use tusk_storage::io::Io;

/// Whether commits are logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Redo logs on disk; commit modes as documented on [`crate::Commit`].
    #[default]
    On,
    /// No log at all: the same transactions, purely in memory (every commit mode behaves like
    /// `Async`, nothing survives a close, `is_stable` is always false).
    Off,
}

/// How a store is opened. `Options::default()` suits most uses.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of address space reserved for the heap (touched lazily; default 4 GiB). May grow
    /// between opens; it must hold everything the store already allocated.
    pub heap_capacity: u64,
    /// Logging on or off (default on).
    pub durability: Durability,
    /// The I/O backend for the log (default: io_uring where available, else pwrite).
    pub io: Io,
    /// Number of log partitions (default: available cores). Threads map to them round-robin
    /// for their `Async` commits; `Sync` and `Partition` commits share partition 0, so that
    /// concurrent waiters share its flushes.
    pub log_partitions: usize,
    /// A partition's buffer is written once it holds this many bytes (default 1 MiB).
    pub log_buffer_bytes: usize,
    /// Async commits become durable at least this often (default 1 ms), as far as the
    /// background flusher gets a core: it asks for short scheduler slices (Linux 6.12+), which
    /// on 2 cores busy with commits kept a partition's flushes 1.6 ms apart at p50, 11 ms at p99.
    pub group_commit_interval: Duration,
    /// A log segment file is closed once it passes this size (default 64 MiB).
    pub segment_bytes: u64,
    /// log2 of the number of stripe locks, each guarding 64-byte lines (default 24: 16 M lock
    /// words in 128 MiB of address space, touched as the heap is). Lines 2^`stripes_log2` × 64
    /// bytes apart share a word (1 GiB by default); a large transaction holds the words of every
    /// line it touches until it commits, so with too few words (2^20 aliases every 64 MiB) one
    /// that touches most of a 150 MB tree held nearly all of them and unrelated small
    /// transactions waited for it.
    pub stripes_log2: u32,
    /// A checkpoint is taken this often in the background (default 10 s; `None`: only on
    /// [`crate::Store::checkpoint`]).
    pub checkpoint_interval: Option<Duration>,
    /// Closing the store takes a checkpoint when a reopen would otherwise replay more than
    /// this many bytes of log (default 1 MiB; `u64::MAX`: never). Only where checkpoints are
    /// automatic (`checkpoint_interval` set).
    pub close_checkpoint_above: u64,
    /// Checkpoints copy and write the heap in chunks of this many bytes (default 1 MiB).
    pub chunk_size: u64,
    /// Log space the checkpointer aims to stay under: clean chunks whose image would pin more
    /// than half of it are rewritten (default 1 GiB).
    pub max_log_bytes: u64,
    /// A large transaction (one running in place) whose redo record may reach this many bytes
    /// writes it to the log as it encodes it, in pieces, instead of building it whole in
    /// memory first (default 256 MiB). Its commit then returns with the record durable,
    /// whatever the commit mode, and the lines it wrote stay locked until then.
    pub stream_records_from: u64,
    /// Heap bytes kept populated beyond the allocator's high-water mark by a background
    /// thread, so transactions that take new memory do not pay its first-touch page faults
    /// (default 64 MiB; 0: no thread, pages are faulted in by whoever touches them first).
    pub prefault_ahead: u64,
    /// How a reopen brings the checkpoint into the heap (default [`HeapLoad::OnDemand`]: each
    /// chunk when first used, the rest by background threads, so that opening takes as long
    /// as the log after the checkpoint, whatever the heap's size; [`HeapLoad::Whole`]: all of
    /// it before `open` returns).
    pub heap_load: HeapLoad,
    /// Background threads read the chunks a reopen on demand left absent (default true; off,
    /// chunks come in only when used: tests that need chunks absent for a while).
    #[doc(hidden)]
    pub load_in_background: bool,
    /// Sees every record the log appends, with its LSN, as it is appended (default none):
    /// the source of replication (`tusk-replica`). Needs durability on.
    pub commit_tap: Option<tusk_txn::CommitTap>,
    /// Fails checkpoint I/O on purpose (tests of crashes during checkpoints).
    #[doc(hidden)]
    pub checkpoint_faults: Option<std::sync::Arc<tusk_storage::io::FaultPlan>>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            heap_capacity: 4 << 30,
            durability: Durability::On,
            io: Io::Auto,
            log_partitions: std::thread::available_parallelism().map_or(1, |n| n.get()),
            log_buffer_bytes: 1 << 20,
            group_commit_interval: Duration::from_millis(1),
            segment_bytes: 64 << 20,
            stripes_log2: 24,
            checkpoint_interval: Some(Duration::from_secs(10)),
            close_checkpoint_above: 1 << 20,
            chunk_size: 1 << 20,
            max_log_bytes: 1 << 30,
            stream_records_from: 256 << 20,
            prefault_ahead: 64 << 20,
            heap_load: HeapLoad::OnDemand,
            load_in_background: true,
            commit_tap: None,
            checkpoint_faults: None,
        }
    }
}
