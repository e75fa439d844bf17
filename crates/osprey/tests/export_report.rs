//! `export::summary` on a hand-built profile with known numbers, and
//! `osprey report` (osprey-cli's `report.rs`, compiled in here since a binary
//! crate's modules cannot be reached from tests).

#[path = "../../osprey-cli/src/report.rs"]
mod report;

use osprey::export::encode::encode;
use osprey::export::maps::ProcMaps;
use osprey::export::pprof::Profile;
use osprey::export::{summarize, write_profile, Frame, FunctionStat, ProfileData, Sample};

const MS: i64 = 1_000_000;

/// Stacks (root first, as written) and their cpu time in ms:
/// a;b;c 10, a;b;b 20 (recursion), a 30, a;b;a;b 40 (mutual recursion).
fn data() -> ProfileData {
    let f = |n: &str| Frame::Function {
        name: n.into(),
        file: "x.py".into(),
        line: 1,
    };
    let sample = |root_first: &str, count: i64| {
        let frames = root_first.split(';').rev().map(f).collect();
        Sample {
            frames,
            values: vec![count, count * 10 * MS],
            labels: vec![],
        }
    };
    ProfileData {
        sample_types: vec![
            ("samples".into(), "count".into()),
            ("cpu".into(), "nanoseconds".into()),
        ],
        period: ("cpu".into(), "nanoseconds".into(), 10 * MS),
        samples: vec![
            sample("a;b;c", 1),
            sample("a;b;b", 2),
            sample("a", 3),
            sample("a;b;a;b", 4),
        ],
        ..ProfileData::default()
    }
}

fn profile() -> Profile {
    encode(&data(), &ProcMaps::default(), |a| {
        vec![Default::default(); a.len()]
    })
}

fn stat(name: &str, flat: i64, cum: i64) -> FunctionStat {
    FunctionStat {
        name: name.into(),
        flat,
        cum,
    }
}

#[test]
fn flat_and_cum_with_recursion() {
    let s = summarize(&[profile()], None).unwrap();
    assert_eq!(
        s.sample_type,
        ("cpu".to_string(), "nanoseconds".to_string())
    );
    assert_eq!((s.total, s.samples), (100 * MS, 10));
    assert_eq!(
        s.functions,
        [
            stat("b", 60 * MS, 70 * MS),
            stat("a", 30 * MS, 100 * MS),
            stat("c", 10 * MS, 10 * MS)
        ]
    );
    let folded: Vec<(&str, i64)> = s
        .folded
        .iter()
        .map(|(k, v)| (k.as_str(), *v / MS))
        .collect();
    assert_eq!(
        folded,
        [("a", 30), ("a;b;a;b", 40), ("a;b;b", 20), ("a;b;c", 10)]
    );

    // Another sample type by name or index; several profiles are merged.
    let counts = summarize(&[profile(), profile()], Some("samples")).unwrap();
    assert_eq!(
        (counts.total, counts.functions[0].clone()),
        (20, stat("b", 12, 14))
    );
    assert_eq!(summarize(&[profile()], Some("0")).unwrap().total, 10);
    assert!(summarize(&[profile()], Some("alloc")).is_err());
}

#[test]
fn top_table_and_values() {
    assert_eq!(report::format_value(999, "nanoseconds"), "999ns");
    assert_eq!(report::format_value(1_500, "nanoseconds"), "1.50us");
    assert_eq!(report::format_value(30 * MS, "nanoseconds"), "30.00ms");
    assert_eq!(report::format_value(2_500_000_000, "nanoseconds"), "2.50s");
    assert_eq!(report::format_value(2048, "bytes"), "2.00KiB");
    assert_eq!(report::format_value(42, "count"), "42");
    let s = summarize(&[profile()], None).unwrap();
    let table = report::render_top(&s, 2, 1);
    assert!(table.contains("Total: 100.00ms in 10 samples"), "{table}");
    assert!(table.contains("Showing top 2 of 3 functions"), "{table}");
    let rows: Vec<&str> = table.lines().skip(4).collect();
    assert_eq!(rows.len(), 2, "{table}");
    let cols: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cols, ["60.00ms", "60.00%", "70.00ms", "70.00%", "b"]);
}

#[test]
fn report_writes_a_flamegraph() {
    let dir = std::env::temp_dir().join(format!("osprey-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = vec![
        write_profile(&dir, &data()).unwrap(),
        write_profile(&dir, &data()).unwrap(),
    ];
    let svg = dir.join("flame.svg");
    report::run(&files, 10, Some(&svg), None).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("osprey"),
        "not a flamegraph"
    );
    for frame in [
        "<title>all (200,000,000 nanoseconds",
        "<title>b (140,000,000 nanoseconds",
        "<title>c (",
    ] {
        assert!(text.contains(frame), "flamegraph lacks {frame:?}");
    }
    assert!(report::run(&[dir.join("missing.pb.gz")], 10, None, None).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
