//! Recovery of an arbitrary directory image: log segments, manifests and chunk images (see
//! `tusk_fuzz::parse_image`) written to a fresh folder, then `Store::open`. It must return
//! Ok or an error, never panic, never read out of bounds (the sanitizer watches the mmap'd
//! segments).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tusk::Store;

/// Where the images go: `TUSK_FUZZ_TMP`, else /dev/shm (no disk I/O per run), else the
/// system temp folder.
fn scratch_root() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("TUSK_FUZZ_TMP") {
        return dir.into();
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

fuzz_target!(|input: &[u8]| {
    let dir = tempfile::Builder::new().prefix("tusk-fuzz-").tempdir_in(scratch_root()).expect("scratch folder");
    tusk_fuzz::write_image(input, dir.path()).expect("writing the image");
    let options = tusk_fuzz::store_options();
    if let Ok(store) = Store::open(dir.path(), options) {
        let _ = store.close();
    }
});
