//! Stores on the file systems users pick (ext4, XFS, btrfs), each a fresh loop-mounted image
//! (`tusk::crashtest::scratch_fs`; skipped, saying why, where this machine cannot mount).

use std::process::Command;

use tusk::crashtest::scratch_fs::{unavailable, FileSystem, MountError, ScratchFs, MIN_IMAGE_MIB};
use tusk::{Commit, Options, Store};

/// Mounts `fs` in a fresh folder, or says why it cannot.
fn scratch(fs: FileSystem, parent: &std::path::Path) -> Option<ScratchFs> {
    if let Some(why) = unavailable(fs) {
        eprintln!("{fs}: skipped: {why}");
        return None;
    }
    match ScratchFs::mount(fs, parent, MIN_IMAGE_MIB) {
        Ok(scratch) => Some(scratch),
        Err(MountError::Refused(why)) => {
            eprintln!("{fs}: skipped: {why}");
            None
        }
        Err(e) => panic!("{fs}: {e}"),
    }
}

/// Whether `lsattr -d` shows the no-copy-on-write attribute (`C`) on `path`.
fn is_nocow(path: &std::path::Path) -> bool {
    let out = Command::new("lsattr").arg("-d").arg(path).output().expect("lsattr (e2fsprogs) runs");
    assert!(out.status.success(), "lsattr {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().is_some_and(|flags| flags.contains('C'))
}

/// On btrfs the log is written in place: its folder, partitions and segments carry the
/// no-copy-on-write attribute (a Sync commit's fdatasync then allocates no new extent; found
/// by `tusk crashtest --fs all`, where btrfs acknowledged a sixth of XFS's commits). Every
/// file system recovers what was committed.
#[test]
fn logs_are_written_in_place_on_btrfs_and_every_file_system_recovers() {
    let parent = tempfile::tempdir().unwrap();
    for fs in FileSystem::ALL {
        let Some(scratch) = scratch(fs, parent.path()) else { continue };
        let dir = scratch.path().join("store");
        let options = Options { heap_capacity: 16 << 20, ..Options::default() };
        let store = Store::open(&dir, options.clone()).unwrap();
        let (p, _) = store
            .transact(Commit::Sync, |tx| {
                let p = tx.alloc(8 * 100)?;
                tx.set_root("words", p)?;
                Ok(p)
            })
            .unwrap();
        for i in 0..100u64 {
            store.transact(Commit::Sync, |tx| tx.write_u64_at(p, i * 8, i * 3)).unwrap();
        }
        store.close().unwrap();
        let log = dir.join("log");
        let segment = std::fs::read_dir(log.join("p0000")).ok().and_then(|mut d| d.next()).map(|e| e.unwrap().path());
        let in_place = is_nocow(&log) && segment.as_deref().is_none_or(is_nocow);
        assert_eq!(in_place, fs == FileSystem::Btrfs, "{fs}: log folder and segments no-copy-on-write only on btrfs");
        let store = Store::open(&dir, options).unwrap();
        let (words, _) = store.transact(Commit::Async, |tx| (0..100u64).map(|i| tx.read_u64_at(p, i * 8)).collect::<Result<Vec<_>, _>>()).unwrap();
        assert_eq!(words, (0..100u64).map(|i| i * 3).collect::<Vec<_>>(), "{fs}");
        store.close().unwrap();
        scratch.remove().unwrap();
    }
}
