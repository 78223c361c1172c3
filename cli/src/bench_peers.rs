//! `tusk bench peers`: tusk against the embedded stores users pick today, on the same work
//! through each store's own public API, in one run, with matched durability.
//!
//! Stores: tusk (its B-link tree under a root; `Commit::Sync` / `Commit::Async`), SQLite
//! through `rusqlite` (bundled; WAL; `synchronous=FULL` / `OFF`; a table with an INTEGER
//! PRIMARY KEY), `redb` (a `u64 → u64` table; `Durability::Immediate` / `None`), LMDB
//! through `heed` (default flags / `NO_SYNC`) and `fjall` (an LSM tree; transactions committed
//! with `PersistMode::SyncData` / buffered in its journal). The
//! durability classes: `sync`, every commit durable when it returns; `nosync`, commits
//! durable later (or at a clean close).
//!
//! Work, on `--keys` keys (values start at 0):
//! - load: all keys in one write transaction, in key order (each store's bulk path: tusk's
//!   `bulk_load`, one prepared INSERT per key, one `insert` per key);
//! - load1: `--load1-keys` keys (sync; default 2,000, since each commit waits for one or two
//!   disk flushes) or `--load1-keys-nosync` keys (default 100,000) into a fresh store of its
//!   own, in key order, one key per write transaction committed in the class's durability
//!   (SQLite: an autocommit INSERT); keys/s and latency per transaction;
//! - hathi: each transaction reads and adds 1 to `--words` random keys, for `--duration`
//!   seconds on each thread count (each thread with its own connection or handle; SQLite
//!   takes its write lock at BEGIN IMMEDIATE, redb lets one writer in at a time);
//! - lookup: random point reads, 100 per read transaction, one thread;
//! - scan100: `--scans` scans of the 100 keys from a random start on, summing their values,
//!   one per read transaction (tusk: `range(lo..)`, SQLite: `k >= ? ORDER BY k LIMIT 100`,
//!   the others' range iterators); scans/s and latency per scan;
//! - range1000: `--ranges` count+sum ranges [lo, lo + 1000) from random lo, one per read
//!   transaction (tusk: the tree's `count` and `sum`, which walk the leaves without yielding
//!   entries; SQLite: `SELECT count(*), sum(v) ... WHERE k >= ? AND k < ?`; the others: their
//!   range iterators); ranges/s and latency per range;
//! - bytes on disk per key after the load and the runs (`value`);
//! - reopen: a clean close, then open and one read (`value`, seconds);
//! - reopen-kill: a child process (the hidden `tusk peers-child`) opens the store and runs
//!   Hathi transactions in the class's durability; 100 ms after it has committed 100 it is
//!   killed with SIGKILL, then the store is opened and read once (`value`, seconds: recovery
//!   included), and the first 1,000 loaded keys are checked to be there.
//!
//! The defaults take minutes: the 10 M-key loads, and on a disk whose flush takes 5 ms,
//! about 10 to 20 s per store for the sync load1. `--scans 0`, `--ranges 0` and
//! `--load1-keys 0` (or `--load1-keys-nosync 0`) leave those workloads out.
//!
//! The JSON lines carry `store`, `durability`, `workload`, `threads`, `ops_per_s`, `p50_us`,
//! `p99_us` and `value`; the table ends with tusk's ratio to each peer per workload.

use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use redb::{ReadableDatabase, ReadableTable};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tusk::{Commit, Durability, Options, Store};

use super::report::rate;
use super::svg_plot::{write_bars_grid, Bars};
use super::{store_files, BenchDir, ChartedOutput, CliResult, IoAt};

type AnyError = Box<dyn Error + Send + Sync>;

#[derive(Args, Debug, Clone)]
pub struct PeersArgs {
    /// Stores to measure (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "tusk,sqlite,lmdb,redb,fjall")]
    stores: Vec<StoreChoice>,
    /// Durability classes (comma-separated): `sync` (durable when the commit returns) and
    /// `nosync` (durable later).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sync,nosync")]
    durability: Vec<Class>,
    /// Keys loaded (u64 keys 0..N, u64 values).
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// Thread counts for the Hathi workload (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Keys read and updated per Hathi transaction.
    #[arg(long, default_value_t = 6)]
    words: usize,
    /// Seconds of Hathi work per store, class and thread count.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Random point lookups per store and class (100 per read transaction).
    #[arg(long, default_value_t = 1_000_000)]
    lookups: u64,
    /// Keys loaded one per write transaction into a fresh store, `sync` class (0: none).
    /// Each of these commits waits for the disk (one or two flushes), hence the small count.
    #[arg(long, default_value_t = 2_000)]
    load1_keys: u64,
    /// Keys loaded one per write transaction into a fresh store, `nosync` class (0: none).
    #[arg(long, default_value_t = 100_000)]
    load1_keys_nosync: u64,
    /// Keys per write transaction of the `txn` workload (comma-separated): for each size,
    /// `--txn-total` distinct random keys go into a fresh store, that many per transaction.
    #[arg(long, value_delimiter = ',', default_value = "100,10000,100000")]
    txn_keys: Vec<u64>,
    /// Keys inserted per size of the `txn` workload (0: none); rounded up to whole
    /// transactions.
    #[arg(long, default_value_t = 200_000)]
    txn_total: u64,
    /// Scans of 100 consecutive keys from random starts per store and class, one per read
    /// transaction (0: none).
    #[arg(long, default_value_t = 100_000)]
    scans: u64,
    /// Count+sum ranges of 1,000 keys from random starts per store and class, one per read
    /// transaction (0: none).
    #[arg(long, default_value_t = 10_000)]
    ranges: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    pub(super) out: ChartedOutput,
}

impl PeersArgs {
    /// Keys of the one-key-per-transaction load in `class`.
    fn load1_keys(&self, class: Class) -> u64 {
        match class {
            Class::Sync => self.load1_keys,
            Class::Nosync => self.load1_keys_nosync,
        }
    }
}

/// The child process of `reopen-kill`: opens a loaded store and runs Hathi transactions in
/// its durability class until it is killed (or its parent is gone).
#[derive(Args, Debug, Clone)]
pub struct ChildArgs {
    #[arg(long, value_enum)]
    store: StoreChoice,
    #[arg(long, value_enum)]
    durability: Class,
    #[arg(long)]
    dir: PathBuf,
    /// Keys the store was loaded with (the Hathi keys are drawn from them).
    #[arg(long)]
    keys: u64,
    #[arg(long, default_value_t = 6)]
    words: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// Keys per `scan100` scan and per `range1000` range.
const SCAN_KEYS: usize = 100;
const RANGE_KEYS: u64 = 1_000;
/// The `reopen-kill` child prints `ready` after this many commits; the parent kills it
/// `KILL_DELAY` later, while it is still committing.
const CHILD_READY_AFTER: u64 = 100;
const KILL_DELAY: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
enum KillError {
    #[error("the writer child has no stdout")]
    NoStdout,
    #[error("the writer child ended before it was ready ({0})")]
    NotReady(std::process::ExitStatus),
    #[error("reopened after the kill, keys 0..{expected} count {found}")]
    Lost { expected: u64, found: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreChoice {
    Tusk,
    Sqlite,
    Lmdb,
    Redb,
    Fjall,
}

impl StoreChoice {
    fn name(self) -> &'static str {
        match self {
            StoreChoice::Tusk => "tusk",
            StoreChoice::Sqlite => "sqlite",
            StoreChoice::Lmdb => "lmdb",
            StoreChoice::Redb => "redb",
            StoreChoice::Fjall => "fjall",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Class {
    Sync,
    Nosync,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Sync => "sync",
            Class::Nosync => "nosync",
        }
    }
}

/// A store opened for the benchmark; each thread works through a session of its own.
trait Peer: Send + Sync {
    fn session(&self) -> Result<Box<dyn Session + '_>, AnyError>;
    /// Writes keys 0..n (value 0) in one transaction, durably.
    fn load(&self, n: u64) -> Result<(), AnyError>;
}

trait Session {
    /// One transaction: read each key and write it back plus one.
    fn hathi(&mut self, keys: &[u64]) -> Result<(), AnyError>;
    /// One write transaction inserting `key` (value 0), committed in the class's durability.
    fn insert(&mut self, key: u64) -> Result<(), AnyError>;
    /// One write transaction inserting every key of `keys` (value 0), one by one, committed
    /// in the class's durability.
    fn insert_many(&mut self, keys: &[u64]) -> Result<(), AnyError>;
    /// One read transaction of point lookups; returns the sum of the values found.
    fn lookups(&mut self, keys: &[u64]) -> Result<u64, AnyError>;
    /// One read transaction reading the first `n` entries with keys from `lo` on, in key
    /// order; returns the sum of their values.
    fn scan(&mut self, lo: u64, n: usize) -> Result<u64, AnyError>;
    /// One read transaction: the number of keys in `lo..hi` and the sum of their values.
    fn count_sum(&mut self, lo: u64, hi: u64) -> Result<(u64, u128), AnyError>;
}

// ------------------------------------------------------------------------------- tusk

struct TuskPeer {
    store: Store,
    commit: Commit,
}

const TUSK_ROOT: &str = "peers";

impl TuskPeer {
    fn open(dir: &Path, class: Class, keys: u64) -> Result<TuskPeer, AnyError> {
        // Room for the tree (about 28 bytes a key shuffled, less bulk-loaded) and its churn.
        let heap_capacity = (keys * 64 + (256 << 20)).next_multiple_of(1 << 21);
        let store = Store::open(dir, Options { heap_capacity, durability: Durability::On, ..Options::default() })?;
        let commit = if class == Class::Sync { Commit::Sync } else { Commit::Async };
        Ok(TuskPeer { store, commit })
    }
}

impl Peer for TuskPeer {
    fn session(&self) -> Result<Box<dyn Session + '_>, AnyError> {
        Ok(Box::new(TuskSession { peer: self }))
    }

    fn load(&self, n: u64) -> Result<(), AnyError> {
        self.store.transact(Commit::Sync, |tx| tx.btree(TUSK_ROOT)?.bulk_load((0..n).map(|k| (k, 0)), 1.0))?;
        Ok(())
    }
}

struct TuskSession<'p> {
    peer: &'p TuskPeer,
}

impl Session for TuskSession<'_> {
    fn hathi(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        self.peer.store.transact(self.peer.commit, |tx| {
            // Read and add 1 in one descent (BTree::update), as SQLite does in one statement.
            let mut tree = tx.btree(TUSK_ROOT)?;
            for &k in keys {
                tree.update(k, |v| v.unwrap_or(0) + 1)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn insert(&mut self, key: u64) -> Result<(), AnyError> {
        self.peer.store.transact(self.peer.commit, |tx| tx.btree(TUSK_ROOT)?.insert(key, 0))?;
        Ok(())
    }

    fn insert_many(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        self.peer.store.transact(self.peer.commit, |tx| {
            let mut tree = tx.btree(TUSK_ROOT)?;
            keys.iter().try_for_each(|&k| tree.insert(k, 0).map(drop))
        })?;
        Ok(())
    }

    fn lookups(&mut self, keys: &[u64]) -> Result<u64, AnyError> {
        let (sum, _) = self.peer.store.transact(Commit::Async, |tx| {
            let mut tree = tx.btree(TUSK_ROOT)?;
            keys.iter().try_fold(0u64, |s, &k| Ok(s + tree.get(k)?.unwrap_or(0)))
        })?;
        Ok(sum)
    }

    fn scan(&mut self, lo: u64, n: usize) -> Result<u64, AnyError> {
        let (sum, _) = self.peer.store.transact(Commit::Async, |tx| {
            tx.btree(TUSK_ROOT)?.range(lo..)?.take(n).try_fold(0u64, |s, kv| Ok(s + kv?.1))
        })?;
        Ok(sum)
    }

    fn count_sum(&mut self, lo: u64, hi: u64) -> Result<(u64, u128), AnyError> {
        // The tree's own count and sum walk the leaves' runs without yielding each entry.
        let (cs, _) = self.peer.store.transact(Commit::Async, |tx| {
            let mut tree = tx.btree(TUSK_ROOT)?;
            Ok((tree.count(lo..hi)?, tree.sum(lo..hi)?))
        })?;
        Ok(cs)
    }
}

// ------------------------------------------------------------------------------ SQLite

struct SqlitePeer {
    path: PathBuf,
    class: Class,
}

impl SqlitePeer {
    fn open(dir: &Path, class: Class) -> Result<SqlitePeer, AnyError> {
        std::fs::create_dir_all(dir).at(dir)?;
        let peer = SqlitePeer { path: dir.join("peers.sqlite"), class };
        peer.connect()?.execute_batch("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);")?;
        Ok(peer)
    }

    fn connect(&self) -> Result<rusqlite::Connection, AnyError> {
        let conn = rusqlite::Connection::open(&self.path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", if self.class == Class::Sync { "FULL" } else { "OFF" })?;
        conn.busy_timeout(Duration::from_secs(60))?;
        Ok(conn)
    }
}

impl Peer for SqlitePeer {
    fn session(&self) -> Result<Box<dyn Session + '_>, AnyError> {
        Ok(Box::new(SqliteSession { conn: self.connect()? }))
    }

    fn load(&self, n: u64) -> Result<(), AnyError> {
        let mut conn = self.connect()?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        let tx = conn.transaction()?;
        {
            let mut insert = tx.prepare("INSERT INTO kv (k, v) VALUES (?1, 0)")?;
            for k in 0..n {
                insert.execute([k as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

struct SqliteSession {
    conn: rusqlite::Connection,
}

impl Session for SqliteSession {
    fn hathi(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            // Read and add 1 in one statement (one descent), the value read returned.
            let mut update = tx.prepare_cached("UPDATE kv SET v = v + 1 WHERE k = ?1 RETURNING v")?;
            for &k in keys {
                let _read: i64 = update.query_row([k as i64], |row| row.get(0))?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn insert(&mut self, key: u64) -> Result<(), AnyError> {
        // Autocommit: the statement is its own write transaction.
        self.conn.prepare_cached("INSERT INTO kv (k, v) VALUES (?1, 0)")?.execute([key as i64])?;
        Ok(())
    }

    fn insert_many(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached("INSERT INTO kv (k, v) VALUES (?1, 0)")?;
            for &k in keys {
                insert.execute([k as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn lookups(&mut self, keys: &[u64]) -> Result<u64, AnyError> {
        let tx = self.conn.transaction()?;
        let mut sum = 0u64;
        {
            let mut read = tx.prepare_cached("SELECT v FROM kv WHERE k = ?1")?;
            for &k in keys {
                let v: i64 = read.query_row([k as i64], |row| row.get(0))?;
                sum += v as u64;
            }
        }
        tx.commit()?;
        Ok(sum)
    }

    fn scan(&mut self, lo: u64, n: usize) -> Result<u64, AnyError> {
        let tx = self.conn.transaction()?;
        let mut sum = 0u64;
        {
            let mut read = tx.prepare_cached("SELECT v FROM kv WHERE k >= ?1 ORDER BY k LIMIT ?2")?;
            let mut rows = read.query([lo as i64, n as i64])?;
            while let Some(row) = rows.next()? {
                sum += row.get::<_, i64>(0)? as u64;
            }
        }
        tx.commit()?;
        Ok(sum)
    }

    fn count_sum(&mut self, lo: u64, hi: u64) -> Result<(u64, u128), AnyError> {
        let tx = self.conn.transaction()?;
        let (count, sum): (i64, Option<i64>) = tx
            .prepare_cached("SELECT count(*), sum(v) FROM kv WHERE k >= ?1 AND k < ?2")?
            .query_row([lo as i64, hi as i64], |row| Ok((row.get(0)?, row.get(1)?)))?;
        tx.commit()?;
        Ok((count as u64, sum.unwrap_or(0) as u128))
    }
}

// -------------------------------------------------------------------------------- redb

const REDB_TABLE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("kv");

struct RedbPeer {
    db: redb::Database,
    durability: redb::Durability,
}

impl RedbPeer {
    fn open(dir: &Path, class: Class) -> Result<RedbPeer, AnyError> {
        std::fs::create_dir_all(dir).at(dir)?;
        let db = redb::Database::create(dir.join("peers.redb"))?;
        let durability = if class == Class::Sync { redb::Durability::Immediate } else { redb::Durability::None };
        Ok(RedbPeer { db, durability })
    }

    fn write(&self, durability: redb::Durability, body: impl FnOnce(&mut redb::Table<u64, u64>) -> Result<(), AnyError>) -> Result<(), AnyError> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(durability)?;
        {
            let mut table = tx.open_table(REDB_TABLE)?;
            body(&mut table)?;
        }
        tx.commit()?;
        Ok(())
    }
}

impl Peer for RedbPeer {
    fn session(&self) -> Result<Box<dyn Session + '_>, AnyError> {
        Ok(Box::new(RedbSession { peer: self }))
    }

    fn load(&self, n: u64) -> Result<(), AnyError> {
        self.write(redb::Durability::Immediate, |table| {
            for k in 0..n {
                table.insert(k, 0)?;
            }
            Ok(())
        })
    }
}

struct RedbSession<'p> {
    peer: &'p RedbPeer,
}

impl Session for RedbSession<'_> {
    fn hathi(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        self.peer.write(self.peer.durability, |table| {
            for &k in keys {
                let v = table.get(k)?.map_or(0, |g| g.value());
                table.insert(k, v + 1)?;
            }
            Ok(())
        })
    }

    fn insert(&mut self, key: u64) -> Result<(), AnyError> {
        self.peer.write(self.peer.durability, |table| {
            table.insert(key, 0)?;
            Ok(())
        })
    }

    fn insert_many(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        self.peer.write(self.peer.durability, |table| {
            for &k in keys {
                table.insert(k, 0)?;
            }
            Ok(())
        })
    }

    fn lookups(&mut self, keys: &[u64]) -> Result<u64, AnyError> {
        let tx = self.peer.db.begin_read()?;
        let table = tx.open_table(REDB_TABLE)?;
        let mut sum = 0;
        for &k in keys {
            sum += table.get(k)?.map_or(0, |g| g.value());
        }
        Ok(sum)
    }

    fn scan(&mut self, lo: u64, n: usize) -> Result<u64, AnyError> {
        let tx = self.peer.db.begin_read()?;
        let table = tx.open_table(REDB_TABLE)?;
        let mut sum = 0;
        for kv in table.range(lo..)?.take(n) {
            sum += kv?.1.value();
        }
        Ok(sum)
    }

    fn count_sum(&mut self, lo: u64, hi: u64) -> Result<(u64, u128), AnyError> {
        let tx = self.peer.db.begin_read()?;
        let table = tx.open_table(REDB_TABLE)?;
        let (mut count, mut sum) = (0, 0);
        for kv in table.range(lo..hi)? {
            count += 1;
            sum += kv?.1.value() as u128;
        }
        Ok((count, sum))
    }
}

// ------------------------------------------------------------------------ LMDB (heed)

type LmdbTable = heed::Database<heed::types::U64<heed::byteorder::BigEndian>, heed::types::U64<heed::byteorder::NativeEndian>>;

struct LmdbPeer {
    env: heed::Env,
    db: LmdbTable,
}

impl LmdbPeer {
    fn open(dir: &Path, class: Class, keys: u64) -> Result<LmdbPeer, AnyError> {
        std::fs::create_dir_all(dir).at(dir)?;
        let mut options = heed::EnvOpenOptions::new();
        // The map is address space, not memory: room for the keys many times over.
        options.map_size(((keys as usize) * 256 + (1 << 30)).next_multiple_of(1 << 21)).max_dbs(1);
        if class == Class::Nosync {
            // SAFETY: NO_SYNC only gives up durability of the last commits at a crash (the
            // nosync class measures exactly that); this process opens the environment once.
            unsafe { options.flags(heed::EnvFlags::NO_SYNC) };
        }
        // SAFETY: the environment's files are this run's own, opened once in this process
        // (the reopen comes after the first handle is dropped) and changed by nothing else.
        let env = unsafe { options.open(dir)? };
        let mut w = env.write_txn()?;
        let db: LmdbTable = env.create_database(&mut w, Some("kv"))?;
        w.commit()?;
        Ok(LmdbPeer { env, db })
    }
}

impl Peer for LmdbPeer {
    fn session(&self) -> Result<Box<dyn Session + '_>, AnyError> {
        Ok(Box::new(LmdbSession { peer: self }))
    }

    fn load(&self, n: u64) -> Result<(), AnyError> {
        let mut w = self.env.write_txn()?;
        for k in 0..n {
            self.db.put(&mut w, &k, &0)?;
        }
        w.commit()?;
        self.env.force_sync()?;
        Ok(())
    }
}

struct LmdbSession<'p> {
    peer: &'p LmdbPeer,
}

impl Session for LmdbSession<'_> {
    fn hathi(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        let mut w = self.peer.env.write_txn()?;
        for &k in keys {
            let v = self.peer.db.get(&w, &k)?.unwrap_or(0);
            self.peer.db.put(&mut w, &k, &(v + 1))?;
        }
        w.commit()?;
        Ok(())
    }

    fn insert(&mut self, key: u64) -> Result<(), AnyError> {
        let mut w = self.peer.env.write_txn()?;
        self.peer.db.put(&mut w, &key, &0)?;
        w.commit()?;
        Ok(())
    }

    fn insert_many(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        let mut w = self.peer.env.write_txn()?;
        for k in keys {
            self.peer.db.put(&mut w, k, &0)?;
        }
        w.commit()?;
        Ok(())
    }

    fn lookups(&mut self, keys: &[u64]) -> Result<u64, AnyError> {
        let r = self.peer.env.read_txn()?;
        let mut sum = 0;
        for &k in keys {
            sum += self.peer.db.get(&r, &k)?.unwrap_or(0);
        }
        Ok(sum)
    }

    fn scan(&mut self, lo: u64, n: usize) -> Result<u64, AnyError> {
        let r = self.peer.env.read_txn()?;
        let mut sum = 0;
        for kv in self.peer.db.range(&r, &(lo..))?.take(n) {
            sum += kv?.1;
        }
        Ok(sum)
    }

    fn count_sum(&mut self, lo: u64, hi: u64) -> Result<(u64, u128), AnyError> {
        let r = self.peer.env.read_txn()?;
        let (mut count, mut sum) = (0, 0);
        for kv in self.peer.db.range(&r, &(lo..hi))? {
            count += 1;
            sum += kv?.1 as u128;
        }
        Ok((count, sum))
    }
}

// ------------------------------------------------------------------------------- fjall

struct FjallPeer {
    keyspace: fjall::TxKeyspace,
    kv: fjall::TxPartitionHandle,
    durability: Option<fjall::PersistMode>,
}

impl FjallPeer {
    fn open(dir: &Path, class: Class) -> Result<FjallPeer, AnyError> {
        let keyspace = fjall::Config::new(dir).open_transactional()?;
        let kv = keyspace.open_partition("kv", fjall::PartitionCreateOptions::default())?;
        let durability = (class == Class::Sync).then_some(fjall::PersistMode::SyncData);
        Ok(FjallPeer { keyspace, kv, durability })
    }
}

fn fjall_value(v: Option<fjall::Slice>) -> u64 {
    v.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().expect("8-byte values")))
}

impl Peer for FjallPeer {
    fn session(&self) -> Result<Box<dyn Session + '_>, AnyError> {
        Ok(Box::new(FjallSession { peer: self }))
    }

    fn load(&self, n: u64) -> Result<(), AnyError> {
        let mut w = self.keyspace.write_tx().durability(Some(fjall::PersistMode::SyncData));
        for k in 0..n {
            w.insert(&self.kv, k.to_be_bytes(), 0u64.to_le_bytes());
        }
        w.commit()?;
        Ok(())
    }
}

struct FjallSession<'p> {
    peer: &'p FjallPeer,
}

impl Session for FjallSession<'_> {
    fn hathi(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        let mut w = self.peer.keyspace.write_tx().durability(self.peer.durability);
        for &k in keys {
            let v = fjall_value(w.get(&self.peer.kv, k.to_be_bytes())?);
            w.insert(&self.peer.kv, k.to_be_bytes(), (v + 1).to_le_bytes());
        }
        w.commit()?;
        Ok(())
    }

    fn insert(&mut self, key: u64) -> Result<(), AnyError> {
        let mut w = self.peer.keyspace.write_tx().durability(self.peer.durability);
        w.insert(&self.peer.kv, key.to_be_bytes(), 0u64.to_le_bytes());
        w.commit()?;
        Ok(())
    }

    fn insert_many(&mut self, keys: &[u64]) -> Result<(), AnyError> {
        let mut w = self.peer.keyspace.write_tx().durability(self.peer.durability);
        for k in keys {
            w.insert(&self.peer.kv, k.to_be_bytes(), 0u64.to_le_bytes());
        }
        w.commit()?;
        Ok(())
    }

    fn lookups(&mut self, keys: &[u64]) -> Result<u64, AnyError> {
        let r = self.peer.keyspace.read_tx();
        let mut sum = 0;
        for &k in keys {
            sum += fjall_value(r.get(&self.peer.kv, k.to_be_bytes())?);
        }
        Ok(sum)
    }

    fn scan(&mut self, lo: u64, n: usize) -> Result<u64, AnyError> {
        let r = self.peer.keyspace.read_tx();
        let mut sum = 0;
        for kv in r.range(&self.peer.kv, lo.to_be_bytes()..).take(n) {
            sum += fjall_value(Some(kv?.1));
        }
        Ok(sum)
    }

    fn count_sum(&mut self, lo: u64, hi: u64) -> Result<(u64, u128), AnyError> {
        let r = self.peer.keyspace.read_tx();
        let (mut count, mut sum) = (0, 0);
        for kv in r.range(&self.peer.kv, lo.to_be_bytes()..hi.to_be_bytes()) {
            count += 1;
            sum += fjall_value(Some(kv?.1)) as u128;
        }
        Ok((count, sum))
    }
}

// --------------------------------------------------------------------------- measuring

fn open(store: StoreChoice, dir: &Path, class: Class, keys: u64) -> Result<Box<dyn Peer>, AnyError> {
    Ok(match store {
        StoreChoice::Tusk => Box::new(TuskPeer::open(dir, class, keys)?),
        StoreChoice::Sqlite => Box::new(SqlitePeer::open(dir, class)?),
        StoreChoice::Lmdb => Box::new(LmdbPeer::open(dir, class, keys)?),
        StoreChoice::Redb => Box::new(RedbPeer::open(dir, class)?),
        StoreChoice::Fjall => Box::new(FjallPeer::open(dir, class)?),
    })
}

/// One figure of one store.
#[derive(Clone, Debug)]
struct Figure {
    store: &'static str,
    durability: &'static str,
    workload: String,
    threads: usize,
    ops_per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    /// Bytes per key on disk or seconds to reopen, where the workload is one of those.
    value: Option<f64>,
}

impl Figure {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "bench": "peers",
            "store": self.store,
            "durability": self.durability,
            "workload": self.workload,
            "threads": self.threads,
            "ops_per_s": self.ops_per_s,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "value": self.value,
        })
    }
}

/// Runs `threads` threads of Hathi transactions for `duration`; ops/s and latency.
fn hathi(peer: &dyn Peer, args: &PeersArgs, threads: usize) -> Result<(f64, Histogram<u64>), AnyError> {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let results: Vec<Result<(u64, Histogram<u64>), AnyError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || -> Result<(u64, Histogram<u64>), AnyError> {
                    let mut session = peer.session()?;
                    let mut rng = SmallRng::seed_from_u64(args.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
                    let mut keys = vec![0u64; args.words];
                    let mut done = 0;
                    while !stop.load(Ordering::Relaxed) {
                        keys.iter_mut().for_each(|k| *k = rng.random_range(0..args.keys));
                        let t0 = Instant::now();
                        session.hathi(&keys)?;
                        latency.record(t0.elapsed().as_nanos().max(1) as u64)?;
                        done += 1;
                    }
                    Ok((done, latency))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(args.duration));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().expect("a bench thread panicked")).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut total = 0;
    for r in results {
        let (done, latency) = r?;
        total += done;
        all.add(latency)?;
    }
    Ok((total as f64 / elapsed, all))
}

/// Runs `op(i)` for i in 0..n, one transaction each, on one thread; operations/s and the
/// latency of each.
fn timed(n: u64, mut op: impl FnMut(u64) -> Result<(), AnyError>) -> Result<(f64, Histogram<u64>), AnyError> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let started = Instant::now();
    for i in 0..n {
        let t0 = Instant::now();
        op(i)?;
        latency.record(t0.elapsed().as_nanos().max(1) as u64)?;
    }
    Ok((n as f64 / started.elapsed().as_secs_f64(), latency))
}

/// Random point lookups, 100 per read transaction; lookups/s and per-transaction latency.
fn lookups(peer: &dyn Peer, args: &PeersArgs) -> Result<(f64, Histogram<u64>), AnyError> {
    let mut session = peer.session()?;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut keys = vec![0u64; 100];
    let mut sum = 0;
    let (batches_per_s, latency) = timed(args.lookups.div_ceil(100).max(1), |_| {
        keys.iter_mut().for_each(|k| *k = rng.random_range(0..args.keys));
        sum += session.lookups(&keys)?;
        Ok(())
    })?;
    std::hint::black_box(sum);
    Ok((batches_per_s * 100.0, latency))
}

/// Keys 0..n, one per write transaction in key order, into the fresh store `peer`; keys/s
/// and per-transaction latency.
fn load1(peer: &dyn Peer, n: u64) -> Result<(f64, Histogram<u64>), AnyError> {
    let mut session = peer.session()?;
    timed(n, |k| session.insert(k))
}

/// `--txn-total` distinct random keys, `size` per write transaction, into the fresh store
/// `peer`; keys/s and per-transaction latency.
fn insert_txns(peer: &dyn Peer, args: &PeersArgs, size: u64) -> Result<(f64, Histogram<u64>), AnyError> {
    let mut session = peer.session()?;
    let txns = args.txn_total.div_ceil(size);
    // Distinct keys: a bijection of the position (odd multiplier), spread over the u64 range.
    let salt = SmallRng::seed_from_u64(args.seed ^ size).random::<u64>();
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
    let mut keys = Vec::with_capacity(size as usize);
    let (txns_per_s, latency) = timed(txns, |t| {
        keys.clear();
        keys.extend((t * size..(t + 1) * size).map(key));
        session.insert_many(&keys)
    })?;
    Ok((txns_per_s * size as f64, latency))
}

/// `--scans` scans of `SCAN_KEYS` consecutive keys from random starts, one per read
/// transaction; scans/s and per-scan latency.
fn scans(peer: &dyn Peer, args: &PeersArgs) -> Result<(f64, Histogram<u64>), AnyError> {
    let mut session = peer.session()?;
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x5CA7);
    let mut sum = 0;
    let result = timed(args.scans, |_| {
        sum += session.scan(rng.random_range(0..=args.keys.saturating_sub(SCAN_KEYS as u64)), SCAN_KEYS)?;
        Ok(())
    })?;
    std::hint::black_box(sum);
    Ok(result)
}

/// `--ranges` count+sum ranges [lo, lo + `RANGE_KEYS`) from random lo, one per read
/// transaction; ranges/s and per-range latency.
fn ranges(peer: &dyn Peer, args: &PeersArgs) -> Result<(f64, Histogram<u64>), AnyError> {
    let mut session = peer.session()?;
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0x2A26E);
    let mut total = 0;
    let result = timed(args.ranges, |_| {
        let lo = rng.random_range(0..=args.keys.saturating_sub(RANGE_KEYS));
        let (count, sum) = session.count_sum(lo, lo + RANGE_KEYS)?;
        total += count as u128 + sum;
        Ok(())
    })?;
    std::hint::black_box(total);
    Ok(result)
}

/// Kills a child on every way out (an error before the kill included).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Already killed and reaped on the normal path; then both fail harmlessly.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Seconds to open the loaded store at `path` and answer one read after a child writing to
/// it in `class` was killed (SIGKILL) mid-work; then checks that the loaded keys are there.
fn reopen_after_kill(store: StoreChoice, class: Class, path: &Path, args: &PeersArgs) -> Result<f64, AnyError> {
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe()?)
            .arg("peers-child")
            .args(["--store", store.name(), "--durability", class.name()])
            .arg("--dir")
            .arg(path)
            .args(["--keys", &args.keys.to_string(), "--words", &args.words.to_string(), "--seed", &args.seed.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().ok_or(KillError::NoStdout)?).read_line(&mut line)?;
    if line.trim() != "ready" {
        return Err(KillError::NotReady(child.0.wait()?).into());
    }
    std::thread::sleep(KILL_DELAY);
    child.0.kill()?;
    child.0.wait()?;
    let t0 = Instant::now();
    let peer = open(store, path, class, args.keys)?;
    let mut session = peer.session()?;
    session.lookups(&[0])?;
    let seconds = t0.elapsed().as_secs_f64();
    let expected = args.keys.min(RANGE_KEYS);
    let (found, _) = session.count_sum(0, expected)?;
    if found != expected {
        return Err(KillError::Lost { expected, found }.into());
    }
    Ok(seconds)
}

/// `tusk peers-child`: Hathi transactions on the store until killed; `ready` on stdout after
/// `CHILD_READY_AFTER` commits. Stops by itself once its parent is gone.
pub fn child(args: ChildArgs) -> CliResult {
    child_work(&args).map_err(|e| -> Box<dyn Error> { e })
}

fn child_work(args: &ChildArgs) -> Result<(), AnyError> {
    let parent = std::os::unix::process::parent_id();
    let peer = open(args.store, &args.dir, args.durability, args.keys)?;
    let mut session = peer.session()?;
    let mut rng = SmallRng::seed_from_u64(args.seed ^ 0xC411D);
    let mut keys = vec![0u64; args.words];
    let mut stdout = std::io::stdout().lock();
    for done in 1u64.. {
        keys.iter_mut().for_each(|k| *k = rng.random_range(0..args.keys));
        session.hathi(&keys)?;
        if done == CHILD_READY_AFTER {
            writeln!(stdout, "ready")?;
            stdout.flush()?;
        }
        if std::os::unix::process::parent_id() != parent {
            break;
        }
    }
    Ok(())
}

/// Bytes of the files of a store directory.
fn dir_bytes(dir: &Path) -> Result<u64, AnyError> {
    store_files(dir)?.iter().map(|f| Ok(std::fs::metadata(f).at(f)?.len())).sum()
}

/// Every figure of one store in one durability class, on a fresh directory.
fn measure(store: StoreChoice, class: Class, args: &PeersArgs, out: &mut Vec<Figure>) -> Result<(), AnyError> {
    let dir = BenchDir::new(args.out.dir.clone())?;
    let path = dir.path().join(store.name());
    let fig = |workload: &str, threads: usize, ops_per_s: f64, latency: Option<&Histogram<u64>>, value: Option<f64>| Figure {
        store: store.name(),
        durability: class.name(),
        workload: workload.into(),
        threads,
        ops_per_s,
        p50_us: latency.map(|h| h.value_at_quantile(0.5) as f64 / 1e3),
        p99_us: latency.map(|h| h.value_at_quantile(0.99) as f64 / 1e3),
        value,
    };
    let peer = open(store, &path, class, args.keys)?;
    let t0 = Instant::now();
    peer.load(args.keys)?;
    out.push(fig("load", 1, args.keys as f64 / t0.elapsed().as_secs_f64(), None, None));
    let n = args.load1_keys(class);
    if n > 0 {
        let load1_path = dir.path().join(format!("{}-load1", store.name()));
        let (ops, latency) = load1(open(store, &load1_path, class, n)?.as_ref(), n)?;
        out.push(fig("load1", 1, ops, Some(&latency), None));
    }
    if args.txn_total > 0 {
        for &size in &args.txn_keys {
            let txn_path = dir.path().join(format!("{}-txn{size}", store.name()));
            let (ops, latency) = insert_txns(open(store, &txn_path, class, args.txn_total)?.as_ref(), args, size)?;
            out.push(fig(&txn_workload(size), 1, ops, Some(&latency), None));
        }
    }
    for &threads in &args.threads {
        let (ops, latency) = hathi(peer.as_ref(), args, threads)?;
        out.push(fig("hathi", threads, ops, Some(&latency), None));
    }
    let (ops, latency) = lookups(peer.as_ref(), args)?;
    out.push(fig("lookup", 1, ops, Some(&latency), None));
    if args.scans > 0 {
        let (ops, latency) = scans(peer.as_ref(), args)?;
        out.push(fig("scan100", 1, ops, Some(&latency), None));
    }
    if args.ranges > 0 {
        let (ops, latency) = ranges(peer.as_ref(), args)?;
        out.push(fig("range1000", 1, ops, Some(&latency), None));
    }
    drop(peer);
    out.push(fig("bytes/key", 1, 0.0, None, Some(dir_bytes(&path)? as f64 / args.keys as f64)));
    let t0 = Instant::now();
    let peer = open(store, &path, class, args.keys)?;
    peer.session()?.lookups(&[0])?;
    out.push(fig("reopen", 1, 0.0, None, Some(t0.elapsed().as_secs_f64())));
    drop(peer);
    out.push(fig("reopen-kill", 1, 0.0, None, Some(reopen_after_kill(store, class, &path, args)?)));
    Ok(())
}

/// The `txn` workload's name at `size` keys per transaction.
fn txn_workload(size: u64) -> String {
    format!("txn{size}")
}

pub fn run(args: PeersArgs) -> CliResult {
    if args.keys == 0 || args.words == 0 || args.threads.contains(&0) || args.txn_keys.contains(&0) {
        return Err("--keys, --words, --threads and --txn-keys take counts of at least 1".into());
    }
    let mut figures = Vec::new();
    for &class in &args.durability {
        for &store in &args.stores {
            if !args.out.json {
                eprintln!("measuring {} ({}, {} keys)...", store.name(), class.name(), args.keys);
            }
            measure(store, class, &args, &mut figures).map_err(|e| format!("{} ({}): {e}", store.name(), class.name()))?;
        }
    }
    if let Some(dir) = &args.out.plot {
        plot(dir, &args, &figures)?;
    }
    if args.out.json {
        for f in &figures {
            outln!("{}", f.json());
        }
        return Ok(());
    }
    outln!(
        "tusk bench peers: {} keys, {} words per Hathi transaction, {} s per run, {} / {} keys loaded one per transaction (sync / nosync)",
        args.keys, args.words, args.duration, args.load1_keys, args.load1_keys_nosync
    );
    outln!("{:<8} {:<8} {:<11} {:>7} {:>14} {:>10} {:>10} {:>10}", "store", "class", "workload", "threads", "ops/s", "p50 us", "p99 us", "value");
    for f in &figures {
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        // Reopen times are often milliseconds: four decimals below one.
        let value = f.value.map_or("-".to_string(), |v| if v < 1.0 { format!("{v:.4}") } else { format!("{v:.2}") });
        let ops = if f.value.is_some() { "-".to_string() } else { rate(f.ops_per_s) };
        outln!("{:<8} {:<8} {:<11} {:>7} {:>14} {:>10} {:>10} {:>10}", f.store, f.durability, f.workload, f.threads, ops, opt(f.p50_us), opt(f.p99_us), value);
    }
    outln!("load: keys/s of one write transaction; load1: keys/s, one per write transaction into a fresh store; lookup: point reads/s, 100 per read transaction");
    outln!("txnN: keys/s of {} distinct random keys inserted N per write transaction into a fresh store (latency per transaction)", args.txn_total);
    outln!("scan100: scans/s of {SCAN_KEYS} keys from a random start; range1000: count+sum ranges/s of {RANGE_KEYS} keys; one per read transaction (latency per transaction)");
    outln!("value: bytes on disk per key; seconds to open and answer a read after a clean close (reopen) or after killing a writer mid-work (reopen-kill)");
    outln!("tusk/peer: ratio of rates (above 1: tusk faster); \"of the value\": ratio of bytes or seconds (above 1: tusk larger or slower)");
    // tusk against each peer, same class and workload: rates (higher is better for tusk)
    // and values (bytes, seconds: lower is better for tusk).
    for f in figures.iter().filter(|f| f.store == "tusk") {
        for p in figures.iter().filter(|p| p.store != "tusk" && p.durability == f.durability && p.workload == f.workload && p.threads == f.threads) {
            let (ratio, what) = match (f.value, p.value) {
                (Some(t), Some(v)) => (t / v, " (of the value)"),
                _ => (f.ops_per_s / p.ops_per_s, ""),
            };
            outln!("tusk/{:<7} {:<7} {:<11} @{}: {ratio:.2}x{what}", p.store, f.durability, f.workload, f.threads);
        }
    }
    Ok(())
}

/// `DIR/peers.svg`: ops/s per workload (a bar per store), one panel per durability class;
/// below them, the seconds to reopen after a clean close and after a kill, likewise.
fn plot(dir: &Path, args: &PeersArgs, figures: &[Figure]) -> CliResult {
    std::fs::create_dir_all(dir).at(dir)?;
    let mut workloads: Vec<(String, usize)> = vec![("load".into(), 1), ("load1".into(), 1)];
    if args.txn_total > 0 {
        workloads.extend(args.txn_keys.iter().map(|&n| (txn_workload(n), 1)));
    }
    workloads.extend(args.threads.iter().map(|&t| ("hathi".to_string(), t)));
    workloads.extend(["lookup", "scan100", "range1000"].map(|w| (w.to_string(), 1)));
    let reopens: Vec<(String, usize)> = ["reopen", "reopen-kill"].map(|w| (w.to_string(), 1)).into();
    let mut charts: Vec<Bars> = args
        .durability
        .iter()
        .map(|&class| bars(args, figures, class, &workloads, "operations/s (log)", |f| f.ops_per_s))
        .collect();
    charts.extend(args.durability.iter().map(|&class| bars(args, figures, class, &reopens, "seconds (log)", |f| f.value.unwrap_or(f64::NAN))));
    write_bars_grid(&charts, args.durability.len().max(1), &dir.join("peers.svg"))?;
    Ok(())
}

/// One panel: `figure`'s number for each workload (a category) and store (a series).
fn bars(args: &PeersArgs, figures: &[Figure], class: Class, workloads: &[(String, usize)], y_label: &str, figure: impl Fn(&Figure) -> f64) -> Bars {
    Bars {
        title: format!("{} keys, {} commits", args.keys, class.name()),
        y_label: y_label.into(),
        log_y: true,
        categories: workloads.iter().map(|(w, t)| if w == "hathi" { format!("hathi @{t}") } else { w.clone() }).collect(),
        series: args
            .stores
            .iter()
            .map(|s| {
                let values = workloads
                    .iter()
                    .map(|(w, t)| {
                        figures
                            .iter()
                            .find(|f| f.store == s.name() && f.durability == class.name() && &f.workload == w && f.threads == *t)
                            .map_or(f64::NAN, &figure)
                    })
                    .collect();
                (s.name().to_string(), values)
            })
            .collect(),
    }
}
