//! Real Python servers under OpenTelemetry auto-instrumentation
//! (`opentelemetry-instrument`, no OpenTelemetry code in the app), profiled
//! with `osprey exec`, unchanged, under a load of concurrent requests sent
//! by the test: a Flask app (osprey-python's `tests/py/otel_flask_app.py`) served by
//! gunicorn's threaded workers in two processes, and a FastAPI app
//! (`otel_asgi_app.py`) served by uvicorn, its requests asyncio
//! tasks interleaving on one thread. Each request writes the span it runs
//! in, as `opentelemetry.trace.get_current_span()` gives it, and burns CPU
//! in a function named after that span (`otel_request.py`): at
//! least 90% of the CPU samples in a request carry the `span id`, `trace
//! id` and `local root span id` of that very request, and none ids its
//! thread never served (`osprey_testkit::otel::check_requests`).

use std::path::{Path, PathBuf};

use osprey_pprof::pprof::Profile;
use osprey_testkit::cli::osprey_output;
use osprey_testkit::http::{free_port, serve_under_exec};
use osprey_testkit::otel::{check_requests, read_used, RequestTally};
use osprey_testkit::profile::{cpu_in_span, decode, function_names, label, read_profiles};
use osprey_testkit::python::{otel_servers, python, slots, PY_CRATE};
use osprey_testkit::run::rerun_on_noise;
use osprey_testkit::tempdir;

/// A server's run: its profiles, the requests it wrote (a host path), the
/// requests answered and the tally of its samples.
struct Served {
    out: PathBuf,
    used: PathBuf,
    answered: usize,
    tally: RequestTally,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.out);
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.used);
        }
    }
}

/// Serves `server` (its arguments, `{port}` and `{out}` replaced) under
/// `opentelemetry-instrument` (no exporter) and `osprey exec FLAGS`, with
/// the variables `env` and `clients` client threads for `seconds`; checks
/// the profiles against the requests it wrote, measuring once more if a
/// share missed (`check_requests`).
fn serve(tag: &str, flags: &[&str], server: &[&str], env: &[(&str, &str)], load: (usize, f64)) -> Option<Served> {
    let name = "3.12";
    let py = python(name)?;
    let pkgs = otel_servers(&py, name)?;
    let _slots = slots(2);
    let bin = Path::new(&pkgs).join("bin");
    let fixtures = Path::new(PY_CRATE).join("tests/py");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let pythonpath = format!("{pkgs}:{}", fixtures.display());
    Some(rerun_on_noise(2, |last| {
        let out = tempdir(&format!("{tag}-profiles"));
        let used = py.scratch(&format!("{tag}-spans"));
        let port = free_port();
        let mut cmd = vec![bin.join("opentelemetry-instrument").to_string_lossy().into_owned()];
        let arg = |a: &&str| a.replace("{port}", &port.to_string()).replace("{out}", &out.to_string_lossy());
        cmd.extend(server.iter().map(arg));
        let mut all = vec![
            ("PATH", path.as_str()),
            ("PYTHONPATH", pythonpath.as_str()),
            ("OSPREY_TEST_SPANS", used.as_str()),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_LOGS_EXPORTER", "none"),
        ];
        all.extend_from_slice(env);
        let (o, answered) = serve_under_exec(&out, flags, &cmd, &all, port, (load.0, load.1, "/"));
        let profiles = read_profiles(&out);
        let used = py.host_path(&used);
        eprintln!("{tag}: requests in {}", used.display());
        let tally = check_requests(tag, &profiles, &used, 60, last)?;
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(tally.requests, answered, "{tag}: requests written and answered; osprey: {err}");
        Some(Served { out, used, answered, tally })
    }))
}

/// gunicorn, two worker processes of four threads each (`gthread`), the
/// Flask instrumentation: every thread's samples carry its own request.
#[test]
fn gunicorn_flask() {
    let server = [
        "gunicorn",
        "-k",
        "gthread",
        "-w",
        "2",
        "--threads",
        "4",
        "-b",
        "127.0.0.1:{port}",
        "--control-socket",
        "{out}/gunicorn.ctl",
        "otel_flask_app:app",
    ];
    let Some(s) = serve("gunicorn", &["--children", "--hz", "100"], &server, &[], (4, 5.0)) else { return };
    assert!(s.tally.threads >= 2, "{} requests served by {} threads", s.answered, s.tally.threads);
}

/// uvicorn, the FastAPI instrumentation: the requests are asyncio tasks on
/// the one event loop thread, each in its span while it runs (the thread
/// state's context is the task's then), interleaving between their bursts.
#[test]
fn uvicorn_fastapi() {
    let server = ["uvicorn", "--host", "127.0.0.1", "--port", "{port}", "--no-access-log", "otel_asgi_app:app"];
    let Some(s) = serve("uvicorn", &["--hz", "100"], &server, &[], (4, 5.0)) else { return };
    assert_eq!(s.tally.threads, 1, "{} requests served by {} threads, not one event loop", s.answered, s.tally.threads);
}

/// `osprey report --span` of one request of a Flask service under gunicorn
/// (one process, two threads, two clients) where every 10th request runs
/// `slow_path`, 40 ms of CPU time more than the others' 2 ms, sampled at
/// 100 Hz: each slow request's report holds only samples of its span, in
/// the view `index`, mostly under `slow_path`; the slow requests' CPU by
/// `--span` is about 42 ms on average and over 4 times the fast ones'.
#[test]
fn report_of_one_slow_request() {
    let server = [
        "gunicorn",
        "-k",
        "gthread",
        "-w",
        "1",
        "--threads",
        "2",
        "-b",
        "127.0.0.1:{port}",
        "--control-socket",
        "{out}/gunicorn.ctl",
        "otel_flask_app:app",
    ];
    let env = [("OSPREY_TEST_SLOW_EVERY", "10"), ("OSPREY_TEST_REQUEST_MS", "2")];
    let Some(s) = serve("slow", &["--children", "--hz", "100"], &server, &env, (2, 4.0)) else { return };
    let used = read_used(&s.used);
    let by_kind = |kind: &str| -> Vec<u64> {
        let mut v: Vec<u64> =
            used.values().flat_map(|m| m.iter().filter(|(_, u)| u.kind == kind).map(|(id, _)| *id)).collect();
        v.sort_unstable();
        v
    };
    let (slow, fast) = (by_kind("slow"), by_kind("root"));
    assert!(slow.len() >= 3, "{} slow requests of {}", slow.len(), s.answered);
    // (CPU ms, samples, of them under slow_path) of each slow request.
    let mut ms = Vec::new();
    let mut views = (0usize, 0usize);
    for &span in &slow {
        let Some(p) = span_report(&s.out, span) else {
            ms.push((0.0, 0, 0));
            continue;
        };
        let (cpu, only) = cpu_in_span(&p, span);
        let of = |x, k| label(&p, x, k).map(|l| l.1 as u64) == Some(span);
        let other = p.sample.iter().find(|x| !of(x, "span id") && !of(x, "local root span id"));
        let labels = other.map(|x| {
            ["span id", "local root span id", "thread id", "state"].map(|k| format!("{k}={:?}", label(&p, x, k)))
        });
        assert!(only, "a sample of another request under --span {span:016x}: {labels:?}");
        // The app starts no span of its own: every sample of the request is
        // in its server span (while the client's remote parent is current,
        // around the span, a sample is in no span of this process).
        let child = p.sample.iter().find(|x| !of(x, "span id")).map(|x| label(&p, x, "span id"));
        assert!(child.is_none(), "a sample under --span {span:016x} in span {child:?}");
        let slow_path = p.sample.iter().filter(|x| function_names(&p, x).contains(&"slow_path")).count();
        // The server span also covers the framework's dispatch around the view.
        let in_view = p.sample.iter().filter(|x| function_names(&p, x).contains(&"index")).count();
        views.0 += in_view;
        views.1 += p.sample.len();
        ms.push((cpu as f64 / 1e6, p.sample.len(), slow_path));
    }
    assert!(views.0 * 10 >= views.1 * 9, "{} of {} samples of the slow requests in the view", views.0, views.1);
    ms.sort_by(|a, b| a.0.total_cmp(&b.0));
    let slow_mean = ms.iter().map(|m| m.0).sum::<f64>() / ms.len() as f64;
    // The fast requests' CPU by span, from the profiles (a report each would
    // take minutes): their mean over all of them, sampled or not.
    let profiles = read_profiles(&s.out);
    let mut fast_cpu = 0i64;
    for p in &profiles {
        let cpu = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").unwrap();
        for x in &p.sample {
            let span = label(p, x, "span id").map(|l| l.1 as u64);
            if span.is_some_and(|id| fast.binary_search(&id).is_ok()) {
                assert!(!function_names(p, x).contains(&"slow_path"), "a fast request under slow_path");
                fast_cpu += x.value[cpu];
            }
        }
    }
    let fast_mean = fast_cpu as f64 / 1e6 / fast.len() as f64;
    eprintln!(
        "{} requests: {} slow, CPU by --span (ms, samples, under slow_path): {ms:.1?}; mean {slow_mean:.1} ms; fast ones' mean {fast_mean:.1} ms",
        s.answered,
        slow.len()
    );
    // 42 ms of CPU time (the fast path and the slow one) against 2 ms. A
    // sample carries its thread's CPU since the one before, so a request's
    // figure is off by up to a sampling period at each end, much more when
    // the sampler falls behind on a loaded machine: the mean is checked.
    assert!((21.0..=84.0).contains(&slow_mean), "--span of slow requests: mean {slow_mean:.1} ms: {ms:.1?}");
    assert!(slow_mean >= 4.0 * fast_mean, "slow requests {slow_mean:.1} ms, fast ones {fast_mean:.1} ms");
    let under: usize = ms.iter().map(|m| m.2).sum();
    let samples: usize = ms.iter().map(|m| m.1).sum();
    assert!(under * 2 > samples, "slow requests' samples under slow_path: {under} of {samples}");
}

/// `osprey report OUT --span SPAN` as pprof, None if no sample has it.
fn span_report(out: &Path, span: u64) -> Option<Profile> {
    let id = format!("{span:016x}");
    let file = out.with_extension(format!("span-{id}.pb.gz"));
    let args = ["report", out.to_str().unwrap(), "--span", &id, "--format", "pprof", "-o", file.to_str().unwrap()];
    let o = osprey_output(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && err.contains("no samples") {
        return None;
    }
    assert!(o.status.success(), "osprey report --span {id}: {err}");
    let p = decode(&std::fs::read(&file).unwrap());
    let _ = std::fs::remove_file(&file);
    Some(p)
}
