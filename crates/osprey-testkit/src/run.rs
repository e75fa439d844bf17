//! Running children and measuring CPU: the child's own CPU time from
//! `wait4`, a deadline on a child that may hang, the calling thread's CPU
//! clock, the time the hypervisor stole, the lock that keeps measuring tests
//! apart, and the median that measurements are compared by.

use osprey_pprof::pprof::Profile;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Serializes the tests of one test binary that measure CPU shares or
/// time, or change process-wide state: on 2 cores, tests running side by
/// side starve each other. Every such test holds the guard for its whole
/// run; a panicking holder does not poison it for the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a measured run left: exit status, output, the child's CPU time
/// (rusage), the profiles it wrote.
#[derive(Debug)]
pub struct Run {
    /// The exit code, or None if a signal ended it.
    pub code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// User plus system CPU of the child and the descendants it waited for.
    pub cpu_ns: i64,
    /// The profiles in the output directory (none if it was not created).
    pub profiles: Vec<Profile>,
}

/// User plus system time of `ru`, in nanoseconds.
pub fn rusage_cpu_ns(ru: &libc::rusage) -> i64 {
    (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1_000_000_000 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1_000
}

/// Runs `cmd` with its output in `dir/stdout` and `dir/stderr`, waits with
/// `wait4` to read its own CPU time, then reads the profiles in `out`.
pub fn run_measured(cmd: &mut Command, dir: &Path, out: &Path) -> Run {
    let (so, se) = (dir.join("stdout"), dir.join("stderr"));
    let child = cmd
        .stdout(Stdio::from(std::fs::File::create(&so).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&se).unwrap()))
        .spawn()
        .unwrap();
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status = 0;
    // SAFETY: waits for our own child (reaped here, with its rusage); valid out pointers.
    unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    // Reaped by wait4 above: `Child` must not wait again, only be forgotten.
    std::mem::forget(child);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let profiles = if out.exists() { crate::profile::read_profiles(out) } else { Vec::new() };
    Run {
        code,
        stdout: std::fs::read_to_string(so).unwrap(),
        stderr: std::fs::read_to_string(se).unwrap(),
        cpu_ns: rusage_cpu_ns(&ru),
        profiles,
    }
}

/// Waits for `child` (started with piped output) and returns its output;
/// kills it and fails the test, showing `what` and its standard error, if
/// it still runs after `limit` (a deadlock). The pipes are drained while it
/// runs: a child writing more than a pipe holds (64 KiB) must not block.
pub fn output_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = stderr.join().unwrap();
            panic!("{what}: still running after {limit:?} (deadlock?); stderr:\n{}", String::from_utf8_lossy(&err));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// Reads `pipe` to its end on a thread of its own.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut r) = pipe {
            let _ = r.read_to_end(&mut v);
        }
        v
    })
}

/// The calling thread's CPU time.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The share of the machine's CPU time the hypervisor stole since
/// [`Steal::start`] (`/proc/stat`). A perf clock counts time stolen while its
/// thread is current, a thread's CPU clock does not: a rate of perf-clocked
/// samples against CPU time is off by up to this share.
pub struct Steal {
    start: (u64, u64),
}

impl Steal {
    /// Counts from now.
    pub fn start() -> Steal {
        Steal { start: steal_and_all_ticks() }
    }

    /// Stolen ticks over all ticks since [`Steal::start`] (0 to 1).
    pub fn share(&self) -> f64 {
        let (s, a) = steal_and_all_ticks();
        (s - self.start.0) as f64 / (a - self.start.1).max(1) as f64
    }
}

/// Stolen and all CPU ticks of the machine so far (the `cpu` line of `/proc/stat`).
fn steal_and_all_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let line = stat.lines().next().expect("a cpu line");
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest
    // time is already in user time.
    (ticks.get(7).copied().unwrap_or(0), ticks.iter().take(8).sum())
}

/// Burns `d` of the calling thread's CPU time: on a loaded machine this takes
/// longer in wall time, but the samples expected from it stay the same.
pub fn burn_cpu(d: Duration) -> u64 {
    let end = thread_cpu() + d;
    let mut x = 1u64;
    while thread_cpu() < end {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }
    x
}

/// `/proc/PID/schedstat` of `pid`'s main thread: nanoseconds on a CPU and
/// waiting for one (runnable), since it started; zeros if it is gone.
pub fn schedstat(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap_or_default();
    let mut f = s.split_whitespace().map(|n| n.parse::<u64>().unwrap_or(0));
    (f.next().unwrap_or(0), f.next().unwrap_or(0))
}

/// Runs a statistical check up to `runs` times and returns what it found.
/// `check(last)` asserts what must always hold and returns None when the
/// run missed only a figure that sampling noise explains; on the `last`
/// run it asserts that figure too (None there is a bug of the check).
pub fn rerun_on_noise<T>(runs: usize, mut check: impl FnMut(bool) -> Option<T>) -> T {
    for _ in 1..runs {
        if let Some(t) = check(false) {
            return t;
        }
    }
    check(true).expect("the last run asserts instead of returning None")
}

/// The median of `v` (the upper one of an even count). Panics when `v` is
/// empty or holds a NaN.
pub fn median<T: Copy + PartialOrd>(v: &[T]) -> T {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}
