//! Overhead benchmark: one CPU-bound workload (2 threads, the
//! 50/30/20 split) with no profiler, with osprey, and with pprof-rs, at
//! 100 Hz and 1 kHz. Each run is a fresh child process; runs alternate and
//! the median of `OSPREY_BENCH_REPS` (default 5) is reported.
//!
//! A fourth run, "signals only", arms on each worker the very clock osprey
//! would (`cpu_clock::open`) with a handler that only counts the signal: what is left
//! is the kernel's cost of delivering the samples (timer interrupt, signal
//! frame, `rt_sigreturn`), the floor of any in-process signal profiler.
//!
//! Figures: CPU-time overhead during the workload (ratio to no profiler),
//! samples delivered vs expected (CPU seconds x rate), peak RSS added, and
//! the one-off cost of writing the profile at the end.
//!
//! `cargo bench -p osprey-demo --bench overhead`

use osprey_testkit::run::median;
use std::process::Command;
use std::time::Instant;

const ROUNDS: u64 = 1500;

#[derive(Clone, Copy, Debug, Default)]
struct Run {
    work_cpu_s: f64,
    samples: f64,
    hwm_kib: f64,
    report_ms: f64,
}

fn cpu_s() -> f64 {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn hwm_kib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn workload() {
    osprey_demo::on_threads(2, || {
        osprey_demo::split_work(ROUNDS / 2);
    });
}

/// Runs the workload with osprey's clock on each worker and a handler that
/// only counts; returns the signals received.
fn signals_only(hz: u32) -> u64 {
    static RECEIVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    extern "C" fn counting_handler(_: libc::c_int) {
        RECEIVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let sig = libc::SIGRTMIN() + 5;
    // SAFETY: an all-zero sigaction is valid; the handler only bumps an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = counting_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
    let period = 1_000_000_000 / u64::from(hz);
    osprey_demo::on_threads(2, move || {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        osprey::internals::cpu_clock::open(tid, period, sig).expect("clock");
        osprey_demo::split_work(ROUNDS / 2);
    });
    RECEIVED.load(std::sync::atomic::Ordering::Relaxed)
}

fn child(mode: &str, hz: u32) {
    let dir = std::env::temp_dir().join(format!("osprey-bench-{}", std::process::id()));
    let c0 = cpu_s();
    let (samples, report_ms);
    match mode {
        "none" => {
            workload();
            samples = 0.0;
            report_ms = 0.0;
        }
        "signals" => {
            samples = signals_only(hz) as f64;
            report_ms = 0.0;
        }
        "osprey" => {
            let p = osprey::Profiler::builder().hz(hz).out_dir(&dir).start().unwrap();
            workload();
            let c1 = cpu_s();
            let signals = osprey::internals::agent::stats().signals;
            let t = Instant::now();
            let files = p.stop();
            assert!(!files.is_empty(), "osprey wrote no profile");
            samples = signals as f64;
            report_ms = t.elapsed().as_secs_f64() * 1e3;
            println!("{} {samples} {} {report_ms}", c1 - c0, hwm_kib());
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        "pprof" => {
            let g = pprof::ProfilerGuardBuilder::default().frequency(hz as i32).build().unwrap();
            workload();
            let c1 = cpu_s();
            let t = Instant::now();
            let r = g.report().build().unwrap();
            samples = r.data.values().map(|&c| c as f64).sum();
            report_ms = t.elapsed().as_secs_f64() * 1e3;
            println!("{} {samples} {} {report_ms}", c1 - c0, hwm_kib());
            return;
        }
        _ => panic!("mode"),
    }
    println!("{} {samples} {} {report_ms}", cpu_s() - c0, hwm_kib());
}

fn spawn(mode: &str, hz: u32) -> Run {
    let out = Command::new(std::env::current_exe().unwrap()).args(["--child", mode, &hz.to_string()]).output().unwrap();
    assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).unwrap();
    let v: Vec<f64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    Run { work_cpu_s: v[0], samples: v[1], hwm_kib: v[2], report_ms: v[3] }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(&args[2], args[3].parse().unwrap());
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let reps: usize = std::env::var("OSPREY_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    println!("| rate | profiler | CPU overhead | samples / expected | peak RSS added | profile write |");
    println!("|---|---|---|---|---|---|");
    for hz in [100u32, 1000] {
        let mut runs: std::collections::BTreeMap<&str, Vec<Run>> = Default::default();
        for _ in 0..reps {
            for mode in ["none", "signals", "osprey", "pprof"] {
                runs.entry(mode).or_default().push(spawn(mode, hz));
            }
        }
        let base_cpu = median(&runs["none"].iter().map(|r| r.work_cpu_s).collect::<Vec<_>>());
        let base_rss = median(&runs["none"].iter().map(|r| r.hwm_kib).collect::<Vec<_>>());
        for mode in ["signals", "osprey", "pprof"] {
            let rs = &runs[mode];
            let cpu = median(&rs.iter().map(|r| r.work_cpu_s).collect::<Vec<_>>());
            let delivered = median(&rs.iter().map(|r| r.samples / (r.work_cpu_s * hz as f64)).collect::<Vec<_>>());
            let rss = median(&rs.iter().map(|r| r.hwm_kib).collect::<Vec<_>>()) - base_rss;
            let write = median(&rs.iter().map(|r| r.report_ms).collect::<Vec<_>>());
            let name = match mode {
                "pprof" => "pprof-rs 0.15",
                "signals" => "signals only (same clocks, counting handler)",
                _ => "osprey",
            };
            println!(
                "| {hz} Hz | {name} | {:+.2}% | {:.1}% | {:.1} MiB | {:.0} ms |",
                (cpu / base_cpu - 1.0) * 100.0,
                delivered * 100.0,
                rss / 1024.0,
                write
            );
        }
        println!("| {hz} Hz | none | workload {base_cpu:.2} CPU-s | | base {:.1} MiB | |", base_rss / 1024.0);
    }
}
