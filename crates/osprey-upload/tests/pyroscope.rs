//! Pyroscope: a loopback receiver of `POST /ingest` checks the query
//! (name with series labels, from/until, format) and decodes the pprof:
//! span and thread ids are not series labels.

use osprey_testkit::backends::*;
use osprey_upload::{Flags, Language, Meta, UploadConfig, Uploader};
use std::time::Duration;

#[test]
fn ingest_gets_series_labels_and_a_pprof_without_high_cardinality_labels() {
    let r = Receiver::start(|_, _| ok());
    let env = |k: &str| match k {
        "PYROSCOPE_TENANT_ID" => Some("tenant-7".to_string()),
        "PYROSCOPE_TAGS" => Some("region=eu-west,rack=r1".to_string()),
        _ => None,
    };
    let url = r.url.replace("http://", "http://alice:s3cret@");
    let flags = Flags {
        pyroscope: Some(url),
        env: Some("prod".into()),
        version: Some("2.0".into()),
        tags: vec!["team:core".into()],
        ..Default::default()
    };
    let cfg = UploadConfig::resolve(&flags, "checkout", &env).unwrap();
    assert!(!cfg.timeline, "off for Pyroscope alone");
    let mut u = Uploader::start(cfg, Meta::new("rt", 1, Language::Python), Duration::from_secs(60));
    let data = profile(30, 2, true);
    u.submit_profile(&osprey_pprof::to_pprof(&data));
    let stats = u.shutdown(Duration::from_secs(10));
    assert_eq!(stats[0].delivered, 1);
    let reqs = r.wait_for(1, Duration::from_secs(1));
    let q = &reqs[0];
    assert_eq!((q.method.as_str(), q.path()), ("POST", "/ingest"));
    assert_eq!(q.query("name").unwrap(), "checkout.cpu{env=prod,version=2.0,region=eu-west,rack=r1,team=core}");
    assert_eq!(q.query("format").as_deref(), Some("pprof"));
    assert_eq!(q.query("from").unwrap(), "1700000000");
    assert_eq!(q.query("until").unwrap(), "1700000060");
    assert_eq!(q.query("sampleRate").as_deref(), Some("100"));
    assert_eq!(q.header("X-Scope-OrgID"), Some("tenant-7"));
    assert_eq!(q.header("Authorization"), Some("Basic YWxpY2U6czNjcmV0"));
    let p: osprey_pprof::pprof::Profile = prost::Message::decode(&gunzip(&q.body)[..]).unwrap();
    assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 60);
    let keys: std::collections::BTreeSet<&str> =
        p.sample.iter().flat_map(|s| s.label.iter().map(|l| p.string(l.key))).collect();
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        ["process", "span_id", "state"],
        "only low-cardinality labels and the span stay"
    );
    // Spans as Pyroscope's span profiles name them: 16 hex digits.
    let spans: std::collections::BTreeSet<&str> = p
        .sample
        .iter()
        .flat_map(|s| s.label.iter().filter(|l| p.string(l.key) == "span_id").map(|l| p.string(l.str)))
        .collect();
    assert_eq!(spans.len(), 15, "{spans:?}");
    assert!(spans.contains("0000000012345678"), "{spans:?}");
}
