//! The on-disk unwind-table cache (`osprey_unwind::cache`) as profiled
//! processes use it: two processes filling it at once both unwind and
//! leave whole files, a damaged file is compiled again and replaced, and a
//! directory the process cannot write costs nothing but the compile.
//! Every run here must say at most one line on stderr and unwind the
//! program's frame-pointer-less stacks through the tables.

use osprey_testkit::cc::Cc;
use osprey_testkit::paths::preload_lib;
use osprey_testkit::profile::{function_names, read_profiles};
use osprey_testkit::{osprey, tempdir};
use osprey_unwind::cache::Cache;
use osprey_unwind::compile::DEBUG_ROOT;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A call chain without frame pointers: only the tables unwind it.
const DEEP_C: &str = r#"
#include <stdlib.h>
volatile unsigned long sink;
__attribute__((noinline)) void leaf(long n) { for (long i = 0; i < n; i++) sink += i * i; }
__attribute__((noinline)) void middle(long n) { leaf(n); sink++; }
__attribute__((noinline)) void upper(long n) { middle(n); sink++; }
int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 300;
    for (long k = 0; k < rounds; k++) upper(200000);
    return 0;
}
"#;

fn program(dir: &Path) -> PathBuf {
    let src = dir.join("deep.c");
    std::fs::write(&src, DEEP_C).unwrap();
    Cc::new("cc").flags(["-O2", "-fomit-frame-pointer", "-g"]).build(&src, &dir.join("deep"))
}

/// `osprey exec --quiet` of the program with the cache in `cache`, as
/// `user` (uid, gid) when given.
fn start(prog: &Path, cache: &Path, out: &Path, user: Option<u32>) -> Child {
    let mut c = match user {
        Some(id) => {
            let mut c = Command::new("setpriv");
            c.args([format!("--reuid={id}"), format!("--regid={id}"), "--clear-groups".into()]).arg(osprey());
            c
        }
        None => Command::new(osprey()),
    };
    c.args(["exec", "--quiet", "--hz", "500", "--out"])
        .arg(out)
        .arg("--")
        .arg(prog)
        .env("OSPREY_UNWIND_CACHE", cache)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a run: it succeeded, said at most one line, and its profile
/// has `leaf` called through `middle` and `upper` from `main` (the tables
/// unwound it) for nearly all of `leaf`'s samples.
fn check(child: Child, out: &Path) {
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.lines().count() <= 1, "at most one line: {err}");
    let (mut leaf, mut whole) = (0, 0);
    for p in read_profiles(out) {
        for s in &p.sample {
            let names = function_names(&p, s);
            if names.first() == Some(&"leaf") {
                leaf += s.value[0];
                whole += i64::from(names.windows(4).any(|w| w == ["leaf", "middle", "upper", "main"])) * s.value[0];
            }
        }
    }
    assert!(leaf > 10, "leaf sampled: {leaf}");
    assert!(whole * 10 >= leaf * 9, "{whole} of {leaf} leaf samples unwound to main");
}

/// The modules the program maps with a build id: itself, the agent and
/// their libraries, by build id in hex.
fn modules(prog: &Path) -> BTreeMap<String, PathBuf> {
    let mut paths = vec![prog.to_path_buf(), preload_lib()];
    for of in [prog.to_path_buf(), preload_lib()] {
        let ldd = Command::new("ldd").arg(&of).output().unwrap();
        for l in String::from_utf8_lossy(&ldd.stdout).lines() {
            let path = l.split_whitespace().find(|w| w.starts_with('/'));
            paths.extend(path.map(PathBuf::from));
        }
    }
    paths.into_iter().filter_map(|p| Some((osprey_pprof::build_id::read_hex(&p)?, p))).collect()
}

/// Every file in `cache` is a whole table of one of the program's modules:
/// reading it through the cache needs no compile (a damaged file would be
/// compiled again) and gives the table a fresh compile gives.
fn assert_whole(cache: &Path, prog: &Path) -> usize {
    let mods = modules(prog);
    let disk = Cache::open(cache).unwrap();
    let files: Vec<String> =
        std::fs::read_dir(cache).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    for f in &files {
        assert!(f.ends_with(".tbl"), "no temporary left: {files:?}");
        let id = f.trim_end_matches(".tbl").trim_end_matches("-d");
        let path = mods.get(id).unwrap_or_else(|| panic!("{f}: not a module of the program ({mods:?})"));
        let cached = disk.compile_file(path, Some(Path::new(DEBUG_ROOT))).unwrap();
        assert_eq!(cached.eh_fdes, 0, "{f} ({}) did not check out: compiled again", path.display());
        let fresh = osprey_unwind::compile::compile_file(path, Some(Path::new(DEBUG_ROOT))).unwrap();
        assert!(cached.table.iter().eq(fresh.table.iter()), "{f}: not the table of {}", path.display());
    }
    files.len()
}

/// Two processes starting at once on an empty cache both compile and both
/// write every entry: both unwind, and the files left are whole.
#[test]
fn two_processes_filling_the_cache_at_once() {
    let dir = tempdir("ucache-race");
    let prog = program(&dir);
    let cache = dir.join("cache");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let runs = [start(&prog, &cache, &a, None), start(&prog, &cache, &b, None)];
    for (child, out) in runs.into_iter().zip([&a, &b]) {
        check(child, out);
    }
    let n = assert_whole(&cache, &prog);
    assert!(n >= 3, "the program, libc and the agent at least: {n} files");
}

/// A damaged entry (a flipped byte, then a truncated file) is not used:
/// the process compiles the module again, unwinds, says nothing of it, and
/// leaves a whole file in its place.
#[test]
fn a_damaged_entry_is_compiled_again_and_replaced() {
    let dir = tempdir("ucache-damage");
    let prog = program(&dir);
    let cache = dir.join("cache");
    check(start(&prog, &cache, &dir.join("first"), None), &dir.join("first"));
    let libc = modules(&prog)
        .into_iter()
        .find(|(_, p)| p.to_string_lossy().contains("libc.so"))
        .map(|(id, _)| id)
        .expect("libc has a build id");
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&libc))
        .expect("libc's entry");
    let whole = std::fs::read(&entry).unwrap();
    let mut flipped = whole.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x55;
    for (tag, damaged) in [("flipped", flipped), ("truncated", whole[..whole.len() / 3].to_vec())] {
        std::fs::write(&entry, &damaged).unwrap();
        let out = dir.join(tag);
        check(start(&prog, &cache, &out, None), &out);
        assert_eq!(std::fs::read(&entry).unwrap(), whole, "{tag}: replaced by the whole table");
    }
    assert_whole(&cache, &prog);
}

/// A cache directory the process cannot write (mode 0500; as root, run as
/// `nobody`, who owns it): profiling works, nothing is said, nothing left.
#[test]
fn a_read_only_cache_directory_only_costs_the_compile() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("ucache-ro");
    let prog = program(&dir);
    let (cache, out) = (dir.join("cache"), dir.join("out"));
    std::fs::create_dir(&cache).unwrap();
    std::fs::create_dir(&out).unwrap();
    // SAFETY: geteuid has no preconditions.
    let user = (unsafe { libc::geteuid() } == 0).then_some(65534u32);
    if let Some(id) = user {
        // The cache must be the user's own to be used at all.
        std::os::unix::fs::chown(&cache, Some(id), Some(id)).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o500)).unwrap();
    check(start(&prog, &cache, &out, user), &out);
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0, "nothing written");
}
