//! OTLP/HTTP: `POST .../v1development/profiles`, `application/x-protobuf`
//! (`Content-Encoding: gzip`, which OTLP/HTTP receivers accept),
//! an `ExportProfilesServiceRequest` of opentelemetry-proto's profiles
//! schema (`v1development`, as in the `opentelemetry-proto` crate 0.33).
//!
//! The pprof profile maps onto it this way:
//! - one OTLP `Profile` per pprof sample type (the schema has one value
//!   type per profile), all sharing the request's `ProfilesDictionary`;
//! - strings keep their pprof indices (both tables start with `""`);
//!   mappings, locations and functions keep their order, shifted by one
//!   (index 0 of every dictionary table is the zero value); stacks are
//!   deduplicated into `stack_table`;
//! - sample labels become attributes (`thread id` -> `thread.id`,
//!   `thread name` -> `thread.name`, others as named); `span id` and
//!   `trace id` become the sample's link (a span without a known trace has
//!   an all-zero trace id), `local root span id` an attribute; the timeline's
//!   `end_timestamp_ns` the sample's `timestamps_unix_nano`;
//! - resource attributes: `service.name`, `service.version`,
//!   `deployment.environment.name`, `process.pid`, `host.name`, the
//!   container and pod ([`crate::Deployment`]), the user's
//!   tags, `OTEL_RESOURCE_ATTRIBUTES`, and `osprey.runtime_id`.

use crate::config::{Endpoint, UploadConfig};
use crate::http::Request;
use crate::{Error, Item, Meta};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otel;
use opentelemetry_proto::tonic::resource::v1::Resource;
use osprey_pprof::pprof::Profile;
use prost::Message;
use std::collections::HashMap;

fn kv(k: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: k.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn s(v: &str) -> any_value::Value {
    any_value::Value::StringValue(v.to_string())
}

/// The OTLP resource: service, version, environment, pid, host, tags.
pub fn resource(cfg: &UploadConfig, meta: &Meta) -> Resource {
    let mut attrs = vec![kv("service.name", s(&cfg.service))];
    if let Some(v) = &cfg.version {
        attrs.push(kv("service.version", s(v)));
    }
    if let Some(v) = &cfg.env {
        attrs.push(kv("deployment.environment.name", s(v)));
    }
    attrs.push(kv("process.pid", any_value::Value::IntValue(meta.pid as i64)));
    attrs.push(kv("host.name", s(&meta.host)));
    attrs.push(kv("osprey.runtime_id", s(&meta.runtime_id)));
    attrs.push(kv("process.runtime.name", s(meta.language.name())));
    for (k, v) in meta.deployment.otel_attributes() {
        attrs.push(kv(k, s(&v)));
    }
    for (k, v) in cfg.tags.iter().chain(&cfg.resource_attributes) {
        if !attrs.iter().any(|a| a.key == *k) {
            attrs.push(kv(k, s(v)));
        }
    }
    Resource { attributes: attrs, ..Default::default() }
}

/// Converts `p`, a profile covering `[start_ns, end_ns)`.
pub fn convert(
    p: &Profile,
    cfg: &UploadConfig,
    meta: &Meta,
    start_ns: i64,
    end_ns: i64,
) -> ExportProfilesServiceRequest {
    let mut dict = otel::ProfilesDictionary {
        mapping_table: vec![otel::Mapping::default()],
        location_table: vec![otel::Location::default()],
        function_table: vec![otel::Function::default()],
        link_table: vec![otel::Link::default()],
        string_table: if p.string_table.is_empty() { vec![String::new()] } else { p.string_table.clone() },
        attribute_table: vec![otel::KeyValueAndUnit::default()],
        stack_table: vec![otel::Stack::default()],
    };
    let intern = |dict: &mut otel::ProfilesDictionary, t: &str| -> i32 {
        match dict.string_table.iter().position(|x| x == t) {
            Some(i) => i as i32,
            None => {
                dict.string_table.push(t.to_string());
                dict.string_table.len() as i32 - 1
            }
        }
    };
    let mapping_index: HashMap<u64, i32> = p.mapping.iter().enumerate().map(|(i, m)| (m.id, i as i32 + 1)).collect();
    let function_index: HashMap<u64, i32> = p.function.iter().enumerate().map(|(i, f)| (f.id, i as i32 + 1)).collect();
    let location_index: HashMap<u64, i32> = p.location.iter().enumerate().map(|(i, l)| (l.id, i as i32 + 1)).collect();
    for m in &p.mapping {
        dict.mapping_table.push(otel::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex: m.filename as i32,
            attribute_indices: vec![],
        });
    }
    for f in &p.function {
        dict.function_table.push(otel::Function {
            name_strindex: f.name as i32,
            system_name_strindex: f.system_name as i32,
            filename_strindex: f.filename as i32,
            start_line: f.start_line,
        });
    }
    for l in &p.location {
        dict.location_table.push(otel::Location {
            mapping_index: mapping_index.get(&l.mapping_id).copied().unwrap_or(0),
            address: l.address,
            lines: l
                .line
                .iter()
                .map(|x| otel::Line {
                    function_index: function_index.get(&x.function_id).copied().unwrap_or(0),
                    line: x.line,
                    column: x.column,
                })
                .collect(),
            attribute_indices: vec![],
        });
    }
    let key_thread_id = intern(&mut dict, "thread.id");
    let key_thread_name = intern(&mut dict, "thread.name");
    let key_root = intern(&mut dict, "span.local_root_id");
    let mut stacks: HashMap<Vec<i32>, i32> = HashMap::new();
    let mut attrs: HashMap<(i32, Option<i64>, i64), i32> = HashMap::new();
    let mut links: HashMap<(i64, [u8; 16]), i32> = HashMap::new();
    struct Converted {
        stack: i32,
        attrs: Vec<i32>,
        link: i32,
        ts: Vec<u64>,
    }
    let mut converted = Vec::with_capacity(p.sample.len());
    for smp in &p.sample {
        let locs: Vec<i32> = smp.location_id.iter().map(|id| location_index.get(id).copied().unwrap_or(0)).collect();
        let next = dict.stack_table.len() as i32;
        let stack = *stacks.entry(locs.clone()).or_insert_with(|| {
            dict.stack_table.push(otel::Stack { location_indices: locs });
            next
        });
        let mut c = Converted { stack, attrs: vec![], link: 0, ts: vec![] };
        // The W3C trace id of the sample's span: 32 hex digits, else zeros.
        let trace = smp
            .label
            .iter()
            .find(|l| p.string(l.key) == "trace id")
            .and_then(|l| trace_bytes(p.string(l.str)))
            .unwrap_or([0; 16]);
        for l in &smp.label {
            let key = p.string(l.key);
            if key == osprey_pprof::TIMESTAMP_LABEL {
                c.ts.push(l.num as u64);
                continue;
            }
            if key == "trace id" {
                continue;
            }
            if key == "span id" {
                if l.num != 0 {
                    let next = dict.link_table.len() as i32;
                    c.link = *links.entry((l.num, trace)).or_insert_with(|| {
                        dict.link_table.push(otel::Link {
                            trace_id: trace.to_vec(),
                            span_id: (l.num as u64).to_be_bytes().to_vec(),
                        });
                        next
                    });
                }
                continue;
            }
            let k = match key {
                "thread id" => key_thread_id,
                "thread name" => key_thread_name,
                "local root span id" => key_root,
                _ => l.key as i32,
            };
            let is_str = l.str != 0;
            let id = (k, if is_str { None } else { Some(l.num) }, l.str);
            let next = dict.attribute_table.len() as i32;
            let a = *attrs.entry(id).or_insert_with(|| {
                let value = if is_str {
                    any_value::Value::StringValue(p.string(l.str).to_string())
                } else {
                    any_value::Value::IntValue(l.num)
                };
                dict.attribute_table.push(otel::KeyValueAndUnit {
                    key_strindex: k,
                    value: Some(AnyValue { value: Some(value) }),
                    unit_strindex: l.num_unit as i32,
                });
                next
            });
            c.attrs.push(a);
        }
        converted.push(c);
    }
    let mut profile_id = crate::new_runtime_id().replace('-', "").into_bytes();
    profile_id.truncate(16);
    let period_type = p
        .period_type
        .as_ref()
        .map(|t| otel::ValueType { type_strindex: t.r#type as i32, unit_strindex: t.unit as i32 });
    let profiles = p
        .sample_type
        .iter()
        .enumerate()
        .map(|(t, vt)| otel::Profile {
            sample_type: Some(otel::ValueType { type_strindex: vt.r#type as i32, unit_strindex: vt.unit as i32 }),
            samples: p
                .sample
                .iter()
                .zip(&converted)
                .filter(|(smp, _)| smp.value.get(t).is_some_and(|v| *v != 0))
                .map(|(smp, c)| otel::Sample {
                    stack_index: c.stack,
                    attribute_indices: c.attrs.clone(),
                    link_index: c.link,
                    values: vec![smp.value[t]],
                    timestamps_unix_nano: c.ts.clone(),
                })
                .collect(),
            time_unix_nano: start_ns.max(0) as u64,
            duration_nano: (end_ns - start_ns).max(0) as u64,
            period_type,
            period: p.period,
            profile_id: profile_id.clone(),
            ..Default::default()
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles: vec![otel::ResourceProfiles {
            resource: Some(resource(cfg, meta)),
            scope_profiles: vec![otel::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "osprey".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict),
    }
}

/// The OTLP request for `item`.
pub fn request(endpoint: &Endpoint, item: &Item, cfg: &UploadConfig, meta: &Meta) -> Result<Request, Error> {
    let p = Profile::decode(&item.pprof[..])?;
    let req = convert(&p, cfg, meta, item.start_ns, item.end_ns);
    let mut headers = endpoint.headers.clone();
    headers.push(("Content-Encoding".into(), "gzip".into()));
    Ok(Request {
        url: endpoint.url.clone(),
        content_type: "application/x-protobuf".into(),
        headers,
        body: crate::gzip(&req.encode_to_vec()),
    })
}

/// A trace id written as W3C does (32 hex digits) as its 16 bytes.
fn trace_bytes(hex: &str) -> Option<[u8; 16]> {
    let v = u128::from_str_radix(hex, 16).ok().filter(|_| hex.len() == 32)?;
    Some(v.to_be_bytes())
}
