//! Threads that block every signal, sampled through `perf_event_open`
//! instead of the sampling signal: liblzma's workers (`xz -T2`) and a C
//! worker that blocks all signals around a hot loop. Their CPU has stacks
//! that reach the thread's start routine, the split between functions is
//! the program's, and the profile's CPU total is still the process's.
//!
//! Needs `osprey` and the preload library built
//! (`cargo build -p osprey-cli -p osprey-preload`), `cc`, and xz-utils.
//! Where `perf_event_open` is refused (`kernel.perf_event_paranoid` 3 and
//! above, seccomp), the tests check the fallback instead: the CPU under
//! `[signals blocked]`, and one line saying why. The tests measure shares
//! and osprey's own CPU, so they run one at a time.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::compile_source;
use osprey_testkit::run::{run_measured, Run};
use osprey_testkit::{osprey, paths, tempdir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `osprey exec --hz HZ --out DIR/profiles OPTIONS -- PROGRAM ARGS` (started
/// by `wrapper` if given), measured with the kit's `run_measured`.
fn run(hz: u32, dir: &Path, program: &Path, args: &[&str]) -> Run {
    run_under(None, &[], hz, dir, program, args)
}

/// [`run`], with `osprey` started by `wrapper` (`wrapper osprey exec ...`)
/// and `options` given to `osprey exec`.
fn run_under(wrapper: Option<&Path>, options: &[&str], hz: u32, dir: &Path, program: &Path, args: &[&str]) -> Run {
    let out = dir.join("profiles");
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = Command::new(w);
            c.arg(osprey());
            c
        }
        None => Command::new(osprey()),
    };
    cmd.args(["exec", "--hz", &hz.to_string(), "--out"])
        .arg(&out)
        .args(options)
        .arg("--")
        .arg(program)
        .args(args)
        .env("OSPREY_VERBOSE", "1");
    run_measured(&mut cmd, dir, &out)
}

/// One profile sample, flattened: thread, CPU ns, function names leaf first.
struct Flat {
    tid: i64,
    thread: String,
    cpu_ns: i64,
    /// Wall nanoseconds (0 without `--wall`) and the `state` label.
    wall_ns: i64,
    state: String,
    functions: Vec<String>,
}

fn flatten(profiles: &[Profile]) -> Vec<Flat> {
    let mut out = vec![];
    for p in profiles {
        let cpu = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").expect("cpu sample type");
        let wall = p.sample_type.iter().position(|t| p.string(t.r#type) == "wall");
        let names: HashMap<u64, Vec<String>> = p
            .location
            .iter()
            .map(|l| {
                let n = l.line.iter().map(|ln| p.string(p.function[ln.function_id as usize - 1].name).to_string());
                (l.id, n.collect())
            })
            .collect();
        for s in &p.sample {
            let label = |k: &str| s.label.iter().find(|l| p.string(l.key) == k);
            out.push(Flat {
                tid: label("thread id").map_or(0, |l| l.num),
                thread: label("thread name").map_or(String::new(), |l| p.string(l.str).to_string()),
                cpu_ns: s.value[cpu],
                wall_ns: wall.map_or(0, |w| s.value[w]),
                state: label("state").map_or(String::new(), |l| p.string(l.str).to_string()),
                functions: s.location_id.iter().flat_map(|id| names.get(id).cloned().unwrap_or_default()).collect(),
            });
        }
    }
    out
}

fn has(f: &Flat, pred: impl Fn(&str) -> bool) -> bool {
    f.functions.iter().any(|n| pred(n))
}

fn blocked_frame(f: &Flat) -> bool {
    has(f, |n| n.starts_with("[signals blocked]"))
}

fn agent_frame(f: &Flat) -> bool {
    has(f, |n| n == "[osprey] agent")
}

/// Whether this kernel lets the process open perf events on its own threads.
fn refused(r: &Run) -> bool {
    r.stderr.contains("perf_event_open") && r.stderr.contains("reported under [signals blocked]")
}

/// Checks the accounting every run must keep, and returns the profile's CPU.
fn check_total(r: &Run, flat: &[Flat]) -> i64 {
    let total: i64 = flat.iter().map(|f| f.cpu_ns).sum();
    let ratio = total as f64 / r.cpu_ns as f64;
    assert!((0.85..=1.1).contains(&ratio), "profile CPU {total} ns vs process {} ns", r.cpu_ns);
    total
}

/// Checks the fallback where the kernel refuses the events.
fn check_refused(r: &Run, flat: &[Flat], total: i64) {
    let blocked: i64 = flat.iter().filter(|f| blocked_frame(f)).map(|f| f.cpu_ns).sum();
    assert!(blocked > total / 2, "refused: blocked threads' CPU not accounted: {blocked} of {total} ns");
    assert!(r.stderr.contains("perf_event_paranoid") || r.stderr.contains("seccomp"), "{}", r.stderr);
}

/// liblzma's workers block every signal: sampled through perf events, their
/// CPU has stacks from `start_thread` (or `clone3`) through liblzma, hardly
/// any of it is left under `[signals blocked]` (only what ran before the
/// events opened), and osprey's own CPU stays within 1% of the program's.
#[test]
fn xz_workers_have_stacks() {
    let _serial = osprey_testkit::run::serial();
    let dir = tempdir("xz");
    let xz = paths::debian_program("xz", "xz-utils");
    let input = prose(&dir, 8 << 20);
    // osprey's own CPU (a debug build here) at most 2% of the program's,
    // measured once more when over: its share moves with the machine
    // (1.0-1.5% on some, with or without load).
    for attempt in 0..2 {
        // Each attempt reads only its own profiles.
        let _ = std::fs::remove_dir_all(dir.join("profiles"));
        let r = run(100, &dir, &xz, &["-6", "-T2", "-k", "-f", input.to_str().unwrap()]);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        assert!(r.stderr.contains("blocks the sampling signal"), "nothing said: {}", r.stderr);
        let flat = flatten(&r.profiles);
        let total = check_total(&r, &flat);
        if refused(&r) {
            return check_refused(&r, &flat, total);
        }
        let main = flat.iter().filter(|f| f.tid > 0).map(|f| f.tid).min().unwrap_or(0);
        let workers: Vec<&Flat> = flat.iter().filter(|f| f.tid > 0 && f.tid != main).collect();
        let worker_cpu: i64 = workers.iter().map(|f| f.cpu_ns).sum();
        let rooted: i64 = workers
            .iter()
            .filter(|f| has(f, |n| n == "start_thread" || n.contains("clone3")) && has(f, |n| n.contains("lzma")))
            .map(|f| f.cpu_ns)
            .sum();
        let blocked: i64 = flat.iter().filter(|f| blocked_frame(f)).map(|f| f.cpu_ns).sum();
        let agent: i64 = flat.iter().filter(|f| agent_frame(f)).map(|f| f.cpu_ns).sum();
        eprintln!(
            "xz -T2: process {} ms, profile {} ms, workers {} ms, rooted through liblzma {:.1}%, \
         [signals blocked] {} ms, agent {:.2}%",
            r.cpu_ns / 1_000_000,
            total / 1_000_000,
            worker_cpu / 1_000_000,
            100.0 * rooted as f64 / worker_cpu.max(1) as f64,
            blocked / 1_000_000,
            100.0 * agent as f64 / (total - agent).max(1) as f64
        );
        assert!(worker_cpu > total / 2, "workers {worker_cpu} of {total} ns");
        assert!(rooted * 100 >= worker_cpu * 95, "stacks reaching start_thread: {rooted} of {worker_cpu} ns");
        assert!(blocked * 100 <= total * 5, "left under [signals blocked]: {blocked} of {total} ns");
        if agent * 50 <= total - agent {
            break;
        }
        assert!(attempt == 0, "agent {agent} ns of {} ns", total - agent);
    }
}

const WORKER_C: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long sink;
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__attribute__((noinline)) static void spin(long n) { for (long i = 0; i < n; i++) sink += i; }
__attribute__((noinline)) void fifty(void) { spin(50000); __asm__ volatile(""); }
__attribute__((noinline)) void thirty(void) { spin(30000); __asm__ volatile(""); }
__attribute__((noinline)) void twenty(void) { spin(20000); __asm__ volatile(""); }
static double seconds, idle;
__attribute__((noinline)) void *blocking_worker(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "blockworker");
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, 0);
    double end = cpu() + seconds;
    while (cpu() < end) { fifty(); thirty(); twenty(); }
    if (idle > 0) usleep(idle * 1e6);
    return 0; /* exits blocked, as liblzma's workers do */
}
int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 3;
    idle = argc > 2 ? atof(argv[2]) : 0;
    pthread_t t;
    if (pthread_create(&t, 0, blocking_worker, 0)) return 1;
    pthread_join(t, 0);
    return 0;
}
"#;

/// Compiles C `source` into `dir/name`.
fn compile(dir: &Path, name: &str, source: &str) -> PathBuf {
    compile_source(dir, name, source)
}

/// Runs its arguments as a command with `perf_event_open` failing with
/// `EACCES` (a seccomp filter, as container runtimes install).
const NO_PERF_C: &str = r#"
#include <errno.h>
#include <stddef.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_perf_event_open, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { sizeof f / sizeof f[0], f };
    if (argc < 2 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) return 99;
    execvp(argv[1], argv + 1);
    return 98;
}
"#;

/// Where `perf_event_open` is refused, a blocked thread's CPU stays under
/// `[signals blocked]`, the profile's total is still the process's, and
/// the line about the thread says why and which setting allows it.
#[test]
fn refused_events_leave_the_cpu_under_signals_blocked() {
    let _serial = osprey_testkit::run::serial();
    let dir = tempdir("refused");
    let exe = compile(&dir, "worker", WORKER_C);
    let wrapper = compile(&dir, "no_perf", NO_PERF_C);
    // Idle a while after the loop: without an event, the CPU a blocked thread
    // uses after the last clock check (once a second) and before it exits is
    // not seen.
    let r = run_under(Some(&wrapper), &[], 100, &dir, &exe, &["2", "1.5"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let flat = flatten(&r.profiles);
    let total = check_total(&r, &flat);
    assert!(refused(&r), "{}", r.stderr);
    check_refused(&r, &flat, total);
    let said = r.stderr.lines().filter(|l| l.contains("blocks the sampling signal")).count();
    assert_eq!(said, 1, "said once per thread: {}", r.stderr);
}

/// A worker that blocks every signal around a hot loop of three functions
/// doing 50%, 30% and 20% of the work: found blocked by the clock check,
/// then sampled through its perf event; the split of its stacked CPU is the
/// program's within 5 points (some 1500 samples at 250 Hz: a 30% share
/// varies by 1.2 points), each stack reaches the worker's start
/// routine, and the profile's CPU total is the process's.
#[test]
fn a_worker_blocking_signals_keeps_its_split() {
    let _serial = osprey_testkit::run::serial();
    let dir = tempdir("split");
    let exe = compile(&dir, "worker", WORKER_C);
    let r = run(250, &dir, &exe, &["6"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let flat = flatten(&r.profiles);
    let total = check_total(&r, &flat);
    assert!(r.stderr.contains("blocks the sampling signal"), "nothing said: {}", r.stderr);
    if refused(&r) {
        return check_refused(&r, &flat, total);
    }
    let worker: Vec<&Flat> = flat.iter().filter(|f| f.thread == "blockworker" && !blocked_frame(f)).collect();
    let stacked: i64 = worker.iter().map(|f| f.cpu_ns).sum();
    let under = |name: &str| worker.iter().filter(|f| has(f, |n| n == name)).map(|f| f.cpu_ns).sum::<i64>();
    let rooted: i64 = worker
        .iter()
        .filter(|f| has(f, |n| n == "blocking_worker") && has(f, |n| n == "start_thread" || n.contains("clone3")))
        .map(|f| f.cpu_ns)
        .sum();
    let share = |ns: i64| 100.0 * ns as f64 / stacked.max(1) as f64;
    let (a, b, c) = (share(under("fifty")), share(under("thirty")), share(under("twenty")));
    eprintln!(
        "worker: process {} ms, profile {} ms, worker with stacks {} ms: fifty {a:.1}% thirty {b:.1}% twenty {c:.1}%, \
         rooted {:.1}%",
        r.cpu_ns / 1_000_000,
        total / 1_000_000,
        stacked / 1_000_000,
        share(rooted)
    );
    assert!(stacked > total / 3, "worker's stacked CPU {stacked} of {total} ns");
    assert!((a - 50.0).abs() <= 5.0 && (b - 30.0).abs() <= 5.0 && (c - 20.0).abs() <= 5.0, "{a} {b} {c}");
    assert!(share(rooted) >= 95.0, "stacks reaching the start routine: {:.1}%", share(rooted));
}

/// With `--wall`, the running time of a thread sampled through its event
/// comes with the event's samples: a stack, state `running`, not a bare
/// `[truncated]` frame.
#[test]
fn wall_time_of_a_blocking_worker_has_stacks() {
    let _serial = osprey_testkit::run::serial();
    let dir = tempdir("wall");
    let exe = compile(&dir, "worker", WORKER_C);
    let r = run_under(None, &["--wall"], 100, &dir, &exe, &["3"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    if refused(&r) {
        return;
    }
    let flat = flatten(&r.profiles);
    let mut threads: HashMap<(i64, &str, &str), (i64, i64)> = HashMap::new();
    for f in &flat {
        let e = threads.entry((f.tid, f.thread.as_str(), f.state.as_str())).or_default();
        e.0 += f.wall_ns;
        e.1 += f.cpu_ns;
    }
    let worker: Vec<&Flat> = flat.iter().filter(|f| f.thread == "blockworker" && f.wall_ns > 0).collect();
    let wall: i64 = worker.iter().map(|f| f.wall_ns).sum();
    let stacked: i64 =
        worker.iter().filter(|f| f.state == "running" && has(f, |n| n == "blocking_worker")).map(|f| f.wall_ns).sum();
    eprintln!("worker wall {} ms, running with a stack {} ms", wall / 1_000_000, stacked / 1_000_000);
    assert!(wall > 1_000_000_000, "worker wall {wall} ns; (tid, name, state) -> (wall, cpu): {threads:?}");
    assert!(stacked * 100 >= wall * 80, "running with a stack: {stacked} of {wall} ns");
}

/// `bytes` of text with a vocabulary in `dir/input.txt`: it compresses like
/// prose, not like noise or zeros.
fn prose(dir: &Path, bytes: usize) -> PathBuf {
    let mut x = 12345u64;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x >> 33
    };
    let words: Vec<String> =
        (0..4000).map(|_| (0..2 + next() % 8).map(|_| (b'a' + (next() % 26) as u8) as char).collect()).collect();
    let mut text = String::with_capacity(bytes);
    while text.len() < bytes {
        text.push_str(&words[(next() % 4000) as usize]);
        text.push(if next() % 12 == 0 { '\n' } else { ' ' });
    }
    let input = dir.join("input.txt");
    std::fs::write(&input, text).unwrap();
    input
}

/// zstd's worker pool leaves signals unblocked (liblzma's blocks them): its
/// workers are sampled by their own clocks, with stacks, and none of their
/// CPU is left under `[signals blocked]`.
#[test]
fn zstd_workers_have_stacks() {
    let _serial = osprey_testkit::run::serial();
    let dir = tempdir("zstd");
    let zstd = paths::debian_program("zstd", "zstd");
    let input = prose(&dir, 4 << 20);
    let out = dir.join("out.zst");
    let r = run(100, &dir, &zstd, &["-17", "-T2", "-f", "-q", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let flat = flatten(&r.profiles);
    let total = check_total(&r, &flat);
    let main = flat.iter().filter(|f| f.tid > 0).map(|f| f.tid).min().unwrap_or(0);
    let workers: Vec<&Flat> = flat.iter().filter(|f| f.tid > 0 && f.tid != main).collect();
    let worker_cpu: i64 = workers.iter().map(|f| f.cpu_ns).sum();
    let rooted: i64 =
        workers.iter().filter(|f| has(f, |n| n == "start_thread" || n.contains("clone3"))).map(|f| f.cpu_ns).sum();
    let blocked: i64 = flat.iter().filter(|f| blocked_frame(f)).map(|f| f.cpu_ns).sum();
    eprintln!(
        "zstd -T2: process {} ms, profile {} ms, workers {} ms, rooted {:.1}%, [signals blocked] {} ms",
        r.cpu_ns / 1_000_000,
        total / 1_000_000,
        worker_cpu / 1_000_000,
        100.0 * rooted as f64 / worker_cpu.max(1) as f64,
        blocked / 1_000_000
    );
    assert!(worker_cpu > total / 2, "workers {worker_cpu} of {total} ns");
    assert!(rooted * 100 >= worker_cpu * 95, "stacks reaching start_thread: {rooted} of {worker_cpu} ns");
    assert!(blocked * 100 <= total * 5, "left under [signals blocked]: {blocked} of {total} ns");
}
