//! tusk embeds as a library without the command's crates: a tiny program that depends on the
//! package `tusk` (the library alone; the command is the package `tusk-cli` in cli/) builds,
//! runs a durable transaction, and pulls in none of clap, indicatif, hdrhistogram,
//! serde_json, congee, delaunator, stats_alloc, plotters, the peers of `bench peers`
//! (rusqlite, heed, redb, fjall), the other tools only the `tusk` command uses, or replication's
//! (tusk-replica, openraft, tokio and the transport).

use std::path::Path;
use std::process::Command;

/// Crates only the command and its benchmarks need.
const COMMAND_ONLY: &[&str] =
    &["tusk-cli", "clap", "indicatif", "hdrhistogram", "serde_json", "congee", "delaunator", "stats_alloc", "plotters", "rand", "rand_distr", "tempfile", "rusqlite", "libsqlite3-sys", "redb", "heed", "lmdb-master-sys", "fjall", "lsm-tree",
      // Replication's (tusk-replica): only a program that replicates compiles them.
      "tusk-replica", "openraft", "tokio", "axum", "hyper", "reqwest", "bincode", "serde"];

const MAIN: &str = r#"
fn main() -> Result<(), tusk::Error> {
    let dir = std::env::args().nth(1).expect("a store directory");
    let store = tusk::Store::open(&dir, tusk::Options::default())?;
    store.transact(tusk::Commit::Sync, |tx| {
        let p = tx.alloc(16)?;
        tx.write_at(p, 0, b"embedded")?;
        tx.set_root("greeting", p)
    })?;
    store.close()?;
    let store = tusk::Store::open(&dir, tusk::Options::default())?;
    let (text, _) = store.transact(tusk::Commit::Async, |tx| {
        let p = tx.root("greeting")?.expect("the root survives a reopen");
        let mut buf = [0u8; 8];
        tx.read(p, &mut buf)?;
        Ok(buf)
    })?;
    assert_eq!(&text, b"embedded");
    println!("embedded ok");
    Ok(())
}
"#;

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

#[test]
fn a_dependent_crate_without_default_features_builds_runs_and_skips_the_command_crates() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = tempfile::tempdir().unwrap();
    let krate = work.path().join("embed-check");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"embed-check\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\ntusk = {{ path = {:?} }}\n\n[workspace]\n",
            repo.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(krate.join("src/main.rs"), MAIN).unwrap();
    // The workspace's lock file: the same versions, resolved without the network.
    std::fs::copy(repo.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    // A target folder of its own inside the workspace's, kept between runs (a cache).
    let target = repo.join("target").join("embed-check");

    let tree = cargo()
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(tree.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&tree.stderr));
    let tree = String::from_utf8_lossy(&tree.stdout);
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains(&"tusk"), "{tree}");
    for name in COMMAND_ONLY {
        assert!(!crates.contains(name), "an embedding program compiles {name}:\n{tree}");
    }

    let build = cargo().args(["build", "--offline", "--quiet"]).current_dir(&krate).env("CARGO_TARGET_DIR", &target).output().unwrap();
    assert!(build.status.success(), "the dependent crate does not build: {}", String::from_utf8_lossy(&build.stderr));
    let store = work.path().join("store");
    let run = Command::new(target.join("debug").join("embed-check")).arg(&store).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "embedded ok");
}
