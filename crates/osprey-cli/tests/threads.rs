//! The host's threads under `osprey exec`: threads that block signals, a
//! thousand threads at once, short-lived threads, tiny stacks at 10 kHz,
//! sleeping threads (no `EINTR`), descriptors closed by the program, and
//! the cost of idle threads. Each program is a small C file compiled here.
//!
//! Needs the workspace built (`cargo build --workspace`); `cargo xtask test` does it.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::compile_source;
use osprey_testkit::run::{run_measured, Run};
use osprey_testkit::{osprey, tempdir};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `osprey exec --hz HZ --out DIR -- PROGRAM ARGS`, or the program alone
/// when `hz` is `None`; waits with `wait4` to read the program's own CPU time.
fn run(hz: Option<u32>, dir: &Path, program: &Path, args: &[&str]) -> Run {
    let out = dir.join(format!("profiles-{}", hz.unwrap_or(0)));
    let mut cmd = match hz {
        Some(hz) => {
            let mut c = Command::new(osprey());
            c.args(["exec", "--hz", &hz.to_string(), "--out"]).arg(&out).arg("--").arg(program);
            // The agent's last line is written at exit, after the program's own closes.
            c.env("OSPREY_VERBOSE", "1");
            c
        }
        None => Command::new(program),
    };
    run_measured(cmd.args(args), dir, &out)
}

/// Total cpu nanoseconds in `profiles`, and the part under frames whose name starts with `prefix`.
fn cpu_under(profiles: &[Profile], prefix: &str) -> (i64, i64) {
    let (mut total, mut under) = (0, 0);
    for p in profiles {
        let cpu = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").expect("cpu sample type");
        let hit: std::collections::HashSet<u64> = p
            .location
            .iter()
            .filter(|l| {
                l.line.iter().any(|ln| p.string(p.function[ln.function_id as usize - 1].name).starts_with(prefix))
            })
            .map(|l| l.id)
            .collect();
        for s in &p.sample {
            total += s.value[cpu];
            if s.location_id.iter().any(|id| hit.contains(id)) {
                under += s.value[cpu];
            }
        }
    }
    (total, under)
}

fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true")
}

/// liblzma's worker threads block every signal: they are never signalled,
/// their CPU time is in the profile (with stacks through their perf events,
/// or under `[signals blocked]` where the kernel refuses those), said once
/// per thread on stderr, and the profile's CPU total matches the process's.
#[test]
fn threads_that_block_signals_are_accounted() {
    let dir = tempdir("xz");
    let Ok(xz) = which("xz") else {
        panic!("xz missing: apt-get install xz-utils");
    };
    let input = dir.join("input");
    let size = if ci() { 4 << 20 } else { 16 << 20 };
    let mut data = Vec::with_capacity(size);
    let mut x = 12345u64;
    while data.len() < size {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        data.extend_from_slice(format!("line {} {}\n", x >> 50, (x >> 20) % 1000).as_bytes());
    }
    std::fs::write(&input, &data).unwrap();
    let r = run(Some(100), &dir, &xz, &["-T2", "-3", "-k", "-f", input.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let (total, blocked) = cpu_under(&r.profiles, "[signals blocked]");
    eprintln!(
        "xz -T2: process CPU {} ms, profile {} ms, of which [signals blocked] {} ms",
        r.cpu_ns / 1_000_000,
        total / 1_000_000,
        blocked / 1_000_000
    );
    assert!(r.stderr.contains("blocks the sampling signal"), "nothing said: {}", r.stderr);
    if r.stderr.contains("reported under [signals blocked]") {
        // perf_event_open refused: the workers' CPU is accounted without stacks.
        assert!(blocked > total / 2, "workers' CPU not accounted: {blocked} of {total} ns");
    } else {
        // Sampled through their perf events: stacks, not `[signals blocked]`.
        assert!(blocked * 20 < total, "workers' CPU left without stacks: {blocked} of {total} ns");
    }
    let ratio = total as f64 / r.cpu_ns as f64;
    assert!((0.85..=1.1).contains(&ratio), "profile CPU {total} ns vs process {} ns", r.cpu_ns);
}

const THREADS_C: &str = r#"
#include <unistd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <dirent.h>
static pthread_barrier_t bar;
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static volatile unsigned long sink;
static void burn(double s) { double end = cpu() + s; while (cpu() < end) for (int i = 0; i < 1000; i++) sink += i; }
static void *worker(void *arg) { double ms = *(double *)arg; pthread_barrier_wait(&bar); burn(ms / 1000); return 0; }
static int count_fds(void) { int n = 0; DIR *d = opendir("/proc/self/fd"); while (readdir(d)) n++; closedir(d); return n; }
/* The fewest of a few counts: the agent's collector opens /proc files for a
 * moment now and then; a leaked descriptor stays. */
static int fds(void) { int m = 1 << 30; for (int i = 0; i < 8; i++) { int n = count_fds(); if (n < m) m = n; usleep(3000); } return m; }
int main(int argc, char **argv) {
    int n = atoi(argv[1]); double ms = atof(argv[2]); int together = atoi(argv[3]);
    pthread_t *t = calloc(n, sizeof *t);
    pthread_attr_t a; pthread_attr_init(&a); pthread_attr_setstacksize(&a, 64 << 10);
    int before = fds();
    if (together) {
        pthread_barrier_init(&bar, 0, n);
        for (int i = 0; i < n; i++) if (pthread_create(&t[i], &a, worker, &ms)) { perror("pthread_create"); return 1; }
        for (int i = 0; i < n; i++) pthread_join(t[i], 0);
    } else {
        pthread_barrier_init(&bar, 0, 1);
        for (int i = 0; i < n; i++) { pthread_create(&t[i], &a, worker, &ms); pthread_join(t[i], 0); }
    }
    printf("fds %d %d\n", before, fds());
    return 0;
}
"#;

/// A thousand threads started at once, each burning 3 ms: every one has a
/// clock, no descriptor is left behind, and the profile holds the CPU the
/// process used (nothing dropped as "thread not registered").
#[test]
fn a_thousand_threads_at_once() {
    let dir = tempdir("burst");
    let exe = compile_source(&dir, "threads", THREADS_C);
    let r = run(Some(100), &dir, &exe, &["1000", "3", "1"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let fds: Vec<i32> = r.stdout.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect();
    assert_eq!(fds[0], fds[1], "descriptors leaked: {}", r.stdout);
    let (total, unregistered) = cpu_under(&r.profiles, "[osprey] dropped: thread not registered");
    eprintln!(
        "1000 threads: process CPU {} ms, profile {} ms, unregistered {} ms",
        r.cpu_ns / 1_000_000,
        total / 1_000_000,
        unregistered / 1_000_000
    );
    assert!(unregistered * 20 < total, "{unregistered} of {total} ns without a record");
    let ratio = total as f64 / r.cpu_ns as f64;
    assert!((0.8..=1.15).contains(&ratio), "profile CPU {total} ns vs process {} ns", r.cpu_ns);
}

/// 200 threads burning 5 ms each, one after the other (each shorter than a
/// sample period at 100 Hz): the profile shows about their 1 s of CPU.
#[test]
fn short_lived_threads_are_accounted() {
    let dir = tempdir("short");
    let exe = compile_source(&dir, "threads", THREADS_C);
    let r = run(Some(100), &dir, &exe, &["200", "5", "0"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let (total, _) = cpu_under(&r.profiles, "-");
    eprintln!("200 x 5 ms: process CPU {} ms, profile {} ms", r.cpu_ns / 1_000_000, total / 1_000_000);
    assert!(total >= 800_000_000, "200 x 5 ms reported as {} ms", total / 1_000_000);
    let ratio = total as f64 / r.cpu_ns as f64;
    assert!((0.8..=1.15).contains(&ratio), "profile CPU {total} ns vs process {} ns", r.cpu_ns);
}

const SMALL_STACKS_C: &str = r#"
#include <pthread.h>
#include <limits.h>
#include <stdio.h>
#include <time.h>
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static volatile unsigned long sink;
__attribute__((noinline)) static unsigned long deep(int n) { char pad[256]; pad[n % 256] = n; return n ? deep(n - 1) + pad[n % 256] : sink++; }
static void *worker(void *arg) { double end = cpu() + 0.3; while (cpu() < end) deep(20); return 0; }
int main(void) {
    pthread_attr_t a; pthread_attr_init(&a);
    if (pthread_attr_setstacksize(&a, 16384)) { perror("stacksize"); return 1; }
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], &a, worker, 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    puts("ok");
    return 0;
}
"#;

/// 16 KiB thread stacks (20 frames of 256 bytes deep already use 6 KiB of
/// them) sampled at 10 kHz: the handler's walk lives in the thread's record,
/// not on its stack, so nothing overflows.
#[test]
fn sixteen_kib_stacks_at_ten_khz() {
    let dir = tempdir("stacks");
    let exe = compile_source(&dir, "small_stacks", SMALL_STACKS_C);
    let r = run(Some(10_000), &dir, &exe, &[]);
    assert_eq!(r.code, Some(0), "crashed: {}", r.stderr);
    assert_eq!(r.stdout.trim(), "ok");
    let (total, _) = cpu_under(&r.profiles, "-");
    assert!(total > 600_000_000, "barely sampled: {total} ns");
}

const SLEEPERS_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>
static int calls;
static int eintr[4];
static void *sleeper(void *arg) {
    int kind = *(int *)arg, ep = epoll_create1(0);
    struct epoll_event ev;
    for (int i = 0; i < calls; i++) {
        int r;
        if (kind == 0) { struct timespec ts = {0, 1000000}; r = nanosleep(&ts, 0); }
        else if (kind == 1) r = poll(0, 0, 1);
        else if (kind == 2) r = epoll_wait(ep, &ev, 1, 1);
        else { struct timeval tv = {0, 1000}; r = select(0, 0, 0, 0, &tv); }
        if (r < 0 && errno == EINTR) __atomic_add_fetch(&eintr[kind], 1, __ATOMIC_RELAXED);
    }
    return 0;
}
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static volatile unsigned long sink;
static void *busy(void *arg) { double end = cpu() + 1.0; while (cpu() < end) sink++; return 0; }
int main(int argc, char **argv) {
    calls = atoi(argv[1]);
    pthread_t t[5]; int kinds[4] = {0, 1, 2, 3};
    pthread_create(&t[4], 0, busy, 0);
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, sleeper, &kinds[i]);
    for (int i = 0; i < 5; i++) pthread_join(t[i], 0);
    printf("%d %d %d %d\n", eintr[0], eintr[1], eintr[2], eintr[3]);
    return 0;
}
"#;

/// Sleeping threads are never woken by osprey: at the default rate (POSIX
/// CPU timers, which fire only while a thread runs user or kernel code of its
/// own, and priming sent only to running threads) nanosleep, poll,
/// epoll_wait and select return EINTR as often with osprey as without it.
/// At 1 kHz (perf clocks) a sample that lands while a thread enters a wait
/// interrupts that call, as any CPU-time signal does: the figure is printed.
#[test]
fn sleeping_threads_see_no_eintr() {
    let dir = tempdir("eintr");
    let exe = compile_source(&dir, "sleepers", SLEEPERS_C);
    let calls = if ci() { "500" } else { "2000" };
    let mut lines = vec![];
    for hz in [None, Some(100), Some(1000)] {
        let r = run(hz, &dir, &exe, &[calls]);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        let counts: Vec<u32> = r.stdout.split_whitespace().map(|v| v.parse().unwrap()).collect();
        lines.push((hz, counts));
    }
    for (hz, c) in &lines {
        eprintln!("EINTR per {calls} calls (nanosleep, poll, epoll_wait, select) at {hz:?} Hz: {c:?}");
    }
    let baseline: u32 = lines[0].1.iter().sum();
    let (hz, c) = &lines[1];
    assert!(c.iter().sum::<u32>() <= baseline, "EINTR at {hz:?} Hz: {c:?} (without osprey: {:?})", lines[0].1);
}

const CLOSER_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <time.h>
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static volatile unsigned long sink;
static volatile int phase;
static double secs = 0.2;
static void *busy(void *arg) { while (phase < 1) sink++; double end = cpu() + secs; while (cpu() < end) sink++; return 0; }
int main(int argc, char **argv) {
    if (argc > 2) secs = atof(argv[2]);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, busy, 0);
    struct timespec ts = {0, 100000000}; nanosleep(&ts, 0);
    /* Close every descriptor but stdio, as a daemon does, then open files: they
       may get the numbers osprey used. */
    syscall(SYS_close_range, 3, ~0U, 0);
    int fd[64]; char name[256];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "%s/f%d", argv[1], i);
        fd[i] = open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
        if (fd[i] < 0) { perror("open"); return 1; }
        /* Also take high numbers, where osprey keeps its descriptors. */
        int hi = fcntl(fd[i], F_DUPFD, 700 + i);
        if (hi >= 0) { close(fd[i]); fd[i] = hi; }
    }
    /* And make stderr a file of its own, as a daemon's log. */
    dup2(fd[0], 2);
    phase = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);  /* threads exit: osprey gives up their clocks */
    for (int i = 0; i < 64; i++) {
        char line[32]; int n = snprintf(line, sizeof line, "file %d\n", i);
        if (write(fd[i], line, n) != n) { printf("write %d failed\n", i); return 1; }
        char back[32] = {0};
        if (pread(fd[i], back, sizeof back - 1, 0) != n || strcmp(back, line)) { printf("file %d holds '%s'\n", i, back); return 1; }
    }
    puts("ok");
    return 0;
}
"#;

/// A program that closes every descriptor, reopens files on the same
/// numbers and puts one on stderr keeps its files: osprey never closes or
/// writes a descriptor that is no longer its own, its lines included (1 kHz:
/// perf clocks, one descriptor per thread).
#[test]
fn descriptors_taken_over_by_the_program_are_left_alone() {
    let dir = tempdir("fds");
    let exe = compile_source(&dir, "closer", CLOSER_C);
    let files = dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    for hz in [100, 1000] {
        // Busy long enough (1 s per thread) for the agent to find the clocks gone.
        let r = run(Some(hz), &dir, &exe, &[files.to_str().unwrap(), "1"]);
        assert_eq!(r.code, Some(0), "at {hz} Hz: {} {}", r.stdout, r.stderr);
        assert_eq!(r.stdout.trim(), "ok");
        for i in 0..64 {
            assert_eq!(std::fs::read_to_string(files.join(format!("f{i}"))).unwrap(), format!("file {i}\n"));
        }
        // The CPU used while the threads had no working clock (from the
        // close to the switch to timers) is in the profile once, on their
        // stacks: not twice, not under a made-up frame.
        let (total, unregistered) = cpu_under(&r.profiles, "[osprey] dropped: thread not registered");
        let ratio = total as f64 / r.cpu_ns as f64;
        eprintln!("at {hz} Hz: process CPU {} ms, profile {} ms", r.cpu_ns / 1_000_000, total / 1_000_000);
        assert!((0.85..=1.1).contains(&ratio), "at {hz} Hz: profile CPU {total} ns vs process {} ns", r.cpu_ns);
        assert!(unregistered * 20 < total, "at {hz} Hz: {unregistered} of {total} ns without a record");
    }
}

const IDLE_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static volatile unsigned long sink;
static void *idle(void *arg) { pause(); return 0; }
int main(int argc, char **argv) {
    int n = atoi(argv[1]); double secs = atof(argv[2]);
    pthread_attr_t a; pthread_attr_init(&a); pthread_attr_setstacksize(&a, 64 << 10);
    pthread_t t;
    for (int i = 0; i < n; i++) pthread_create(&t, &a, idle, 0);
    double end = cpu() + secs;
    while (cpu() < end) sink++;
    if (argc > 3) { /* print VmRSS (kB) */
        FILE *f = fopen("/proc/self/status", "r"); char line[256];
        while (fgets(line, sizeof line, f)) if (!strncmp(line, "VmRSS:", 6)) fputs(line, stdout);
        fclose(f);
    }
    return 0;
}
"#;

/// What idle threads cost: one busy thread at 100 Hz with 0 and 1000 idle
/// threads, process CPU with and without osprey, over the same busy CPU time.
/// Prints the figures; asserts only that idle threads do not multiply the cost.
#[test]
fn idle_threads_cost_little() {
    let dir = tempdir("idle");
    let exe = compile_source(&dir, "idle", IDLE_C);
    // Long enough that registering the 1000 threads (a one-off) does not
    // dominate the per-second figure.
    let secs = "6";
    let mut extra = vec![];
    for n in ["0", "1000"] {
        let base = run(None, &dir, &exe, &[n, secs]);
        let prof = run(Some(100), &dir, &exe, &[n, secs]);
        assert_eq!((base.code, prof.code), (Some(0), Some(0)), "{}", prof.stderr);
        let added = (prof.cpu_ns - base.cpu_ns) as f64 / (secs.parse::<f64>().unwrap() * 1e9) * 100.0;
        eprintln!(
            "{n} idle threads: process CPU {} ms without osprey, {} ms with (+{added:.2}% of a core)",
            base.cpu_ns / 1_000_000,
            prof.cpu_ns / 1_000_000
        );
        extra.push(prof.cpu_ns - base.cpu_ns);
    }
    // The agent's own CPU is not charged to the program's threads: compare
    // whole-process CPU. The target, 0.3% of a core, is met by release
    // builds (the README has the figures); this bound, loose for debug
    // builds on a shared machine, catches idle threads multiplying the cost.
    let per_second = (extra[1] - extra[0]) as f64 / secs.parse::<f64>().unwrap() / 1e9;
    assert!(per_second < 0.10, "1000 idle threads cost {:.1}% of a core", per_second * 100.0);
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.exists()))
        .ok_or(())
}

/// Ten thousand threads under `ulimit -n 1024`, sampled at 1 kHz: perf
/// clocks take descriptors only in the top quarter of the limit, the rest
/// of the threads get POSIX timers, so the program never runs out of
/// descriptors; and the agent's memory for them stays under 64 MiB.
#[test]
fn ten_thousand_threads_under_a_1024_descriptor_limit() {
    use std::os::unix::process::CommandExt;
    let dir = tempdir("10k");
    let exe = compile_source(&dir, "idle", IDLE_C);
    let n = if ci() { "3000" } else { "10000" };
    let rss = |hz: Option<u32>| -> i64 {
        let mut cmd = match hz {
            Some(hz) => {
                let mut c = Command::new(osprey());
                c.args(["exec", "--quiet", "--hz", &hz.to_string(), "--out"]).arg(dir.join("p")).arg("--").arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        // SAFETY: setrlimit between fork and exec is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                Ok(())
            });
        }
        let out = cmd.args([n, "0.3", "rss"]).output().unwrap();
        assert!(out.status.success(), "{hz:?}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no VmRSS in {text}"))
    };
    let (base, profiled) = (rss(None), rss(Some(1000)));
    let added_mib = (profiled - base) as f64 / 1024.0;
    eprintln!(
        "{n} threads, ulimit -n 1024, 1 kHz: VmRSS {base} kB without osprey, {profiled} kB with (+{added_mib:.1} MiB)"
    );
    assert!(added_mib < 64.0, "{n} threads cost {added_mib:.1} MiB");
}
