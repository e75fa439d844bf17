//! The `osprey` binary alone is an installation: copied into an empty
//! directory it profiles programs with the agent libraries embedded in it,
//! written once per build into a private cache (see
//! `crates/osprey-cli/src/agent_libs.rs`), which it checks before every use.

use osprey_testkit::paths::{demo, osprey, profile_dir};
use osprey_testkit::profile::{expect_profiles, function_names};
use osprey_testkit::tempdir;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory holding only a copy of the `osprey` binary, and a cache
/// directory for it.
struct Lone {
    bin: PathBuf,
    cache: PathBuf,
}

fn lone(tag: &str) -> Lone {
    let dir = tempdir(tag);
    std::fs::create_dir(dir.join("bin")).unwrap();
    let bin = dir.join("bin/osprey");
    std::fs::copy(osprey(), &bin).unwrap();
    Lone { bin, cache: dir.join("cache") }
}

impl Lone {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin).args(args).env("XDG_CACHE_HOME", &self.cache).output().expect("run the copied osprey")
    }

    /// The versioned directory the libraries are written to.
    fn agent_dir(&self) -> PathBuf {
        let dirs: Vec<PathBuf> = std::fs::read_dir(self.cache.join("osprey"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("agent-"))
            .collect();
        assert_eq!(dirs.len(), 1, "one agent directory: {dirs:?}");
        dirs[0].clone()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `osprey exec --out DIR [flags] -- osprey-demo`, which must succeed; its stderr.
fn profile_demo(l: &Lone, out: &Path, flags: &[&str]) -> String {
    let mut args = vec!["exec", "--hz", "500", "--out", out.to_str().unwrap()];
    args.extend(flags);
    let demo = demo();
    args.extend(["--", demo.to_str().unwrap(), "--threads", "1", "--seconds", "1"]);
    let o = l.run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let ps = expect_profiles(out);
    let names: Vec<&str> = ps[0].sample.iter().flat_map(|s| function_names(&ps[0], s)).collect();
    assert!(names.iter().any(|n| n.contains("work_a")), "the demo's functions in the profile: {names:?}");
    stderr(&o)
}

/// What `LD_PRELOAD` the copied osprey gives a program.
fn preload_seen(l: &Lone) -> String {
    let o = l.run(&["exec", "-q", "--", "/bin/sh", "-c", "echo \"$LD_PRELOAD\""]);
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn a_copied_binary_profiles_with_its_embedded_agent_written_once() {
    let l = lone("lone");
    let err = profile_demo(&l, &tempdir("lone-out"), &[]);
    assert!(!err.contains("replacing"), "a first run writes without complaint: {err}");
    let dir = l.agent_dir();
    let lib = dir.join("libosprey_preload.so");
    assert!(preload_seen(&l).starts_with(lib.to_str().unwrap()), "the cached agent is preloaded");
    for p in [l.cache.join("osprey"), dir.clone()] {
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o700, "{} private", p.display());
    }
    let m = std::fs::metadata(&lib).unwrap();
    assert_eq!(m.mode() & 0o022, 0, "the library is not group/other-writable");
    // A second run (with the allocators) finds both files as written: not rewritten.
    let inode = m.ino();
    let err = profile_demo(&l, &tempdir("lone-alloc"), &["--alloc"]);
    assert!(!err.contains("replacing"), "{err}");
    assert_eq!(std::fs::metadata(&lib).unwrap().ino(), inode, "written once per build");
}

#[test]
fn a_group_writable_cache_is_refused_in_one_line() {
    let l = lone("lone-gw");
    assert!(!preload_seen(&l).is_empty());
    let cache = l.cache.join("osprey");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o770)).unwrap();
    let o = l.run(&["exec", "--", "/bin/echo", "ran"]);
    assert_eq!(o.status.code(), Some(1), "refused");
    assert!(o.stdout.is_empty(), "the program did not run with an agent from a shared directory");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("writable by group or others") && err.contains(cache.to_str().unwrap()), "{err}");
}

#[test]
fn a_tampered_or_shared_library_is_replaced_in_one_line() {
    let l = lone("lone-tamper");
    assert!(!preload_seen(&l).is_empty());
    let lib = l.agent_dir().join("libosprey_preload.so");
    let original = std::fs::read(&lib).unwrap();
    // Changed content (same size, so no length check alone catches it).
    let mut bytes = original.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&lib, &bytes).unwrap();
    let err = profile_demo(&l, &tempdir("lone-tamper-out"), &[]);
    let replaced: Vec<&str> = err.lines().filter(|l| l.contains("replacing")).collect();
    assert_eq!(replaced.len(), 1, "{err}");
    assert!(replaced[0].contains("content is not this osprey's agent"), "{err}");
    assert!(std::fs::read(&lib).unwrap() == original, "rewritten");
    // The right content, but writable by others.
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = l.run(&["exec", "--", "/bin/true"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("writable by group or others"), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&lib).unwrap().mode() & 0o022, 0);
}

#[test]
fn a_development_build_prefers_the_libraries_beside_it() {
    let cache = tempdir("dev-cache");
    let o = Command::new(osprey())
        .args(["exec", "-q", "--", "/bin/sh", "-c", "echo \"$LD_PRELOAD\""])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let beside = std::fs::canonicalize(profile_dir().join("libosprey_preload.so")).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), beside.to_str().unwrap());
    let agent_dirs = std::fs::read_dir(cache.join("osprey"))
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("agent-")).count())
        .unwrap_or(0);
    assert_eq!(agent_dirs, 0, "no library written to the cache");
}
