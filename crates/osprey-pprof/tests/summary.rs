//! `summary` and the `top` table on a hand-built profile with known numbers.

use osprey_pprof::encode::encode;
use osprey_pprof::maps::ProcMaps;
use osprey_pprof::pprof::Profile;
use osprey_pprof::top::{format_value, render_top};
use osprey_pprof::{summarize, Frame, FunctionStat, ProfileData, Sample};
use osprey_testkit::profile::folded;

const MS: i64 = 1_000_000;

/// Stacks (root first, as written) and their cpu time in ms:
/// a;b;c 10, a;b;b 20 (recursion), a 30, a;b;a;b 40 (mutual recursion).
fn data() -> ProfileData {
    folded(&[("a;b;c", 1), ("a;b;b", 2), ("a", 3), ("a;b;a;b", 4)])
}

fn profile() -> Profile {
    encode(&data(), &ProcMaps::default(), |a| vec![Default::default(); a.len()], Vec::new)
}

fn stat(name: &str, flat: i64, cum: i64) -> FunctionStat {
    FunctionStat { name: name.into(), flat, cum }
}

#[test]
fn flat_and_cum_with_recursion() {
    let s = summarize(&[profile()], None).unwrap();
    assert_eq!(s.sample_type, ("cpu".to_string(), "nanoseconds".to_string()));
    assert_eq!((s.total, s.samples), (100 * MS, 10));
    assert_eq!(s.functions, [stat("b", 60 * MS, 70 * MS), stat("a", 30 * MS, 100 * MS), stat("c", 10 * MS, 10 * MS)]);
    let folded: Vec<(&str, i64)> = s.folded.iter().map(|(k, v)| (k.as_str(), *v / MS)).collect();
    assert_eq!(folded, [("a", 30), ("a;b;a;b", 40), ("a;b;b", 20), ("a;b;c", 10)]);

    // Another sample type by name or index; several profiles are merged.
    let counts = summarize(&[profile(), profile()], Some("samples")).unwrap();
    assert_eq!((counts.total, counts.functions[0].clone()), (20, stat("b", 12, 14)));
    assert_eq!(summarize(&[profile()], Some("0")).unwrap().total, 10);
    assert!(summarize(&[profile()], Some("alloc")).is_err());
}

#[test]
fn top_table_and_values() {
    assert_eq!(format_value(999, "nanoseconds"), "999ns");
    assert_eq!(format_value(1_500, "nanoseconds"), "1.50us");
    assert_eq!(format_value(30 * MS, "nanoseconds"), "30.00ms");
    assert_eq!(format_value(2_500_000_000, "nanoseconds"), "2.50s");
    assert_eq!(format_value(2048, "bytes"), "2.00KiB");
    assert_eq!(format_value(42, "count"), "42");
    let s = summarize(&[profile()], None).unwrap();
    let table = render_top(&s, 2, 1);
    assert!(table.contains("Total: 100.00ms in 10 samples"), "{table}");
    assert!(table.contains("Showing top 2 of 3 functions"), "{table}");
    let rows: Vec<&str> = table.lines().skip(4).collect();
    assert_eq!(rows.len(), 2, "{table}");
    let cols: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cols, ["60.00ms", "60.00%", "70.00ms", "70.00%", "b"]);
}

/// Samples measured after symbolization are encoded with the others, and
/// `late` runs after `symbolize` (the order the agent's own CPU relies on).
#[test]
fn late_samples_come_after_symbolization() {
    let mut data = data();
    data.samples.push(Sample {
        frames: vec![Frame::Native { addr: 0x1234, return_address: false }],
        values: vec![1, 10 * MS],
        labels: vec![],
    });
    let order = std::cell::RefCell::new(Vec::new());
    let p = encode(
        &data,
        &ProcMaps::default(),
        |a| {
            order.borrow_mut().push("symbolize");
            vec![Default::default(); a.len()]
        },
        || {
            order.borrow_mut().push("late");
            vec![Sample { frames: vec![Frame::Synthetic("[late]".into())], values: vec![0, 5 * MS], labels: vec![] }]
        },
    );
    assert_eq!(*order.borrow(), ["symbolize", "late"]);
    let s = summarize(&[p], None).unwrap();
    assert_eq!(s.total, 115 * MS);
    assert!(s.functions.contains(&stat("[late]", 5 * MS, 5 * MS)), "{:?}", s.functions);
}
