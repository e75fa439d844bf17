//! OTLP: what the uploader sends is decoded by the official generated
//! Python classes (PyPI `opentelemetry-proto` 1.45, the schema of the Rust
//! crate `opentelemetry-proto` 0.33), not only by our own types.
//! The Python package is looked up in `$OSPREY_OTLP_PYTHONPATH`, else in
//! `target/otlp-python` (where .ci/run installs it).

use osprey_testkit::backends::*;
use osprey_upload::{Flags, Language, Meta, UploadConfig, Uploader};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn python_path() -> PathBuf {
    std::env::var_os("OSPREY_OTLP_PYTHONPATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/otlp-python"))
}

#[test]
fn the_official_classes_decode_what_is_sent() {
    let r = Receiver::start(|_, _| ok());
    let env = |k: &str| match k {
        "OTEL_RESOURCE_ATTRIBUTES" => Some("k8s.pod.name=pod-1,service.namespace=shop".to_string()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("x-api-key=abc%20def".to_string()),
        _ => None,
    };
    let flags = Flags {
        otlp: Some(r.url.clone()),
        service: Some("cart".into()),
        env: Some("prod".into()),
        version: Some("3.1".into()),
        ..Default::default()
    };
    let cfg = UploadConfig::resolve(&flags, "x", &env).unwrap();
    let mut u = Uploader::start(cfg, Meta::new("rt-otlp", 4242, Language::Python), Duration::from_secs(60));
    let data = profile(25, 2, true);
    u.submit_profile(&osprey_pprof::to_pprof(&data));
    assert_eq!(u.shutdown(Duration::from_secs(10))[0].delivered, 1);
    let q = &r.wait_for(1, Duration::from_secs(1))[0];
    assert_eq!(q.path(), "/v1development/profiles");
    assert_eq!(q.header("Content-Type"), Some("application/x-protobuf"));
    assert_eq!(q.header("x-api-key"), Some("abc def"));
    assert_eq!(q.header("Content-Encoding"), Some("gzip"));

    let file = std::env::temp_dir().join(format!("osprey-otlp-{}.bin", std::process::id()));
    std::fs::write(&file, gunzip(&q.body)).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/decode_otlp.py");
    let out = Command::new("python3").arg(&script).arg(&file).env("PYTHONPATH", python_path()).output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "decode_otlp.py failed (pip install --target target/otlp-python opentelemetry-proto==1.45.2): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let res = &v["resources"][0];
    let a = &res["attributes"];
    assert_eq!(a["service.name"], "cart");
    assert_eq!(a["service.version"], "3.1");
    assert_eq!(a["deployment.environment.name"], "prod");
    assert_eq!(a["process.pid"], 4242);
    assert_eq!(a["k8s.pod.name"], "pod-1");
    assert!(a["host.name"].as_str().is_some_and(|h| !h.is_empty()));
    let profiles = res["profiles"].as_array().unwrap();
    let types: Vec<&str> = profiles.iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["samples/count", "cpu/nanoseconds"]);
    let p = &profiles[0];
    assert_eq!((p["samples"].as_i64(), p["sum"].as_i64()), (Some(25), Some(50)));
    assert_eq!(profiles[1]["sum"].as_i64(), Some(50 * 10_000_000));
    assert_eq!(p["period_type"], "cpu/nanoseconds");
    assert_eq!(p["time_unix_nano"].as_u64(), Some(1_700_000_000_000_000_000));
    assert_eq!(p["duration_nano"].as_u64(), Some(60_000_000_000));
    assert_eq!(p["timestamps"].as_i64(), Some(25), "one timestamp per sample (timeline)");
    assert_eq!(p["min_ts"].as_u64(), Some(1_700_000_000_000_000_000));
    // Span ids as links (even samples carry one): 0x12345678 + i.
    let links = p["links"].as_array().unwrap();
    assert_eq!(links.len(), 13);
    assert!(links.iter().any(|l| l == "0000000012345678"));
    // Each link carries its span's W3C trace id (the `trace id` label).
    let traced = p["link_traces"].as_array().unwrap();
    assert!(traced.iter().any(|l| l == "000000000000000000000000abc00000/0000000012345678"), "{traced:?}");
    assert!(traced.iter().all(|l| !l.as_str().unwrap().starts_with(&"0".repeat(32))), "{traced:?}");
    let funcs: Vec<&str> = p["functions"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(funcs.contains(&"leaf_3") && funcs.contains(&"main"));
    let attrs: Vec<&str> = p["attributes"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    // `pid` and `process`: the labels osprey-pprof's encoder puts on every sample (main).
    assert_eq!(attrs, ["pid", "process", "span.local_root_id", "state", "thread.id", "thread.name"]);
}
