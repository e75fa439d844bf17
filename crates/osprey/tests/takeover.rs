//! A program that links the agent (no interposed `sigaction`) and later
//! installs its own handler on osprey's sampling signal: the collector
//! notices within its check interval, osprey steps aside with one line, and
//! the program's handler receives no further osprey signal.

use osprey::internals::signal::STATE;
use osprey_testkit::run::burn_cpu;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

static THEIRS: AtomicU64 = AtomicU64::new(0);

extern "C" fn their_handler(_: libc::c_int) {
    THEIRS.fetch_add(1, Relaxed);
}

#[test]
fn a_program_taking_the_sampling_signal_later_gets_it_to_itself() {
    let dir = std::env::temp_dir().join(format!("osprey-takeover-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).start().unwrap();
    burn_cpu(Duration::from_millis(100));
    let signal = STATE.sample_signal.load(Relaxed);
    assert!(signal > 0);
    // SAFETY: a handler that only bumps an atomic.
    unsafe { libc::signal(signal, their_handler as *const () as libc::sighandler_t) };
    // The collector checks once a second; burning CPU keeps the clock firing.
    let started = Instant::now();
    while STATE.enabled.load(SeqCst) && started.elapsed() < Duration::from_secs(10) {
        burn_cpu(Duration::from_millis(20));
    }
    assert!(!STATE.enabled.load(SeqCst), "osprey did not step aside");
    // Signals already queued may still arrive; then none.
    burn_cpu(Duration::from_millis(50));
    let after = THEIRS.load(Relaxed);
    burn_cpu(Duration::from_millis(300));
    assert_eq!(THEIRS.load(Relaxed), after, "osprey's clock still signals the program's handler");
    p.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
