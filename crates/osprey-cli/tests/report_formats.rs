//! `osprey report --format collapsed|speedscope|pprof` on files with known
//! numbers, each output read by the real tool: inferno, speedscope's JSON
//! schema, `go tool pprof`.

use osprey_pprof::{write_profile, Label, LabelValue, ProfileData};
use osprey_testkit::cli::osprey_ok;
use osprey_testkit::profile::{decode, folded, label};
use osprey_testkit::readers::{go_pprof, speedscope_schema, validate_json};
use osprey_testkit::tempdir;
use std::path::{Path, PathBuf};

const MS: i64 = 1_000_000;

/// Two files of process `pid`: thread 1 "main" runs a;b;c (10 ms) and a
/// (30 ms), thread 2 "worker" runs a;b;b (20 ms) and w (40 ms): 100 ms per
/// file.
fn files(dir: &Path, pid: i32) -> Vec<PathBuf> {
    let mut data: ProfileData = folded(&[("a;b;c", 1), ("a", 3), ("a;b;b", 2), ("w", 4)]);
    data.pid = pid;
    for (i, s) in data.samples.iter_mut().enumerate() {
        let (tid, name) = if i < 2 { (1, "main") } else { (2, "worker") };
        s.labels = vec![
            Label { key: "thread id".into(), value: LabelValue::Num(tid) },
            Label { key: "thread name".into(), value: LabelValue::Str(name.into()) },
        ];
    }
    (0..2).map(|_| write_profile(dir, &data).unwrap()).collect()
}

/// A pid no process has (so no name is read from /proc for it).
const PID: i32 = 3_999_001;

#[test]
fn collapsed_stacks_add_up_and_inferno_draws_them() {
    let dir = tempdir("collapsed");
    let f = files(&dir, PID);
    let text =
        osprey_ok(&["report".as_ref(), f[0].as_os_str(), f[1].as_os_str(), "--format".as_ref(), "collapsed".as_ref()]);
    let mut lines: Vec<(&str, i64)> = text
        .lines()
        .map(|l| {
            let (stack, v) = l.rsplit_once(' ').unwrap_or_else(|| panic!("not folded: {l:?}"));
            (stack, v.parse().unwrap_or_else(|_| panic!("no value: {l:?}")))
        })
        .collect();
    lines.sort();
    assert_eq!(lines, [("a", 60 * MS), ("a;b;b", 40 * MS), ("a;b;c", 20 * MS), ("w", 80 * MS)]);
    let mut svg = Vec::new();
    let mut opts = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_lines(&mut opts, text.lines(), &mut svg).expect("inferno reads collapsed");
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.contains("<title>all (200,000,000 samples"), "inferno's total");
    // The same file through --output.
    let out = dir.join("out.folded");
    osprey_ok(&[
        "report".as_ref(),
        dir.as_os_str(),
        "--format".as_ref(),
        "collapsed".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn speedscope_files_match_speedscopes_schema() {
    let dir = tempdir("speedscope");
    files(&dir, PID);
    let schema = speedscope_schema();
    let out = dir.join("s.json");
    for (group, want) in
        [("thread", vec![("main (1)", 80 * MS), ("worker (2)", 120 * MS)]), ("process", vec![("", 200 * MS)])]
    {
        osprey_ok(&[
            "report",
            dir.to_str().unwrap(),
            "--format",
            "speedscope",
            "--group",
            group,
            "-o",
            out.to_str().unwrap(),
        ]);
        validate_json(&schema, &out).unwrap_or_else(|e| panic!("--group {group}: not valid speedscope: {e}"));
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let frames: Vec<&str> =
            doc["shared"]["frames"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
        let profiles = doc["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), want.len(), "--group {group}");
        for (p, (name, total)) in profiles.iter().zip(&want) {
            assert!(p["name"].as_str().unwrap().ends_with(name), "{} for {name}", p["name"]);
            assert_eq!(p["unit"], "nanoseconds");
            let weights: i64 = p["weights"].as_array().unwrap().iter().map(|w| w.as_i64().unwrap()).sum();
            assert_eq!((weights, p["endValue"].as_i64().unwrap()), (*total, *total), "{name}");
            let stacks: Vec<String> = p["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s.as_array()
                        .unwrap()
                        .iter()
                        .map(|i| frames[i.as_u64().unwrap() as usize])
                        .collect::<Vec<_>>()
                        .join(";")
                })
                .collect();
            assert!(stacks.iter().any(|s| s == "a;b;c" || s == "a;b;b"), "root first: {stacks:?}");
        }
    }
    // The validator does reject what speedscope would not read.
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    doc["profiles"][0]["weights"] = serde_json::json!(["ten"]);
    std::fs::write(&out, doc.to_string()).unwrap();
    assert!(validate_json(&schema, &out).is_err(), "a string weight passes the schema");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pprof_output_is_the_merged_filtered_profile_for_go_tool_pprof() {
    let dir = tempdir("pprof-out");
    files(&dir, PID);
    files(&dir, PID + 1);
    let out = dir.join("merged.pb.gz");
    let pid = PID.to_string();
    osprey_ok(&["report", dir.to_str().unwrap(), "--format", "pprof", "--pid", &pid, "-o", out.to_str().unwrap()]);
    let p = decode(&std::fs::read(&out).unwrap());
    assert!(p.sample.iter().all(|s| label(&p, s, "pid") == Some(("", PID as i64))), "only --pid {PID}");
    let top = go_pprof(&dir, &["-top", "-symbolize=none"], &out);
    assert!(top.contains("Type: cpu"), "the chosen type is pprof's default: {top}");
    assert!(top.contains("of 200ms total"), "two files of 100 ms: {top}");
    let w = top.lines().find(|l| l.trim_end().ends_with(" w")).unwrap_or_else(|| panic!("no w: {top}"));
    assert!(w.trim_start().starts_with("80ms"), "w flat 80 ms: {w}");
    // Every type of the inputs is kept: -sample_index=samples counts them.
    let samples = go_pprof(&dir, &["-top", "-symbolize=none", "-sample_index=samples"], &out);
    assert!(samples.contains("of 20 total"), "{samples}");
    std::fs::remove_dir_all(&dir).unwrap();
}
