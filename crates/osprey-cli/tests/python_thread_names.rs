//! `osprey exec` on a Python program with named threads (osprey-python's
//! `tests/py/thread_names.py`):
//! each thread's samples carry its Python name in the `thread name` label,
//! full length (beyond the 15 bytes of an OS thread name, which 3.14+ set
//! from it), and a thread renamed while running shows its new name in the
//! later profiles. One test per interpreter: pyenv 3.8–3.13, Debian's
//! static 3.11, and Debian testing's 3.13–3.15 in the forky chroot (see
//! `osprey_testkit::python`); a missing interpreter fails the test
//! unless OSPREY_SKIP_MISSING_PYTHON=1.

use osprey_testkit::profile::{label, read_profiles};
use osprey_testkit::python::{python, slots, Py, PY_CRATE};
use osprey_testkit::{osprey, tempdir};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use osprey_pprof::pprof::Profile;

const LONG_NAME: &str = "a-rather-long-thread-name-beyond-15";

/// Seconds the program runs, and when it renames its thread.
const TOTAL: &str = "5";
const RENAME_AT: &str = "2.5";

fn fixture() -> PathBuf {
    Path::new(PY_CRATE).join("tests/py/thread_names.py")
}

/// Which of the fixture's threads a sample is, by the function it burns in.
fn burner(p: &Profile, s: &osprey_pprof::pprof::Sample) -> Option<&'static str> {
    for id in &s.location_id {
        for l in &p.location[(*id - 1) as usize].line {
            let f = p.string(p.function[(l.function_id - 1) as usize].name);
            for b in ["burn_main", "burn_worker", "burn_long", "burn_renamed"] {
                if f == b {
                    return Some(b);
                }
            }
        }
    }
    None
}

/// The profiles `osprey exec --period 1` wrote for `name`'s run, oldest first.
fn run(py: &Py, name: &str) -> Vec<Profile> {
    let out = tempdir(&format!("names-{name}"));
    let script = py.script_at(&fixture());
    let o = Command::new(osprey())
        .args(["exec", "--hz", "100", "--period", "1", "--out"])
        .arg(&out)
        .arg("--")
        .args(py.argv())
        .args([script.as_str(), TOTAL, RENAME_AT])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{name}: {}\n{stdout}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains(",renamed"), "{name}: the program did not rename its thread: {stdout}");
    let mut profiles = read_profiles(&out);
    let _ = std::fs::remove_dir_all(&out);
    profiles.sort_by_key(|p| p.time_nanos);
    profiles
}

fn thread_names(name: &str) {
    let Some(py) = python(name) else { return };
    let _slot = slots(1);
    let profiles = run(&py, name);
    assert!(profiles.len() >= 3, "{name}: {} profiles (a 5 s run, --period 1)", profiles.len());
    // (thread, name) -> samples, overall and per profile.
    let mut all: BTreeMap<(&str, String), i64> = BTreeMap::new();
    let mut renamed_per_profile: Vec<HashMap<String, i64>> = Vec::new();
    for p in &profiles {
        let mut renamed = HashMap::new();
        for s in &p.sample {
            let Some(b) = burner(p, s) else { continue };
            let n = label(p, s, "thread name")
                .map(|(n, _)| n)
                .unwrap_or_else(|| panic!("{name}: a sample without a thread name"));
            *all.entry((b, n.to_string())).or_default() += s.value[0];
            if b == "burn_renamed" {
                *renamed.entry(n.to_string()).or_default() += s.value[0];
            }
        }
        renamed_per_profile.push(renamed);
    }
    eprintln!("{name}: {all:?}");
    eprintln!("{name}: renamed thread per profile {renamed_per_profile:?}");
    for (b, want) in [("burn_main", "MainThread"), ("burn_worker", "worker-1"), ("burn_long", LONG_NAME)] {
        let total: i64 = all.iter().filter(|(k, _)| k.0 == b).map(|(_, v)| v).sum();
        let named = all.get(&(b, want.to_string())).copied().unwrap_or(0);
        assert!(total >= 50, "{name}: {total} samples in {b}");
        assert!(
            named as f64 >= 0.98 * total as f64,
            "{name}: {named} of {total} samples in {b} named {want:?}: {all:?}"
        );
    }
    // Before the rename: its first name; in the last profile: only the new one.
    let with = |m: &HashMap<String, i64>, n: &str| m.get(n).copied().unwrap_or(0);
    assert!(
        renamed_per_profile.iter().any(|m| with(m, "to-be-renamed") > 20),
        "{name}: no profile shows the thread's first name: {renamed_per_profile:?}"
    );
    // (The very last profile may cover a few milliseconds.)
    let last = renamed_per_profile
        .iter()
        .rev()
        .find(|m| m.values().sum::<i64>() > 20)
        .unwrap_or_else(|| panic!("{name}: few samples of the renamed thread: {renamed_per_profile:?}"));
    let total: i64 = last.values().sum();
    assert_eq!(with(last, "renamed"), total, "{name}: the last profile names the thread {last:?}");
    let other: i64 = all
        .iter()
        .filter(|(k, _)| k.0 == "burn_renamed" && k.1 != "renamed" && k.1 != "to-be-renamed")
        .map(|(_, v)| v)
        .sum();
    assert!(other <= 10, "{name}: {other} samples of the renamed thread under other names: {all:?}");
}

osprey_testkit::per_interpreter!(thread_names);
