//! write_profile -> read_profile on native frames of this very test binary,
//! plus interpreted and synthetic frames and labels.

use osprey_pprof::pprof::Profile;
use osprey_pprof::{read_profile, write_profile, Frame, Label, LabelValue, ProfileData, Sample};
use osprey_testkit::profile::cpu_data;
use std::path::PathBuf;

#[inline(never)]
fn alpha_leaf(n: u64) -> u64 {
    (0..n).fold(1u64, |s, i| s.wrapping_mul(31).wrapping_add(i))
}

#[inline(never)]
fn beta_caller(n: u64) -> u64 {
    std::hint::black_box(alpha_leaf(n)).wrapping_add(alpha_leaf(n / 2))
}

fn addr_of(f: fn(u64) -> u64, offset: u64) -> u64 {
    f as usize as u64 + offset
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("osprey-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn labels(tid: i64, trace: &str) -> Vec<Label> {
    vec![
        Label { key: "trace".into(), value: LabelValue::Str(trace.into()) },
        Label { key: "thread id".into(), value: LabelValue::Num(tid) },
    ]
}

fn data() -> ProfileData {
    let stack = vec![
        Frame::Native { addr: addr_of(alpha_leaf, 4), return_address: false },
        Frame::Native { addr: addr_of(beta_caller, 8), return_address: true },
        Frame::Function { name: "py_handler".into(), file: "app.py".into(), line: 12 },
        Frame::Synthetic("[osprey] root".into()),
    ];
    let mut reordered = labels(7, "abc");
    reordered.reverse();
    let sample =
        |frames: &Vec<Frame>, values: Vec<i64>, labels: Vec<Label>| Sample { frames: frames.clone(), values, labels };
    ProfileData {
        samples: vec![
            sample(&stack, vec![1, 10_000_000], labels(7, "abc")),
            sample(&stack, vec![2, 20_000_000], reordered),
            sample(&stack, vec![1, 10_000_000], labels(8, "abc")),
            sample(&vec![Frame::Native { addr: 0x10, return_address: false }], vec![1, 5], vec![]),
            sample(&vec![Frame::Synthetic("[osprey] dropped".into())], vec![4, 0], vec![]),
        ],
        comments: vec!["osprey test".into()],
        lines: true,
        ..cpu_data(vec![])
    }
}

/// Function names of a location, innermost first.
fn names(p: &Profile, location_id: u64) -> Vec<String> {
    let loc = &p.location[location_id as usize - 1];
    assert_eq!(loc.id, location_id);
    loc.line.iter().map(|l| p.string(p.function[l.function_id as usize - 1].name).to_string()).collect()
}

#[test]
fn round_trip() {
    let dir = temp_dir("roundtrip");
    let path = write_profile(&dir, &data()).unwrap();
    let p = read_profile(&path).unwrap();

    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (p.string(t.r#type), p.string(t.unit))).collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = p.period_type.as_ref().unwrap();
    assert_eq!((p.string(pt.r#type), p.string(pt.unit), p.period), ("cpu", "nanoseconds", 10_000_000));
    assert_eq!((p.time_nanos, p.duration_nanos), (1_700_000_000_000_000_000, 60_000_000_000));
    assert_eq!(p.comment.iter().map(|&c| p.string(c)).collect::<Vec<_>>(), ["osprey test"]);

    // Samples 1 and 2 merge (same stack and labels, in another order); 3 differs by tid.
    assert_eq!(p.sample.len(), 4);
    assert_eq!(p.sample[0].value, [3, 30_000_000]);
    assert_eq!(p.sample[1].value, [1, 10_000_000]);
    let label = |s: usize, key: &str| p.sample[s].label.iter().find(|l| p.string(l.key) == key).cloned().unwrap();
    assert_eq!(label(0, "thread id").num, 7);
    assert_eq!(label(1, "thread id").num, 8);
    assert_eq!(p.string(label(0, "trace").str), "abc");
    assert_eq!(label(0, "trace").num, 0);

    // Native frames: demangled names of this binary's functions, with lines.
    let ids = &p.sample[0].location_id;
    assert_eq!(ids.len(), 4);
    let leaf = names(&p, ids[0]);
    assert!(leaf.last().unwrap().contains("alpha_leaf"), "{leaf:?}");
    assert!(names(&p, ids[1]).iter().any(|n| n.contains("beta_caller")), "{:?}", names(&p, ids[1]));
    assert!(leaf.iter().all(|n| !n.starts_with("_ZN") && !n.starts_with("_R") && !n.contains("::h")), "{leaf:?}");
    let leaf_loc = &p.location[ids[0] as usize - 1];
    assert_eq!(leaf_loc.address, addr_of(alpha_leaf, 4));
    assert_eq!(p.location[ids[1] as usize - 1].address, addr_of(beta_caller, 8), "return addresses are kept");
    assert!(leaf_loc.line.last().unwrap().line > 0);
    let file = p.string(p.function[leaf_loc.line.last().unwrap().function_id as usize - 1].filename);
    assert!(file.ends_with("tests/roundtrip.rs"), "{file}");
    assert_eq!(names(&p, ids[2]), ["py_handler"]);
    assert_eq!(p.location[ids[2] as usize - 1].line[0].line, 12);
    assert_eq!(p.location[ids[2] as usize - 1].mapping_id, 0);
    assert_eq!(names(&p, ids[3]), ["[osprey] root"]);

    // mapping[0] is this test binary and holds the native frames.
    let exe = std::env::current_exe().unwrap();
    let m = &p.mapping[0];
    assert_eq!((m.id, p.string(m.filename)), (1, exe.to_str().unwrap()));
    assert!(m.memory_start <= leaf_loc.address && leaf_loc.address < m.memory_limit);
    assert_eq!(leaf_loc.mapping_id, 1);
    assert!(m.has_functions && m.has_filenames && m.has_line_numbers);
    eprintln!("main build id: {:?}", p.string(m.build_id));

    // Unknown address: a location with an address and no lines, no mapping.
    let unknown = &p.location[p.sample[2].location_id[0] as usize - 1];
    assert_eq!((unknown.address, unknown.mapping_id, unknown.line.len()), (0x10, 0, 0));

    // Dedup: one location per distinct frame, one function per distinct name+file.
    let mut strings = p.string_table.clone();
    strings.sort();
    strings.dedup();
    assert_eq!(strings.len(), p.string_table.len());
    assert_eq!(p.location.len(), 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn file_names_are_unique_and_complete() {
    let dir = temp_dir("names").join("nested");
    let d = ProfileData { pid: 4242, ..ProfileData::default() };
    let a = write_profile(&dir, &d).unwrap();
    let b = write_profile(&dir, &d).unwrap();
    assert_ne!(a, b);
    for p in [&a, &b] {
        let name = p.file_name().unwrap().to_str().unwrap();
        let rest = name.strip_prefix("osprey-4242-").unwrap().strip_suffix(".pb.gz").unwrap();
        let (stamp, seq) = rest.split_once('-').unwrap();
        assert!(stamp.len() == 16 && stamp.ends_with('Z') && stamp.as_bytes()[8] == b'T', "{name}");
        seq.parse::<u64>().unwrap();
        assert_eq!(std::fs::read(p).unwrap()[..2], [0x1f, 0x8b]);
    }
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, 2, "no temporary files left behind");
    // The reader also takes uncompressed protobuf.
    let raw = dir.join("raw.pb");
    std::fs::write(&raw, prost::Message::encode_to_vec(&osprey_pprof::to_pprof(&data()))).unwrap();
    assert_eq!(read_profile(&raw).unwrap().sample.len(), 4);
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}
