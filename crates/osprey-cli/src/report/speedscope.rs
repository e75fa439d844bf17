//! speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json):
//! one sampled profile per thread, or per process, over shared frames.
//!
//! Invariants: each stack lists frame indexes root first; a profile's
//! weights are the chosen sample type's values in its unit (`none` for a
//! count), add up to its `endValue`, and are in time order when the
//! samples carry their time; the profile with the most weight is the one
//! speedscope opens on.

use super::{Group, Merged};
use osprey_pprof::frames::{FrameInfo, FrameTable};
use osprey_pprof::TIMESTAMP_LABEL;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// One speedscope profile being built: (time, stack, weight) per sample.
#[derive(Default)]
struct Lane {
    samples: Vec<(i64, Vec<usize>, i64)>,
}

/// The speedscope file of `m`, grouped by `group`.
pub fn render(m: &Merged, group: Group) -> String {
    let p = &m.profile;
    let vi = m.value_index();
    let table = FrameTable::new(p);
    let mut frames: Vec<&FrameInfo> = Vec::new();
    let mut frame_ids: HashMap<&FrameInfo, usize> = HashMap::new();
    let mut lanes: BTreeMap<(i64, i64), (String, Lane)> = BTreeMap::new();
    for s in &p.sample {
        let weight = s.value.get(vi).copied().unwrap_or(0);
        if weight == 0 {
            continue;
        }
        let stack: Vec<usize> = table
            .stack(s)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .map(|f| {
                *frame_ids.entry(f).or_insert_with(|| {
                    frames.push(f);
                    frames.len() - 1
                })
            })
            .collect();
        let pid = p.label_num(s, "pid").unwrap_or(0);
        let process = p.label_str(s, "process").unwrap_or("process");
        let (key, name) = match group {
            Group::Process => ((pid, 0), format!("{process} ({pid})")),
            Group::Thread => {
                let tid = p.label_num(s, "thread id").unwrap_or(0);
                match p.label_str(s, "thread name") {
                    _ if tid == 0 => ((pid, 0), format!("{process} ({pid}): no thread")),
                    name => ((pid, tid), format!("{process} ({pid}): {} ({tid})", name.unwrap_or("thread"))),
                }
            }
        };
        let at = p.label_num(s, TIMESTAMP_LABEL).unwrap_or(0);
        lanes.entry(key).or_insert_with(|| (name, Lane::default())).1.samples.push((at, stack, weight));
    }
    let unit = match m.sample_type.1.as_str() {
        u @ ("nanoseconds" | "microseconds" | "milliseconds" | "seconds" | "bytes") => u,
        _ => "none",
    };
    let mut best = (0, i64::MIN);
    let profiles: Vec<Value> = lanes
        .into_values()
        .enumerate()
        .map(|(i, (name, mut lane))| {
            // Stable: samples without a time keep the profile's order.
            lane.samples.sort_by_key(|(at, _, _)| *at);
            let total: i64 = lane.samples.iter().map(|(_, _, w)| w).sum();
            if total > best.1 {
                best = (i, total);
            }
            let (stacks, weights): (Vec<_>, Vec<_>) = lane.samples.into_iter().map(|(_, st, w)| (st, w)).unzip();
            json!({
                "type": "sampled",
                "name": name,
                "unit": unit,
                "startValue": 0,
                "endValue": total,
                "samples": stacks,
                "weights": weights,
            })
        })
        .collect();
    let frames: Vec<Value> = frames
        .iter()
        .map(|f| {
            let mut o = json!({ "name": f.name });
            if !f.file.is_empty() {
                o["file"] = json!(f.file);
            }
            if f.line > 0 {
                o["line"] = json!(f.line);
            }
            o
        })
        .collect();
    let file = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "name": format!("osprey: {} ({})", m.sample_type.0, m.sample_type.1),
        "exporter": concat!("osprey ", env!("CARGO_PKG_VERSION")),
        "activeProfileIndex": best.0,
        "shared": { "frames": frames },
        "profiles": profiles,
    });
    file.to_string()
}
