//! `osprey exec` and `osprey attach` on a Python program instrumented with
//! the real `opentelemetry-sdk` (osprey-python's `tests/py/otel_spans.py`,
//! three threads running spans of their own traces), no change to it: the
//! pprof files read back carry, on at least 90% of the CPU samples taken
//! inside a span, the `span id`, `trace id` and `local root span id` that
//! thread used there; samples outside spans carry none, and no sample ids
//! its thread never used; asyncio tasks (3.14, 3.15) carry the running
//! task's span. Per interpreter reading details and costs:
//! osprey-python's `tests/otel_spans.rs`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use osprey_testkit::cli::{attach_into, exec_into};
use osprey_testkit::otel::{check_requests, check_spans};
use osprey_testkit::profile::read_profiles;
use osprey_testkit::python::{otel_sdk, python, slots, Py, PY_CRATE};
use osprey_testkit::run::rerun_on_noise;
use osprey_testkit::tempdir;

fn fixture() -> PathBuf {
    Path::new(PY_CRATE).join("tests/py/otel_spans.py")
}

/// Checks the profiles in `out` against the spans the program wrote
/// (None: run again, see `check_spans`).
fn check(name: &str, py: &Py, out: &Path, used_file: &str, last: bool) -> Option<()> {
    let profiles = read_profiles(out);
    let _ = std::fs::remove_dir_all(out);
    let host = py.host_path(used_file);
    let t = check_spans(name, &profiles, &host, Some(3), last);
    let _ = std::fs::remove_file(&host);
    t.map(|_| ())
}

fn exec(name: &str) {
    let Some(py) = python(name) else { return };
    let Some(sdk) = otel_sdk(&py, name) else { return };
    let _slots = slots(2);
    rerun_on_noise(2, |last| {
        let out = tempdir(&format!("spans-{name}"));
        let used = py.scratch("spans");
        let script = py.script_at(&fixture());
        let mut cmd = py.argv();
        cmd.extend([script, used.clone(), "3".into(), "4".into()]);
        exec_into(&out, &["--hz", "100"], &cmd, &[("PYTHONPATH", &sdk)]);
        check(name, &py, &out, &used, last)
    });
}

osprey_testkit::per_interpreter!(only exec;
    exec38 => "3.8", exec312 => "3.12", exec313 => "3.13", exec_forky314 => "forky-3.14");

/// `osprey exec` on asyncio tasks interleaving on one thread, each in its
/// own spans (osprey-python's `tests/py/otel_request.py`): their samples
/// carry the span of the task that was running.
fn exec_tasks(name: &str) {
    let Some(py) = python(name) else { return };
    let Some(sdk) = otel_sdk(&py, name) else { return };
    let _slots = slots(1);
    let script = py.script_at(&Path::new(PY_CRATE).join("tests/py/otel_request.py"));
    let t = rerun_on_noise(2, |last| {
        let out = tempdir(&format!("tasks-{name}"));
        let used = py.scratch("tasks");
        let mut cmd = py.argv();
        cmd.extend([script.clone(), used.clone(), "4".into(), "4".into()]);
        exec_into(&out, &["--hz", "100"], &cmd, &[("PYTHONPATH", &sdk)]);
        let profiles = read_profiles(&out);
        let _ = std::fs::remove_dir_all(&out);
        let host = py.host_path(&used);
        let t = check_requests(&format!("exec {name} tasks"), &profiles, &host, 60, last);
        let _ = std::fs::remove_file(&host);
        t
    });
    assert_eq!(t.threads, 1, "{name}: tasks on {} threads", t.threads);
}

osprey_testkit::per_interpreter!(only exec_tasks; exec_tasks_forky314 => "forky-3.14", exec_tasks_forky315 => "forky-3.15");

/// `osprey attach --pid` to the program once its threads run.
#[test]
fn attach() {
    let name = "3.11";
    let Some(py) = python(name) else { return };
    let Some(sdk) = otel_sdk(&py, name) else { return };
    let _slots = slots(2);
    let script = py.script_at(&fixture());
    rerun_on_noise(2, |last| {
        let used = py.scratch("spans");
        let mut child =
            py.command(&[&script, &used, "3", "5"]).env("PYTHONPATH", &sdk).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let out = tempdir("spans-attach");
        attach_into(&out, child.id(), &["--duration", "4"]);
        let status = child.wait().unwrap();
        assert!(status.success(), "the program failed");
        check(name, &py, &out, &used, last)
    });
}
