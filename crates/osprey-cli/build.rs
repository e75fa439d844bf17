//! Embeds the agent libraries (`libosprey_preload.so`, `libosprey_alloc.so`)
//! in the `osprey` binary, so that the binary alone is an installation
//! (`cargo install --path crates/osprey-cli`, or copying it anywhere).
//!
//! Why a nested `cargo build` here rather than an artifact dependency or an
//! xtask step: artifact dependencies are unstable, and an xtask step would
//! leave plain `cargo build -p osprey-cli` and `cargo install` producing a
//! binary without its agent. The nested cargo uses its own target directory
//! (`<target>/osprey-agent`) because the outer cargo holds the lock of its own
//! for the whole build: sharing it would deadlock. It builds the outer
//! build's profile (for a release build, `agent`: release with whole-program
//! LTO), with debug info stripped (the embedded copy is what a copied binary
//! writes to its cache; development builds prefer the full libraries beside
//! the binary, see `src/agent_libs.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

const LIBS: [&str; 2] = ["libosprey_preload.so", "libosprey_alloc.so"];

fn main() {
    let manifest = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let workspace = manifest.join("../..");
    let out = PathBuf::from(var("OUT_DIR"));
    if !workspace.join("crates/osprey-preload/Cargo.toml").is_file() {
        panic!("osprey-cli embeds the agent built from its workspace: build it from a clone of osprey");
    }
    let release = var("PROFILE") == "release";
    let target_dir = agent_target_dir(&out);
    let mut cargo = Command::new(var("CARGO"));
    cargo.current_dir(&workspace).args(["build", "-p", "osprey-preload", "-p", "osprey-alloc", "--target-dir"]);
    cargo.arg(&target_dir);
    let (target, host) = (var("TARGET"), var("HOST"));
    let mut artifacts = target_dir.clone();
    if target != host {
        cargo.args(["--target", &target]);
        artifacts.push(&target);
    }
    // A release `osprey` embeds the agent of the `agent` profile (release
    // with whole-program LTO: less for the loader to relocate in each process).
    let (profile, dir, strip) = if release {
        ("agent", "agent", "CARGO_PROFILE_AGENT_STRIP")
    } else {
        ("dev", "debug", "CARGO_PROFILE_DEV_STRIP")
    };
    artifacts.push(dir);
    cargo.args(["--profile", profile]);
    cargo.env(strip, "debuginfo");
    // `cargo clippy` wraps the outer rustc only; the agent must be compiled.
    cargo.env_remove("RUSTC_WORKSPACE_WRAPPER").env_remove("CARGO_TARGET_DIR").env_remove("CARGO_BUILD_TARGET_DIR");
    let status = cargo.status().unwrap_or_else(|e| panic!("cannot run cargo for the agent libraries: {e}"));
    assert!(status.success(), "building the agent libraries (osprey-preload, osprey-alloc) failed");

    let mut embedded = String::new();
    let mut hash = Fnv::default();
    for lib in LIBS {
        let built = artifacts.join(lib);
        // Copied: a later nested build must not change a file this crate includes.
        let copy = out.join(lib);
        std::fs::copy(&built, &copy).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
        hash.write(&std::fs::read(&copy).expect("read back the copy"));
        let konst = if lib.contains("preload") { "PRELOAD" } else { "ALLOC" };
        embedded += &format!("pub const {konst}: &[u8] = include_bytes!({:?});\n", copy.display().to_string());
        rerun_on_sources(&artifacts.join(lib.replace(".so", ".d")));
    }
    embedded += &format!("pub const VERSION_KEY: &str = \"{:016x}\";\n", hash.0);
    std::fs::write(out.join("agent_libs.rs"), embedded).expect("write agent_libs.rs");
    for f in ["Cargo.lock", "Cargo.toml", "crates/osprey-preload/Cargo.toml", "crates/osprey-alloc/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", workspace.join(f).display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    // Read by osprey-preload's build script (see `cargo xtask dist`): the
    // nested build inherits it, but only reruns if this script does.
    println!("cargo:rerun-if-env-changed=OSPREY_PORTABLE_AGENT");
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name} for build scripts"))
}

/// `<target>/osprey-agent` beside the outer profile directories (shared by
/// the debug and release builds, kept across `cargo build` runs), found by
/// walking up from `<target>[/<triple>]/<profile>/build/<pkg>/out`.
fn agent_target_dir(out: &Path) -> PathBuf {
    let build = out.ancestors().find(|p| p.file_name().is_some_and(|n| n == "build"));
    match build.and_then(Path::parent).and_then(Path::parent) {
        Some(target) => target.join("osprey-agent"),
        None => out.join("osprey-agent"),
    }
}

/// Reruns this script when a source file of the agent changes: cargo's
/// dep-info file beside each library lists them all.
fn rerun_on_sources(dep_info: &Path) {
    let Ok(text) = std::fs::read_to_string(dep_info) else {
        println!("cargo:rerun-if-changed=../");
        return;
    };
    let deps = text.split_once(": ").map_or("", |(_, d)| d);
    let mut path = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => path.extend(chars.next()),
            ' ' | '\n' => {
                if !path.is_empty() {
                    println!("cargo:rerun-if-changed={path}");
                }
                path.clear();
            }
            c => path.push(c),
        }
    }
    if !path.is_empty() {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// FNV-1a, 64 bits: a name for this build of the libraries (the cache
/// compares whole contents, so the name needs no cryptographic strength).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
