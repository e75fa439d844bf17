//! Thread labels survive the thread: a named thread that burns CPU for a
//! moment and exits before the next drain is still labelled with its name.

use osprey_testkit::run::{burn_cpu, serial};
use std::time::Duration;

#[test]
fn short_lived_thread_keeps_its_name() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("osprey-labels-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).start().unwrap();
    std::thread::sleep(Duration::from_millis(30));
    std::thread::Builder::new()
        .name("short-lived".into())
        .spawn(|| {
            let _r = osprey::register_current_thread();
            burn_cpu(Duration::from_millis(60));
        })
        .unwrap()
        .join()
        .unwrap();
    let files = p.stop();
    let prof = osprey_pprof::read_profile(&files[0]).unwrap();
    let named: i64 = prof
        .sample
        .iter()
        .filter(|s| {
            s.label.iter().any(|l| {
                prof.string_table[l.key as usize] == "thread name" && prof.string_table[l.str as usize] == "short-lived"
            })
        })
        .map(|s| s.value[0])
        .sum();
    assert!(named >= 20, "only {named} samples labelled with the exited thread's name");
    let _ = std::fs::remove_dir_all(dir);
}

/// A thread whose first osprey call is a context write gets the whole
/// thread-start setup (stack bounds, CPU clock), not a bare record.
#[test]
fn context_write_registers_the_thread_fully() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("osprey-labels-ctx-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).scan_interval(Duration::from_millis(1000)).start().unwrap();
    let (hi, clock) = std::thread::spawn(|| {
        osprey::context::set(1, 2);
        let (_, rec) = osprey::internals::registry::Registry::get()
            .unwrap()
            .lookup(osprey::internals::signal::sys::gettid())
            .expect("registered by the write");
        let r = (
            rec.stack_hi.load(std::sync::atomic::Ordering::Relaxed),
            rec.clock.load(std::sync::atomic::Ordering::Relaxed),
        );
        osprey::internals::threads::unregister_current();
        r
    })
    .join()
    .unwrap();
    drop(p);
    assert!(hi != 0, "no stack bounds: samples would be leaf-only");
    assert!(clock != 0, "no CPU clock: the thread is not sampled");
    let _ = std::fs::remove_dir_all(dir);
}
