//! `LD_PRELOAD` sampler for the real-program comparison with perf: samples
//! the main thread of a Debian program (xz, zstd, sqlite3) from a
//! process-CPU timer, unwinds in the SIGPROF handler, and at exit prints the
//! share of samples whose walk is complete, i.e. reaches `_start` (whose CFI
//! marks the return address undefined), hence `main`.
//!
//! ```text
//! cargo build --release -p osprey-unwind --example preload_sampler
//! LD_PRELOAD=target/release/examples/libpreload_sampler.so xz -6 -T1 -c input > /dev/null
//! ```

use osprey_unwind::scan::Tracker;
use osprey_unwind::{unwind, ModuleSet, Regs, Shared, StackReader};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

static SHARED: OnceLock<&'static Shared<ModuleSet>> = OnceLock::new();
static STACK: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static SAMPLES: AtomicU64 = AtomicU64::new(0);
static COMPLETE: AtomicU64 = AtomicU64::new(0);
static OFF_STACK: AtomicU64 = AtomicU64::new(0);
static FRAMES: AtomicU64 = AtomicU64::new(0);
static REPORT_FD: AtomicU64 = AtomicU64::new(2);

extern "C" fn on_sigprof(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler argument.
    let regs = unsafe { Regs::from_ucontext(uc) };
    let (lo, hi) = (STACK[0].load(Relaxed), STACK[1].load(Relaxed));
    if regs.sp < lo || regs.sp >= hi {
        OFF_STACK.fetch_add(1, Relaxed); // another thread: not sampled here
        return;
    }
    // SAFETY: [sp, hi) lies in the main thread's stack mapping.
    let stack = unsafe { StackReader::new(regs.sp, hi) };
    let mut frames = [0u64; 128];
    let Some(shared) = SHARED.get() else { return };
    if let Some(walk) = shared.read(|set| unwind(set, regs, |a| stack.read(a), &mut frames)) {
        SAMPLES.fetch_add(1, Relaxed);
        FRAMES.fetch_add(walk.len as u64, Relaxed);
        COMPLETE.fetch_add(!walk.truncated as u64, Relaxed);
    }
}

extern "C" fn report() {
    let off = libc::itimerval {
        it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
        it_value: libc::timeval { tv_sec: 0, tv_usec: 0 },
    };
    // SAFETY: disarming the timer.
    unsafe { libc::setitimer(libc::ITIMER_PROF, &off, std::ptr::null_mut()) };
    let (n, c) = (SAMPLES.load(Relaxed), COMPLETE.load(Relaxed));
    let line = format!(
        "osprey-unwind: {n} samples of the main thread, {c} complete to _start ({:.1}%), {:.1} frames on average, {} samples on other threads\n",
        100.0 * c as f64 / n.max(1) as f64,
        FRAMES.load(Relaxed) as f64 / n.max(1) as f64,
        OFF_STACK.load(Relaxed),
    );
    // Some programs (xz) close stderr before exit: write to the copy made at start.
    // SAFETY: writing a buffer to a file descriptor we own.
    unsafe { libc::write(REPORT_FD.load(Relaxed) as i32, line.as_ptr().cast(), line.len()) };
}

extern "C" fn init() {
    // SAFETY: duplicating stderr for the report.
    REPORT_FD.store(unsafe { libc::dup(2) }.max(0) as u64, Relaxed);
    let maps = osprey_procfs::maps::read(0).unwrap_or_default();
    let Some(stack) = osprey_procfs::maps::entries(&maps).find(|e| e.path == b"[stack]") else {
        return;
    };
    // The stack grows down past the mapping's current start: allow 8 MiB.
    STACK[0].store(stack.end.saturating_sub(8 << 20).max(stack.start), Relaxed);
    STACK[1].store(stack.end, Relaxed);
    let tracker = Box::leak(Box::new(Tracker::new(Some(osprey_unwind::compile::DEBUG_ROOT.into()))));
    tracker.refresh();
    let _ = SHARED.set(&**Box::leak(Box::new(tracker.shared().clone())));
    // SAFETY: a handler touching atomics only, a profiling timer, an exit hook.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigprof as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut());
        let every = libc::timeval { tv_sec: 0, tv_usec: 2000 };
        let it = libc::itimerval { it_interval: every, it_value: every };
        libc::setitimer(libc::ITIMER_PROF, &it, std::ptr::null_mut());
        libc::atexit(report);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
