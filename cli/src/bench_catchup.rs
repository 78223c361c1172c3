//! `tusk bench catchup`: a follower far behind catches up by snapshot, against the disk's
//! sequential write rate in the same run.
//!
//! A group of three on loopback; one follower is killed, the leader commits `--mib` MiB of
//! blocks of pseudo-random bytes (4 MiB per `Sync` transaction); it and the other follower
//! make a snapshot and purge their logs below it. The follower is opened again: its log ends before what the leader
//! keeps, so the leader sends the snapshot (the heap image, streamed with its checksums),
//! the follower checks and installs it as its store's checkpoint, and applies the log after
//! it. Catch-up time runs from the open until the follower has applied the leader's last
//! commit; its rate is the snapshot's bytes over that time. The disk's rate is a file of the
//! same size written and synced as the follower writes a snapshot it receives, in its
//! directory, just before and just after the catch-up (their mean); the system's dirty
//! pages are written before each. Each further round kills the follower again and commits a little more, so
//! that a newer snapshot is needed.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;
use tusk::{Commit, HeapPtr, Options};
use tusk_replica::snapshot_stream::{Bytes, Writer};
use tusk_replica::ReplicatedNode;

use super::group::{LocalGroup, Settings};
use super::report::median;
use super::{BenchDir, BenchOutput, CliResult};

#[derive(Args, Debug, Clone)]
pub struct CatchupArgs {
    /// MiB the follower falls behind by (committed while it is down).
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Rounds (the figures are medians over them).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Worker threads of each node's async runtime (default the node's default).
    #[arg(long)]
    runtime_threads: Option<usize>,
    #[command(flatten)]
    pub out: BenchOutput,
}

/// Bytes of each block (one transaction).
const BLOCK: u64 = 4 << 20;
/// How long the follower may take to catch up.
const PATIENCE: Duration = Duration::from_secs(600);

struct Round {
    snapshot_bytes: u64,
    catchup: Duration,
    /// Until the follower's heap was loaded whole (the store opens before, on demand).
    loaded: Duration,
    disk_bytes_per_s: f64,
}

impl Round {
    fn rate(&self) -> f64 {
        self.snapshot_bytes as f64 / self.catchup.as_secs_f64()
    }
}

fn up(group: &LocalGroup, i: usize) -> Result<std::sync::RwLockReadGuard<'_, Option<ReplicatedNode>>, Box<dyn std::error::Error>> {
    Ok(group.node(i).filter(|n| n.is_some()).ok_or_else(|| format!("node {} is down", i + 1))?)
}

/// A block of pseudo-random bytes, the same for the same `n`.
fn block(n: u64) -> Vec<u8> {
    random_bytes(n, BLOCK)
}

/// `len` (a multiple of 8) pseudo-random bytes, the same for the same `seed`: nothing a disk
/// or a transport could compress.
pub fn random_bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// Commits blocks `from..to` on the leader (each under a root of its own number's table).
fn load(leader: &ReplicatedNode, table: HeapPtr, from: u64, to: u64) -> Result<u64, Box<dyn std::error::Error>> {
    let mut last = 0;
    for n in from..to {
        let bytes = block(n);
        let (_, at) = leader.transact(Commit::Sync, |tx| {
            let p = tx.alloc(BLOCK)?;
            tx.write(p, &bytes)?;
            tx.write_u64_at(table, 8 * n, p.offset())
        })?;
        last = at.map_or(last, |a| a.index);
    }
    Ok(last)
}

/// The crc32 of blocks `0..count` (every `step`-th) on `node`.
fn blocks_crc(node: &ReplicatedNode, table: HeapPtr, count: u64, step: u64) -> Result<u32, Box<dyn std::error::Error>> {
    let store = node.store()?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; BLOCK as usize];
    for n in (0..count).step_by(step as usize) {
        store.transact(Commit::Async, |tx| {
            let p = HeapPtr(tx.read_u64_at(table, 8 * n)?);
            tx.read(p, &mut buf)
        })?;
        h.update(&buf);
    }
    Ok(h.finalize())
}

/// Writes `bytes` to a new file in `dir` as a follower writes a snapshot it receives (pieces
/// of 1 MiB from a thread of their own, synced every 64 MiB on another and at the end:
/// `tusk_replica::snapshot_stream::Writer`), the system's dirty pages written first; bytes
/// per second. The disk's sequential write rate as the follower can use it at best.
fn disk_rate(dir: &Path, bytes: u64) -> Result<f64, Box<dyn std::error::Error>> {
    nix::unistd::sync();
    let path = dir.join("disk-probe");
    let piece = Bytes::from(vec![0x5Au8; tusk_replica::snapshot_stream::PIECE]);
    let started = Instant::now();
    let writer = Writer::new(std::fs::File::create(&path)?)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(piece.len() as u64) as usize;
        if !writer.write_blocking(piece.slice(..n)) {
            break;
        }
        left -= n as u64;
    }
    writer.finish_blocking()?;
    let rate = bytes as f64 / started.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(rate)
}

/// The bytes of node `id`'s current snapshot file.
fn snapshot_bytes(node_dir: &Path) -> Result<u64, Box<dyn std::error::Error>> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(node_dir.join("snapshots"))? {
        let entry = entry?;
        if entry.path().extension().is_some_and(|x| x == "snap") {
            bytes = bytes.max(entry.metadata()?.len());
        }
    }
    Ok(bytes)
}

pub fn run(args: CatchupArgs) -> CliResult {
    if args.rounds == 0 || args.mib < 4 || args.runtime_threads == Some(0) {
        return Err("--rounds and --runtime-threads must be ≥ 1 and --mib ≥ 4".into());
    }
    let dir = BenchDir::new(args.out.dir.clone())?;
    let blocks = args.mib * (1 << 20) / BLOCK;
    let options = Options { heap_capacity: (blocks * BLOCK * 3 / 2 + (256 << 20)).next_multiple_of(1 << 30), checkpoint_interval: None, ..Options::default() };
    // Snapshots only when asked, and the log purged up to them: the follower cannot catch
    // up from the log.
    let settings = Settings {
        snapshot_after_log_bytes: Some(u64::MAX),
        log_kept_after_snapshot: 0,
        election_timeout: (Duration::from_secs(3), Duration::from_secs(6)),
        runtime_threads: args.runtime_threads.unwrap_or(Settings::default().runtime_threads),
        ..Settings::default()
    };
    let group = LocalGroup::start(dir.path(), 3, options, settings)?;
    let l = group.leader(Duration::from_secs(30)).ok_or("no leader elected")?;
    let f = (l + 1) % 3;
    let (table, _) = up(&group, l)?.as_ref().expect("up").transact(Commit::Sync, |tx| {
        let table = tx.alloc(8 * (blocks + 64 * args.rounds as u64))?;
        tx.set_root("blocks", table)?;
        Ok(table)
    })?;
    let mut rounds = Vec::new();
    let mut count = 0;
    for round in 0..args.rounds {
        group.kill(f);
        let more = if round == 0 { blocks } else { 4 };
        let last = {
            let leader = up(&group, l)?;
            let leader = leader.as_ref().expect("up");
            let last = load(leader, table, count, count + more)?;
            count += more;
            last
        };
        // Every member up purges its log: whichever leads when the follower returns (a
        // restarted node's election can move the lead), it can only send a snapshot.
        for i in (0..3).filter(|&i| i != f) {
            let node = up(&group, i)?;
            let node = node.as_ref().expect("up");
            if !node.wait_applied(tusk_replica::Position { index: last }, PATIENCE) {
                return Err(format!("node {} did not apply entry {last} within {PATIENCE:?}", i + 1).into());
            }
            node.trigger_snapshot()?;
            let deadline = Instant::now() + PATIENCE;
            while node.snapshot_and_purged().1.is_none_or(|p| p < last) {
                if Instant::now() > deadline {
                    return Err(format!("node {} made no snapshot through entry {last}", i + 1).into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let snapshot_bytes = snapshot_bytes(&dir.path().join(format!("n{}", l + 1)))?;
        let node_dir = dir.path().join(format!("n{}", f + 1));
        // The disk's rate before and after the catch-up, their mean.
        let before = disk_rate(&node_dir, snapshot_bytes)?;
        nix::unistd::sync();
        let started = Instant::now();
        group.restart(f)?;
        let (catchup, loaded, installed) = {
            let node = up(&group, f)?;
            let node = node.as_ref().expect("up");
            if !node.wait_applied(tusk_replica::Position { index: last }, PATIENCE) {
                return Err(format!("the follower did not catch up within {PATIENCE:?}").into());
            }
            let catchup = started.elapsed();
            let store = node.store()?;
            while store.chunks_absent() > 0 && started.elapsed() < PATIENCE {
                std::thread::sleep(Duration::from_millis(5));
            }
            (catchup, started.elapsed(), node.snapshots_installed())
        };
        if installed == 0 {
            let now = group.leader(Duration::ZERO).map_or("none".to_string(), |i| format!("node {}", i + 1));
            return Err(format!("the follower caught up from the log, not by a snapshot: the bench measured nothing (leader at the load: node {}, now: {now})", l + 1).into());
        }
        let disk = (before + disk_rate(&node_dir, snapshot_bytes)?) / 2.0;
        let (mine, theirs) = {
            let step = (count / 64).max(1);
            (blocks_crc(up(&group, f)?.as_ref().expect("up"), table, count, step)?, blocks_crc(up(&group, l)?.as_ref().expect("up"), table, count, step)?)
        };
        if mine != theirs {
            return Err("the follower's blocks differ from the leader's after the catch-up".into());
        }
        rounds.push(Round { snapshot_bytes, catchup, loaded, disk_bytes_per_s: disk });
    }
    group.close()?;
    let m = |v: &dyn Fn(&Round) -> f64| median(&rounds.iter().map(v).collect::<Vec<_>>());
    let (bytes, catchup_s, loaded_s) = (m(&|r| r.snapshot_bytes as f64), m(&|r| r.catchup.as_secs_f64()), m(&|r| r.loaded.as_secs_f64()));
    let (rate, disk) = (m(&|r| r.rate()), m(&|r| r.disk_bytes_per_s));
    let ratio = m(&|r| r.rate() / r.disk_bytes_per_s);
    if args.out.json {
        outln!(
            "{}",
            serde_json::json!({
                "bench": "catchup", "mib": args.mib, "rounds": args.rounds, "snapshot_bytes": bytes,
                "catchup_s": catchup_s, "loaded_s": loaded_s, "catchup_bytes_per_s": rate, "disk_bytes_per_s": disk,
                "catchup_vs_disk": ratio,
            })
        );
    } else {
        outln!("tusk bench catchup: a follower {} MiB behind, 3 nodes on loopback, medians of {} round(s)", args.mib, args.rounds);
        outln!("{:>14} {:>12} {:>12} {:>14} {:>14} {:>14}", "snapshot MiB", "catch-up s", "loaded s", "catch-up MB/s", "disk MB/s", "catch-up/disk");
        outln!("{:>14.0} {catchup_s:>12.2} {loaded_s:>12.2} {:>14.0} {:>14.0} {ratio:>14.2}", bytes / (1 << 20) as f64, rate / 1e6, disk / 1e6);
    }
    Ok(())
}
