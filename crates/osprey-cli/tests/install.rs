//! The `osprey` binary alone is an installation: copied into an empty
//! directory it profiles programs with the agent libraries embedded in it,
//! written once per build into a private cache (see
//! `crates/osprey-cli/src/agent_libs.rs`), which it checks before every use.

use osprey_testkit::paths::{demo, osprey, profile_dir};
use osprey_testkit::profile::{expect_profiles, function_names};
use osprey_testkit::tempdir;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory holding only a copy of the `osprey` binary, and a cache
/// directory for it; removed on drop (a debug build is over 100 MB), but
/// for the cache when the test failed.
struct Lone {
    dir: PathBuf,
    bin: PathBuf,
    cache: PathBuf,
}

fn lone(tag: &str) -> Lone {
    let dir = tempdir(tag);
    std::fs::create_dir(dir.join("bin")).unwrap();
    let bin = dir.join("bin/osprey");
    // A hard link where it can be (no copy of a large file): run by its
    // new name, the binary finds nothing beside it, as a copy would.
    if std::fs::hard_link(osprey(), &bin).is_err() {
        std::fs::copy(osprey(), &bin).unwrap();
    }
    Lone { cache: dir.join("cache"), dir, bin }
}

impl Drop for Lone {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::fs::remove_file(&self.bin);
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Lone {
    /// The copied osprey with `args`, its cache in `XDG_CACHE_HOME`.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args).env("XDG_CACHE_HOME", &self.cache);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run the copied osprey")
    }

    /// The versioned directory the libraries are written to.
    fn agent_dir(&self) -> PathBuf {
        agent_dir(&self.cache.join("osprey"))
    }
}

/// The one `agent-<hash>` directory in the cache `dir`.
fn agent_dir(dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("agent-"))
        .collect();
    assert_eq!(dirs.len(), 1, "one agent directory: {dirs:?}");
    dirs[0].clone()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `osprey exec --out DIR [flags] -- osprey-demo`, which must succeed; its stderr.
fn profile_demo(l: &Lone, out: &Path, flags: &[&str]) -> String {
    profile_demo_with(l, out, flags, &demo(), |_| {})
}

/// [`profile_demo`] of the demo at `demo`, the command first passed to `setup`.
fn profile_demo_with(l: &Lone, out: &Path, flags: &[&str], demo: &Path, setup: impl Fn(&mut Command)) -> String {
    let mut args = vec!["exec", "--hz", "500", "--out", out.to_str().unwrap()];
    args.extend(flags);
    args.extend(["--", demo.to_str().unwrap(), "--threads", "1", "--seconds", "1"]);
    let mut c = l.command(&args);
    setup(&mut c);
    let o = c.output().expect("run the copied osprey");
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
    let err = profile_demo(&l, &l.dir.join("out"), &[]);
    assert!(!err.contains("replaced"), "a first run writes without complaint: {err}");
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
    let err = profile_demo(&l, &l.dir.join("out-alloc"), &["--alloc"]);
    assert!(!err.contains("replaced"), "{err}");
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
    let err = profile_demo(&l, &l.dir.join("out"), &[]);
    let replaced: Vec<&str> = err.lines().filter(|l| l.contains("replaced")).collect();
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
fn a_cache_reached_through_a_symbolic_link_is_used_by_its_real_path() {
    let l = lone("lone-link");
    let real = l.dir.join("real-cache");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &l.cache).unwrap();
    let seen = preload_seen(&l);
    let real = std::fs::canonicalize(&real).unwrap();
    assert!(seen.starts_with(real.join("osprey").to_str().unwrap()), "{seen}");
}

/// Whether the tests run as root: they then run osprey as `nobody` where
/// file modes must bind (root writes through them).
fn is_root() -> bool {
    // SAFETY: a plain id query.
    unsafe { libc::geteuid() == 0 }
}

const NOBODY: u32 = 65534;

/// A directory `nobody` owns (mode 0700) when running as root.
fn private_dir_for_user(d: &Path) {
    std::fs::create_dir(d).unwrap();
    if is_root() {
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn a_tampered_library_that_cannot_be_replaced_is_refused_in_one_line() {
    let l = lone("lone-ro");
    private_dir_for_user(&l.cache);
    let run = |args: &[&str]| {
        let mut c = l.command(args);
        if is_root() {
            c.uid(NOBODY).gid(NOBODY);
        }
        c.output().unwrap()
    };
    let out = l.dir.join("out");
    private_dir_for_user(&out);
    let o = run(&["exec", "-q", "--out", out.to_str().unwrap(), "--", "/bin/true"]);
    assert!(l.agent_dir().join("libosprey_preload.so").is_file(), "written by the first run: {}", stderr(&o));
    let dir = l.agent_dir();
    let lib = dir.join("libosprey_preload.so");
    let mut bytes = std::fs::read(&lib).unwrap();
    bytes.push(0);
    std::fs::write(&lib, &bytes).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).unwrap();
    let o = run(&["exec", "--out", out.to_str().unwrap(), "--", "/bin/echo", "ran"]);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(o.status.code(), Some(1), "refused: {}", stderr(&o));
    assert!(o.stdout.is_empty(), "the program did not run with a library that is not osprey's");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("cannot replace") && err.contains("content is not this osprey's agent"), "{err}");
}

/// An unprivileged user whose home is not writable (`/`, as for a container
/// user without a passwd entry) gets a private cache under `$TMPDIR`, and
/// a profile. Needs root to become that user.
#[test]
fn a_user_without_a_writable_home_gets_a_private_cache_in_tmp() {
    if !is_root() {
        eprintln!("skipped: needs root to run osprey as another user");
        return;
    }
    let l = lone("lone-nobody");
    // The demo beside osprey: the build directory need not be readable by `nobody`.
    let demo_copy = l.dir.join("bin/osprey-demo");
    if std::fs::hard_link(demo(), &demo_copy).is_err() {
        std::fs::copy(demo(), &demo_copy).unwrap();
    }
    let (tmp, out) = (l.dir.join("tmp"), l.dir.join("out"));
    private_dir_for_user(&tmp);
    private_dir_for_user(&out);
    let err = profile_demo_with(&l, &out, &["--alloc"], &demo_copy, |c| {
        c.env_remove("XDG_CACHE_HOME").env("HOME", "/").env("TMPDIR", &tmp).uid(NOBODY).gid(NOBODY);
    });
    assert!(!err.contains("replaced"), "{err}");
    let cache = tmp.join(format!("osprey-{NOBODY}"));
    let lib = agent_dir(&cache).join("libosprey_preload.so");
    for p in [&cache, &lib] {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!(m.uid(), NOBODY, "{} is the user's", p.display());
        assert_eq!(m.mode() & 0o022, 0, "{} not group/other-writable", p.display());
    }
    assert_eq!(std::fs::metadata(&cache).unwrap().mode() & 0o777, 0o700);
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
    let _ = std::fs::remove_dir_all(&cache);
}
