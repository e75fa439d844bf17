//! `osprey attach --pid` to real programs: a Rust release build (no frame
//! pointers, Rust's CFI), a program that keeps forking and executing
//! children (not followed; its output and status unchanged), and Debian's
//! /usr/bin/python3.11 (libpython linked in) with `--native`, and a program
//! blocked in read() and futex (no CPU: no samples); targets exiting while
//! attached.
//!
//! Needs the osprey binary built (`cargo build -p osprey-cli`), rustc, a C
//! compiler, perf_event_open and ptrace allowed.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::compile_frameless;
use osprey_testkit::cli::attach_into;
use osprey_testkit::profile::{function_names, label, read_profiles};
use osprey_testkit::python::{python, slots};
use osprey_testkit::tempdir;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `osprey attach --pid PID --duration S ARGS --out DIR`: the profiles
/// written, and osprey's stderr.
fn attach(pid: u32, secs: &str, args: &[&str], dir: &Path) -> (Vec<Profile>, String) {
    let out = dir.join("profiles");
    let o = attach_into(&out, pid, &[&["--duration", secs, "--hz", "200"], args].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    let p = read_profiles(&out);
    assert!(!p.is_empty(), "no profile: {err}");
    (p, err.into_owned())
}

/// Each sample's function names (leaf first) and `values[i]`.
fn stacks(ps: &[Profile], value: &str) -> Vec<(Vec<String>, i64)> {
    let mut out = Vec::new();
    for p in ps {
        let i = p.sample_type.iter().position(|t| p.string(t.r#type) == value).expect("sample type");
        for s in &p.sample {
            out.push((function_names(p, s).into_iter().map(String::from).collect(), s.value[i]));
        }
    }
    out
}

/// The stdout and status of `child` once it ends.
fn finish(mut child: Child) -> (String, Option<i32>) {
    let mut s = String::new();
    child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
    (s, child.wait().unwrap().code())
}

#[test]
fn a_rust_release_build_keeps_its_split_and_reaches_main() {
    let _cpu = slots(1);
    let dir = tempdir("attach-rs");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rs/attach_spin.rs");
    let bin = dir.join("attach_spin");
    let st = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args(["-O", "-C", "force-frame-pointers=no", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    // A statistical figure on shared cores: measured once more when it
    // misses (a systematic error misses both times).
    osprey_testkit::run::rerun_on_noise(2, |last| {
        let target = Command::new(&bin).arg("3").stdout(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let all = stacks(&attach(target.id(), "2", &[], &dir).0, "cpu");
        let (out, code) = finish(target);
        assert_eq!((out.as_str(), code), ("ok 1\n", Some(0)));
        let has = |s: &(Vec<String>, i64), f: &str| s.0.iter().any(|n| n.ends_with(f));
        let total: i64 = all.iter().map(|s| s.1).sum();
        let work: Vec<i64> =
            ["::seventy", "::thirty"].iter().map(|f| all.iter().filter(|s| has(s, f)).map(|s| s.1).sum()).collect();
        let share = work[0] as f64 * 100.0 / (work[0] + work[1]).max(1) as f64;
        let rooted: i64 = all.iter().filter(|s| has(s, "attach_spin::main")).map(|s| s.1).sum();
        let reach = rooted as f64 * 100.0 / total.max(1) as f64;
        eprintln!("seventy {share:.1}% of the work, {reach:.1}% reaches attach_spin::main");
        assert!(reach >= 95.0, "{reach:.1}% reaches main: {:?}", &all[..all.len().min(5)]);
        if (share - 70.0).abs() > 6.0 && !last {
            return None;
        }
        assert!((share - 70.0).abs() <= 6.0, "seventy {share:.1}%: {:?}", &all[..all.len().min(5)]);
        Some(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_target_forking_and_executing_children_is_sampled_alone_and_unchanged() {
    let _cpu = slots(2);
    let dir = tempdir("attach-spawn");
    let bin = compile_frameless(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"), "spawners", &dir);
    let target = Command::new(&bin).arg("600").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = target.id();
    std::thread::sleep(Duration::from_millis(300));
    let (profiles, _) = attach(pid, "1.5", &[], &dir);
    let mut target = target;
    let mut err = String::new();
    target.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let (out, code) = finish(target);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("spawned 600 deaths 0 failures 0"), "{out}{err}");
    assert!(err.is_empty(), "{err}");
    // Only the target's own samples: its children are not followed.
    for p in &profiles {
        for s in &p.sample {
            assert_eq!(label(p, s, "pid").map(|l| l.1), Some(pid as i64));
        }
    }
    let all = stacks(&profiles, "cpu");
    assert!(all.iter().any(|s| s.0.iter().any(|f| f == "busy")), "{:?}", &all[..all.len().min(5)]);
}

#[test]
fn debian_python_3_11_with_native_frames() {
    let Some(py) = python("debian-3.11") else { return };
    let _cpu = slots(1);
    let dir = tempdir("attach-deb311");
    let w = py.start(&["split"]);
    let (profiles, err) = attach(w.pid() as u32, "2", &["--native"], &dir);
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
    let all = stacks(&profiles, "cpu");
    let busy: Vec<_> = all.iter().filter(|s| s.1 > 0).collect();
    let with = |f: &str| busy.iter().filter(|s| s.0.iter().any(|n| n == f)).count();
    // "--native: N stacks unwound: M merged, ...": native walks joined to the Python stacks.
    let merged: u64 = err
        .split_once("stacks unwound: ")
        .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no --native summary: {err}"));
    // The C functions Python calls into show above the Python frames.
    let native_leaf = busy.iter().filter(|s| s.0.len() > 1 && s.0[1] == "f50" && s.0[0] != "f50").count();
    eprintln!(
        "{} busy stacks, f50 in {}, {merged} merged, {native_leaf} with a native leaf over f50",
        busy.len(),
        with("f50")
    );
    assert!(with("f50") > 0 && with("f30") > 0, "{:?}", &busy[..busy.len().min(5)]);
    assert!(merged > 0, "{err}");
    let rooted = busy.iter().filter(|s| s.0.last().is_some_and(|f| f == "<module>")).count();
    assert_eq!(rooted, busy.len(), "every busy stack ends in <module>: {busy:?}");
}

/// A program blocked in read() and futex uses no CPU: attach says it took
/// no samples (`dump` shows such stacks: tests/dump.rs), and the program,
/// woken afterwards, ends as it would have.
#[test]
fn a_blocked_program_gets_no_cpu_samples_and_is_left_unchanged() {
    let dir = tempdir("attach-blocked");
    let bin = compile_frameless(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"), "dump_blocked", &dir);
    let mut c = Command::new(&bin).arg("2").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut ready = [0u8; 6];
    c.stdout.as_mut().unwrap().read_exact(&mut ready).unwrap();
    assert_eq!(&ready, b"ready\n");
    let o = attach_into(&dir.join("profiles"), c.id(), &["--duration", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no samples"), "{err}");
    drop(c.stdin.take());
    assert_eq!(c.wait().unwrap().code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A target that exits while attached: the attach ends then (long before
/// its `--duration`) with one line saying so, and writes what it sampled;
/// native and CPython alike.
#[test]
fn a_target_exiting_during_the_attach_ends_it() {
    let _cpu = slots(1);
    let dir = tempdir("attach-exit");
    let bin = compile_frameless(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"), "attach_split", &dir);
    let mut targets: Vec<(&str, Command)> = Vec::new();
    let mut native = Command::new(&bin);
    native.arg("100");
    targets.push(("native", native));
    if let Some(py) = python("3.12") {
        let script = py.script();
        targets.push(("cpython", py.command(&[&script, "short", "2"])));
    }
    for (what, mut cmd) in targets {
        let mut t = cmd.stdout(Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let o = attach_into(&dir.join(what), t.id(), &["--duration", "60"]);
        let err = String::from_utf8_lossy(&o.stderr);
        // 60 s asked: only the exit ends it this early.
        assert!(started.elapsed() < Duration::from_secs(30), "{what}: {err}");
        assert!(err.contains("profile(s) written"), "{what}: {err}");
        assert_eq!(t.wait().unwrap().code(), Some(0), "{what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
