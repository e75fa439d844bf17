//! Stacks that change as fast as they are read. A loop calling a 20-deep
//! recursion, sampled at 100 Hz for 3 s on every interpreter: at least 95%
//! of the expected samples are kept and at least 99% of them end at the
//! right outermost frame; each sample's CPU is the thread's own since its
//! previous sample (no lumps). A 10,000-deep stack is sampled, truncated
//! beyond `MAX_DEPTH` with a `[truncated]` frame, and counted. With
//! `blocking`, no read is torn or retried. Short calls from C, nested short
//! calls and a loop over a generator keep their shares in the default mode,
//! within 2 points of py-spy's stopped reads, and so do short calls inside
//! OpenTelemetry spans.

mod common;

use std::sync::atomic::AtomicBool;

use osprey_pprof::{Frame, ProfileData};
use osprey_python::stack::{MAX_DEPTH, TRUNCATED};
use osprey_python::Options;

use common::INTERPRETERS;

/// One of each version.
const PY_VERSIONS: [&str; 8] = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "forky-3.14", "forky-3.15"];

fn start(py: &common::Py, args: &[&str]) -> common::Workload {
    start_env(py, args, &[])
}

fn start_env(py: &common::Py, args: &[&str], env: &[(&str, &str)]) -> common::Workload {
    py.start_script_env(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/calls.py"), args, env)
}

fn collect(pid: i32, hz: u32, secs: f64) -> (Vec<ProfileData>, osprey_python::Summary) {
    collect_with(pid, hz, secs, false)
}

fn collect_with(pid: i32, hz: u32, secs: f64, blocking: bool) -> (Vec<ProfileData>, osprey_python::Summary) {
    common::collect(pid, &Options { blocking, ..common::options(hz, Some(secs)) }, &AtomicBool::new(false))
}

fn name(f: &Frame) -> &str {
    match f {
        Frame::Function { name, .. } => name,
        Frame::Synthetic(s) => s,
        Frame::Native { .. } => "native",
    }
}

/// Runs `measure` on each interpreter of `versions` there is: a
/// statistical measurement on shared cores, taken again, up to `ATTEMPTS`
/// times, while it misses (a systematic error misses every time; a process
/// whose shares drifted, as py-spy's own reads of one do by 1-2 points, is
/// outweighed by fresh ones). `measure` returns its line and whether it met
/// the target; the test fails with the lines of the misses.
fn on_each(versions: &[&str], mut measure: impl FnMut(&str, &common::Py) -> (String, bool)) {
    const ATTEMPTS: usize = 3;
    let mut failures = Vec::new();
    for v in versions {
        let Some(py) = common::python(v) else { continue };
        for attempt in 0..ATTEMPTS {
            let _slots = common::slots(common::SLOTS);
            let (line, met) = measure(v, &py);
            eprintln!("{line}");
            if met {
                break;
            }
            if attempt == ATTEMPTS - 1 {
                failures.push(line);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Each leaf function's share of the cpu, by its bare name (`Made.__init__`
/// as `__init__`, as py-spy names it), a `[gc]` frame charged to the frame
/// under it (py-spy has none).
fn flat_cpu(profiles: &[ProfileData]) -> impl Fn(&str) -> f64 {
    let mut flat = std::collections::HashMap::<String, i64>::new();
    for s in profiles.iter().flat_map(|p| &p.samples) {
        let leaf = s.frames.iter().map(name).find(|&n| n != "[gc]").unwrap_or("");
        *flat.entry(osprey_testkit::readers::bare_name(leaf).to_string()).or_default() += s.values[1];
    }
    let total = flat.values().sum::<i64>().max(1) as f64;
    move |f: &str| 100.0 * flat.get(f).copied().unwrap_or(0) as f64 / total
}

#[test]
fn recursion_loop_keeps_samples_and_outermost_frames() {
    on_each(&INTERPRETERS, |v, py| {
        let w = start(py, &["recurse"]);
        let (profiles, summary) = collect(w.pid(), 100, 3.0);
        let (mut kept, mut right, mut truncated, mut cpu, mut max_cpu) = (0i64, 0i64, 0i64, 0i64, 0i64);
        for p in &profiles {
            for s in &p.samples {
                let n = s.values[0];
                kept += n;
                // Outermost: the module, then main (innermost first).
                let names: Vec<&str> = s.frames.iter().map(name).collect();
                let outer_ok = names.last() == Some(&"<module>")
                    && names.len() >= 2
                    && names[names.len() - 2] == "main"
                    && names[..names.len() - 2].iter().all(|f| *f == "recurse")
                    && names.len() <= 22;
                if outer_ok {
                    right += n;
                }
                if names.contains(&TRUNCATED) {
                    truncated += n;
                }
                cpu += s.values[1];
                max_cpu = max_cpu.max(s.values[1] / n.max(1));
            }
        }
        let expected = summary.passes_requested as f64;
        let line = format!(
            "{v}: kept {kept}/{expected} ({:.1}%), right outermost {:.1}%, truncated {truncated}, retries {}, cpu {:.0} ms, max per sample {:.1} ms",
            100.0 * kept as f64 / expected,
            100.0 * right as f64 / kept.max(1) as f64,
            summary.retries,
            cpu as f64 / 1e6,
            max_cpu as f64 / 1e6
        );
        // Targets: >= 95% kept and >= 99% with the right outermost frame.
        (line, (kept as f64) >= 0.95 * expected && (right as f64) >= 0.99 * kept as f64)
    });
}

/// Short calls keep their share in the default mode: the thread's frame
/// pointer and the frame it names are read a fraction of a microsecond
/// apart, and a call that began or ended in between once put the sample on
/// the caller (the loop, 1-3% of the time, took 41% of the samples on 3.12
/// through calls from C, 35% on 3.13 through `__init__`'s shim frame);
/// it is held under 8% on every version (3.11 gave 7-26% until a cframe
/// entered from the pointer's was followed down to its call's first frame).
#[test]
fn short_calls_keep_their_share() {
    on_each(&PY_VERSIONS, |v, py| {
        let w = start(py, &["from_c"]);
        let (profiles, _) = collect(w.pid(), 100, 3.0);
        let share = flat_cpu(&profiles);
        let line = format!(
            "{v}: Made.__init__ {:.1}%, direct {:.1}%, main (the loop) {:.1}%",
            share("__init__"),
            share("direct"),
            share("main")
        );
        (line, share("main") < 8.0)
    });
}

/// Nested short calls keep their shares in the default mode. A frame that
/// returned while the stack was copied is still shown when it can be told
/// apart from a reused one: 3.8-3.10, its code's zombie frame or its caller
/// still running, the walk as deep as the thread's recursion depth said;
/// 3.14+, its code object found from its instruction pointer. `c`, the
/// innermost of `a -> b -> c` (each a microsecond or less), is compared
/// with a read of the stopped thread, on the same process: once such reads
/// were dropped and retried, which gave `c` half to three quarters of its
/// share (3.9: 18-27% against 35%; 3.15: 21-25% against 38-41%).
#[test]
fn nested_calls_match_a_stopped_read() {
    // 600 samples a read: `c`'s share has about 2 points of standard
    // deviation, and varies more between runs on shared cores.
    on_each(&PY_VERSIONS, |v, py| {
        let w = start(py, &["chain"]);
        let shares = |blocking| {
            let share = flat_cpu(&collect_with(w.pid(), 200, 3.0, blocking).0);
            ["a", "b", "c"].map(share)
        };
        let (read, stopped) = (shares(false), shares(true));
        (format!("{v}: a b c {read:.1?} read, {stopped:.1?} stopped"), read[2] >= 0.8 * stopped[2])
    });
}

/// A loop over a generator keeps the generator's share and its callers in
/// the default mode. A generator yields every few hundred nanoseconds, and
/// a yield clears its frame's caller: a frame the pointer named running
/// was often found suspended when copied. Kept as it was, its stack ended
/// at the generator (3.11+: a third of `black`'s CPU had a generator at its
/// root); read again, the generator got 0.6-0.7 of the share a read of the
/// stopped thread gives it. Both on every version: `produce`'s share at
/// least 0.85 of the stopped read's, on the same process, and 99% of the
/// samples ending at `main` and the module.
#[test]
fn generators_keep_their_share_and_callers() {
    on_each(&PY_VERSIONS, |v, py| {
        let w = start(py, &["gen"]);
        let (read, _) = collect_with(w.pid(), 200, 3.0, false);
        let (mut kept, mut right) = (0i64, 0i64);
        for s in read.iter().flat_map(|p| &p.samples) {
            let names: Vec<&str> = s.frames.iter().map(name).collect();
            kept += s.values[0];
            if names.len() >= 3 && names[names.len() - 2..] == ["main", "<module>"] {
                right += s.values[0];
            }
        }
        let produce = flat_cpu(&read)("produce");
        let stopped = flat_cpu(&collect_with(w.pid(), 200, 3.0, true).0)("produce");
        let right = 100.0 * right as f64 / kept.max(1) as f64;
        let line = format!("{v}: produce {produce:.1}% read, {stopped:.1}% stopped; right outermost {right:.1}%");
        (line, produce >= 0.85 * stopped && right >= 99.0)
    });
}

/// The default mode is within 2 points of py-spy's default mode (the
/// process stopped for each read), on every interpreter, on calls of a
/// microsecond or so (most entered from C) and on a loop over a generator:
/// each function's flat share, at about 8,000 samples a reader (about 0.6
/// points of noise on each), the two readers alternating every 2 s on the
/// same process so that both see the same load, py-spy on the process's
/// CPU (`py_spy_flat`: from another CPU its stops favoured the loop by 2-3
/// points over the process's own CPU-time samples). A process's shares
/// drift by 1-2 points from one run to the next: a miss is judged again on
/// the samples of every run so far together. Read from outside without
/// the copies at the interrupt, the short calls were 4-6 points off.
#[test]
fn default_mode_within_two_points_of_py_spy() {
    const FUNCS: [(&str, &[&str]); 2] =
        [("short", &["__init__", "__hash__", "produce", "direct", "short_loop"]), ("gen", &["produce", "consume"])];
    let mut pools = std::collections::HashMap::new();
    on_each(&INTERPRETERS, |v, py| {
        let (lines, met): (Vec<String>, Vec<bool>) = FUNCS
            .iter()
            .map(|&(workload, funcs)| {
                against_py_spy(py, &[], workload, funcs, pools.entry((v.to_string(), workload)).or_default())
            })
            .unzip();
        (format!("{v}: {}", lines.join("; ")), met.iter().all(|&m| m))
    });
}

/// The same short calls inside OpenTelemetry spans (the real SDK, 20 rounds
/// a span): a running thread's span is copied at its interrupt with its
/// frames, so its stack is as exact as without spans. Two interpreters
/// whose instances keep attributes differently (`otel_spans` checks the
/// span copies on every one).
#[test]
fn inside_spans_within_two_points_of_py_spy() {
    const FUNCS: [&str; 5] = ["__init__", "__hash__", "produce", "direct", "span_loop"];
    let mut pools = std::collections::HashMap::new();
    on_each(&["3.11", "3.12"], |v, py| {
        let Some(sdk) = osprey_testkit::python::otel_sdk(py, v) else { return (format!("{v}: no SDK"), true) };
        let pool = pools.entry(v.to_string()).or_default();
        let (line, met) = against_py_spy(py, &[("PYTHONPATH", &sdk)], "span_short", &FUNCS, pool);
        (format!("{v}: {line}"), met)
    });
}

/// Every attempt's samples of one interpreter and workload (a miss is
/// judged again on them all together).
#[derive(Default)]
struct Pool {
    /// osprey's profiles.
    read: Vec<ProfileData>,
    /// py-spy's shares, summed over the rounds.
    spy: std::collections::HashMap<String, f64>,
    rounds: u64,
    /// Stacks copied at the interrupt, and running threads read from outside.
    copied: u64,
    missed: u64,
}

impl Pool {
    fn add(&mut self, o: Pool) {
        self.read.extend(o.read);
        for (f, s) in o.spy {
            *self.spy.entry(f).or_default() += s;
        }
        (self.rounds, self.copied, self.missed) =
            (self.rounds + o.rounds, self.copied + o.copied, self.missed + o.missed);
    }
}

/// An attempt in which the process waited for a CPU more than this share
/// of the time (%) was made on a busy machine: py-spy's shares then move
/// by 3-6 points from one attempt to the next (its reads fall where the
/// process was preempted, several in a row), osprey's hold within 1 (its
/// samples are of the process's CPU time). It is made again, twice at
/// most. On a quiet machine, py-spy's stops on the process's CPU and
/// osprey's sampler make it wait 8-14%; another busy process, 39-45%.
const BUSY: f64 = 25.0;

/// `workload` of `calls.py` (with `env`) sampled by osprey's default mode
/// and py-spy in turns, 2 s each, 4 rounds, added to `pool`: the line, and
/// whether every share of `funcs` over the pool is within 2 points of
/// py-spy's and 90% of the samples were copied at the interrupt.
fn against_py_spy(
    py: &common::Py,
    env: &[(&str, &str)],
    workload: &str,
    funcs: &[&str],
    pool: &mut Pool,
) -> (String, bool) {
    let (mut spied, mut wait) = (0, 0.0);
    for again in 0..3 {
        let this;
        (this, spied, wait) = attempt(py, env, workload);
        if wait <= BUSY || again == 2 {
            pool.add(this);
            break;
        }
        eprintln!(
            "{workload}: the process waited for a CPU {wait:.0}% of the attempt (a busy machine): measured again"
        );
    }
    let share = flat_cpu(&pool.read);
    let ours: Vec<f64> = funcs.iter().map(|f| share(f)).collect();
    let rounds = pool.rounds;
    let theirs: Vec<f64> = funcs.iter().map(|f| pool.spy.get(*f).copied().unwrap_or(0.0) / rounds as f64).collect();
    let worst = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    let samples: i64 = pool.read.iter().flat_map(|p| &p.samples).map(|s| s.values[0]).sum();
    let (copied, missed) = (pool.copied, pool.missed);
    let line = format!(
        "{workload} {funcs:?} {ours:.1?} ({samples} samples over {rounds} rounds, {copied} copied at the \
         interrupt, {missed} read from outside), py-spy {theirs:.1?} ({spied} this attempt, the process \
         waiting for a CPU {wait:.0}% of it); largest difference {worst:.1}"
    );
    (line, worst <= 2.0 && copied * 10 >= samples as u64 * 9)
}

/// One attempt of [`against_py_spy`]: its samples, py-spy's count, and the
/// share of the time (%) the process's main thread waited for a CPU.
fn attempt(py: &common::Py, env: &[(&str, &str)], workload: &str) -> (Pool, u64, f64) {
    let w = start_env(py, &[workload], env);
    let waited_ns = || osprey_testkit::run::schedstat(w.pid() as u32).1;
    let (mut pool, waited_before, began, mut spied) = (Pool::default(), waited_ns(), std::time::Instant::now(), 0);
    for _ in 0..4 {
        let (read, summary) = collect_with(w.pid(), 1000, 2.0, false);
        let i = summary.interrupt.expect("copies at the interrupt (run as root)");
        let (spy, n) = osprey_testkit::readers::py_spy_flat(w.pid(), 2, 1000);
        pool.add(Pool { read, spy, rounds: 1, copied: i.copied, missed: i.missed });
        spied += n;
    }
    let wait = 100.0 * waited_ns().saturating_sub(waited_before) as f64 / began.elapsed().as_nanos() as f64;
    (pool, spied, wait)
}

/// `blocking`: the running thread stands still while its stack is read, so
/// no read is ever retried or torn, however fast the stack changes.
#[test]
fn blocking_reads_are_whole() {
    for v in ["3.8", "3.10", "3.12"] {
        let Some(py) = common::python(v) else { continue };
        let _slots = common::slots(common::SLOTS);
        let w = start(&py, &["recurse"]);
        let (profiles, summary) = collect_with(w.pid(), 100, 2.0, true);
        let kept: i64 = profiles.iter().flat_map(|p| &p.samples).map(|s| s.values[0]).sum();
        eprintln!(
            "{v}: kept {kept}, torn {}, retries {}, warnings {:?}",
            summary.torn, summary.retries, summary.warnings
        );
        assert!(kept > 100, "{v}: {kept} samples");
        assert!(summary.warnings.is_empty(), "{v}: {:?}", summary.warnings);
        assert_eq!((summary.torn, summary.retries), (0, 0), "{v}: torn or retried reads of a stopped thread");
    }
}

/// CPU per sample is the thread's CPU since its previous sample: a thread
/// busy all the time has a CPU value on nearly every sample, and none of
/// them carries more than a few intervals' worth.
#[test]
fn cpu_per_sample_has_no_lumps() {
    let Some(py) = common::python("3.12") else { return };
    let _slots = common::slots(common::SLOTS);
    let w = start(&py, &["recurse"]);
    let (profiles, _) = collect(w.pid(), 100, 2.0);
    let values: Vec<(i64, i64)> =
        profiles.iter().flat_map(|p| p.samples.iter().map(|s| (s.values[0], s.values[1]))).collect();
    let (n, with_cpu): (i64, i64) = values.iter().fold((0, 0), |a, (c, v)| (a.0 + c, a.1 + (*v > 0) as i64 * c));
    let total: i64 = values.iter().map(|v| v.1).sum();
    let biggest = values.iter().map(|(c, v)| v / c.max(&1)).max().unwrap_or(0);
    eprintln!("{with_cpu}/{n} samples with CPU, total {} ms, largest {} ms", total / 1_000_000, biggest / 1_000_000);
    assert!(with_cpu as f64 >= 0.9 * n as f64, "{with_cpu}/{n} samples carry CPU");
    assert!((biggest as f64) < 0.05 * total as f64, "one sample carries {biggest} of {total} ns");
}

#[test]
fn ten_thousand_frames() {
    let Some(py) = common::python("3.12") else { return };
    let _slots = common::slots(1);
    let w = start(&py, &["deep", "10000"]);
    let (profiles, summary) = collect(w.pid(), 20, 1.0);
    let samples: Vec<_> = profiles.iter().flat_map(|p| &p.samples).collect();
    assert!(!samples.is_empty(), "no samples of a 10,000-deep stack");
    for s in &samples {
        assert_eq!(s.frames.len(), MAX_DEPTH + 1, "innermost MAX_DEPTH frames and the marker");
        assert_eq!(name(s.frames.last().unwrap()), TRUNCATED);
        assert_eq!(name(&s.frames[0]), "spin_at");
    }
    assert!(summary.torn as usize >= samples.len());
    assert!(profiles.iter().any(|p| p.comments.iter().any(|c| c.contains("[truncated]"))), "counted in the comments");
}
