//! Which of a node's store directories is its store: `DIR/STORE` names it (`store` when
//! absent). An installed snapshot or a rebuild makes a new store in a directory of its own
//! (`store.N`) while the old one may still be open, then switches `STORE` to it atomically
//! (temp file, fsync, rename, fsync of `DIR`): after a crash the node opens one or the
//! other, never a mix, and the directories no longer named are deleted when it opens.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use tusk::Store;

const POINTER: &str = "STORE";
const FIRST: &str = "store";

/// The store in use, swapped whole when a snapshot is installed: callers clone the `Arc`.
pub type StoreSlot = RwLock<Arc<Store>>;

/// The directory named as the node's store.
pub fn current(node_dir: &Path) -> std::io::Result<PathBuf> {
    match std::fs::read_to_string(node_dir.join(POINTER)) {
        Ok(name) => Ok(node_dir.join(name.trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(node_dir.join(FIRST)),
        Err(e) => Err(e),
    }
}

/// A directory for a new store, after every one there is (not created).
pub fn next(node_dir: &Path) -> std::io::Result<PathBuf> {
    let mut highest = 0u64;
    for entry in std::fs::read_dir(node_dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(n) = generation(&name) {
            highest = highest.max(n);
        }
    }
    Ok(node_dir.join(format!("{FIRST}.{}", highest + 1)))
}

/// `store` is generation 0, `store.N` (or `store.N.installing`) N.
fn generation(name: &str) -> Option<u64> {
    if name == FIRST {
        return Some(0);
    }
    let rest = name.strip_prefix("store.")?;
    rest.strip_suffix(".installing").unwrap_or(rest).parse().ok()
}

/// Names `store_dir` (in `node_dir`) the node's store, durably.
pub fn switch(node_dir: &Path, store_dir: &Path) -> std::io::Result<()> {
    let name = store_dir.file_name().and_then(|n| n.to_str()).ok_or_else(|| std::io::Error::other("a store directory's name"))?;
    let tmp = node_dir.join(format!("{POINTER}.part"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(name.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, node_dir.join(POINTER))?;
    std::fs::File::open(node_dir)?.sync_all()
}

/// Deletes the store directories of `node_dir` other than the current one (call while none
/// of them is open).
pub fn remove_others(node_dir: &Path) -> std::io::Result<()> {
    let keep = current(node_dir)?;
    for entry in std::fs::read_dir(node_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if generation(&name).is_some() && entry.path() != keep {
            match std::fs::remove_dir_all(entry.path()) {
                // A store retired by the node's last run may still be going (its thread
                // deletes it once let go of): gone meanwhile, or still writing files into
                // it (a group crash run's reopen met a checkpoint's file made after the
                // listing). What is left, the next open removes.
                Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty) => {}
                other => other?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_names_one_store_and_the_others_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path();
        assert_eq!(current(node).unwrap(), node.join("store"), "a node without the pointer uses `store`");
        std::fs::create_dir(node.join("store")).unwrap();
        let first = next(node).unwrap();
        assert_eq!(first, node.join("store.1"));
        std::fs::create_dir(&first).unwrap();
        switch(node, &first).unwrap();
        assert_eq!(current(node).unwrap(), first);
        // What a crash mid-install leaves: a half-made directory past the current one.
        std::fs::create_dir(tusk::installing_dir(&node.join("store.2"))).unwrap();
        assert_eq!(next(node).unwrap(), node.join("store.3"), "past every generation there is, half-made ones too");
        std::fs::write(node.join("raft.redb"), b"not a store").unwrap();
        remove_others(node).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(node).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, vec!["STORE", "raft.redb", "store.1"]);
    }
}
