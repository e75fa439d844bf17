//! Datadog agent (or, with `DD_API_KEY`, the agentless intake):
//! `POST /profiling/v1/input`, `multipart/form-data` with three parts:
//!
//! - `event` (`event.json`): `attachments` (the file names sent),
//!   `tags_profiler` (`service`, `env`, `version`, user tags, `runtime-id`,
//!   `host`, `language`, `profiler_version`, `process_id`, `container_id`,
//!   `pod_name`, `kube_namespace`, `kube_node`), `start`/`end`
//!   (RFC 3339), `family` (`native` or `python`), `version` `"4"`;
//! - `auto.pprof`: the gzip pprof profile (samples carry `thread id`,
//!   `thread name`, `span id`, `local root span id`, and with the timeline
//!   `end_timestamp_ns`, the labels Datadog's profiler UI reads);
//! - `code-provenance.json`: `{"v1":[{"kind","name","version","paths"}]}`.

use crate::config::{Endpoint, UploadConfig};
use crate::http::Request;
use crate::{Item, Meta};

/// The pprof attachment's name.
pub const PPROF_NAME: &str = "auto.pprof";
/// The code provenance attachment's name.
pub const PROVENANCE_NAME: &str = "code-provenance.json";

/// `key:value` tags, commas and colons in values replaced (`,` separates tags).
pub fn tags_profiler(cfg: &UploadConfig, meta: &Meta) -> String {
    let mut t = cfg.all_tags();
    t.push(("runtime-id".into(), meta.runtime_id.clone()));
    t.push(("host".into(), meta.host.clone()));
    t.push(("language".into(), meta.language.name().into()));
    t.push(("profiler_version".into(), format!("osprey-{}", env!("CARGO_PKG_VERSION"))));
    t.push(("process_id".into(), meta.pid.to_string()));
    t.extend(meta.deployment.datadog_tags().into_iter().map(|(k, v)| (k.to_string(), v)));
    t.iter().map(|(k, v)| format!("{k}:{}", v.replace(',', "_"))).collect::<Vec<_>>().join(",")
}

/// The `event` part.
pub fn event_json(cfg: &UploadConfig, meta: &Meta, item: &Item) -> String {
    serde_json::json!({
        "attachments": [PPROF_NAME, PROVENANCE_NAME],
        "tags_profiler": tags_profiler(cfg, meta),
        "start": crate::rfc3339(item.start_ns),
        "end": crate::rfc3339(item.end_ns),
        "family": meta.language.name(),
        "version": "4",
        "endpoint_counts": null,
        "internal": { "osprey": { "sequence": item.seq } },
        "info": { "profiler": { "version": env!("CARGO_PKG_VERSION"), "name": "osprey" } },
    })
    .to_string()
}

/// The multipart request for `item`.
pub fn request(endpoint: &Endpoint, item: &Item, cfg: &UploadConfig, meta: &Meta, provenance: &str) -> Request {
    let boundary = format!("osprey-{:016x}", crate::now_ns() as u64 ^ (item.seq << 48));
    let gz = crate::gzip(&item.pprof);
    let event = event_json(cfg, meta, item);
    let mut body = Vec::with_capacity(gz.len() + event.len() + provenance.len() + 512);
    let mut part = |name: &str, file: &str, ctype: &str, data: &[u8]| {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: {ctype}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    };
    part("event", "event.json", "application/json", event.as_bytes());
    part(PPROF_NAME, PPROF_NAME, "application/octet-stream", &gz);
    part(PROVENANCE_NAME, PROVENANCE_NAME, "application/json", provenance.as_bytes());
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let mut headers = endpoint.headers.clone();
    headers.push(("DD-EVP-ORIGIN".into(), "osprey".into()));
    headers.push(("DD-EVP-ORIGIN-VERSION".into(), env!("CARGO_PKG_VERSION").into()));
    Request {
        url: endpoint.url.clone(),
        content_type: format!("multipart/form-data; boundary={boundary}"),
        headers,
        body,
    }
}
