//! What sampling costs, on both sides, with the test target
//! (`tests/c/split.c`, `fixed` mode: one thread, a fixed amount of work).
//!
//! - Target: its CPU time (user + system, from `wait4`: the kernel's copy
//!   of registers and stack at each sample is charged to it) with and
//!   without an attached [`ProcessSampler`], runs alternated, medians.
//! - Ours: the sampling thread's CPU time (poll, drain, decode, unwind,
//!   refresh of the threads every 100 ms) per sample, and apart the unwind
//!   alone per sample; [`Unwinder::new`] (tables compiled or loaded from
//!   the disk cache) once.
//!
//! `cargo run --release -p osprey-perf --example cost -- [ROUNDS] [RUNS] [HZ...]`
//! (`STACK_BYTES=N` in the environment: the stack copied, 16 KiB by default)

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use osprey_perf::{ProcessSampler, Unwinder};
use osprey_testkit::run::median;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn build() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/split.c");
    let out = std::env::temp_dir().join(format!("osprey-perf-cost-{}", std::process::id()));
    let ok = Command::new("cc").args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"]).arg(&out).arg(&src).status();
    assert!(ok.is_ok_and(|s| s.success()), "cc failed");
    out
}

/// Whether `pid` (our child) has exited, leaving it to be reaped.
fn exited(pid: u32) -> bool {
    // SAFETY: a zeroed siginfo is valid to write.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: WNOWAIT: the child stays for `reap`.
    let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
    // SAFETY: filled by waitid (si_pid 0 when nothing changed).
    r == 0 && unsafe { info.si_pid() } != 0
}

/// User and system CPU time, ns.
type Cpu = (u64, u64);

/// Reaps `pid`: its CPU time.
fn reap(pid: u32) -> Cpu {
    let mut status = 0;
    // SAFETY: zeroed rusage is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers; our child.
    unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 3, "target failed: {status}");
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

#[derive(Default)]
struct Ours {
    samples: u64,
    lost: u64,
    thread_ns: u64,
    unwind_ns: u64,
    new_ns: u64,
    complete: u64,
}

/// One run of the target; `hz`: sampled at that rate. Its user and system
/// CPU ns, and ours.
// The child is reaped by `reap`'s wait4, for its rusage.
#[allow(clippy::zombie_processes)]
fn run(bin: &PathBuf, rounds: &str, hz: Option<u32>) -> (Cpu, Ours) {
    let mut child = Command::new(bin).args(["fixed", rounds]).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let mut out = child.stdout.take().unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut ready).unwrap();
    let mut ours = Ours::default();
    if let Some(hz) = hz {
        let t0 = thread_cpu_ns();
        let mut sampler = ProcessSampler::attach(pid, hz, stack_bytes()).unwrap();
        let mut unwinder = Unwinder::new(pid);
        ours.new_ns = thread_cpu_ns() - t0;
        let mut last_refresh = Instant::now();
        let mut each = |sampler: &mut ProcessSampler, ours: &mut Ours| {
            sampler.drain(&mut |s| {
                let u0 = thread_cpu_ns();
                let st = unwinder.unwind(s);
                ours.unwind_ns += thread_cpu_ns() - u0;
                ours.complete += u64::from(!st.truncated);
            });
        };
        while !exited(pid) {
            sampler.wait(Duration::from_millis(100)).unwrap();
            each(&mut sampler, &mut ours);
            if last_refresh.elapsed() >= Duration::from_millis(100) {
                let _ = sampler.refresh_threads();
                last_refresh = Instant::now();
            }
        }
        each(&mut sampler, &mut ours);
        ours.samples = sampler.totals().samples;
        ours.lost = sampler.totals().lost;
        // Minus the constant cost of attaching (reported apart).
        ours.thread_ns = thread_cpu_ns() - t0 - ours.new_ns;
    }
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut out, &mut rest).unwrap();
    (reap(pid), ours)
}

fn stack_bytes() -> u32 {
    std::env::var("STACK_BYTES").ok().and_then(|s| s.parse().ok()).unwrap_or(16 << 10)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = args.first().cloned().unwrap_or_else(|| "40000".into());
    let runs: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let rates: Vec<u32> = args.iter().skip(2).filter_map(|a| a.parse().ok()).collect();
    let rates = if rates.is_empty() { vec![100, 999] } else { rates };
    let bin = build();
    println!(
        "target: split fixed {rounds} (one thread), {runs} runs per setting, alternated; {} bytes of stack per sample",
        stack_bytes()
    );
    println!("| rate | target CPU ms (median) | of which system | vs unsampled | samples/run | lost | our CPU us/sample (all) | unwind us/sample | complete | Unwinder::new ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut base = Vec::new();
    let mut by_rate: Vec<(Vec<Cpu>, Vec<Ours>)> = rates.iter().map(|_| (Vec::new(), Vec::new())).collect();
    for _ in 0..runs {
        base.push(run(&bin, &rounds, None).0);
        for (i, &hz) in rates.iter().enumerate() {
            let (cpu, ours) = run(&bin, &rounds, Some(hz));
            by_rate[i].0.push(cpu);
            by_rate[i].1.push(ours);
        }
    }
    let total = |v: &[Cpu]| median(&v.iter().map(|c| c.0 + c.1).collect::<Vec<_>>());
    let sys = |v: &[Cpu]| median(&v.iter().map(|c| c.1).collect::<Vec<_>>());
    let b = total(&base);
    println!("| off | {:.1} | {:.1} | 1.000 | - | - | - | - | - | - |", b as f64 / 1e6, sys(&base) as f64 / 1e6);
    for (hz, (cpus, ours)) in rates.iter().zip(by_rate) {
        let c = total(&cpus);
        let samples: u64 = ours.iter().map(|o| o.samples).sum();
        let per = |f: fn(&Ours) -> u64| ours.iter().map(f).sum::<u64>() as f64 / samples.max(1) as f64 / 1e3;
        println!(
            "| {hz} Hz | {:.1} | {:.1} | {:.3} | {} | {} | {:.1} | {:.1} | {:.1}% | {:.1} |",
            c as f64 / 1e6,
            sys(&cpus) as f64 / 1e6,
            c as f64 / b as f64,
            samples / runs as u64,
            ours.iter().map(|o| o.lost).sum::<u64>(),
            per(|o| o.thread_ns),
            per(|o| o.unwind_ns),
            100.0 * ours.iter().map(|o| o.complete).sum::<u64>() as f64 / samples.max(1) as f64,
            median(&ours.iter().map(|o| o.new_ns).collect::<Vec<_>>()) as f64 / 1e6,
        );
    }
    let _ = std::fs::remove_file(&bin);
}
