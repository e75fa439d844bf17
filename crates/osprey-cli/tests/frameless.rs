//! Native stacks through code without frame pointers, end to end: programs
//! built here with `gcc -O2 -fomit-frame-pointer` (`c/frameless.c`) and
//! `rustc -O -C force-frame-pointers=no`, profiled with `osprey exec`.
//! The programs do fixed amounts of work; assertions are ratios of samples.
//!
//! Needs the workspace built (`cargo build --workspace`); `cargo xtask test`
//! does it.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::Cc;
use osprey_testkit::profile::function_names;
use osprey_testkit::{osprey, tempdir};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `c/frameless.c`, built without frame pointers.
fn frameless_c(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/frameless.c");
    Cc::new("cc")
        .flags(["-O2", "-fomit-frame-pointer", "-pthread"])
        .after(["-lz", "-ldl"])
        .build(&src, &dir.join("frameless"))
}

/// One sample: its function names leaf first, its CPU nanoseconds, its thread id.
struct Stack {
    names: Vec<String>,
    cpu: i64,
    tid: i64,
}

impl Stack {
    fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// Runs `osprey exec --hz HZ -- BIN ARGS` and returns the samples and the pid.
fn profile(tag: &str, hz: u32, bin: &Path, args: &[&str]) -> (Vec<Stack>, i64) {
    let out = tempdir(tag);
    let o = Command::new(osprey())
        .args(["exec", "--hz", &hz.to_string(), "--out"])
        .arg(&out)
        .arg("--")
        .arg(bin)
        .args(args)
        .output()
        .expect("run osprey");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{tag}: {:?}\n{stderr}", o.status);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("ok"), "{tag}: did not finish");
    assert!(!stderr.contains("no unwind tables"), "{tag}: {stderr}");
    let mut stacks = Vec::new();
    let mut pid = 0;
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".pb.gz") {
            continue;
        }
        pid = name.split('-').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        stacks.extend(samples(&osprey_pprof::read_profile(&e.path()).unwrap()));
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(!stacks.is_empty(), "{tag}: no samples");
    (stacks, pid)
}

fn samples(p: &Profile) -> Vec<Stack> {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let cpu = p.sample_type.iter().position(|t| s(t.r#type) == "cpu").expect("cpu sample type");
    p.sample
        .iter()
        .map(|smp| {
            let names = function_names(p, smp).into_iter().map(String::from).collect();
            let tid = smp.label.iter().find(|l| s(l.key) == "thread id").map_or(0, |l| l.num);
            Stack { names, cpu: smp.value[cpu], tid }
        })
        .collect()
}

/// CPU share (percent) of the stacks matching `what` among those matching `of`.
fn share(stacks: &[Stack], of: impl Fn(&Stack) -> bool, what: impl Fn(&Stack) -> bool) -> f64 {
    let total: i64 = stacks.iter().filter(|s| of(s)).map(|s| s.cpu).sum();
    let hit: i64 = stacks.iter().filter(|s| of(s) && what(s)).map(|s| s.cpu).sum();
    assert!(total > 0, "no matching samples");
    hit as f64 * 100.0 / total as f64
}

#[test]
fn frameless_c_reaches_main_and_the_zlib_caller() {
    let dir = tempdir("c");
    let bin = frameless_c(&dir);
    // The split is statistical (shared cores: a CI run got 47.6/33.1/19.4):
    // measured once more when it misses; a systematic error misses both times.
    let (stacks, pid) = osprey_testkit::run::rerun_on_noise(2, |last| {
        let (stacks, pid) = profile("split", 1000, &bin, &["split", "8"]);
        let to_main = share(&stacks, |s| s.tid == pid, |s| s.has("main"));
        assert!(to_main >= 95.0, "{to_main:.1}% of the main thread's samples reach main");
        let hot = |s: &Stack| s.has("hot_a") || s.has("hot_b") || s.has("hot_c");
        let split: Vec<f64> = ["hot_a", "hot_b", "hot_c"].iter().map(|h| share(&stacks, hot, |s| s.has(h))).collect();
        let close = split.iter().zip([50.0, 30.0, 20.0]).all(|(got, want)| (got - want).abs() <= 3.0);
        if !(close || last) {
            return None;
        }
        assert!(close, "split {split:.1?}, want 50/30/20 within 3 points");
        Some((stacks, pid))
    });
    let zlib = |s: &Stack| {
        s.tid != pid
            && s.names
                .first()
                .is_some_and(|n| n.contains("libz") || n == "compress2" || n == "deflate" || n == "adler32_z")
    };
    let to_caller = share(&stacks, zlib, |s| s.has("zlib_caller"));
    assert!(to_caller >= 90.0, "{to_caller:.1}% of the samples inside zlib reach zlib_caller");
    // Symbol-less frames: module+offset; never a symbol they lie past the end of.
    let names: Vec<&String> = stacks.iter().flat_map(|s| &s.names).collect();
    assert!(names.iter().any(|n| n.starts_with("libz.so.1") && n.contains("+0x")), "no libz.so.1+0x... frame");
    // libc's local functions come from its separate debug file (libc6-dbg).
    let libc_id = osprey_pprof::build_id::read_hex(Path::new("/lib/x86_64-linux-gnu/libc.so.6")).unwrap_or_default();
    let libc_dbg = format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &libc_id[..2.min(libc_id.len())],
        &libc_id[2.min(libc_id.len())..]
    );
    if Path::new(&libc_dbg).is_file() {
        assert!(names.iter().any(|n| *n == "start_thread"), "libc's start_thread not named from {libc_dbg}");
    }
    for bad in ["_init", "__do_global_dtors_aux", "osprey_preload::trampoline"] {
        assert!(!names.iter().any(|n| *n == bad), "a frame is named {bad}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn frameless_rust_release_reaches_main() {
    let dir = tempdir("rust");
    let src = dir.join("frameless_rs.rs");
    std::fs::write(
        &src,
        r#"
use std::hint::black_box;
#[inline(never)] fn burn(mut x: u64, n: u64) -> u64 { for _ in 0..n { x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1)); } x }
#[inline(never)] fn hot_a(x: u64) -> u64 { burn(x, 5000) ^ 1 }
#[inline(never)] fn hot_b(x: u64) -> u64 { burn(x, 3000) ^ 2 }
#[inline(never)] fn hot_c(x: u64) -> u64 { burn(x, 2000) ^ 3 }
#[inline(never)] fn walk(d: u32, x: u64) -> u64 {
    if d == 0 { return hot_a(x) ^ hot_b(x) ^ hot_c(x) }
    black_box(walk(d - 1, black_box(x + 1))) + 1
}
fn main() {
    let mut s = 0u64;
    for i in 0..120_000 { s ^= walk(8, i) }
    println!("ok {}", s & 1);
}
"#,
    )
    .unwrap();
    let bin = dir.join("frameless_rs");
    // Outside the workspace's `force-frame-pointers=yes`: rustc directly.
    let st = Command::new("rustc")
        .args(["-O", "-C", "force-frame-pointers=no", "-C", "debuginfo=0", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("rustc");
    assert!(st.success());
    // The split is statistical (about 1,200 samples: one standard deviation
    // is 1.4 points on `hot_a`): measured once more when it misses; a
    // systematic error misses both times.
    osprey_testkit::run::rerun_on_noise(2, |last| {
        let (stacks, pid) = profile("rust", 1000, &bin, &[]);
        let to_main = share(&stacks, |s| s.tid == pid, |s| s.has("frameless_rs::main"));
        assert!(to_main >= 95.0, "{to_main:.1}% of the samples reach frameless_rs::main");
        let hot =
            |s: &Stack| s.has("frameless_rs::hot_a") || s.has("frameless_rs::hot_b") || s.has("frameless_rs::hot_c");
        let a = share(&stacks, hot, |s| s.has("frameless_rs::hot_a"));
        eprintln!("hot_a {a:.1}%");
        assert!(!last || (a - 50.0).abs() <= 3.0, "hot_a {a:.1}%, want 50 within 3 points");
        ((a - 50.0).abs() <= 3.0).then_some(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hostile stacks at 10 kHz: the program finishes and its samples are sane.
#[test]
fn hostile_stacks_at_10khz() {
    let dir = tempdir("hostile");
    let bin = frameless_c(&dir);
    // 10,000 frames: cut at the default depth (128) and marked truncated.
    let (stacks, _) = profile("deep", 10_000, &bin, &["deep"]);
    let deep = |s: &Stack| s.has("deep");
    let cut = share(&stacks, deep, |s| s.has("[truncated]") && s.names.len() <= 129);
    assert!(cut >= 99.0, "{cut:.1}% of the deep samples cut and marked");
    // 16 KiB thread stacks: walks stay inside them and reach the thread.
    let (stacks, pid) = profile("tiny", 10_000, &bin, &["tiny", "40"]);
    let hot = |s: &Stack| s.has("hot_a") || s.has("hot_b") || s.has("hot_c");
    let reach = share(&stacks, |s| s.tid != pid && hot(s), |s| s.has("tiny_thread"));
    assert!(reach >= 90.0, "{reach:.1}% of the tiny-stack samples reach tiny_thread");
    // Own handler on an alternate stack, coroutines on heap stacks: the leaf
    // is kept and the walk ends, truncated.
    for mode in ["altstack", "coro"] {
        let (stacks, _) = profile(mode, 10_000, &bin, &[mode]);
        let leaf = share(&stacks, |_| true, |s| s.names.first().is_some_and(|n| n == "burn"));
        assert!(leaf >= 90.0, "{mode}: {leaf:.1}% of samples in burn");
    }
    // longjmp out of a recursion, again and again: walks still reach main.
    let (stacks, _) = profile("longjmp", 10_000, &bin, &["longjmp"]);
    let reach = share(&stacks, |s| s.has("jump_from"), |s| s.has("main"));
    assert!(reach >= 95.0, "{reach:.1}% of the longjmp samples reach main");
    // dlopen/dlclose in a loop (tables republished each time), then loaded
    // until exit: the library's frames are named.
    let (stacks, _) = profile("dlopen", 10_000, &bin, &["dlopen", "2"]);
    let named = stacks.iter().filter(|s| s.names.iter().any(|n| n.starts_with("ZSTD_"))).count();
    assert!(named > 10, "{named} samples in a ZSTD_ function");
    let _ = std::fs::remove_dir_all(&dir);
}
