//! Where the workspace and its built artifacts are, from any crate's test
//! or benchmark binary.
//!
//! Cargo puts a test binary in `<target>/<profile>/deps/`, and the
//! workspace's binaries and libraries one level up, in `<target>/<profile>/`:
//! the running executable locates them all, whichever crate's test it is.
//! Only the osprey-cli crate's own tests are sure to find the `osprey`
//! binary freshly built; other crates need `cargo build --workspace` first.

use std::path::{Path, PathBuf};

/// The workspace root (this crate sits at `crates/osprey-testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory of the workspace crate `name` (`crates/NAME`).
pub fn crate_dir(name: &str) -> PathBuf {
    workspace_root().join("crates").join(name)
}

/// `<target>/<profile>`: the directory of the running test binary, less
/// its `deps` component.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("the test binary's directory").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// `<target>`: the target directory (the parent of [`profile_dir`]).
pub fn target_dir() -> PathBuf {
    profile_dir().parent().expect("the target directory").to_path_buf()
}

/// The artifact `name` built beside the `osprey` binary (the preload and
/// allocation libraries, the demo); fails the test if it is not built.
pub fn sibling(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(p.exists(), "{} missing: build the workspace first (cargo build --workspace)", p.display());
    p
}

/// The `osprey` binary.
pub fn osprey() -> PathBuf {
    sibling("osprey")
}

/// The LD_PRELOAD agent library (`osprey-preload`).
pub fn preload_lib() -> PathBuf {
    sibling("libosprey_preload.so")
}

/// The allocation interposer library (`osprey-alloc`).
pub fn alloc_lib() -> PathBuf {
    sibling("libosprey_alloc.so")
}

/// The demo program (`osprey-demo`).
pub fn demo() -> PathBuf {
    sibling("osprey-demo")
}

/// The test OpenTelemetry Collector built by
/// `crates/osprey-upload/tests/collector/build.sh` (`$OSPREY_OTELCOL/osprey-otelcol`,
/// default `/var/cache/osprey/otelcol-0.165.0`); `None`, with one line
/// saying why, when it is not built (`.ci/run` builds it where Go >= 1.26 is).
pub fn otelcol() -> Option<PathBuf> {
    let dir =
        std::env::var_os("OSPREY_OTELCOL").map_or(PathBuf::from("/var/cache/osprey/otelcol-0.165.0"), PathBuf::from);
    let p = dir.join("osprey-otelcol");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("skipped: {} not built (crates/osprey-upload/tests/collector/build.sh)", p.display());
        None
    }
}
