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

/// `dir/file`, built once by `script` (a cached build: the collector, a
/// free-threaded CPython). A build in progress (`.ci/run` starts them in the
/// background) holds `dir.lock`, and is waited for; when the file is still
/// missing, one line says so and the caller skips (None).
pub fn cached_build(dir: &Path, file: &str, script: &str) -> Option<PathBuf> {
    let lock = PathBuf::from(format!("{}.lock", dir.display()));
    if let Ok(f) = std::fs::File::open(&lock) {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns; closed with `f`.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) };
    }
    let p = dir.join(file);
    if p.exists() {
        return Some(p);
    }
    eprintln!("skipping: {} not built (run {script})", p.display());
    None
}

/// The test OpenTelemetry Collector built by
/// `crates/osprey-upload/tests/collector/build.sh` (`$OSPREY_OTELCOL/osprey-otelcol`,
/// default `/var/cache/osprey/otelcol-0.165.0`; see [`cached_build`]).
pub fn otelcol() -> Option<PathBuf> {
    let dir =
        std::env::var_os("OSPREY_OTELCOL").map_or(PathBuf::from("/var/cache/osprey/otelcol-0.165.0"), PathBuf::from);
    cached_build(&dir, "osprey-otelcol", "crates/osprey-upload/tests/collector/build.sh")
}

/// The Debian program `name` (in `/usr/bin` or `/bin`); fails the test
/// naming the package that provides it (`.ci/run` installs it).
pub fn debian_program(name: &str, package: &str) -> PathBuf {
    ["/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} missing: apt-get install {package}"))
}
