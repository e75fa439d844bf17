//! End to end: `osprey exec` with backends, against loopback receivers.
//! CPython programs go through the out-of-process sampler's sink; native
//! ones get the configuration as `OSPREY_*` variables.

use osprey_testkit::backends::*;
use osprey_testkit::python::interpreter;
use osprey_testkit::{osprey, tempdir};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BUSY: &str = "import time\nt=time.time()\nwhile time.time()-t < 1.6: sum(range(1000))\nprint(repr(time.time()), flush=True)\nraise SystemExit(3)\n";

#[test]
fn python_program_to_pyroscope_every_period() {
    let Some(py) = interpreter("3.11") else { return };
    let r = Receiver::start(|_, _| ok());
    let dir = tempdir("pyro");
    let out = Command::new(osprey())
        .current_dir(&dir)
        .args([
            "exec",
            "--period",
            "0.5",
            "--service",
            "shop",
            "--env",
            "test",
            "--tag",
            "team:core",
            "--pyroscope",
            &r.url,
            "--",
        ])
        .arg(&py)
        .args(["-c", BUSY])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let reqs = r.wait_for(2, Duration::from_secs(2));
    assert!(reqs.len() >= 2, "one upload per period: {}", reqs.len());
    for q in &reqs {
        assert_eq!(q.path(), "/ingest");
        assert_eq!(q.query("name").unwrap(), "shop.cpu{env=test,team=core}");
    }
    let samples: i64 = reqs.iter().map(|q| sample_count(&q.body)).sum();
    assert!(samples >= 100, "about 160 samples at 100 Hz over 1.6 s: {samples}");
    assert!(!dir.join("profiles").exists(), "no files unless --out with a backend");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pyroscope:") && err.contains("profiles delivered"), "{err}");
    // --out as well: files written too. The program runs long enough to be
    // sampled on a loaded machine (`print(1)` alone may end before the
    // sampler's second pass: then there is no profile, and osprey says so).
    let out = Command::new(osprey())
        .current_dir(&dir)
        .args(["exec", "--period", "5", "--out", "files", "--pyroscope", &r.url, "--"])
        .arg(&py)
        .args(["-c", "import time\nt=time.process_time()\nwhile time.process_time()-t < 0.3: pass"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let files = std::fs::read_dir(dir.join("files"));
    assert!(files.is_ok_and(|f| f.count() >= 1), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hung_backend_delays_exit_by_at_most_the_exit_wait() {
    let Some(py) = interpreter("3.11") else { return };
    let r = Receiver::start(|_, _| Answer::Hang);
    let dir = tempdir("hung");
    let out = Command::new(osprey())
        .current_dir(&dir)
        .args(["exec", "--period", "60", "--exit-wait", "1", "--datadog", &r.url, "--"])
        .arg(&py)
        .args(["-c", BUSY])
        .output()
        .unwrap();
    let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let exited: f64 = stdout.trim().parse().unwrap();
    let lag = end - exited;
    eprintln!("hung backend, --exit-wait 1: program's end to osprey's end {lag:.2} s");
    assert_eq!(out.status.code(), Some(3), "the program's status, untouched");
    assert!(r.count() >= 1, "the last profile was sent");
    assert!(lag < 2.5, "{lag}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 not delivered by exit"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_configuration_exits_2_before_the_program_runs() {
    let dir = tempdir("bad");
    let marker = dir.join("ran");
    for (args, msg) in [
        (vec!["--tag", "nocolon"], "--tag: tag \"nocolon\" is not KEY:VALUE"),
        (vec!["--datadog", "ftp://h"], "--datadog: unsupported scheme \"ftp\""),
        (vec!["--otlp", "http://h:99999"], "--otlp: \"http://h:99999\" is not a valid URL (bad port)"),
    ] {
        let t = Instant::now();
        let out = Command::new(osprey())
            .current_dir(&dir)
            .arg("exec")
            .args(&args)
            .args(["--", "sh", "-c", &format!("touch {}", marker.display())])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(msg), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    let out = Command::new(osprey())
        .current_dir(&dir)
        .env("DD_TAGS", "a:b broken")
        .args(["exec", "--datadog", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DD_TAGS: tag \"broken\""));
    assert!(!marker.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn native_programs_get_the_configuration_as_osprey_variables() {
    let dir = tempdir("native");
    let out = Command::new(osprey())
        .current_dir(&dir)
        .env("DD_AGENT_HOST", "127.0.0.9")
        .args([
            "exec",
            "--service",
            "s",
            "--version",
            "1.0",
            "--tag",
            "a:b",
            "--datadog",
            "--otlp",
            "http://127.0.0.1:1/x",
            "--",
            "env",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let vars: Vec<&str> = text.lines().filter(|l| l.starts_with("OSPREY_")).collect();
    for v in [
        "OSPREY_SERVICE=s",
        "OSPREY_VERSION=1.0",
        "OSPREY_TAGS=a:b",
        "OSPREY_DATADOG=http://127.0.0.9:8126/profiling/v1/input",
        "OSPREY_OTLP=http://127.0.0.1:1/x",
        "OSPREY_FILES=0",
        "OSPREY_TIMELINE=1",
    ] {
        assert!(vars.contains(&v), "{v} not in {vars:?}");
    }
    // What the agent parses from them: the same configuration.
    let env: Vec<(String, String)> =
        text.lines().filter_map(|l| l.split_once('=')).map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let c = osprey_upload::UploadConfig::resolve(&Default::default(), "env", &|k| {
        env.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    assert_eq!((c.service.as_str(), c.out.is_none()), ("s", true));
    assert_eq!(c.datadog.unwrap().url, "http://127.0.0.9:8126/profiling/v1/input");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With Datadog the timeline is on: every stack sample of the native agent
/// carries its time, inside the profile's time range.
fn timeline_within_profile(pprof: &[u8]) {
    let p: osprey_pprof::pprof::Profile = prost::Message::decode(&gunzip(pprof)[..]).unwrap();
    let key = p.string_table.iter().position(|s| s == osprey_pprof::TIMESTAMP_LABEL).map(|i| i as i64);
    let (start, end) = (p.time_nanos, p.time_nanos + p.duration_nanos);
    let mut stamped = 0;
    for s in p.sample.iter().filter(|s| s.value[0] > 0 && s.location_id.len() > 1) {
        let at = s.label.iter().find(|l| Some(l.key) == key).map(|l| l.num);
        let at = at.unwrap_or_else(|| panic!("a stack sample without {}", osprey_pprof::TIMESTAMP_LABEL));
        assert!((start - 50_000_000..=end + 50_000_000).contains(&at), "{at} outside [{start}, {end}]");
        assert_eq!(s.value[0], 1, "one sample per timestamped entry");
        stamped += 1;
    }
    assert!(stamped > 0 || p.sample.is_empty());
}

/// A native program under `osprey exec`: the preloaded agent's collector
/// delivers each period to the backend, files only with --out, and at exit
/// a backend that never answers holds the program at most --exit-wait.
#[test]
fn native_program_delivers_through_the_preloaded_agent() {
    let r = Receiver::start(|_, _| ok());
    let dir = tempdir("native-dd");
    // The bundled demo: 2 threads of CPU work, then exit() (dash would `_exit`, skipping the last flush).
    let demo = osprey().parent().unwrap().join("osprey-demo");
    let demo = demo.to_str().unwrap();
    let out = Command::new(osprey())
        .current_dir(&dir)
        .args(["exec", "--period", "0.3", "--service", "loop", "--datadog", &r.url, "--", demo, "--threads", "2"])
        .args(["--seconds", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let reqs = r.wait_for(2, Duration::from_secs(5));
    assert!(reqs.len() >= 2, "a profile per period and a last one: {}", reqs.len());
    let mut samples = 0;
    for q in &reqs {
        assert_eq!(q.path(), "/profiling/v1/input");
        let parts = multipart(q.header("Content-Type").unwrap(), &q.body);
        let event: serde_json::Value = serde_json::from_slice(&parts[0].3).unwrap();
        assert_eq!(event["family"], "native");
        assert!(event["tags_profiler"].as_str().unwrap().contains("service:loop"));
        samples += sample_count(&parts[1].3);
        timeline_within_profile(&parts[1].3);
        let prov: serde_json::Value = serde_json::from_slice(&parts[2].3).unwrap();
        assert!(prov["v1"].as_array().unwrap().iter().any(|e| e["kind"] == "executable"), "{prov}");
    }
    assert!(samples > 20, "{samples}");
    assert!(!dir.join("profiles").exists(), "no files without --out");

    let hung = Receiver::start(|_, _| Answer::Hang);
    let t = Instant::now();
    let out = Command::new(osprey())
        .current_dir(&dir)
        .args(["exec", "--period", "60", "--exit-wait", "1", "--datadog", &hung.url, "--", demo, "--threads", "1"])
        .args(["--seconds", "0.5"])
        .output()
        .unwrap();
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(hung.count(), 1, "the last profile was sent");
    eprintln!("native, hung backend, --exit-wait 1: whole run {took:?}");
    assert!(took < Duration::from_millis(3500), "0.5 s of work + at most 1 s of exit wait: {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
