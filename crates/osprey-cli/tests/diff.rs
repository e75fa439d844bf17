//! `osprey diff BASE NEW` on a real workload (tests/c/shares.c under
//! `osprey exec`): `varying` doubles its cost between the runs, `steady`
//! keeps it, and the new run is longer: ranked by change of share, varying
//! comes first, and the differential flamegraph draws it red, steady blue.

use osprey_testkit::cc::compile_named;
use osprey_testkit::cli::{exec_into, osprey_ok};
use osprey_testkit::paths::crate_dir;
use osprey_testkit::tempdir;

#[test]
fn the_function_whose_cost_doubled_comes_first() {
    let dir = tempdir("diff");
    let exe = compile_named(crate_dir("osprey-cli").join("tests/c"), "shares", &dir);
    let svg = dir.join("diff.svg");
    // A share measured on a shared machine can stray: up to three runs.
    let mut attempt = 0;
    let text = osprey_testkit::run::rerun_on_noise(3, |last| {
        attempt += 1;
        let (base, new) = (dir.join(format!("base{attempt}")), dir.join(format!("new{attempt}")));
        // Millions of iterations: steady:varying 100:50, then 200:200 (twice
        // as long, varying's share 1/3 -> 1/2).
        exec_into(&base, &["--hz", "1000"], &[exe.as_os_str(), "100".as_ref(), "50".as_ref()], &[]);
        exec_into(&new, &["--hz", "1000"], &[exe.as_os_str(), "200".as_ref(), "200".as_ref()], &[]);
        let text =
            osprey_ok(&["diff", base.to_str().unwrap(), new.to_str().unwrap(), "--flamegraph", svg.to_str().unwrap()]);
        assert!(!last || shares_as_set(&text), "varying not first at 1/3 -> 1/2: {text}");
        if !shares_as_set(&text) {
            eprintln!("run {attempt}: shares off, again:\n{text}");
        }
        shares_as_set(&text).then_some(text)
    });
    let rows: Vec<Vec<&str>> = text.lines().skip(5).map(|l| l.split_whitespace().collect()).collect();
    let steady = rows.iter().find(|r| r.last() == Some(&"steady")).unwrap_or_else(|| panic!("{text}"));
    assert!(steady[4].starts_with('-'), "steady's share shrank: {text}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    let fill = |name: &str| {
        let at = svg.find(&format!("<title>{name} (")).unwrap_or_else(|| panic!("{name} not in the flamegraph"));
        let f = &svg[at..][svg[at..].find("fill=\"rgb(").unwrap() + 10..];
        let rgb: Vec<u32> = f[..f.find(')').unwrap()].split(',').map(|c| c.trim().parse().unwrap()).collect();
        rgb
    };
    let (v, s) = (fill("varying"), fill("steady"));
    assert!(v[0] > v[2], "varying grew: red, not {v:?}");
    assert!(s[2] > s[0], "steady shrank: blue, not {s:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The first row of the diff table is `varying`, from about a third to about a half.
fn shares_as_set(text: &str) -> bool {
    let Some(first) = text.lines().nth(5).map(|l| l.split_whitespace().collect::<Vec<_>>()) else { return false };
    let pct = |f: &str| f.trim_end_matches('%').parse::<f64>().unwrap_or(-1.0);
    // base base% new new% change function
    first.len() == 6
        && first[5] == "varying"
        && (25.0..42.0).contains(&pct(first[1]))
        && (42.0..58.0).contains(&pct(first[3]))
}
