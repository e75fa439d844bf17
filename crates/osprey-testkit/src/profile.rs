//! Reading profiles back: the `*.pb.gz` files an output directory holds,
//! pprof bytes as a backend receives them, labels, and hand-built profile
//! data with known numbers.

use osprey_pprof::pprof::{Location, Profile, Sample};
use osprey_pprof::{Frame, ProfileData};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The `*.pb.gz` files in `dir`, sorted by name (so by pid, then time).
pub fn profile_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    v.sort();
    v
}

/// The profiles in `dir`, read by osprey's reader, in [`profile_files`] order.
pub fn read_profiles(dir: &Path) -> Vec<Profile> {
    profile_files(dir)
        .iter()
        .map(|f| osprey_pprof::read_profile(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect()
}

/// As [`read_profiles`], failing the test if `dir` holds none.
pub fn expect_profiles(dir: &Path) -> Vec<Profile> {
    let ps = read_profiles(dir);
    assert!(!ps.is_empty(), "no *.pb.gz in {}", dir.display());
    ps
}

/// Decompresses gzip `b`.
pub fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut v).unwrap();
    v
}

/// Decodes a pprof, gzip-compressed or not.
pub fn decode(pprof: &[u8]) -> Profile {
    let raw = if pprof.starts_with(&[0x1f, 0x8b]) { gunzip(pprof) } else { pprof.to_vec() };
    prost::Message::decode(&raw[..]).unwrap()
}

/// Sum of the first sample type over a pprof (gzip or not).
pub fn sample_count(pprof: &[u8]) -> i64 {
    decode(pprof).sample.iter().map(|s| s.value[0]).sum()
}

/// The names of `p`'s sample types, in order.
pub fn sample_types(p: &Profile) -> Vec<String> {
    p.sample_type.iter().map(|t| p.string(t.r#type).to_string()).collect()
}

/// Sample `s`'s label `key`: its string (empty for a number) and its number.
pub fn label<'a>(p: &'a Profile, s: &Sample, key: &str) -> Option<(&'a str, i64)> {
    s.label.iter().find(|l| p.string(l.key) == key).map(|l| (p.string(l.str), l.num))
}

/// Profile data of CPU samples (`samples`/count, `cpu`/nanoseconds, 10 ms
/// period) from this process, started at a fixed time for 60 s.
pub fn cpu_data(samples: Vec<osprey_pprof::Sample>) -> ProfileData {
    ProfileData {
        pid: std::process::id() as i32,
        sample_types: vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())],
        period: ("cpu".into(), "nanoseconds".into(), 10_000_000),
        start_realtime_ns: 1_700_000_000_000_000_000,
        duration_ns: 60_000_000_000,
        samples,
        ..ProfileData::default()
    }
}

/// Profile data from folded stacks: each `("root;..;leaf", count)` is one
/// sample of `count` samples and `count` x 10 ms of CPU, its frames
/// functions of `x.py` at line 1. Nothing else is set.
pub fn folded(stacks: &[(&str, i64)]) -> ProfileData {
    const MS: i64 = 1_000_000;
    let f = |n: &str| Frame::Function { name: n.into(), file: "x.py".into(), line: 1 };
    let samples = stacks
        .iter()
        .map(|&(root_first, count)| {
            let frames = root_first.split(';').rev().map(f).collect();
            osprey_pprof::Sample { frames, values: vec![count, count * 10 * MS], labels: vec![] }
        })
        .collect();
    ProfileData {
        sample_types: vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())],
        period: ("cpu".into(), "nanoseconds".into(), 10 * MS),
        samples,
        ..ProfileData::default()
    }
}

/// The function names of sample `s`, leaf first (inlined frames first
/// within a location, as pprof lists them).
pub fn function_names<'a>(p: &'a Profile, s: &Sample) -> Vec<&'a str> {
    let mut out = Vec::new();
    for id in &s.location_id {
        let loc = &p.location[(*id - 1) as usize];
        debug_assert_eq!(loc.id, *id);
        for l in &loc.line {
            out.push(p.string(p.function[(l.function_id - 1) as usize].name));
        }
    }
    out
}

/// The (function name, line) of each frame of sample `s`, leaf first, as
/// [`function_names`] lists them.
pub fn function_lines<'a>(p: &'a Profile, s: &Sample) -> Vec<(&'a str, i64)> {
    let mut out = Vec::new();
    for id in &s.location_id {
        for l in &p.location[(*id - 1) as usize].line {
            out.push((p.string(p.function[(l.function_id - 1) as usize].name), l.line));
        }
    }
    out
}

/// The (function name, file, line) of each line of location `loc`,
/// innermost (inlined) first, as pprof lists them.
pub fn location_lines<'a>(p: &'a Profile, loc: &Location) -> Vec<(&'a str, &'a str, i64)> {
    loc.line
        .iter()
        .map(|l| {
            let f = &p.function[(l.function_id - 1) as usize];
            (p.string(f.name), p.string(f.filename), l.line)
        })
        .collect()
}

/// Total CPU (ns) of `p` and whether every sample is of request `span`:
/// its span id, or its local root span id (a span the request began
/// inside it), is `span`, as `osprey report --span` keeps them.
pub fn cpu_in_span(p: &Profile, span: u64) -> (i64, bool) {
    let cpu = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").unwrap();
    let total = p.sample.iter().map(|s| s.value[cpu]).sum();
    let of = |s, k| label(p, s, k).map(|(_, n)| n as u64) == Some(span);
    let all = p.sample.iter().all(|s| of(s, "span id") || of(s, "local root span id"));
    (total, all)
}
