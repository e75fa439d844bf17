//! Torn-read stress: writer threads rewrite their context as fast as they can
//! while another thread hits them with a real-time signal in a tight loop; the
//! handler reads the interrupted thread's record and checks an invariant that
//! ties every field together. A torn read would break it.
//!
//! The handler finds the record through plain static arrays filled before
//! signals start (never thread_local).

use osprey::context::{self, ContextSnapshot, TAG_SLOTS};
use osprey::internals::record::{torn_reads, Record};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

const WRITERS: usize = 3;
const RUN: Duration = Duration::from_millis(1500);
const PACE: Duration = Duration::from_micros(20);

static RECS: [AtomicPtr<Record>; WRITERS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; WRITERS];
static TIDS: [AtomicI32; WRITERS] = [const { AtomicI32::new(0) }; WRITERS];
static READY: AtomicUsize = AtomicUsize::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

static SIGNALS: AtomicU64 = AtomicU64::new(0);
static LABELLED: AtomicU64 = AtomicU64::new(0);
static UNLABELLED: AtomicU64 = AtomicU64::new(0);
static VIOLATIONS: AtomicU64 = AtomicU64::new(0);
static UNKNOWN_THREAD: AtomicU64 = AtomicU64::new(0);

fn tag(span: u64, k: usize) -> u32 {
    ((span ^ span >> 32) as u32).wrapping_mul(2 * k as u32 + 1) | 1
}

/// The 128-bit trace id written with `span` (both halves derived from it).
fn trace_of(span: u64) -> u128 {
    (span as u128) << 64 | span.wrapping_mul(7) as u128
}

/// Even spans are written whole (ids + tags derived from the span); odd ones
/// with `set_trace`, which keeps the tags of the even span just before.
fn valid(c: &ContextSnapshot) -> bool {
    let base = c.span_id & !1;
    c.local_root_span_id == c.span_id.wrapping_mul(3)
        && c.trace_id == trace_of(c.span_id)
        && c.trace_flags == (c.span_id & 1) as u8 + 1
        && (0..TAG_SLOTS).all(|k| c.tags[k] == tag(base, k))
}

extern "C" fn on_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    SIGNALS.fetch_add(1, Relaxed);
    let tid = osprey::internals::signal::sys::gettid();
    let Some(i) = (0..WRITERS).find(|&i| TIDS[i].load(Acquire) == tid) else {
        UNKNOWN_THREAD.fetch_add(1, Relaxed);
        return;
    };
    // SAFETY: published before TIDS[i]; registry records are never unmapped.
    let rec = unsafe { &*RECS[i].load(Acquire) };
    match rec.context.read() {
        Some(c) if valid(&c) => LABELLED.fetch_add(1, Relaxed),
        Some(_) => VIOLATIONS.fetch_add(1, Relaxed),
        None => UNLABELLED.fetch_add(1, Relaxed),
    };
}

fn writer(i: usize) -> u64 {
    context::set(1, 3); // registers this thread
    let rec = osprey::internals::threads::current_or_register().unwrap();
    RECS[i].store(rec as *const Record as *mut Record, Release);
    TIDS[i].store(osprey::internals::signal::sys::gettid(), Release);
    READY.fetch_add(1, Release);
    let base = (i as u64 + 1) << 40;
    let mut n = 0u64;
    while !STOP.load(Relaxed) {
        for _ in 0..1024 {
            let span = base + n;
            if span & 1 == 0 {
                let tags = std::array::from_fn(|k| tag(span, k));
                context::replace(Some(ContextSnapshot {
                    trace_id: trace_of(span),
                    span_id: span,
                    local_root_span_id: span * 3,
                    tags,
                    trace_flags: 1,
                }));
            } else {
                context::set_trace(trace_of(span), span, 2, span * 3);
            }
            n += 1;
        }
    }
    n
}

#[test]
fn no_torn_context_under_signals() {
    let sig = libc::SIGRTMIN() + 6;
    // SAFETY: installs a handler that only touches atomics and raw syscalls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
    let torn_before = torn_reads();
    let writers: Vec<_> = (0..WRITERS).map(|i| std::thread::spawn(move || writer(i))).collect();
    while READY.load(Acquire) < WRITERS {
        std::thread::yield_now();
    }
    let pid = osprey::internals::signal::sys::getpid();
    let tids: Vec<i32> = TIDS.iter().map(|t| t.load(Acquire)).collect();
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let mut sent = 0u64;
        while start.elapsed() < RUN {
            for &t in &tids {
                if osprey::internals::signal::sys::tgkill(pid, t, sig) == 0 {
                    sent += 1;
                }
            }
            // Pace to ~tens of thousands of signals/s per thread so the
            // writers still do most of the work between interruptions.
            let t0 = Instant::now();
            while t0.elapsed() < PACE {
                std::hint::spin_loop();
            }
        }
        sent
    });
    let sent = sender.join().unwrap();
    STOP.store(true, Relaxed);
    let writes: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let secs = start.elapsed().as_secs_f64();

    let (labelled, unlabelled, violations) =
        (LABELLED.load(Relaxed), UNLABELLED.load(Relaxed), VIOLATIONS.load(Relaxed));
    let torn = torn_reads() - torn_before;
    eprintln!(
        "torn stress: {writes} writes ({:.2} M/s/thread), {sent} signals sent, {} handled ({:.0}/s), \
         {labelled} labelled, {unlabelled} read None (write in progress), {violations} violations, \
         {torn} checksum mismatches, {} on unknown threads",
        writes as f64 / secs / WRITERS as f64 / 1e6,
        SIGNALS.load(Relaxed),
        SIGNALS.load(Relaxed) as f64 / secs,
        UNKNOWN_THREAD.load(Relaxed),
    );
    assert_eq!(violations, 0, "a torn context reached a sample");
    assert!(labelled > 0, "no sample was labelled ({unlabelled} reads returned None)");
    assert_eq!(torn, 0, "checksum mismatches in-process mean the write protocol is broken");
}
