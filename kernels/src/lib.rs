//! tusk-kernels: the CUDA C sources of the GPU mirror's kernels (`kernels/*.cu`) and their
//! compilation by NVRTC at run time, for the architecture of the device at hand.
//!
//! - [`source`]: the one translation unit NVRTC compiles (common definitions, the sync
//!   scatter, the B-link and ART kernels, the answers' bit packing, concatenated in that
//!   order: no `#include`s, so NVRTC needs no header search path).
//! - [`compile`]: PTX for a compute capability, cached per process (a map keyed by
//!   architecture and driver version) and on disk (`$XDG_CACHE_HOME/tusk` or `~/.cache/tusk`,
//!   one file per hash of source, options and driver version, written atomically and checked
//!   by length and checksum when read: a damaged or unreadable file means compiling again,
//!   never an error).
//!
//! NVRTC (libnvrtc) is loaded at run time through cudarc; its absence is an error value, not a
//! panic. No CUDA toolkit is needed to build this crate.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

/// Common definitions (types, bounds checks, error slot, tiles, 128-bit sums).
pub const COMMON: &str = include_str!("../common.cuh");
/// The mirror sync's scatter kernel.
pub const UPLOAD: &str = include_str!("../upload.cu");
/// B-link tree lookups and range count/sum.
pub const BTREE: &str = include_str!("../btree.cu");
/// ART lookups and prefix count/sum.
pub const ART: &str = include_str!("../art.cu");
/// Answers into a caller's buffers (found bytes to a bitmap).
pub const ANSWERS: &str = include_str!("../answers.cu");

/// Options besides the architecture. NVRTC optimizes device code fully by default (there is no
/// `-O` flag to raise); `--use_fast_math` is left out: the kernels do integer work only.
pub const OPTIONS: &[&str] = &["--std=c++17"];

/// The kernels' names, as the module exports them (`extern "C"`).
pub mod names {
    pub const SCATTER: &str = "tusk_scatter";
    pub const BTREE_COUNT_SUM: &str = "tusk_btree_count_sum";
    pub const ART_GET: &str = "tusk_art_get";
    pub const ART_GET_NOSPEC: &str = "tusk_art_get_nospec";
    pub const ART_COUNT_SUM_PREFIX: &str = "tusk_art_count_sum_prefix";
    pub const FOUND_BITS: &str = "tusk_found_bits";
    /// A device fault, for tests of a GPU that fails between calls.
    pub const FAULT: &str = "tusk_fault";

    /// How a B-link lookup kernel searches a node's keys.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum NodeSearch {
        /// The tile's lanes load all 28 keys at once and count those below the query.
        Scan,
        /// One thread per query: a binary search over the node's 32-byte sectors of four keys.
        Sectors,
        /// [`NodeSearch::Sectors`] starting at the sector the key's place between its parent's
        /// separators predicts.
        Guessed,
    }

    /// A B-link lookup kernel: tile width, internal nodes' children loaded with their keys
    /// (`preload`), registers capped for more queries in flight (`capped`), node search.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct BTreeGet {
        pub width: u32,
        pub preload: bool,
        pub capped: bool,
        pub search: NodeSearch,
    }

    impl BTreeGet {
        /// A scanning kernel.
        pub const fn scan(width: u32, preload: bool, capped: bool) -> BTreeGet {
            BTreeGet { width, preload, capped, search: NodeSearch::Scan }
        }

        /// A one-thread sector-searching kernel.
        pub const fn sectors(search: NodeSearch, capped: bool) -> BTreeGet {
            BTreeGet { width: 1, preload: false, capped, search }
        }
    }

    impl std::fmt::Display for BTreeGet {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.search {
                NodeSearch::Scan => write!(f, "tile {}", self.width)?,
                NodeSearch::Sectors => write!(f, "sectors")?,
                NodeSearch::Guessed => write!(f, "sectors, guessed")?,
            }
            if self.preload {
                write!(f, "+preload")?;
            }
            if self.capped {
                write!(f, "+capped")?;
            }
            Ok(())
        }
    }

    /// The B-link lookup kernel variants.
    pub const BTREE_GET_VARIANTS: [BTreeGet; 15] = [
        BTreeGet::scan(1, false, false),
        BTreeGet::scan(1, false, true),
        BTreeGet::scan(2, false, false),
        BTreeGet::scan(2, false, true),
        BTreeGet::scan(4, false, false),
        BTreeGet::scan(8, false, false),
        BTreeGet::scan(16, false, false),
        BTreeGet::scan(32, false, false),
        BTreeGet::scan(4, true, false),
        BTreeGet::scan(8, true, false),
        BTreeGet::scan(16, true, false),
        BTreeGet::scan(32, true, false),
        BTreeGet::sectors(NodeSearch::Sectors, false),
        BTreeGet::sectors(NodeSearch::Guessed, false),
        BTreeGet::sectors(NodeSearch::Guessed, true),
    ];

    /// The kernel of a variant: scanning tiles of `width` lanes (1, 2, 4, 8, 16, 32), with
    /// internal nodes' children loaded together with their keys (`preload`; widths ≥ 4), or
    /// with registers capped for more queries in flight (`capped`; widths 1 and 2); sector
    /// searches with one thread per query (capped: guessed only).
    pub fn btree_get_variant(k: BTreeGet) -> Option<&'static str> {
        match (k.search, k.width, k.preload, k.capped) {
            (NodeSearch::Scan, 1, false, true) => Some("tusk_btree_get_t1_o3"),
            (NodeSearch::Scan, 2, false, true) => Some("tusk_btree_get_t2_o4"),
            (NodeSearch::Scan, _, _, true) => None,
            (NodeSearch::Scan, w, p, false) => btree_get(w, p),
            (NodeSearch::Sectors, 1, false, false) => Some("tusk_btree_get_s1"),
            (NodeSearch::Guessed, 1, false, false) => Some("tusk_btree_get_g1"),
            (NodeSearch::Guessed, 1, false, true) => Some("tusk_btree_get_g1_o4"),
            _ => None,
        }
    }

    /// The B-link lookup kernel for a tile of `width` lanes (1, 2, 4, 8, 16, 32), with
    /// internal nodes' children loaded together with their keys (`preload`; widths ≥ 4).
    pub fn btree_get(width: u32, preload: bool) -> Option<&'static str> {
        Some(match (width, preload) {
            (1, false) => "tusk_btree_get_t1",
            (2, false) => "tusk_btree_get_t2",
            (4, false) => "tusk_btree_get_t4",
            (8, false) => "tusk_btree_get_t8",
            (16, false) => "tusk_btree_get_t16",
            (32, false) => "tusk_btree_get_t32",
            (4, true) => "tusk_btree_get_t4v",
            (8, true) => "tusk_btree_get_t8v",
            (16, true) => "tusk_btree_get_t16v",
            (32, true) => "tusk_btree_get_t32v",
            _ => return None,
        })
    }
}

/// Threads per block every kernel is written for (`__launch_bounds__(256)`; the ART prefix
/// kernel sizes its per-warp stacks for it).
pub const BLOCK_THREADS: u32 = 256;
/// Bytes per scatter piece (upload.cu's TUSK_PIECE).
pub const SCATTER_PIECE: usize = 4096;
/// Longest ART key (and prefix) the kernels take (art.cu's TUSK_ART_MAX_KEY).
pub const ART_MAX_KEY: usize = 32;

/// Error codes of a kernel's error slot (common.cuh).
pub mod err {
    pub const BAD_OFFSET: u64 = 1;
    pub const LOOP: u64 = 2;
    pub const BAD_LINK: u64 = 3;
    pub const TOO_DEEP: u64 = 4;
    pub const BAD_TERMINAL: u64 = 5;
}

/// The whole translation unit.
pub fn source() -> String {
    let mut s = String::with_capacity(COMMON.len() + UPLOAD.len() + BTREE.len() + ART.len() + ANSWERS.len() + 256);
    for (name, text) in [("common.cuh", COMMON), ("upload.cu", UPLOAD), ("btree.cu", BTREE), ("art.cu", ART), ("answers.cu", ANSWERS)] {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// Why no module could be had.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// libnvrtc is not on this machine.
    #[error("NVRTC library (libnvrtc) not found")]
    NoNvrtc,
    /// NVRTC refused the source; the log says why.
    #[error("NVRTC compilation for {arch} failed: {log}")]
    Compile { arch: String, log: String },
    /// Any other NVRTC failure (including a panic of the dynamic loader).
    #[error("NVRTC: {0}")]
    Nvrtc(String),
}

/// A compiled module: PTX text with its terminating NUL, ready for `cuModuleLoadData`.
#[derive(Debug)]
pub struct Compiled {
    pub ptx: Vec<u8>,
    /// The `--gpu-architecture` it was compiled for (`compute_XY`).
    pub arch: String,
    /// Whether it came from the disk cache.
    pub from_disk: bool,
}

type ProcessCache = Mutex<HashMap<(u32, u32, i32), Arc<Compiled>>>;

fn process_cache() -> &'static ProcessCache {
    static CACHE: OnceLock<ProcessCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// PTX for a device of compute capability `major.minor` under a driver of version
/// `driver_version` (part of the cache key only: a newer driver may want fresh PTX). Cached
/// per process and on disk.
pub fn compile(major: u32, minor: u32, driver_version: i32) -> Result<Arc<Compiled>, KernelError> {
    let key = (major, minor, driver_version);
    let mut cache = process_cache().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = cache.get(&key) {
        return Ok(c.clone());
    }
    let compiled = Arc::new(compile_in(cache_dir().as_deref(), major, minor, driver_version)?);
    cache.insert(key, compiled.clone());
    Ok(compiled)
}

/// [`compile`] without the process cache, with the disk cache in `dir` (None: none).
pub fn compile_in(dir: Option<&Path>, major: u32, minor: u32, driver_version: i32) -> Result<Compiled, KernelError> {
    let src = source();
    let wanted = major * 10 + minor;
    let disk_key = |arch: &str| cache_key(&src, arch, driver_version);
    // First the device's own architecture from the disk cache: no NVRTC needed at all.
    let own = format!("compute_{wanted}");
    if let Some(ptx) = dir.and_then(|d| read_cache(&d.join(cache_file(disk_key(&own))))) {
        return Ok(Compiled { ptx, arch: own, from_disk: true });
    }
    // SAFETY: probing for the library only opens (and closes) it with dlopen.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(KernelError::NoNvrtc);
    }
    let arch = guarded(|| best_arch(wanted))?.map_or(own, |a| format!("compute_{a}"));
    let path = dir.map(|d| d.join(cache_file(disk_key(&arch))));
    if let Some(ptx) = path.as_deref().and_then(read_cache) {
        return Ok(Compiled { ptx, arch, from_disk: true });
    }
    let ptx = guarded(|| nvrtc_compile(&src, &arch))??;
    if let (Some(dir), Some(path)) = (dir, path.as_deref()) {
        // A cache that cannot be written only costs the next process a compilation.
        let _ = write_cache(dir, path, &ptx);
    }
    Ok(Compiled { ptx, arch, from_disk: false })
}

/// Runs `f`, turning a panic of cudarc's dynamic loader (a missing symbol) into an error.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, KernelError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        KernelError::Nvrtc(msg.unwrap_or_else(|| "panic in NVRTC loader".into()))
    })
}

/// The newest architecture NVRTC supports that is not newer than `wanted` (PTX for it runs on
/// the device through the driver's JIT), or None when NVRTC cannot list them.
fn best_arch(wanted: u32) -> Option<u32> {
    let mut n: std::ffi::c_int = 0;
    // SAFETY: n is a valid out-pointer; the library is present (checked by the caller).
    if unsafe { nvrtc_sys::nvrtcGetNumSupportedArchs(&mut n) } != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || n <= 0 {
        return None;
    }
    let mut archs = vec![0 as std::ffi::c_int; n as usize];
    // SAFETY: archs has room for the n entries NVRTC reported.
    if unsafe { nvrtc_sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) } != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    archs.into_iter().filter_map(|a| u32::try_from(a).ok()).filter(|&a| a <= wanted).max()
}

fn nvrtc_compile(src: &str, arch: &str) -> Result<Vec<u8>, KernelError> {
    let csrc = CString::new(src).map_err(|e| KernelError::Nvrtc(e.to_string()))?;
    let name = CString::new("tusk_kernels.cu").expect("no NUL");
    let prog = nvrtc::create_program(&csrc, Some(&name)).map_err(|e| KernelError::Nvrtc(format!("{e:?}")))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: prog was just created and is destroyed exactly once below.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) };
    let result = match compiled {
        Ok(()) => {
            // SAFETY: prog compiled successfully.
            unsafe { nvrtc::get_ptx(prog) }.map_err(|e| KernelError::Nvrtc(format!("{e:?}"))).map(|chars| {
                let mut ptx: Vec<u8> = chars.into_iter().map(|c| c as u8).collect();
                if ptx.last() != Some(&0) {
                    ptx.push(0);
                }
                ptx
            })
        }
        Err(e) => {
            // SAFETY: prog is valid; the log is NUL-terminated by NVRTC.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .ok()
                .map(|chars| {
                    let bytes: Vec<u8> = chars.into_iter().map(|c| c as u8).take_while(|&b| b != 0).collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            Err(KernelError::Compile { arch: arch.to_string(), log: format!("{e:?}: {log}") })
        }
    };
    // SAFETY: prog is valid and not used after this.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

// ---- disk cache ----

const CACHE_MAGIC: &[u8; 8] = b"TUSKPTX1";
const CACHE_HEADER: usize = 24;

/// FNV-1a, 64 bits: stable across Rust versions (unlike `DefaultHasher`).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The disk cache key of a compilation.
pub fn cache_key(src: &str, arch: &str, driver_version: i32) -> u64 {
    let opts = OPTIONS.join(" ");
    fnv1a(&[src.as_bytes(), arch.as_bytes(), opts.as_bytes(), &driver_version.to_le_bytes()])
}

fn cache_file(key: u64) -> String {
    format!("kernels-{key:016x}.ptx")
}

/// `$XDG_CACHE_HOME/tusk`, else `$HOME/.cache/tusk`; None when neither is set.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("tusk"));
    }
    std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache").join("tusk"))
}

/// A cache file's bytes for `ptx`: magic, length, checksum, then the PTX (NUL included).
pub fn encode_cache(ptx: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CACHE_HEADER + ptx.len());
    out.extend_from_slice(CACHE_MAGIC);
    out.extend_from_slice(&(ptx.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a(&[ptx]).to_le_bytes());
    out.extend_from_slice(ptx);
    out
}

/// The PTX in a cache file's bytes, or None when anything about them is off (wrong magic,
/// length or checksum, no terminating NUL, a NUL inside).
pub fn decode_cache(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < CACHE_HEADER || &bytes[..8] != CACHE_MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    let sum = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    let ptx = &bytes[CACHE_HEADER..];
    if ptx.len() as u64 != len || fnv1a(&[ptx]) != sum {
        return None;
    }
    // Exactly one NUL, at the end: what cuModuleLoadData expects of PTX text.
    CStr::from_bytes_with_nul(ptx).ok()?;
    Some(ptx.to_vec())
}

fn read_cache(path: &Path) -> Option<Vec<u8>> {
    decode_cache(&std::fs::read(path).ok()?)
}

fn write_cache(dir: &Path, path: &Path, ptx: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("kernels"), std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&encode_cache(ptx))?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_holds_every_kernel() {
        let src = source();
        for name in [names::SCATTER, names::BTREE_COUNT_SUM, names::ART_GET, names::ART_GET_NOSPEC, names::ART_COUNT_SUM_PREFIX, names::FOUND_BITS, names::FAULT] {
            assert!(src.contains(name), "{name}");
        }
        for w in [1, 2, 4, 8, 16, 32] {
            assert!(src.contains(names::btree_get(w, false).unwrap()));
        }
        for w in [4, 8, 16, 32] {
            assert!(src.contains(names::btree_get(w, true).unwrap()));
        }
        assert!(names::btree_get(3, false).is_none() && names::btree_get(1, true).is_none());
        for k in names::BTREE_GET_VARIANTS {
            assert!(src.contains(names::btree_get_variant(k).unwrap()), "{k}");
        }
        assert!(names::btree_get_variant(names::BTreeGet::sectors(names::NodeSearch::Sectors, true)).is_none());
        assert!(src.contains(&format!("#define TUSK_PIECE {SCATTER_PIECE}ull")));
        assert!(src.contains(&format!("#define TUSK_ART_MAX_KEY {ART_MAX_KEY}u")));
        assert!(!src.contains("#include"), "NVRTC gets no include path");
    }

    #[test]
    fn cache_round_trip_and_damage() {
        let ptx = b"// ptx\n.version 8.0\n\0".to_vec();
        let file = encode_cache(&ptx);
        assert_eq!(decode_cache(&file).as_deref(), Some(&ptx[..]));
        // Truncated, extended, flipped anywhere, wrong magic, empty: all refused.
        assert!(decode_cache(&file[..file.len() - 1]).is_none());
        let mut longer = file.clone();
        longer.push(0);
        assert!(decode_cache(&longer).is_none());
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x20;
            assert!(decode_cache(&bad).is_none(), "flip at {i}");
        }
        assert!(decode_cache(&[]).is_none());
        // No terminating NUL (yet a consistent header) is refused too.
        assert!(decode_cache(&encode_cache(b"abc")).is_none());
    }

    #[test]
    fn unreadable_or_damaged_files_read_as_misses() {
        let dir = std::env::temp_dir().join(format!("tusk-kernels-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(cache_file(1));
        assert!(read_cache(&path).is_none(), "missing file");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(read_cache(&path).is_none(), "damaged file");
        write_cache(&dir, &path, b"ptx\0").unwrap();
        assert_eq!(read_cache(&path).as_deref(), Some(&b"ptx\0"[..]));
        // A directory where the file should be: a miss, not an error.
        let as_dir = dir.join(cache_file(2));
        std::fs::create_dir_all(&as_dir).unwrap();
        assert!(read_cache(&as_dir).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Compiles for sm_90 where libnvrtc is present (it is not on CI: then it says so), and
    /// checks the disk cache: a second compilation reads the file, a damaged file is
    /// recompiled over.
    #[test]
    fn compiles_for_sm90_where_nvrtc_is_present() {
        // SAFETY: only probes for the library.
        if !unsafe { nvrtc_sys::is_culib_present() } {
            eprintln!("skipped: {}", KernelError::NoNvrtc);
            return;
        }
        let dir = std::env::temp_dir().join(format!("tusk-kernels-nvrtc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = compile_in(Some(&dir), 9, 0, 1).unwrap();
        assert!(!first.from_disk);
        assert!(first.arch.starts_with("compute_"));
        let text = String::from_utf8_lossy(&first.ptx);
        for name in [names::SCATTER, names::ART_COUNT_SUM_PREFIX, names::btree_get(8, true).unwrap()] {
            assert!(text.contains(name), "{name}");
        }
        let second = compile_in(Some(&dir), 9, 0, 1).unwrap();
        assert!(second.from_disk);
        assert_eq!(second.ptx, first.ptx);
        let file = dir.join(cache_file(cache_key(&source(), &first.arch, 1)));
        let mut bytes = std::fs::read(&file).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        let third = compile_in(Some(&dir), 9, 0, 1).unwrap();
        assert!(!third.from_disk, "a damaged file is compiled over");
        assert_eq!(third.ptx, first.ptx);
        assert!(compile_in(Some(&dir), 9, 0, 1).unwrap().from_disk);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_depend_on_every_input() {
        let a = cache_key("src", "compute_90", 13000);
        assert_ne!(a, cache_key("src2", "compute_90", 13000));
        assert_ne!(a, cache_key("src", "compute_80", 13000));
        assert_ne!(a, cache_key("src", "compute_90", 12080));
        assert_eq!(a, cache_key("src", "compute_90", 13000));
    }
}
