//! OTLP delivery into a real OpenTelemetry Collector (v0.165.0, built by
//! `tests/collector/build.sh`; skipped with one line when it is not built):
//! `osprey exec --otlp --out` on the demo, then the collector's debug
//! exporter log (verbosity `detailed`) must show every period's profile,
//! the same sample counts as the local files, the demo's functions and the
//! thread labels, the resource attributes, and no warning or error.
//!
//! Needs the workspace built (`osprey`, the demo, the agent libraries).

use osprey_testkit::paths::{demo, osprey, otelcol};
use osprey_testkit::profile::{profile_files, read_profiles};
use osprey_testkit::tempdir;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The collector, killed on drop; its log (stdout and stderr) in `log`.
struct Collector {
    child: Child,
    log: std::path::PathBuf,
}

impl Collector {
    fn start(bin: &Path, dir: &Path, port: u16) -> Collector {
        let config = dir.join("collector.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  debug:\n    verbosity: detailed\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [debug]\n"
            ),
        )
        .unwrap();
        let log = dir.join("collector.log");
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(["--feature-gates=service.profilesSupport", "--config"])
            .arg(&config)
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut c = Collector { child, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !c.text().contains("Everything is ready") {
            let exited = c.child.try_wait().unwrap().is_some();
            assert!(!exited && Instant::now() < deadline, "the collector did not start: {}", c.text());
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The sum of the `Values:` of the first `Profile` (samples/count, the first
/// sample type) of one `ResourceProfiles` block of the detailed log.
fn first_profile_samples(block: &str) -> i64 {
    let first = block.split("Profile #1").next().unwrap();
    first
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Values: ["))
        .map(|v| v.trim_end_matches(']').split(' ').map(|n| n.parse::<i64>().unwrap()).sum::<i64>())
        .sum()
}

#[test]
fn the_collector_receives_every_period_intact() {
    let Some(bin) = otelcol() else { return };
    let dir = tempdir("otelcol");
    let port = free_port();
    let collector = Collector::start(&bin, &dir, port);
    let out = dir.join("profiles");
    let o = Command::new(osprey())
        .args(["exec", "--period", "0.5", "--service", "shop", "--version", "1.2.3", "--env", "test"])
        .args(["--otlp", &format!("http://127.0.0.1:{port}"), "--out", out.to_str().unwrap(), "--"])
        .arg(demo())
        .args(["--threads", "2", "--seconds", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("otlp:") && !err.contains("failed"), "{err}");
    // The debug exporter writes each request as it is received; osprey
    // waited for the answers, so the log is complete (but give it a moment).
    std::thread::sleep(Duration::from_millis(500));
    let log = collector.text();
    drop(collector);

    // Local files: samples/count per period.
    let local: Vec<i64> = {
        let mut v: Vec<i64> = read_profiles(&out)
            .iter()
            .map(|p| {
                let i = p.sample_type.iter().position(|t| p.string_table[t.r#type as usize] == "samples").unwrap();
                p.sample.iter().map(|s| s.value[i]).sum()
            })
            .collect();
        v.sort();
        v
    };
    assert!(local.len() >= 3, "a profile per 0.5 s period over 2 s: {local:?}");
    let blocks: Vec<&str> = log.split("ResourceProfiles #0").skip(1).collect();
    let mut received: Vec<i64> = blocks.iter().map(|b| first_profile_samples(b)).collect();
    received.sort();
    eprintln!("samples/count per period: files {local:?}, collector {received:?}");
    assert_eq!(received, local, "every period's samples/count, as in the files");

    // The profiled process: files are named osprey-<pid>-<time>-<n>.pb.gz.
    let file = profile_files(&out)[0].file_name().unwrap().to_string_lossy().into_owned();
    let pid = file.split('-').nth(1).unwrap();
    let pid_attr = format!("-> process.pid: Int({pid})");
    for b in &blocks {
        assert!(b.contains(&pid_attr), "{pid_attr} in a request:\n{b}");
        for attr in [
            "-> service.name: Str(shop)",
            "-> service.version: Str(1.2.3)",
            "-> deployment.environment.name: Str(test)",
            "-> host.name: Str(",
            "-> thread.name: Str(",
        ] {
            assert!(b.contains(attr), "{attr} in a request:\n{b}");
        }
    }
    // The dictionary (logged before each request's resource) names the demo's functions.
    for f in ["work_a", "work_b", "work_c"] {
        assert!(log.lines().any(|l| l.trim().ends_with(f) || l.contains(&format!("::{f}"))), "{f} in the string table");
    }
    let bad: Vec<&str> = log.lines().filter(|l| l.contains("\twarn\t") || l.contains("\terror\t")).collect();
    assert!(bad.is_empty(), "the collector complained: {bad:#?}");
}
