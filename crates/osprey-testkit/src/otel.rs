//! Checking the OpenTelemetry span labels of Python samples against the
//! spans the program really used (osprey-python's `tests/py/otel_spans.py`
//! writes them: `TID KIND SPAN_ID TRACE_ID ROOT_SPAN_ID` per line, ids in hex).

use std::collections::HashMap;
use std::path::Path;

use osprey_pprof::pprof::Profile;

use crate::profile::{function_names, label};

/// A span the program used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Used {
    /// "root" or "child".
    pub kind: String,
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// The span id of its trace's root in the program.
    pub root_span_id: u64,
}

/// The spans each thread used: thread id -> span id -> span.
pub type UsedSpans = HashMap<i64, HashMap<u64, Used>>;

/// Reads the program's file of spans.
pub fn read_used(path: &Path) -> UsedSpans {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out: UsedSpans = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 5, "bad line {line:?}");
        let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
        let used = Used { kind: f[1].into(), trace_id: f[3].into(), root_span_id: hex(f[4]) };
        out.entry(f[0].parse().unwrap()).or_default().insert(hex(f[2]), used);
    }
    out
}

/// Counts of CPU samples (`state` running) in and outside spans.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Samples in `in_root` or `in_child` (inside a span).
    pub in_span: i64,
    /// Of them, carrying a span id their thread used there (root or child
    /// as the function says), with its trace id.
    pub right: i64,
    /// Of those, with the right local root span id.
    pub right_root: i64,
    /// Samples in `outside` (no span).
    pub outside: i64,
    /// Of them, those with span labels.
    pub outside_labelled: i64,
    /// Samples carrying ids their thread never used together.
    pub wrong: i64,
    /// A few of those, described.
    pub examples: Vec<String>,
}

/// Where a stack (leaf first) burns: "root", "child" or "outside" when it
/// is `burn` (and its generator) under `in_root`, `in_child` or `outside`
/// under `worker` (a function or a method). Other stacks, torn ones included (3.8 and 3.9 reuse
/// frame objects: a rare read mixes two calls' frames), say nothing here.
fn work(names: &[&str]) -> Option<&'static str> {
    // 3.11+ name the generator by its qualified name, `burn.<locals>.<genexpr>`.
    let at = names.iter().position(|n| *n != "burn" && !n.ends_with("<genexpr>"))?;
    if at == 0 || !names.get(at + 1).is_some_and(|n| *n == "worker" || n.ends_with(".worker")) {
        return None;
    }
    match names[at] {
        "in_root" => Some("root"),
        "in_child" => Some("child"),
        "outside" => Some("outside"),
        _ => None,
    }
}

/// Tallies the samples of `profiles` against `used`.
pub fn tally(profiles: &[Profile], used: &UsedSpans) -> Tally {
    let mut t = Tally::default();
    for p in profiles {
        for s in &p.sample {
            if label(p, s, "state").map(|l| l.0) != Some("running") {
                continue;
            }
            let names = function_names(p, s);
            let Some(kind) = work(&names) else { continue };
            let n = s.value[0];
            let span = label(p, s, "span id").map(|l| l.1 as u64);
            let trace = label(p, s, "trace id").map(|l| l.0.to_string());
            let root = label(p, s, "local root span id").map(|l| l.1 as u64);
            let tid = label(p, s, "thread id").map_or(0, |l| l.1);
            if kind == "outside" {
                t.outside += n;
                if span.is_some() || trace.is_some() {
                    t.outside_labelled += n;
                    let in_span = span.and_then(|id| used.get(&tid)?.get(&id)).map(|u| u.kind.as_str());
                    if t.examples.len() < 5 {
                        t.examples.push(format!("thread {tid} in {names:?}: span {span:x?} ({in_span:?})"));
                    }
                }
                continue;
            }
            t.in_span += n;
            let Some(span) = span else { continue };
            match used.get(&tid).and_then(|m| m.get(&span)) {
                // A span of this thread, its trace: right if the one the
                // function runs in (else one that began or ended during the read).
                Some(u) if Some(&u.trace_id) == trace.as_ref() => {
                    if u.kind == kind {
                        t.right += n;
                        t.right_root += if root == Some(u.root_span_id) { n } else { 0 };
                    }
                }
                _ => {
                    t.wrong += n;
                    if t.examples.len() < 5 {
                        t.examples.push(format!("thread {tid} in {kind}: span {span:016x} trace {trace:?}"));
                    }
                }
            }
        }
    }
    t
}

/// Fails the test unless the samples of `profiles`, against the spans the
/// program wrote to `used_file` (by `threads` threads, if given), show: at least 90% of
/// the CPU samples in spans with the span their thread ran in, its trace
/// and (90% of those) its local root; no ids a thread never used; at most
/// 2% of the samples outside spans with a span (3.8 to 3.10, 1 in about
/// 40 runs: a walk that followed a frame another thread reused while the
/// reader was preempted, see docs/design/python-walk.md). A run has about
/// 70 samples outside spans, so that last count is noise-bound: when it
/// alone fails and this is not the `last` attempt, None (run again).
pub fn check_spans(
    name: &str,
    profiles: &[Profile],
    used_file: &Path,
    threads: Option<usize>,
    last: bool,
) -> Option<Tally> {
    let used = read_used(used_file);
    let t = tally(profiles, &used);
    eprintln!("{name}: {t:?}");
    if let Some(n) = threads {
        assert_eq!(used.len(), n, "{name}: threads that wrote spans");
    }
    assert!(t.in_span >= 60, "{name}: {} samples in spans", t.in_span);
    assert!(t.right as f64 >= 0.9 * t.in_span as f64, "{name}: samples in spans with their span: {t:?}");
    assert!(t.right_root as f64 >= 0.9 * t.right as f64, "{name}: local roots {t:?}");
    assert_eq!(t.wrong, 0, "{name}: ids the thread never used: {t:?}");
    assert!(t.outside >= 10, "{name}: {} samples outside spans", t.outside);
    if t.outside_labelled * 50 > t.outside && !last {
        eprintln!("{name}: {} of {} samples outside spans with a span: once more", t.outside_labelled, t.outside);
        return None;
    }
    assert!(t.outside_labelled * 50 <= t.outside, "{name}: samples outside spans with a span: {t:?}");
    Some(t)
}

/// The function a request of the server fixtures (osprey-cli's
/// `tests/py/otel_request.py`) burns in: `request_burn_<span id in hex>`.
pub const REQUEST_BURN: &str = "request_burn_";

/// Counts of CPU samples in requests of a server, against the requests
/// each thread served.
#[derive(Clone, Debug, Default)]
pub struct RequestTally {
    /// Requests the server wrote.
    pub requests: usize,
    /// Threads that served them.
    pub threads: usize,
    /// Samples whose stack holds a request's [`REQUEST_BURN`] function.
    pub in_request: i64,
    /// Of them, carrying the span id and trace id of a request their
    /// thread served.
    pub right: i64,
    /// Of those, with that request's local root span id.
    pub right_root: i64,
    /// Of those, the very request the stack burns for (its span id is the
    /// function's name): on an asyncio loop, the task running then.
    pub exact: i64,
    /// Samples with ids their thread never served together.
    pub wrong: i64,
    /// A few of those, described.
    pub examples: Vec<String>,
}

/// Tallies the samples of `profiles` against `used` (a line per request).
pub fn tally_requests(profiles: &[Profile], used: &UsedSpans) -> RequestTally {
    let mut t = RequestTally {
        requests: used.values().map(HashMap::len).sum(),
        threads: used.len(),
        ..RequestTally::default()
    };
    for p in profiles {
        for s in &p.sample {
            if label(p, s, "state").map(|l| l.0) != Some("running") {
                continue;
            }
            let names = function_names(p, s);
            let Some(named) = names.iter().find_map(|n| n.strip_prefix(REQUEST_BURN)) else { continue };
            let named = u64::from_str_radix(named, 16).ok();
            let n = s.value[0];
            t.in_request += n;
            let span = label(p, s, "span id").map(|l| l.1 as u64);
            let trace = label(p, s, "trace id").map(|l| l.0.to_string());
            let root = label(p, s, "local root span id").map(|l| l.1 as u64);
            let tid = label(p, s, "thread id").map_or(0, |l| l.1);
            let Some(span) = span else { continue };
            match used.get(&tid).and_then(|m| m.get(&span)) {
                Some(u) if Some(&u.trace_id) == trace.as_ref() => {
                    t.right += n;
                    t.right_root += if root == Some(u.root_span_id) { n } else { 0 };
                    t.exact += if named == Some(span) { n } else { 0 };
                }
                _ => {
                    t.wrong += n;
                    if t.examples.len() < 5 {
                        t.examples.push(format!("thread {tid} in {named:x?}: span {span:016x} trace {trace:?}"));
                    }
                }
            }
        }
    }
    t
}

/// Fails the test unless the samples of `profiles`, against the requests
/// the server wrote to `used_file`, show at least `min_samples` CPU samples
/// in requests and no ids a thread never served; then checks the shares,
/// which are statistical: at least 90% of them with the span, trace and
/// (90% of those) local root of a request their thread served, and 90%
/// with the very request their stack burns for. A share missed fails the
/// test on the `last` attempt, else gives None (the caller measures once
/// more: a systematic error misses both times). Returns the tally.
pub fn check_requests(
    name: &str,
    profiles: &[Profile],
    used_file: &Path,
    min_samples: i64,
    last: bool,
) -> Option<RequestTally> {
    let used = read_used(used_file);
    let t = tally_requests(profiles, &used);
    eprintln!("{name}: {t:?}");
    assert!(t.in_request >= min_samples, "{name}: {} samples in requests: {t:?}", t.in_request);
    assert_eq!(t.wrong, 0, "{name}: ids the thread never served: {t:?}");
    let share = |n: i64, of: i64| n as f64 / of.max(1) as f64;
    let missed = if share(t.right, t.in_request) < 0.9 {
        "samples in requests with their span"
    } else if share(t.right_root, t.right) < 0.9 {
        "local roots"
    } else if share(t.exact, t.in_request) < 0.9 {
        "samples with their own request's span"
    } else {
        return Some(t);
    };
    assert!(!last, "{name}: {missed}: {t:?}");
    eprintln!("{name}: {missed} under 90%: measured once more");
    None
}
