//! Grafana Pyroscope: `POST /ingest?name=SERVICE.cpu{k=v,...}&from=S&until=S&format=pprof`
//! with the gzip pprof as body.
//!
//! Why `/ingest` and not `/push.v1.PusherService/Push`: `/ingest` is plain
//! HTTP with the pprof as body, understood by Grafana Pyroscope (v1 and
//! later), by the older Pyroscope OSS server and by Grafana Cloud; the push
//! API needs a connect/protobuf envelope around the same pprof and would not
//! reach the older servers. And with `/ingest` the series labels are exactly
//! what osprey puts in `name=`: service, env, version and the user's tags.
//!
//! Pyroscope turns a pprof sample's string labels into series too, so the
//! high-cardinality ones (`thread id`, `thread name`, `pid`, `span id`,
//! `local root span id`, `trace id`, the timeline's `end_timestamp_ns`) are
//! removed from the samples before sending; low-cardinality ones (CPython's
//! `state`, the `process` name) stay, with their key made a valid label
//! name. The span becomes `span_id` (16 hex digits), the label Pyroscope's
//! span profiles read (as `otel-profiling-go` writes it) and keep out of
//! the series.

use crate::config::{Endpoint, UploadConfig};
use crate::http::Request;
use crate::{Deployment, Error, Item};
use osprey_pprof::pprof::Profile;
use prost::Message;

/// Labels never sent to Pyroscope as series.
pub const HIGH_CARDINALITY: &[&str] = &[
    "thread id",
    "thread name",
    "pid",
    "span id",
    "local root span id",
    "trace id",
    "trace endpoint",
    osprey_pprof::TIMESTAMP_LABEL,
];

/// A Pyroscope label name: `[A-Za-z_][A-Za-z0-9_.]*`.
pub fn label_name(k: &str) -> String {
    let mut s: String =
        k.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        s.insert(0, '_');
    }
    s
}

/// A label value without the characters `name=`'s syntax uses.
pub fn label_value(v: &str) -> String {
    v.chars().map(|c| if matches!(c, ',' | '{' | '}' | '=' | '"') { '_' } else { c }).collect()
}

/// `SERVICE.cpu{env=prod,version=1.2,k=v,namespace=shop,pod=web-1}`: the
/// tags, then the deployment's labels unless a tag has the same name.
pub fn series_name(cfg: &UploadConfig, deployment: &Deployment) -> String {
    let mut tags: Vec<(String, String)> = cfg.all_tags().into_iter().filter(|(k, _)| k != "service").collect();
    for (k, v) in deployment.pyroscope_labels() {
        if !tags.iter().any(|(t, _)| t == k) {
            tags.push((k.to_string(), v));
        }
    }
    let labels: Vec<String> = tags.iter().map(|(k, v)| format!("{}={}", label_name(k), label_value(v))).collect();
    format!("{}.cpu{{{}}}", label_value(&cfg.service), labels.join(","))
}

fn query_escape(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// The profile without high-cardinality labels, its spans as `span_id`,
/// other label keys sanitized.
pub fn strip_labels(p: &mut Profile) {
    let span = (0..p.string_table.len() as i64).find(|&i| p.string(i) == "span id");
    if let Some(span) = span {
        p.string_table.push("span_id".into());
        let key = p.string_table.len() as i64 - 1;
        for i in 0..p.sample.len() {
            let id = p.sample[i].label.iter().find(|l| l.key == span && l.num != 0).map(|l| l.num as u64);
            if let Some(id) = id {
                p.string_table.push(format!("{id:016x}"));
                let str = p.string_table.len() as i64 - 1;
                p.sample[i].label.push(osprey_pprof::pprof::Label { key, str, ..Default::default() });
            }
        }
    }
    let drop: Vec<i64> =
        (0..p.string_table.len() as i64).filter(|&i| HIGH_CARDINALITY.contains(&p.string(i))).collect();
    for s in &mut p.sample {
        s.label.retain(|l| !drop.contains(&l.key));
    }
    let keys: std::collections::BTreeSet<i64> = p.sample.iter().flat_map(|s| s.label.iter().map(|l| l.key)).collect();
    let mut remap = std::collections::HashMap::new();
    for k in keys {
        let name = label_name(p.string(k));
        if name != p.string(k) {
            p.string_table.push(name);
            remap.insert(k, p.string_table.len() as i64 - 1);
        }
    }
    for s in &mut p.sample {
        for l in &mut s.label {
            if let Some(&n) = remap.get(&l.key) {
                l.key = n;
            }
        }
    }
}

/// The `/ingest` request for `item`.
pub fn request(
    endpoint: &Endpoint,
    item: &Item,
    cfg: &UploadConfig,
    deployment: &Deployment,
) -> Result<Request, Error> {
    let mut p = Profile::decode(&item.pprof[..])?;
    strip_labels(&mut p);
    let rate = if p.period > 0 && p.period_type.as_ref().is_some_and(|t| p.string(t.unit).contains("nanoseconds")) {
        (1_000_000_000 / p.period).max(1)
    } else {
        100
    };
    let sep = if endpoint.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}name={}&from={}&until={}&format=pprof&sampleRate={rate}&spyName=osprey",
        endpoint.url,
        query_escape(&series_name(cfg, deployment)),
        item.start_ns.div_euclid(1_000_000_000),
        (item.end_ns + 999_999_999).div_euclid(1_000_000_000),
    );
    Ok(Request {
        url,
        content_type: "application/octet-stream".into(),
        headers: endpoint.headers.clone(),
        body: crate::gzip(&p.encode_to_vec()),
    })
}
