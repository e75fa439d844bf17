//! Samples the frameless C program (`tests/c/frameless.c` with `-DFL_MAIN`,
//! built here as a shared library with `-O2 -fomit-frame-pointer` and its
//! `main` renamed `fl_main`) from a CPU-time timer on the main thread, unwinds
//! in the SIGPROF handler, and reports the share of samples whose stack
//! reaches `fl_main` and the hot_a/hot_b/hot_c split: the in-process side of
//! the comparison with `perf record --call-graph dwarf`.
//!
//! `cargo run --release -p osprey-unwind --example sample_frameless -- [seconds]`

use osprey_unwind::scan::Tracker;
use osprey_unwind::symbols::Symbols;
use osprey_unwind::{unwind, ModuleSet, Regs, Shared, StackReader};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

const DEPTH: usize = 64;
const MAX: usize = 8192;
static SAMPLES: [[AtomicU64; DEPTH]; MAX] = [const { [const { AtomicU64::new(0) }; DEPTH] }; MAX];
static LENS: [AtomicUsize; MAX] = [const { AtomicUsize::new(0) }; MAX];
static NEXT: AtomicUsize = AtomicUsize::new(0);
static STACK_HI: AtomicU64 = AtomicU64::new(0);
static SHARED: OnceLock<Arc<Shared<ModuleSet>>> = OnceLock::new();

extern "C" fn on_sigprof(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler argument.
    let regs = unsafe { Regs::from_ucontext(uc) };
    // SAFETY: the timer only fires on the main thread, whose stack is
    // [sp, STACK_HI).
    let stack = unsafe { StackReader::new(regs.sp, STACK_HI.load(Relaxed)) };
    let i = NEXT.fetch_add(1, Relaxed);
    let (Some(slot), Some(len), Some(shared)) = (SAMPLES.get(i), LENS.get(i), SHARED.get()) else {
        return;
    };
    let mut frames = [0u64; DEPTH];
    let n = shared.read(|set| unwind(set, regs, |a| stack.read(a), &mut frames).len).unwrap_or(0);
    for (s, f) in slot.iter().zip(&frames[..n]) {
        s.store(*f, Relaxed);
    }
    len.store(n, Relaxed);
}

fn main() {
    let seconds = std::env::args().nth(1).unwrap_or_else(|| "3".into());
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/frameless.c");
    let so = std::env::temp_dir().join(format!("libframeless-main-{}.so", std::process::id()));
    let ok = std::process::Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-DFL_MAIN", "-Dmain=fl_main", "-o"])
        .arg(&so)
        .arg(src)
        .args(["-lz", "-lpthread"])
        .status()
        .expect("gcc")
        .success();
    assert!(ok);
    let c = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading and looking up our own library.
    let fl_main: extern "C" fn(libc::c_int, *const *const libc::c_char) -> libc::c_int = unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null());
        std::mem::transmute(libc::dlsym(h, c"fl_main".as_ptr()))
    };
    let mut tracker = Tracker::new(Some(osprey_unwind::compile::DEBUG_ROOT.into()));
    tracker.refresh();
    let _ = SHARED.set(tracker.shared().clone());

    // SAFETY: stack bounds of this thread, a handler and a per-thread CPU timer.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
        let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        STACK_HI.store(addr as u64 + size as u64, Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigprof as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut());
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = libc::SIGPROF;
        sev.sigev_notify_thread_id = libc::gettid();
        let mut timer: libc::timer_t = std::mem::zeroed();
        assert_eq!(libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut timer), 0);
        let ms = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
        let its = libc::itimerspec { it_interval: ms, it_value: ms };
        assert_eq!(libc::timer_settime(timer, 0, &its, std::ptr::null_mut()), 0);
    }
    let arg0 = c"frameless";
    let arg1 = std::ffi::CString::new(seconds).unwrap();
    let argv = [arg0.as_ptr(), arg1.as_ptr(), std::ptr::null()];
    fl_main(2, argv.as_ptr());
    // SAFETY: stop sampling before reading the samples.
    unsafe { libc::signal(libc::SIGPROF, libc::SIG_IGN) };

    let n = NEXT.load(Relaxed).min(MAX);
    let mut syms: HashMap<std::path::PathBuf, Symbols> = HashMap::new();
    let shared = tracker.shared();
    let mut name = |a: u64| -> String {
        let m = shared.read(|s| s.module_for(a).map(|m| (m.path.clone(), a - m.bias))).unwrap();
        let Some((path, svma)) = m else {
            return format!("{a:#x}");
        };
        let s = syms.entry(path.clone()).or_insert_with(|| Symbols::load(&path).unwrap_or_default());
        s.lookup(svma).map_or_else(|| osprey_unwind::symbols::module_offset_name(&path, svma), |(n, _)| n.into())
    };
    let (mut reach, mut leaves) = (0, HashMap::<String, usize>::new());
    for i in 0..n {
        let len = LENS[i].load(Relaxed);
        let frames: Vec<u64> = SAMPLES[i][..len].iter().map(|f| f.load(Relaxed)).collect();
        let names: Vec<String> =
            frames.iter().enumerate().map(|(k, &f)| name(if k == 0 { f } else { f - 1 })).collect();
        reach += names.iter().any(|n| n == "fl_main") as usize;
        // The hot leaf, or the hot function whose callee (e.g. a libc helper) was interrupted.
        let hot = names.iter().find(|n| n.starts_with("hot_")).cloned().unwrap_or_else(|| "other".into());
        *leaves.entry(hot).or_default() += 1;
    }
    println!("samples {n}, reaching fl_main {reach} ({:.1}%)", 100.0 * reach as f64 / n as f64);
    let mut l: Vec<_> = leaves.into_iter().collect();
    l.sort();
    for (k, v) in l {
        println!("  {k}: {v} ({:.1}%)", 100.0 * v as f64 / n as f64);
    }
    let _ = std::fs::remove_file(&so);
}
