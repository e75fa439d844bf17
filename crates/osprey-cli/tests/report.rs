//! `osprey report` end to end: the binary on files written by the exporter.

use osprey_pprof::{write_profile, Frame, ProfileData, Sample};
use std::process::Command;

const MS: i64 = 1_000_000;

/// Stacks (root first, as written) and their cpu time in ms:
/// a;b;c 10, a;b;b 20 (recursion), a 30, a;b;a;b 40 (mutual recursion).
fn data() -> ProfileData {
    let f = |n: &str| Frame::Function { name: n.into(), file: "x.py".into(), line: 1 };
    let sample = |root_first: &str, count: i64| {
        let frames = root_first.split(';').rev().map(f).collect();
        Sample { frames, values: vec![count, count * 10 * MS], labels: vec![] }
    };
    ProfileData {
        sample_types: vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())],
        period: ("cpu".into(), "nanoseconds".into(), 10 * MS),
        samples: vec![sample("a;b;c", 1), sample("a;b;b", 2), sample("a", 3), sample("a;b;a;b", 4)],
        ..ProfileData::default()
    }
}

fn report(args: &[&std::path::Path]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_osprey")).arg("report").args(args).output().unwrap()
}

#[test]
fn report_writes_a_flamegraph() {
    let dir = std::env::temp_dir().join(format!("osprey-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = vec![write_profile(&dir, &data()).unwrap(), write_profile(&dir, &data()).unwrap()];
    let svg = dir.join("flame.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_osprey"))
        .arg("report")
        .args(&files)
        .arg("--flamegraph")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 file(s)"));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("osprey"), "not a flamegraph");
    for frame in ["<title>all (200,000,000 nanoseconds", "<title>b (140,000,000 nanoseconds", "<title>c ("] {
        assert!(text.contains(frame), "flamegraph lacks {frame:?}");
    }
    let missing = report(&[&dir.join("missing.pb.gz")]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("missing.pb.gz"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_refuses_what_is_not_a_profile_file() {
    let dir = std::env::temp_dir().join(format!("osprey-report-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A device that never ends, and a (sparse) file larger than any profile.
    let big = dir.join("big.pb.gz");
    std::fs::File::create(&big).unwrap().set_len(300 << 20).unwrap();
    for (path, why) in
        [(std::path::Path::new("/dev/zero"), "not a regular file"), (big.as_path(), "more than a profile")]
    {
        let out = report(&[path]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why) && err.lines().count() == 1, "{}: {err}", path.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
