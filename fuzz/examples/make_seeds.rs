//! Writes seed corpora for the fuzz targets from real stores: `make_seeds OUT` creates
//! `OUT/<target>/<name>` files. Seeds start the fuzzers from valid images, so that mutation
//! explores damage near what tusk really writes.

use std::path::Path;

use tusk::{Commit, Store};
use tusk_fuzz::{encode_image, read_store_dir, store_options, FileKind};

/// A store after some commits on both partitions, optionally a checkpoint and more commits,
/// closed cleanly or crashed (unflushed buffers lost).
fn make_store(dir: &Path, checkpoint: bool, crash: bool) -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open(dir, store_options())?;
    let (p, _) = store.transact(Commit::Sync, |tx| {
        let p = tx.alloc(256)?;
        tx.set_root("seed", p)?;
        Ok(p)
    })?;
    let writer = |rounds: u64, mode: Commit| -> Result<(), tusk::Error> {
        for i in 0..rounds {
            store.transact(mode, |tx| {
                tx.write_u64_at(p, (i % 32) * 8, i)?;
                tx.write_at(p, 3, &[i as u8; 5])
            })?;
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| writer(5, Commit::Partition));
        writer(5, Commit::Sync)?;
        other.join().unwrap()
    })?;
    if checkpoint {
        store.checkpoint()?;
        writer(4, Commit::Async)?;
        writer(1, Commit::Sync)?;
    }
    if crash {
        writer(3, Commit::Async)?;
        store.crash();
    } else {
        store.close()?;
    }
    Ok(())
}

fn put(out: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = out.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os().nth(1).ok_or("usage: make_seeds OUT")?;
    let out = Path::new(&out);
    for (name, checkpoint, crash) in [("plain", false, false), ("checkpoint", true, false), ("crash", true, true)] {
        let dir = tempfile::tempdir()?;
        make_store(dir.path(), checkpoint, crash)?;
        let files = read_store_dir(dir.path())?;
        put(out, "recover_dir", name, &encode_image(false, &files))?;
        put(out, "recover_dir", &format!("{name}-repair"), &encode_image(true, &files))?;
        for (kind, bytes) in &files {
            let with = |flags: u8| [&[flags][..], bytes].concat();
            match kind {
                FileKind::Segment { partition, seq } => {
                    put(out, "log_records", &format!("{name}-p{partition}-{seq}"), &with(0))?;
                    put(out, "log_records", &format!("{name}-p{partition}-{seq}-repair"), &with(1))?;
                }
                FileKind::Manifest { epoch } => put(out, "checkpoint_images", &format!("{name}-manifest-{epoch}"), &with(1))?,
                FileKind::Images { epoch } => put(out, "checkpoint_images", &format!("{name}-images-{epoch}"), &with(6))?,
            }
        }
    }
    Ok(())
}
