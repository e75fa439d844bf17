//! Thread registry and priming: signal choice, enumeration,
//! priming and dedup, unregistered threads, concurrent claims.

use osprey::internals::record::Origin;
use osprey::internals::registry::{Registry, RegistryConfig};
use osprey::internals::signal::sys;
use osprey::internals::signal::STATE;
use osprey::internals::threads;
use osprey_testkit::run::serial;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn disposition(sig: i32) -> usize {
    // SAFETY: plain sigaction queries and settings for a signal this test owns.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

extern "C" fn busy_handler(_: libc::c_int) {}

#[test]
fn rt_signals_are_free_ones_and_restored_at_stop() {
    let _s = serial();
    // Take the first candidate so osprey must skip it.
    let taken = libc::SIGRTMIN() + 6;
    // SAFETY: installs a handler that only counts, for a signal this test owns.
    unsafe { libc::signal(taken, busy_handler as *const () as usize) };
    let dir = osprey_testkit::tempdir("out");
    let p = osprey::Profiler::builder().out_dir(&dir).start().unwrap();
    let (sample, prime) = (STATE.sample_signal.load(Relaxed), STATE.prime_signal.load(Relaxed));
    for s in [sample, prime] {
        assert!((libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&s), "signal {s} not real-time");
        assert_ne!(s, taken, "osprey took a signal already in use");
        assert_ne!(disposition(s), libc::SIG_DFL);
    }
    assert_ne!(sample, prime);
    drop(p);
    assert_eq!(disposition(sample), libc::SIG_DFL, "sampling signal not restored");
    assert_eq!(disposition(prime), libc::SIG_DFL, "priming signal not restored");
    assert_eq!(disposition(taken), busy_handler as *const () as usize, "program's handler disturbed");
    // SAFETY: restores the default for the signal this test owns.
    unsafe { libc::signal(taken, libc::SIG_DFL) };
}

#[test]
fn enumerating_threads_finds_all() {
    let _s = serial();
    let stop = Arc::new(AtomicBool::new(false));
    let tids: Vec<i32> = (0..5)
        .map(|_| {
            let (tx, rx) = std::sync::mpsc::channel();
            let stop = stop.clone();
            std::thread::spawn(move || {
                tx.send(sys::gettid()).unwrap();
                while !stop.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            rx.recv().unwrap()
        })
        .collect();
    let listed = threads::list_threads().unwrap();
    for t in tids.iter().chain([sys::gettid()].iter()) {
        assert!(listed.contains(t), "tid {t} missing from {listed:?}");
    }
    stop.store(true, Relaxed);
}

#[test]
fn priming_registers_once() {
    let _s = serial();
    let dir = osprey_testkit::tempdir("out");
    // A long scan interval: this test primes by hand.
    let p = osprey::Profiler::builder().out_dir(&dir).scan_interval(Duration::from_millis(1000)).start().unwrap();
    let reg = Registry::get().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicI32::new(0));
    let h = {
        let (stop, tid) = (stop.clone(), tid.clone());
        std::thread::spawn(move || {
            tid.store(sys::gettid(), SeqCst);
            while !stop.load(Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    assert!(wait_until(Duration::from_secs(1), || tid.load(SeqCst) != 0));
    let t = tid.load(SeqCst);
    // The agent's first scan may already have primed it; either way one record.
    let prime = STATE.prime_signal.load(Relaxed);
    sys::tgkill(sys::getpid(), t, prime);
    assert!(wait_until(Duration::from_secs(2), || reg.lookup(t).is_some()), "priming did not register");
    let (idx, rec) = reg.lookup(t).unwrap();
    assert_eq!(rec.origin(), Some(Origin::Discovery));
    let registered_at = rec.registered_ns.load(Relaxed);
    let primed = STATE.primed.load(Relaxed);
    sys::tgkill(sys::getpid(), t, prime);
    assert!(wait_until(Duration::from_secs(2), || STATE.primed.load(Relaxed) > primed));
    assert_eq!(reg.lookup(t).map(|x| x.0), Some(idx), "second priming changed the record");
    assert_eq!(rec.registered_ns.load(Relaxed), registered_at, "second priming re-registered");
    let mut owned = 0;
    reg.for_each_active(|_, r| owned += (r.tid.load(Relaxed) == t) as usize);
    assert_eq!(owned, 1, "second priming claimed another record");
    stop.store(true, Relaxed);
    h.join().unwrap();
    drop(p);
}

#[test]
fn sample_on_unregistered_thread_is_dropped_and_counted() {
    let _s = serial();
    let dir = osprey_testkit::tempdir("out");
    let p = osprey::Profiler::builder().out_dir(&dir).scan_interval(Duration::from_millis(1000)).start().unwrap();
    let reg = Registry::get().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let h = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Make sure this thread has no record.
            threads::unregister_current();
            tx.send(sys::gettid()).unwrap();
            while !stop.load(Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let t = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    if reg.lookup(t).is_none() {
        let before = reg.dropped_unregistered.load(Relaxed);
        sys::tgkill(sys::getpid(), t, STATE.sample_signal.load(Relaxed));
        assert!(wait_until(Duration::from_secs(1), || reg.dropped_unregistered.load(Relaxed) > before));
    }
    stop.store(true, Relaxed);
    h.join().unwrap();
    drop(p);
}

/// Many threads claim, retire and recycle while priming signals hit them:
/// no record is ever owned by two threads at once.
#[test]
fn concurrent_claims_never_share_a_record() {
    let _s = serial();
    let reg = Registry::get_or_init(RegistryConfig::default()).unwrap();
    let dir = osprey_testkit::tempdir("out");
    let p = osprey::Profiler::builder().out_dir(&dir).start().unwrap();
    const THREADS: usize = 8;
    let owners: Arc<Vec<AtomicI32>> = Arc::new((0..reg.max_records()).map(|_| AtomicI32::new(0)).collect());
    let violations = Arc::new(AtomicU64::new(0));
    let claims = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tids = Arc::new(Mutex::new(Vec::new()));
    let hs: Vec<_> = (0..THREADS)
        .map(|_| {
            let (owners, violations, claims, stop, tids) =
                (owners.clone(), violations.clone(), claims.clone(), stop.clone(), tids.clone());
            std::thread::spawn(move || {
                let me = sys::gettid();
                tids.lock().unwrap().push(me);
                while !stop.load(Relaxed) {
                    let _b = osprey::internals::threads::SignalBlock::all();
                    if let Some((idx, _)) = reg.claim(me, Origin::ThreadStart, sys::monotonic_ns()) {
                        let o = &owners[idx];
                        let prev = o.swap(me, SeqCst);
                        if prev != 0 && prev != me {
                            violations.fetch_add(1, Relaxed);
                        }
                        claims.fetch_add(1, Relaxed);
                        o.compare_exchange(me, 0, SeqCst, SeqCst).ok();
                        reg.retire(me);
                        reg.recycle(idx);
                    }
                }
            })
        })
        .collect();
    // Priming storm while they churn.
    let end = Instant::now() + Duration::from_secs(2);
    let prime = STATE.prime_signal.load(Relaxed);
    while Instant::now() < end {
        for &t in tids.lock().unwrap().iter() {
            sys::tgkill(sys::getpid(), t, prime);
        }
    }
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    drop(p);
    assert!(claims.load(Relaxed) > 1000, "too few claims to mean anything: {}", claims.load(Relaxed));
    assert_eq!(violations.load(Relaxed), 0, "a record was handed to two threads");
}

/// A retired tid stays known as retired however many threads retire after
/// it, while its record is recycled and claimed by others, until the tid is
/// claimed again; a retired tid is never found by `lookup`.
#[test]
fn a_retired_tid_is_remembered_until_claimed_again() {
    let _s = serial();
    let reg = Registry::get_or_init(RegistryConfig::default()).unwrap();
    // Tids no thread of this test process has: near the kernel's ceiling.
    let tids: Vec<i32> = (4_190_000..4_191_000).collect();
    let _b = osprey::internals::threads::SignalBlock::all();
    for &t in &tids {
        let (idx, _) = reg.claim(t, Origin::ThreadStart, sys::monotonic_ns()).expect("a free record");
        assert!(reg.lookup(t).is_some() && !reg.retired_recently(t));
        assert!(reg.retire(t));
        reg.recycle(idx);
    }
    for &t in &tids {
        assert!(reg.retired_recently(t), "tid {t} forgotten after {} later retires", tids.len());
        assert!(reg.lookup(t).is_none(), "retired tid {t} found");
    }
    let again = tids[0];
    let (idx, _) = reg.claim(again, Origin::ThreadStart, sys::monotonic_ns()).unwrap();
    assert_eq!(reg.lookup(again).map(|(i, _)| i), Some(idx));
    assert!(!reg.retired_recently(again));
    assert!(reg.retired_recently(tids[1]), "claiming one tid forgot another");
    assert!(reg.retire(again));
    reg.recycle(idx);
}
