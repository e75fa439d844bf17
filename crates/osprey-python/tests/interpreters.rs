//! Tests against the real interpreters on the machine (found at run time).
//! Each interpreter gets: every applicable discovery method agrees with the
//! thread lists; a 50/30/20 CPU split is attributed within 3 points; a
//! thread in time.sleep and one in zlib.compress have the right states.
//! The forky interpreters run in a chroot (their files only visible through
//! /proc/PID/root), one of them in a PID namespace too.
//! Workloads take CPU slots (see `common::slots`): at most 2 run at once,
//! and the attribution measurement runs alone.

mod common;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use osprey_pprof::{Frame, LabelValue, ProfileData};
use osprey_python::threads::Discovery;
use osprey_python::{open_target, Method, Options};

fn collect(pid: i32, hz: u32, secs: f64, method: Option<Method>) -> (Vec<ProfileData>, osprey_python::Summary) {
    common::collect(pid, &Options { method, ..common::options(hz, Some(secs)) }, &AtomicBool::new(false))
}

fn func_names(frames: &[Frame]) -> Vec<&str> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Function { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

fn label<'a>(s: &'a osprey_pprof::Sample, key: &str) -> Option<&'a LabelValue> {
    s.labels.iter().find(|l| l.key == key).map(|l| &l.value)
}

fn methods_agree(name: &str) {
    let Some(py) = common::python(name) else { return };
    let _slot = common::slots(1);
    let w = py.start(&["threads"]);
    let t = open_target(w.pid()).unwrap_or_else(|e| panic!("{e}"));
    let minor = t.version.minor;
    let mut d = Discovery::default();
    let tids = osprey_python::process::list_tids(w.pid()).unwrap();
    // Reference: the lists.
    let mut reference = HashMap::new();
    for &tid in &tids {
        let ts = d.via_lists(&t, tid).unwrap();
        if ts != 0 {
            reference.insert(tid, ts);
        }
    }
    // main + 3 spinners + sleeper
    assert!(reference.len() >= 5, "{name}: lists found {} thread states: {reference:x?}", reference.len());
    let distinct: std::collections::HashSet<_> = reference.values().collect();
    assert_eq!(distinct.len(), reference.len(), "each thread has its own tstate");
    for &tid in reference.keys() {
        assert_eq!(d.via_tss(&t, tid).unwrap(), reference[&tid], "{name}: TSS for tid {tid}");
        assert_eq!(d.via_cache(&t, tid).unwrap(), reference[&tid], "{name}: cache for tid {tid}");
    }
    if minor >= 12 {
        assert!(t.tls.is_some(), "{name}: TLS decode failed: {:?}", t.tls_error);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            for (&tid, &ts) in &reference {
                let v = d.via_tls(&t, tid).unwrap();
                if v != 0 {
                    assert_eq!(v, ts, "{name}: TLS for tid {tid}");
                    seen.insert(tid);
                }
            }
            if seen.len() >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        assert!(seen.len() >= 2, "{name}: TLS found the GIL holder's tstate in only {} threads", seen.len());
    } else {
        assert!(t.tls.is_none());
    }
    // Each method alone, through the sampler, sees the Python threads.
    let all = [Method::Lists, Method::Cache, Method::Tss];
    for m in all {
        let (_, s) = collect(w.pid(), 200, 0.3, Some(m));
        assert!(s.threads_seen >= 5, "{name}: method {m:?} saw {} threads", s.threads_seen);
    }
}

/// Target CPU time for the attribution measurement, and the most wall time
/// it may take. Sampling stops once the workload has used `CPU_GOAL` of CPU
/// (its own `thread_time` count), so a loaded machine means a longer run,
/// not fewer samples.
const CPU_GOAL: f64 = 8e9;
const WALL_LIMIT: Duration = Duration::from_secs(25);

/// The 50/30/20 measurement, taken once more when it misses the bound: it
/// is statistical, and a shared 2-core machine under other builds moves it
/// (a systematic error misses both times).
fn attribution(name: &str) {
    if let Err(first) = attribution_once(name) {
        eprintln!("{first}; measuring again");
        if let Err(second) = attribution_once(name) {
            panic!("{second} (first attempt: {first})");
        }
    }
}

fn attribution_once(name: &str) -> Result<(), String> {
    let Some(py) = common::python(name) else { return Ok(()) };
    let _slots = common::slots(common::SLOTS);
    let truth_inner = py.scratch("truth");
    let truth_file = py.host_path(&truth_inner);
    let w = py.start(&["split", &truth_inner]);
    let read_truth = || -> [f64; 3] {
        let s = std::fs::read_to_string(&truth_file).unwrap_or_default();
        let v: Vec<f64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        [v.first().copied().unwrap_or(0.0), v.get(1).copied().unwrap_or(0.0), v.get(2).copied().unwrap_or(0.0)]
    };
    std::thread::sleep(Duration::from_millis(100));
    let t0 = read_truth();
    let opts = common::options(1000, None);
    let stop = AtomicBool::new(false);
    let started = std::time::Instant::now();
    let (profiles, summary) = std::thread::scope(|sc| {
        let h = sc.spawn(|| common::collect(w.pid(), &opts, &stop));
        while started.elapsed() < WALL_LIMIT && read_truth().iter().zip(&t0).map(|(a, b)| a - b).sum::<f64>() < CPU_GOAL
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        h.join().unwrap()
    });
    let t1 = read_truth();
    let _ = std::fs::remove_file(&truth_file);
    let dt: Vec<f64> = (0..3).map(|i| t1[i] - t0[i]).collect();
    let dsum: f64 = dt.iter().sum();
    let truth: Vec<f64> = dt.iter().map(|x| 100.0 * x / dsum).collect();
    let mut counts: HashMap<&str, i64> = HashMap::new();
    let mut total = 0;
    let mut nsamples = 0;
    for p in &profiles {
        for s in &p.samples {
            let names = func_names(&s.frames);
            if let Some(f) = names.iter().find(|n| matches!(**n, "f50" | "f30" | "f20")) {
                // CPU time (ns) per function, as the profile reports it.
                *counts.entry(f).or_default() += s.values[1];
                total += s.values[1];
                nsamples += s.values[0];
            }
        }
    }
    assert!(nsamples > 2000, "{name}: only {nsamples} samples ({summary:?})");
    let share = |f: &str| 100.0 * *counts.get(f).unwrap_or(&0) as f64 / total as f64;
    let (a, b, c) = (share("f50"), share("f30"), share("f20"));
    let err = [(a - truth[0]).abs(), (b - truth[1]).abs(), (c - truth[2]).abs()];
    let max_err = err.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "{name}: sampled f50 {a:.1}% f30 {b:.1}% f20 {c:.1}% | measured {:.1}/{:.1}/{:.1} | max error {max_err:.2} points | {nsamples} samples in {:.1} s, passes {}/{} requested, torn {} retries {}",
        truth[0], truth[1], truth[2], started.elapsed().as_secs_f64(), summary.passes_done, summary.passes_requested, summary.torn, summary.retries
    );
    // A sanity check of the workload, not of osprey: f50's sums outgrow
    // small ints, which costs more on some versions (3.15: 54/29/17).
    for (i, want) in [50.0, 30.0, 20.0].iter().enumerate() {
        assert!((truth[i] - want).abs() <= 6.0, "{name}: workload's own split {truth:?} is off 50/30/20");
    }
    if max_err > 3.0 {
        return Err(format!(
            "{name}: attribution error {max_err:.2} points (sampled {a:.1}/{b:.1}/{c:.1}, measured {truth:?})"
        ));
    }
    // Lines are real: f50 is lines 13-17 of workload.py.
    let lines: Vec<i64> = profiles
        .iter()
        .flat_map(|p| p.samples.iter())
        .flat_map(|s| s.frames.iter())
        .filter_map(|f| match f {
            Frame::Function { name, line, file } if name == "f50" && file.ends_with("workload.py") => Some(*line),
            _ => None,
        })
        .collect();
    assert!(lines.iter().all(|l| (13..=17).contains(l)), "{name}: f50 lines {lines:?}");
    Ok(())
}

fn states(name: &str) {
    let Some(py) = common::python(name) else { return };
    let _slot = common::slots(1);
    let w = py.start(&["states"]);
    let (profiles, _) = collect(w.pid(), 200, 2.0, None);
    let mut by: HashMap<(&str, String), i64> = HashMap::new();
    for p in &profiles {
        for s in &p.samples {
            let names = func_names(&s.frames);
            let who = if names.contains(&"sleeper") {
                "sleeper"
            } else if names.contains(&"compressor") {
                "compressor"
            } else {
                continue;
            };
            let Some(LabelValue::Str(st)) = label(s, "state") else { panic!("no state label") };
            assert!(matches!(label(s, "thread id"), Some(LabelValue::Num(n)) if *n > 0));
            assert!(matches!(label(s, "thread name"), Some(LabelValue::Str(_))));
            *by.entry((who, st.clone())).or_default() += s.values[0];
            if s.values[1] > 0 {
                assert_ne!(st, "sleeping", "CPU time only for threads on CPU");
            }
        }
    }
    let frac = |who: &str, st: &str| {
        let tot: i64 = by.iter().filter(|(k, _)| k.0 == who).map(|(_, v)| v).sum();
        (*by.get(&(who, st.to_string())).unwrap_or(&0) as f64 / tot.max(1) as f64, tot)
    };
    eprintln!("{name}: {by:?}");
    let (sl, nsl) = frac("sleeper", "sleeping");
    let (nat, nz) = frac("compressor", "native");
    assert!(nsl > 50 && sl >= 0.9, "{name}: sleeper 'sleeping' {sl:.2} of {nsl}");
    assert!(nz > 50 && nat >= 0.6, "{name}: compressor 'native' {nat:.2} of {nz}");
}

/// Time in the cyclic GC is a `[gc]` frame on top of the Python frame that
/// triggered it (an allocation in `make_cycles`, or `gc.collect()` in
/// `garbage`), and nowhere else.
fn gc_frame(name: &str) {
    let Some(py) = common::python(name) else { return };
    let _slot = common::slots(1);
    let w = py.start(&["garbage"]);
    let (profiles, _) = collect(w.pid(), 200, 2.0, None);
    let (mut gc, mut gc_truncated, mut total) = (0, 0, 0);
    for s in profiles.iter().flat_map(|p| p.samples.iter()) {
        total += s.values[0];
        // The interpreter's own shim after `__init__` (3.13+) is not a Python frame.
        assert!(
            !s.frames.iter().any(|f| matches!(f, Frame::Function { file, .. } if file == "__init__")),
            "{:?}",
            s.frames
        );
        for (i, f) in s.frames.iter().enumerate() {
            if matches!(f, Frame::Synthetic(n) if n == "[gc]") {
                assert_eq!(i, 0, "{name}: [gc] not on top: {:?}", s.frames);
                // A stack the read could not take says so: it names no caller, never a wrong one.
                if matches!(&s.frames[1..], [Frame::Synthetic(t)] if t == "[truncated]") {
                    gc_truncated += s.values[0];
                    gc += s.values[0];
                    continue;
                }
                let caller = func_names(&s.frames[1..]);
                assert!(
                    matches!(
                        caller.first(),
                        Some(&"make_cycles") | Some(&"garbage") | Some(&"__init__") | Some(&"Node.__init__")
                    ),
                    "{name}: [gc] above {:?}",
                    s.frames
                );
                gc += s.values[0];
            }
        }
    }
    let share = gc as f64 / total.max(1) as f64;
    eprintln!("{name}: [gc] in {gc} of {total} samples ({:.0}%)", 100.0 * share);
    assert!(total > 100 && share > 0.1 && share < 0.95, "{name}: [gc] in {gc} of {total} samples");
    assert!(gc_truncated * 20 <= gc, "{name}: {gc_truncated} of {gc} [gc] samples without their stack");
}

/// Three threads spinning in Python share one GIL: at any time up to two
/// of them wait for it. Their `waiting for gil` samples carry the wait as
/// time (the `gil-wait` value), about one interval per waiting sample;
/// samples in other states carry none.
fn gil_wait(name: &str) {
    let Some(py) = common::python(name) else { return };
    let _slot = common::slots(1);
    let w = py.start(&["threads"]);
    let secs = 2.0;
    let (profiles, _) = collect(w.pid(), 200, secs, None);
    let mut wait_ns = 0i64;
    let (mut waiting, mut spinners) = (0, 0);
    for p in &profiles {
        assert_eq!(p.sample_types[2].0, "gil-wait");
        for s in &p.samples {
            let Some(LabelValue::Str(st)) = label(s, "state") else { panic!("no state") };
            if st == "waiting for gil" {
                // The sleeper and the main thread wait too, when they wake.
                if func_names(&s.frames).contains(&"spinner") {
                    spinners += s.values[0];
                }
                waiting += s.values[0];
                wait_ns += s.values[2];
            } else {
                assert_eq!(s.values[2], 0, "{name}: GIL wait in state {st}");
            }
        }
    }
    let threads_waiting = wait_ns as f64 / (secs * 1e9);
    eprintln!("{name}: {waiting} samples waiting for the GIL, {:.2} threads waiting on average", threads_waiting);
    assert!(waiting > 100, "{name}: {waiting} samples waiting for the GIL");
    assert!(spinners as f64 >= 0.8 * waiting as f64, "{name}: {spinners} of {waiting} waiting samples in spinners");
    // Spinners not holding the GIL are also seen runnable (`native`) on a
    // busy machine, so fewer than two wait on average; the wait time
    // must still match the waiting samples (5 ms apart at 200 Hz).
    assert!(
        (0.5..=2.3).contains(&threads_waiting),
        "{name}: {threads_waiting:.2} threads waiting for the GIL on average"
    );
    let per_sample = wait_ns as f64 / waiting as f64 / 5e6;
    assert!((0.65..=1.35).contains(&per_sample), "{name}: {per_sample:.2} intervals of GIL wait per waiting sample");
}

/// 3.14+: samples of a thread running an asyncio task carry the task's
/// name (`task` label), its given name or asyncio's default `Task-N`; as
/// root, the stack and the task are copied together at the interrupt.
fn asyncio_tasks(name: &str) {
    let Some(py) = common::python(name) else { return };
    let _slot = common::slots(1);
    let w = py.start(&["tasks"]);
    let (profiles, summary) = collect(w.pid(), 200, 2.0, None);
    if let Some(i) = summary.interrupt {
        eprintln!("{name}: {i:?}");
        assert!(i.copied > 4 * i.missed, "{name}: the loop's thread is read from its copies: {i:?}");
    }
    let mut by: HashMap<String, i64> = HashMap::new();
    for s in profiles.iter().flat_map(|p| p.samples.iter()) {
        let task = match label(s, "task") {
            Some(LabelValue::Str(t)) => t.clone(),
            _ => String::new(),
        };
        if func_names(&s.frames).contains(&"worker") {
            assert!(!task.is_empty(), "{name}: a worker sample without its task: {:?}", s.frames);
        }
        *by.entry(task).or_default() += s.values[0];
    }
    eprintln!("{name}: {by:?}");
    assert!(by.get("alpha").is_some_and(|n| *n > 50), "{name}: {by:?}");
    assert!(by.keys().any(|k| k.starts_with("Task-") && by[k] > 50), "{name}: {by:?}");
}

#[test]
fn asyncio_tasks_forky314() {
    asyncio_tasks("forky-3.14")
}

#[test]
fn asyncio_tasks_forky315() {
    asyncio_tasks("forky-3.15")
}

osprey_testkit::per_interpreter!(mod {
    methods_agree => methods_agree,
    attribution_50_30_20 => attribution,
    states_sleep_and_zlib => states,
    gc_frame => gc_frame,
    gil_wait => gil_wait,
}; forky314_pidns => "forky-3.14-pidns");

// Free-threaded 3.13t and 3.14t (optional, see `common::free_threaded`): the
// tests that do not assume a GIL (states, [gc] and GIL waits differ; see
// tests/freethreaded.rs).
osprey_testkit::per_interpreter!(mod only {
    methods_agree => methods_agree,
    attribution_50_30_20 => attribution,
}; ft313 => "3.13t", ft314 => "3.14t");
