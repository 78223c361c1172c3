//! Scratch file systems for crash runs on ext4, XFS and btrfs: a sparse file-backed image,
//! formatted by the file system's own `mkfs` and mounted through a loop device
//! (`mount -o loop`) for one run, then unmounted and removed, also when the run fails.
//!
//! Users put stores on all three, and their `fsync`, `rename` and directory semantics differ
//! (btrfs is copy-on-write and logs fsyncs in a tree of its own; XFS allocates late and
//! journals no data). A run on each proves, for that file system (README, Guarantees):
//! - kill faults: the file system's own behaviour under process death (what reached its page
//!   cache survives the process);
//! - power, torn and bitflip faults: tusk's protocol under lost unsynced writes, torn tails and
//!   damaged sectors, replayed as files on that file system;
//! - not a block-level power cut of the file system itself (that needs `dm-log-writes` or
//!   similar, which this harness does not use).
//!
//! Where a machine lacks what a file system needs (root, loop devices, the kernel's support,
//! its `mkfs`), [`prepare`] says why in one line, and a run over several file systems skips
//! that one. [`PROGRAM_PATH_VAR`] narrows where the programs are looked for, so CI can show a
//! fresh machine's case (only e2fsprogs and mount) on a machine that has them all.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A file system a crash run can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileSystem {
    /// ext4 (`mkfs.ext4`, Debian's e2fsprogs).
    Ext4,
    /// XFS (`mkfs.xfs`, Debian's xfsprogs).
    Xfs,
    /// btrfs (`mkfs.btrfs`, Debian's btrfs-progs).
    Btrfs,
}

/// The smallest image `tusk crashtest --fs` makes: mkfs.xfs refuses file systems under
/// 300 MiB, and a crash run's store needs room for its heap's checkpoint segments and logs.
pub const MIN_IMAGE_MIB: u64 = 512;

/// The environment variable that, when set, is the only search path (folders separated by
/// `:`, as in `PATH`) for the programs a scratch file system needs (`mkfs.*`, `mount`,
/// `umount`). Unset: `PATH`, then the sbin folders.
pub const PROGRAM_PATH_VAR: &str = "TUSK_FS_PROGRAM_PATH";

/// How often, and how long apart, an unmount that finds the file system busy is retried (a
/// crashed child's descriptors close as the kernel reaps it) before a lazy unmount.
const UMOUNT_TRIES: u32 = 20;
const UMOUNT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

impl FileSystem {
    /// Every file system, in the order `--fs all` runs them.
    pub const ALL: [FileSystem; 3] = [FileSystem::Ext4, FileSystem::Xfs, FileSystem::Btrfs];

    /// The name the kernel (and `--fs`) uses.
    pub fn name(self) -> &'static str {
        match self {
            FileSystem::Ext4 => "ext4",
            FileSystem::Xfs => "xfs",
            FileSystem::Btrfs => "btrfs",
        }
    }

    /// The formatting program and its arguments before the image path (quiet, and forced:
    /// the image is a fresh file, not a device that might hold data).
    fn mkfs(self) -> (&'static str, &'static [&'static str]) {
        match self {
            FileSystem::Ext4 => ("mkfs.ext4", &["-F", "-q"]),
            FileSystem::Xfs => ("mkfs.xfs", &["-f", "-q"]),
            FileSystem::Btrfs => ("mkfs.btrfs", &["-f", "-q"]),
        }
    }

    /// The Debian package that installs the formatting program.
    pub fn package(self) -> &'static str {
        match self {
            FileSystem::Ext4 => "e2fsprogs",
            FileSystem::Xfs => "xfsprogs",
            FileSystem::Btrfs => "btrfs-progs",
        }
    }
}

impl std::fmt::Display for FileSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why this machine cannot mount a scratch `fs`, or `None` when it can (root, loop devices,
/// the kernel's support and the formatting program are all there).
pub fn unavailable(fs: FileSystem) -> Option<String> {
    match effective_uid() {
        Some(0) => {}
        Some(uid) => return Some(format!("mounting a loop image needs root; this process runs as uid {uid}")),
        None => return Some("cannot tell this process's user (/proc/self/status unreadable); mounting needs root".into()),
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("this machine has no loop devices (/dev/loop-control is missing)".into());
    }
    let kernel = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !kernel.lines().any(|l| l.split_whitespace().last() == Some(fs.name())) {
        return Some(format!("the kernel does not support {fs} (/proc/filesystems does not list it)"));
    }
    let (mkfs, _) = fs.mkfs();
    if find_program(mkfs).is_none() {
        return Some(format!("{mkfs} is not installed (Debian package {})", fs.package()));
    }
    ["mount", "umount"].into_iter().find_map(|program| mount_program(program).err())
}

/// What [`prepare`] found: a mounted scratch file system, or why this machine cannot make one.
#[derive(Debug)]
pub enum Prepared {
    /// Mounted and empty.
    Mounted(ScratchFs),
    /// The one-line reason this machine cannot make or mount it: [`unavailable`]'s, or the
    /// refusal of `mkfs` or `mount` (a container without the right to mount, say).
    Unavailable(String),
}

/// Makes and mounts a scratch `fs` in `parent` ([`ScratchFs::mount`]), or says why this
/// machine cannot. An error is left only for what a run must report: the image or mount
/// point could not be made (a leftover of an interrupted run, a full or read-only disk).
pub fn prepare(fs: FileSystem, parent: &Path, mib: u64) -> Result<Prepared, MountError> {
    if let Some(why) = unavailable(fs) {
        return Ok(Prepared::Unavailable(why));
    }
    match ScratchFs::mount(fs, parent, mib) {
        Ok(scratch) => Ok(Prepared::Mounted(scratch)),
        Err(MountError::Refused(why)) => Ok(Prepared::Unavailable(format!("cannot mount an image here: {why}"))),
        Err(e @ MountError::Files(_)) => Err(e),
    }
}

/// The effective user id, from `/proc/self/status` (its `Uid:` line: real, effective, ...).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `program`'s path: in the folders of [`PROGRAM_PATH_VAR`] where it is set, else on `PATH`
/// or in the sbin folders (which a non-login root shell may lack on its `PATH`).
fn find_program(program: &str) -> Option<PathBuf> {
    let folders: Vec<PathBuf> = match std::env::var_os(PROGRAM_PATH_VAR) {
        Some(only) => std::env::split_paths(&only).collect(),
        None => {
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::split_paths(&path).chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from)).collect()
        }
    };
    folders.into_iter().map(|d| d.join(program)).find(|p| p.is_file())
}

/// [`find_program`], or the reason it is missing (for the package `mount`'s programs).
fn mount_program(program: &str) -> Result<PathBuf, String> {
    find_program(program).ok_or_else(|| format!("{program} is not installed (Debian package mount)"))
}

/// Runs `command`; its stderr is the error when it fails.
fn run(mut command: Command) -> Result<(), String> {
    let shown = format!("{command:?}").replace('"', "");
    let out = command.output().map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    // One line, whatever the program printed.
    let stderr = String::from_utf8_lossy(&out.stderr).split_whitespace().collect::<Vec<_>>().join(" ");
    Err(format!("{shown} failed ({}): {stderr}", out.status))
}

/// Why [`ScratchFs::mount`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The machine would not format or mount the image (a container without the right to
    /// mount, say): a reason to skip this file system, like [`unavailable`]'s.
    #[error("{0}")]
    Refused(String),
    /// The image or mount point could not be made (a leftover of an interrupted run, a full
    /// or read-only disk): an error to report.
    #[error("{0}")]
    Files(String),
}

/// A mounted scratch file system: `DIR/<fs>.img` mounted on `DIR/<fs>.mnt`. Dropping it
/// unmounts it and removes both, as [`ScratchFs::remove`] does (reporting nothing).
#[derive(Debug)]
pub struct ScratchFs {
    fs: FileSystem,
    image: PathBuf,
    mount_point: PathBuf,
    /// The `umount` found when it was mounted (the same search as `mount`'s).
    umount: PathBuf,
    mounted: bool,
    image_exists: bool,
    mount_point_exists: bool,
}

impl ScratchFs {
    /// Creates a sparse image of `mib` MiB (at least [`MIN_IMAGE_MIB`]) in `parent`, formats
    /// it as `fs` and mounts it. Call [`unavailable`] first for a reason to skip.
    pub fn mount(fs: FileSystem, parent: &Path, mib: u64) -> Result<ScratchFs, MountError> {
        let image = parent.join(format!("{fs}.img"));
        let mount_point = parent.join(format!("{fs}.mnt"));
        let mut scratch = ScratchFs {
            fs,
            image: image.clone(),
            mount_point: mount_point.clone(),
            umount: PathBuf::from("umount"),
            mounted: false,
            image_exists: false,
            mount_point_exists: false,
        };
        let files = |path: &Path, e: std::io::Error| MountError::Files(format!("{}: {e}", path.display()));
        std::fs::create_dir_all(parent).map_err(|e| files(parent, e))?;
        let file = match OpenOptions::new().write(true).create_new(true).open(&image) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(MountError::Files(format!(
                    "{} exists: an earlier run was interrupted? `umount {}` if it is mounted, then remove both",
                    image.display(),
                    mount_point.display()
                )))
            }
            Err(e) => return Err(files(&image, e)),
        };
        scratch.image_exists = true;
        file.set_len(mib.max(MIN_IMAGE_MIB) << 20).map_err(|e| files(&image, e))?;
        drop(file);
        std::fs::create_dir(&mount_point).map_err(|e| files(&mount_point, e))?;
        scratch.mount_point_exists = true;
        let (mkfs, args) = fs.mkfs();
        let program = find_program(mkfs).ok_or_else(|| MountError::Refused(format!("{mkfs} is not installed (Debian package {})", fs.package())))?;
        let mut format = Command::new(program);
        format.args(args).arg(&image);
        run(format).map_err(MountError::Refused)?;
        let mount = mount_program("mount").map_err(MountError::Refused)?;
        scratch.umount = mount_program("umount").map_err(MountError::Refused)?;
        let mut mount = Command::new(mount);
        mount.args(["-t", fs.name(), "-o", "loop"]).arg(&image).arg(&mount_point);
        run(mount).map_err(MountError::Refused)?;
        scratch.mounted = true;
        Ok(scratch)
    }

    /// The file system.
    pub fn file_system(&self) -> FileSystem {
        self.fs
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// Unmounts it and removes the image and the mount point.
    pub fn remove(mut self) -> Result<(), String> {
        self.clean_up()
    }

    fn clean_up(&mut self) -> Result<(), String> {
        if self.mounted {
            let mut last = Ok(());
            for _ in 0..UMOUNT_TRIES {
                let mut umount = Command::new(&self.umount);
                umount.arg(&self.mount_point);
                last = run(umount);
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(UMOUNT_RETRY);
            }
            if let Err(why) = last {
                // Detach it now, so the image can go; the kernel finishes once it is idle.
                let mut lazy = Command::new(&self.umount);
                lazy.arg("-l").arg(&self.mount_point);
                run(lazy).map_err(|lazy_why| format!("{why}; then {lazy_why}"))?;
            }
            self.mounted = false;
        }
        if self.mount_point_exists {
            std::fs::remove_dir(&self.mount_point).map_err(|e| format!("{}: {e}", self.mount_point.display()))?;
            self.mount_point_exists = false;
        }
        if self.image_exists {
            std::fs::remove_file(&self.image).map_err(|e| format!("{}: {e}", self.image.display()))?;
            self.image_exists = false;
        }
        Ok(())
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        let _ = self.clean_up();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image left by an interrupted run is an error that says what to do, and is kept.
    #[test]
    fn a_leftover_image_is_reported_not_overwritten() {
        let parent = tempfile::tempdir().unwrap();
        let leftover = parent.path().join("ext4.img");
        std::fs::write(&leftover, b"an earlier run's image").unwrap();
        match ScratchFs::mount(FileSystem::Ext4, parent.path(), MIN_IMAGE_MIB) {
            Err(MountError::Files(why)) => assert!(why.contains("ext4.img exists") && why.contains("umount"), "{why}"),
            other => panic!("expected an error about the leftover image: {other:?}"),
        }
        assert_eq!(std::fs::read(&leftover).unwrap(), b"an earlier run's image");
    }

    #[test]
    fn the_effective_uid_is_read() {
        // Whatever user runs the tests, the status file has one.
        assert!(effective_uid().is_some());
    }

    /// Mounts each file system this machine can, writes and syncs a file on it, and checks
    /// that removing it leaves nothing behind; where it cannot, the reason is one line.
    #[test]
    fn scratch_file_systems_mount_and_clean_up_or_say_why_not() {
        let parent = tempfile::tempdir().unwrap();
        for fs in FileSystem::ALL {
            if let Some(why) = unavailable(fs) {
                assert!(!why.is_empty() && !why.contains('\n'), "{fs}: {why:?}");
                eprintln!("{fs}: skipped: {why}");
                continue;
            }
            let scratch = match ScratchFs::mount(fs, parent.path(), MIN_IMAGE_MIB) {
                Ok(scratch) => scratch,
                // Root in a container without the right to mount: the CLI skips with this.
                Err(MountError::Refused(why)) => {
                    assert!(!why.contains('\n'), "{fs}: one line: {why:?}");
                    assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0, "{fs}: a failed mount leaves nothing behind");
                    eprintln!("{fs}: cannot mount: {why}");
                    continue;
                }
                Err(e @ MountError::Files(_)) => panic!("{fs}: {e}"),
            };
            let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
            let point = scratch.path().canonicalize().unwrap();
            assert!(
                mounts.lines().any(|l| l.split_whitespace().nth(1) == point.to_str() && l.split_whitespace().nth(2) == Some(fs.name())),
                "{fs} not mounted on {}",
                point.display()
            );
            let file = scratch.path().join("probe");
            std::fs::write(&file, b"tusk").unwrap();
            std::fs::File::open(&file).unwrap().sync_all().unwrap();
            scratch.remove().unwrap_or_else(|e| panic!("{fs}: {e}"));
            assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0, "{fs}: image or mount point left behind");
        }
    }
}
