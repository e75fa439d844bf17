//! OpenTelemetry span labels on Python samples, read from outside: the real
//! `opentelemetry-sdk` (PyPI, per interpreter: `osprey_testkit::python::
//! otel_sdk`) in `py/otel_spans.py`, three threads each running spans of
//! their own traces. At least 90% of the CPU samples inside a span carry a
//! span id that thread used there, its trace id and its local root; samples
//! outside spans carry none; no sample carries ids its thread never used.
//! asyncio tasks interleaving on one thread, each in its own spans: their
//! samples carry the running task's span (`tasks`). A running thread's span
//! is copied at its sampling interrupt with its stack (nearly every sample of
//! one is: `copied_at_the_interrupt`).
//! Then what one lookup costs the sampler (CPU, memory reads) is measured
//! on the live program and printed. `osprey exec`/`attach` end to end:
//! osprey-cli's `tests/python_spans.rs`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use osprey_python::open_target;
use osprey_python::sampling::otel_context::Spans;
use osprey_python::threads::list_tstates;
use osprey_testkit::otel::{check_requests, check_spans};
use osprey_testkit::profile::read_profiles;
use osprey_testkit::run::thread_cpu;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/otel_spans.py")
}

/// CPU and memory reads of one span lookup, over the live program's threads.
fn cost(name: &str, pid: i32) {
    let t = open_target(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut spans = Spans::default();
    let tstates: Vec<u64> = list_tstates(&t).unwrap().iter().map(|ts| ts.addr).collect();
    // The first read finds the variable (once per process): not counted.
    for &ts in &tstates {
        let m = spans.mark(&t, ts, false);
        let _ = spans.read(&t, ts, m);
    }
    let (before, stats) = (thread_cpu(), spans.stats.clone());
    // CPU and reads of the lookups that found a span, and of the others.
    let mut split = [(Duration::ZERO, 0u64, 0u64); 2];
    for _ in 0..500 {
        for &ts in &tstates {
            let (at, reads) = (thread_cpu(), spans.stats.reads);
            let m = spans.mark(&t, ts, false);
            let got = spans.read(&t, ts, m).is_ok_and(|s| s.is_some()) as usize;
            split[got].0 += thread_cpu() - at;
            split[got].1 += spans.stats.reads - reads;
            split[got].2 += 1;
        }
    }
    let cpu = thread_cpu() - before;
    let n = spans.stats.lookups - stats.lookups;
    let found = spans.stats.found - stats.found;
    let reads = (spans.stats.reads - stats.reads) as f64 / n as f64;
    let each = |(c, r, k): (Duration, u64, u64)| {
        format!("{:.1} µs, {:.1} reads", c.as_secs_f64() * 1e6 / k.max(1) as f64, r as f64 / k.max(1) as f64)
    };
    eprintln!(
        "{name}: span lookup: {:.1} µs CPU, {reads:.1} memory reads ({n} lookups over {} threads, {found} in a span: {}; others: {}; {} torn, {} changed)",
        cpu.as_secs_f64() * 1e6 / n as f64,
        tstates.len(),
        each(split[1]),
        each(split[0]),
        spans.stats.torn - stats.torn,
        spans.stats.changed - stats.changed
    );
    assert!(found > 0, "{name}: no lookup found a span");
    assert!(reads <= 40.0, "{name}: {reads} reads per lookup");
}

/// The profiles as pprof files read back.
/// The spans of running threads were copied at their interrupts with their
/// stacks (root: the tests run as root), the walk failing on few.
fn copied_at_the_interrupt(name: &str, s: &osprey_python::sampling::otel_context::SpanStats) {
    assert!(s.copied >= 50 && s.not_copied * 10 <= s.copied, "{name}: spans copied at the interrupt: {s:?}");
}

fn as_pprof(tag: &str, data: &[osprey_pprof::ProfileData]) -> Vec<osprey_pprof::pprof::Profile> {
    let dir = osprey_testkit::tempdir(&format!("spans-{tag}"));
    for d in data {
        osprey_pprof::write_profile(&dir, d).unwrap();
    }
    let profiles = read_profiles(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    profiles
}

fn spans(name: &str) {
    spans_with(name, &[]);
}

/// [`spans`] with each thread's context holding 40 more variables: the HAMT
/// walked at the interrupt goes through an array node.
#[test]
fn spans_under_an_array_node() {
    spans_with("3.12", &[("OSPREY_EXTRA_VARS", "40")]);
}

fn spans_with(name: &str, env: &[(&str, &str)]) {
    let Some(py) = common::python(name) else { return };
    let Some(sdk) = osprey_testkit::python::otel_sdk(&py, name) else { return };
    // Three busy threads and the sampler: the whole machine.
    let _slots = common::slots(2);
    osprey_testkit::run::rerun_on_noise(2, |last| {
        let out = py.scratch("spans");
        let mut vars = vec![("PYTHONPATH", sdk.as_str())];
        vars.extend_from_slice(env);
        let w = py.start_script_env(&fixture(), &[&out, "3", "4"], &vars);
        std::thread::sleep(Duration::from_millis(300));
        cost(name, w.pid());
        let stop = AtomicBool::new(false);
        let (data, summary) = common::collect(w.pid(), &common::options(100, None), &stop);
        drop(w);
        let profiles = as_pprof(name, &data);
        let used_file = py.host_path(&out);
        eprintln!("{name}: span reads {:?}; warnings {:?}", summary.spans, summary.warnings);
        let checked = check_spans(name, &profiles, &used_file, Some(3), last);
        let _ = std::fs::remove_file(&used_file);
        assert!(summary.spans.torn * 100 <= summary.spans.lookups, "{name}: torn reads {:?}", summary.spans);
        copied_at_the_interrupt(name, &summary.spans);
        checked
    });
}

/// A WSGI app instrumented by `opentelemetry-instrumentation-wsgi` on a
/// threading wsgiref server (`py/otel_wsgi.py`), three clients sending
/// requests with remote parents: the samples of each request's thread carry
/// its server span, whose local root is itself (its parent is remote).
#[test]
fn wsgi_server() {
    let name = "3.12";
    let Some(py) = common::python(name) else { return };
    let Some(pkgs) = osprey_testkit::python::otel_sdk_wsgi(&py, name) else { return };
    let _slots = common::slots(2);
    let out = py.scratch("wsgi");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/otel_wsgi.py");
    let w = py.start_script_env(&script, &[&out, "3", "5"], &[("PYTHONPATH", &pkgs)]);
    let stop = AtomicBool::new(false);
    let (data, summary) = common::collect(w.pid(), &common::options(100, None), &stop);
    drop(w);
    let profiles = as_pprof(name, &data);
    let used_file = py.host_path(&out);
    eprintln!("wsgi: span reads {:?}; warnings {:?}", summary.spans, summary.warnings);
    // A thread per request: as many threads as requests.
    check_spans("wsgi", &profiles, &used_file, None, true);
    copied_at_the_interrupt("wsgi", &summary.spans);
    let _ = std::fs::remove_file(&used_file);
}

/// asyncio tasks on one thread, each running spans of its own traces and
/// interleaving with the others inside them (`py/otel_request.py` as a
/// script): at least 90% of the CPU samples in a task's span carry that
/// very span (the thread state's context is the running task's), none a
/// span of no task of the thread.
fn tasks(name: &str) {
    let Some(py) = common::python(name) else { return };
    let Some(sdk) = osprey_testkit::python::otel_sdk(&py, name) else { return };
    let _slots = common::slots(1);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/otel_request.py");
    let t = osprey_testkit::run::rerun_on_noise(2, |last| {
        let out = py.scratch("tasks");
        let w = py.start_script_env(&script, &[&out, "4", "4"], &[("PYTHONPATH", &sdk)]);
        let stop = AtomicBool::new(false);
        let (data, summary) = common::collect(w.pid(), &common::options(100, None), &stop);
        drop(w);
        let profiles = as_pprof(&format!("tasks-{name}"), &data);
        let used_file = py.host_path(&out);
        eprintln!("{name} tasks: span reads {:?}; warnings {:?}", summary.spans, summary.warnings);
        let t = check_requests(&format!("{name} tasks"), &profiles, &used_file, 60, last);
        copied_at_the_interrupt(name, &summary.spans);
        let _ = std::fs::remove_file(&used_file);
        t
    });
    assert_eq!(t.threads, 1, "{name}: tasks on {} threads", t.threads);
}

osprey_testkit::per_interpreter!(only tasks;
    tasks312 => "3.12", tasks_forky314 => "forky-3.14", tasks_forky315 => "forky-3.15");

/// An `opentelemetry.context` whose runtime context is not a `ContextVar`
/// (`py/otel_other/`): one warning saying so, no span labels, the stacks
/// as usual.
#[test]
fn other_runtime_context_is_said_once() {
    let Some(py) = common::python("3.12") else { return };
    let _slot = common::slots(1);
    let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/otel_other");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/otel_other.py");
    let w = py.start_script_env(&script, &["3"], &[("PYTHONPATH", other.to_str().unwrap())]);
    let stop = AtomicBool::new(false);
    let (data, summary) = common::collect(w.pid(), &common::options(100, Some(1.5)), &stop);
    let said: Vec<&String> = summary.warnings.iter().filter(|w| w.contains("OpenTelemetry")).collect();
    assert_eq!(said.len(), 1, "{:?}", summary.warnings);
    assert!(said[0].contains("other than contextvars"), "{said:?}");
    let samples: usize = data.iter().map(|d| d.samples.len()).sum();
    assert!(samples > 0);
    let labelled = data.iter().flat_map(|d| &d.samples).filter(|s| s.labels.iter().any(|l| l.key == "span id")).count();
    assert_eq!(labelled, 0);
    assert_eq!(summary.spans.lookups, 0, "{:?}", summary.spans);
}

osprey_testkit::per_interpreter!(only spans;
    py38 => "3.8", py39 => "3.9", py310 => "3.10", py311 => "3.11", py312 => "3.12", py313 => "3.13",
    forky314 => "forky-3.14", forky315 => "forky-3.15", ft313 => "3.13t", ft314 => "3.14t");
