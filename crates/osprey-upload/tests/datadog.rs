//! Datadog: the real APM test agent (`ddapm-test-agent` from PyPI, which
//! .ci/run installs) on free loopback ports receives a profile; what it
//! received is read back from `/test/session/requests` and checked: the
//! multipart, the event, `code-provenance.json`, and the pprof with
//! `go tool pprof -raw`.

use base64::Engine;
use osprey_testkit::backends::*;
use osprey_upload::{Flags, Language, Meta, UploadConfig, Uploader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct TestAgent {
    child: Child,
    url: String,
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_test_agent() -> TestAgent {
    let port = free_port();
    let child = Command::new("ddapm-test-agent")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--otlp-http-port", &free_port().to_string(), "--otlp-grpc-port", &free_port().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ddapm-test-agent not found: `pip install ddapm-test-agent` (.ci/run does)");
    let url = format!("http://127.0.0.1:{port}");
    let t = Instant::now();
    while ureq::get(&format!("{url}/test/session/requests")).call().is_err() {
        assert!(t.elapsed() < Duration::from_secs(30), "ddapm-test-agent did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    TestAgent { child, url }
}

#[test]
fn the_datadog_test_agent_receives_a_profile() {
    let agent = start_test_agent();
    let flags = Flags {
        datadog: Some(agent.url.clone()),
        env: Some("staging".into()),
        version: Some("1.2.3".into()),
        tags: vec!["team:core".into()],
        ..Default::default()
    };
    let cfg = UploadConfig::resolve(&flags, "billing", &|k| (k == "DD_API_KEY").then(|| "secret-key".into())).unwrap();
    assert!(cfg.timeline, "on by default for Datadog");
    let meta = Meta::new("0a1b2c3d-0000-4000-8000-000000000001", std::process::id() as i32, Language::Native);
    let mut u = Uploader::start(cfg, meta, Duration::from_secs(60));
    let data = profile(40, 2, true);
    let start = data.start_realtime_ns;
    u.submit_profile(&osprey_pprof::to_pprof(&data));
    u.submit_profile(&osprey_pprof::to_pprof(&profile(3, 1, true)));
    let stats = u.shutdown(Duration::from_secs(10));
    assert_eq!(stats[0].delivered, 2, "{stats:?}");

    let body =
        ureq::get(&format!("{}/test/session/requests", agent.url)).call().unwrap().body_mut().read_to_string().unwrap();
    let reqs: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let reqs: Vec<&serde_json::Value> =
        reqs.iter().filter(|r| r["url"].as_str().unwrap().ends_with("/profiling/v1/input")).collect();
    assert_eq!(reqs.len(), 2);
    let r = reqs[0];
    assert_eq!(r["method"], "POST");
    let headers = r["headers"].as_object().unwrap();
    let header =
        |k: &str| headers.iter().find(|(h, _)| h.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str().unwrap().to_string());
    assert_eq!(header("DD-API-KEY").as_deref(), Some("secret-key"));
    let ctype = header("Content-Type").unwrap();
    assert!(ctype.starts_with("multipart/form-data; boundary="), "{ctype}");
    let raw = base64::engine::general_purpose::STANDARD.decode(r["body"].as_str().unwrap()).unwrap();
    let parts = multipart(&ctype, &raw);
    let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["event", "auto.pprof", "code-provenance.json"]);
    assert_eq!(parts[0].1, "event.json");
    assert_eq!(parts[0].2, "application/json");

    let event: serde_json::Value = serde_json::from_slice(&parts[0].3).unwrap();
    assert_eq!(event["version"], "4");
    assert_eq!(event["family"], "native");
    assert_eq!(event["attachments"], serde_json::json!(["auto.pprof", "code-provenance.json"]));
    let tags: Vec<&str> = event["tags_profiler"].as_str().unwrap().split(',').collect();
    for t in [
        "service:billing",
        "env:staging",
        "version:1.2.3",
        "team:core",
        "runtime-id:0a1b2c3d-0000-4000-8000-000000000001",
        "language:native",
    ] {
        assert!(tags.contains(&t), "{t} not in {tags:?}");
    }
    assert!(
        tags.iter().any(|t| t.starts_with("host:")) && tags.iter().any(|t| t.starts_with("profiler_version:osprey-"))
    );
    assert_eq!(event["start"], osprey_upload::rfc3339(start));
    // Contiguous: the second starts where the first ended.
    let raw2 = base64::engine::general_purpose::STANDARD.decode(reqs[1]["body"].as_str().unwrap()).unwrap();
    let ctype2 = reqs[1]["headers"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(h, _)| h.eq_ignore_ascii_case("content-type"))
        .unwrap()
        .1
        .as_str()
        .unwrap()
        .to_string();
    let event2: serde_json::Value = serde_json::from_slice(&multipart(&ctype2, &raw2)[0].3).unwrap();
    assert_eq!(event2["start"], event["end"]);

    let prov: serde_json::Value = serde_json::from_slice(&parts[2].3).unwrap();
    let v1 = prov["v1"].as_array().unwrap();
    let exe = std::env::current_exe().unwrap().display().to_string();
    assert!(v1.iter().any(|e| e["kind"] == "executable" && e["paths"][0] == exe.as_str()), "{prov}");
    assert!(v1.iter().any(|e| e["kind"] == "library" && e["name"].as_str().unwrap().starts_with("libc.so")), "{prov}");

    // The pprof, with go tool pprof.
    let pprof = &parts[1].3;
    assert_eq!(&pprof[..2], &[0x1f, 0x8b], "gzip");
    assert_eq!(sample_count(pprof), 80);
    let p: osprey_pprof::pprof::Profile = prost::Message::decode(&gunzip(pprof)[..]).unwrap();
    let ts_key = p.string_table.iter().position(|s| s == "end_timestamp_ns").expect("timeline label") as i64;
    assert!(p.sample.iter().all(|s| s.label.iter().any(|l| l.key == ts_key && l.num > 0)));
    let file = std::env::temp_dir().join(format!("osprey-dd-{}.pb.gz", std::process::id()));
    std::fs::write(&file, pprof).unwrap();
    let out = Command::new("go").args(["tool", "pprof", "-raw"]).arg(&file).output().expect("go tool pprof");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("samples/count cpu/nanoseconds"), "{text}");
    assert!(text.contains("leaf_7") && text.contains("end_timestamp_ns"), "{text}");
    assert!(text.contains("span id"), "{text}");
}
