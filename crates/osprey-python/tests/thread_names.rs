//! Python thread names read from each real interpreter (`py/thread_names.py`):
//! every thread state of the program gets its `threading` name, a renamed
//! thread its new name at the next refresh, and what a refresh costs
//! (memory reads, time) is printed. `osprey exec` end to end: osprey-cli's
//! `tests/python_thread_names.rs`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use osprey_python::open_target;
use osprey_python::thread_names::ThreadNames;
use osprey_python::threads::list_tstates;

const LONG_NAME: &str = "a-rather-long-thread-name-beyond-15";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/thread_names.py")
}

/// The names of the program's thread states after a refresh.
fn names(n: &mut ThreadNames, t: &osprey_python::Target) -> BTreeSet<String> {
    n.refresh(t);
    let list = list_tstates(t).unwrap();
    list.iter().filter_map(|ts| n.name(ts.addr)).map(str::to_string).collect()
}

fn names_and_cost(name: &str) {
    let Some(py) = common::python(name) else { return };
    let _slot = common::slots(1);
    let started = Instant::now();
    // Runs 8 s, renames its thread 1.5 s in.
    let w = py.start_script(&fixture(), &["8", "1.5"]);
    let t = open_target(w.pid()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut n = ThreadNames::default();
    let want = |renamed: &str| -> BTreeSet<String> {
        ["MainThread", "worker-1", LONG_NAME, renamed].into_iter().map(str::to_string).collect()
    };
    assert_eq!(names(&mut n, &t), want("to-be-renamed"), "{name}: before the rename");
    let cold = n.stats.clone();
    let rounds = 20;
    for _ in 0..rounds {
        n.refresh(&t);
    }
    let reads = (n.stats.reads - cold.reads) / rounds;
    let micros = (n.stats.time - cold.time).as_secs_f64() * 1e6 / rounds as f64;
    eprintln!(
        "{name}: first refresh {} reads in {:.0} µs; then {reads} reads in {micros:.0} µs per refresh (4 threads)",
        cold.reads,
        cold.time.as_secs_f64() * 1e6
    );
    assert_eq!(n.stats.failures, 0, "{name}: refreshes failed");
    assert!(reads <= 80, "{name}: {reads} reads per refresh");
    // The rename shows at the next refresh after it.
    let mut last = BTreeSet::new();
    while started.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(100));
        last = names(&mut n, &t);
        if last == want("renamed") {
            break;
        }
    }
    assert_eq!(last, want("renamed"), "{name}: after the rename");
}

osprey_testkit::per_interpreter!(names_and_cost; ft313 => "3.13t", ft314 => "3.14t");
