//! `osprey report` end to end: the binary on files written by the exporter.

use osprey_pprof::{write_profile, ProfileData};
use osprey_testkit::profile::folded;
use osprey_testkit::{osprey, tempdir};
use std::process::Command;

/// Stacks (root first, as written) and their cpu time in ms:
/// a;b;c 10, a;b;b 20 (recursion), a 30, a;b;a;b 40 (mutual recursion).
fn data() -> ProfileData {
    folded(&[("a;b;c", 1), ("a;b;b", 2), ("a", 3), ("a;b;a;b", 4)])
}

fn report(args: &[&std::path::Path]) -> std::process::Output {
    Command::new(osprey()).arg("report").args(args).output().unwrap()
}

#[test]
fn report_writes_a_flamegraph() {
    let dir = tempdir("report");
    let files = vec![write_profile(&dir, &data()).unwrap(), write_profile(&dir, &data()).unwrap()];
    let svg = dir.join("flame.svg");
    let out = Command::new(osprey()).arg("report").args(&files).arg("--flamegraph").arg(&svg).output().unwrap();
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
    let dir = tempdir("report-bad");
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
