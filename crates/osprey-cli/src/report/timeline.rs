//! `--timeline out.html`: per thread, which stack ran when, and each
//! request's span as a band under its thread; clicking a stretch of samples
//! or a band shows its stack or its span. One self-contained file: the page
//! ([`PAGE`], inline CSS and JS, no network) with the data as inline JSON.
//!
//! Invariants: only samples that carry their time ([`TIMESTAMP_LABEL`],
//! recorded with `OSPREY_TIMELINE=1`) are drawn; times are milliseconds
//! from the earliest sample's start; a sample covers its value before its
//! time when the value is a duration (CPU time), one period otherwise;
//! consecutive samples of one thread with the same stack and no gap longer
//! than two periods are one stretch.

use super::{Merged, ReportError};
use crate::report::filter::{LOCAL_ROOT_SPAN_ID, SPAN_ID};
use osprey_pprof::frames::FrameTable;
use osprey_pprof::TIMESTAMP_LABEL;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// The page; `__OSPREY_DATA__` is replaced by the data.
const PAGE: &str = include_str!("timeline.html");

/// One sample on a thread's timeline.
struct Point {
    start: i64,
    end: i64,
    stack: usize,
    value: i64,
    span: u64,
    root: u64,
}

/// The HTML timeline of `m`'s samples.
pub fn render(m: &Merged) -> Result<Vec<u8>, ReportError> {
    let p = &m.profile;
    let vi = m.value_index();
    let period = if p.period > 0 { p.period } else { 10_000_000 };
    let duration_value = m.sample_type.1 == "nanoseconds";
    let table = FrameTable::new(p);
    let mut frames: Vec<String> = Vec::new();
    let mut frame_ids: HashMap<String, usize> = HashMap::new();
    let mut stacks: Vec<Vec<usize>> = Vec::new();
    let mut stack_ids: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut threads: BTreeMap<(i64, i64), (String, Vec<Point>)> = BTreeMap::new();
    for s in &p.sample {
        let (Some(at), Some(&value)) = (p.label_num(s, TIMESTAMP_LABEL), s.value.get(vi)) else { continue };
        if value == 0 {
            continue;
        }
        let stack: Vec<usize> = table
            .stack(s)
            .map(|f| {
                let name = if f.file.is_empty() {
                    f.name.clone()
                } else if f.line > 0 {
                    format!("{} ({}:{})", f.name, f.file, f.line)
                } else {
                    format!("{} ({})", f.name, f.file)
                };
                let next = frames.len();
                *frame_ids.entry(name.clone()).or_insert_with(|| {
                    frames.push(name);
                    next
                })
            })
            .collect();
        let next = stacks.len();
        let stack = *stack_ids.entry(stack.clone()).or_insert_with(|| {
            stacks.push(stack);
            next
        });
        let (pid, tid) = (p.label_num(s, "pid").unwrap_or(0), p.label_num(s, "thread id").unwrap_or(0));
        let name = format!(
            "{} {pid} / {} {tid}",
            p.label_str(s, "process").unwrap_or("process"),
            p.label_str(s, "thread name").unwrap_or("thread")
        );
        let width = if duration_value { value.clamp(1, 10 * period) } else { period };
        let id = |k: &str| p.label_num(s, k).map_or(0, |n| n as u64);
        let point = Point { start: at - width, end: at, stack, value, span: id(SPAN_ID), root: id(LOCAL_ROOT_SPAN_ID) };
        threads.entry((pid, tid)).or_insert_with(|| (name, Vec::new())).1.push(point);
    }
    let t0 =
        threads.values().flat_map(|(_, pts)| pts.iter().map(|pt| pt.start)).min().ok_or(ReportError::NoTimestamps)?;
    let ms = |ns: i64| (ns - t0) as f64 / 1e6;
    let lanes: Vec<Value> = threads
        .into_values()
        .map(|(name, mut pts)| {
            pts.sort_by_key(|pt| pt.end);
            // [start ms, end ms, stack, samples, value]
            let mut segs: Vec<(i64, i64, usize, u64, i64)> = Vec::new();
            let mut spans: BTreeMap<u64, (i64, i64, u64, u64, i64)> = BTreeMap::new();
            for pt in &pts {
                match segs.last_mut() {
                    Some(last) if last.2 == pt.stack && pt.start - last.1 <= 2 * period => {
                        last.1 = last.1.max(pt.end);
                        last.3 += 1;
                        last.4 += pt.value;
                    }
                    _ => segs.push((pt.start, pt.end, pt.stack, 1, pt.value)),
                }
                if pt.span != 0 {
                    let e = spans.entry(pt.span).or_insert((pt.start, pt.end, pt.root, 0, 0));
                    (e.0, e.1, e.3, e.4) = (e.0.min(pt.start), e.1.max(pt.end), e.3 + 1, e.4 + pt.value);
                }
            }
            let segs: Vec<Value> = segs.iter().map(|s| json!([ms(s.0), ms(s.1), s.2, s.3, s.4])).collect();
            let spans: Vec<Value> = spans
                .iter()
                .map(|(id, s)| json!([ms(s.0), ms(s.1), format!("{id:#018x}"), format!("{:#018x}", s.2), s.3, s.4]))
                .collect();
            json!({ "name": name, "segments": segs, "spans": spans })
        })
        .collect();
    let data = json!({
        "title": format!("osprey timeline: {} ({}), {} file(s)", m.sample_type.0, m.sample_type.1, m.files.len()),
        "unit": m.sample_type.1,
        "start_ns": t0.to_string(),
        "frames": frames,
        "stacks": stacks,
        "threads": lanes,
    });
    // Inside <script>, "</" could end the element: JSON allows "<\/" for it.
    let data = data.to_string().replace("</", "<\\/");
    Ok(PAGE.replace("__OSPREY_DATA__", &data).into_bytes())
}
