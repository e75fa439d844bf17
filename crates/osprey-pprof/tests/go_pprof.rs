//! Our files as read by the real `go tool pprof` (Debian: `golang-go`).
//!
//! `go` missing fails the test unless `OSPREY_SKIP_GO=1`. pprof is run with
//! `-symbolize=none`: our mappings say `has_functions`, and the one address we
//! leave unknown is outside every mapping, so there is nothing to symbolize and
//! pprof must not go looking for binaries or symbol servers. One `-top` run
//! keeps pprof's default symbolization with `PPROF_BINARY_PATH` pointing at
//! an empty directory, to show that path also works offline. `HOME` and
//! `PPROF_TMPDIR` point into the test's directory so pprof writes nothing
//! elsewhere.

use osprey_pprof::{write_profile, Frame, Label, LabelValue, ProfileData, Sample};
use osprey_testkit::profile::cpu_data;
use std::path::Path;
use std::process::Command;

#[inline(never)]
fn gopher_leaf(n: u64) -> u64 {
    (0..n).fold(7u64, |s, i| s.rotate_left(5) ^ i)
}

#[inline(never)]
fn gopher_caller(n: u64) -> u64 {
    std::hint::black_box(gopher_leaf(n)) ^ gopher_leaf(n + 1)
}

fn addr(f: fn(u64) -> u64, offset: u64) -> u64 {
    f as usize as u64 + offset
}

fn go_available() -> bool {
    match Command::new("go").arg("version").output() {
        Ok(o) if o.status.success() => true,
        _ if std::env::var("OSPREY_SKIP_GO").as_deref() == Ok("1") => false,
        _ => panic!("`go` is not on PATH: install it (`apt-get install -y golang-go`) or set OSPREY_SKIP_GO=1 to skip"),
    }
}

fn pprof(dir: &Path, args: &[&str], file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", dir)
        .env("PPROF_TMPDIR", dir)
        .env("PPROF_BINARY_PATH", dir.join("no-binaries"))
        .output()
        .expect("run go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "pprof {args:?} failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn go_tool_pprof_reads_our_files() {
    if !go_available() {
        eprintln!("OSPREY_SKIP_GO=1: skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("osprey-go-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let stack = vec![
        Frame::Native { addr: addr(gopher_leaf, 4), return_address: false },
        Frame::Native { addr: addr(gopher_caller, 8), return_address: true },
        Frame::Function { name: "handle_request".into(), file: "app.py".into(), line: 3 },
        Frame::Function { name: "<lambda>".into(), file: "app.py".into(), line: 9 },
        Frame::Function { name: "<module>".into(), file: "app.py".into(), line: 10 },
    ];
    let tid = Label { key: "thread id".into(), value: LabelValue::Num(99) };
    let data = ProfileData {
        duration_ns: 10_000_000_000,
        samples: vec![
            Sample { frames: stack, values: vec![5, 50_000_000], labels: vec![tid] },
            Sample {
                frames: vec![Frame::Synthetic("[osprey] dropped".into())],
                values: vec![1, 10_000_000],
                labels: vec![],
            },
            Sample {
                frames: vec![Frame::Native { addr: 0x10, return_address: false }],
                values: vec![1, 10_000_000],
                labels: vec![],
            },
        ],
        lines: true,
        ..cpu_data(vec![])
    };
    let file = write_profile(&dir, &data).unwrap();

    let raw = pprof(&dir, &["-raw", "-symbolize=none"], &file);
    for want in ["gopher_leaf", "gopher_caller", "handle_request", "[osprey] dropped", "thread id", "cpu/nanoseconds"] {
        assert!(raw.contains(want), "-raw lacks {want:?}:\n{raw}");
    }
    eprintln!("{raw}");
    let top = pprof(&dir, &["-top", "-symbolize=none"], &file);
    eprintln!("{top}");
    assert!(top.contains("gopher_leaf") && top.contains("[osprey] dropped"), "{top}");
    assert!(top.contains("50ms"), "flat time of the leaf:\n{top}");
    let top = pprof(&dir, &["-top", "-sample_index=samples"], &file);
    assert!(top.contains("gopher_leaf"), "{top}");
    // pprof strips `<...>` from a name it takes for C++ (a native name, which
    // is also its system name), never from a Python one.
    let top = pprof(&dir, &["-top", "-cum"], &file);
    assert!(top.contains("<module>") && top.contains("<lambda>"), "{top}");
    std::fs::remove_dir_all(&dir).unwrap();
}
