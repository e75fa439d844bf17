//! Nothing taken is lost or counted twice across periodic flushes: with a
//! profile written every 250 ms while two threads are sampled at 1 kHz, each
//! thread's samples summed over all files equal the samples its handler took.

use osprey_pprof::pprof::Profile;
use osprey_testkit::run::burn_cpu;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

fn burn(d: Duration) {
    burn_cpu(d);
}

/// Samples of `tid` in `p`, and how many of them osprey could not resolve to a stack.
fn samples_of(p: &Profile, tid: i32) -> (i64, i64) {
    let synthetic = |s: &osprey_pprof::pprof::Sample| {
        s.location_id.iter().any(|&id| {
            let loc = &p.location[id as usize - 1];
            loc.line.iter().any(|l| {
                let f = &p.function[l.function_id as usize - 1];
                p.string_table[f.name as usize].starts_with("[osprey]")
            })
        })
    };
    let mine = p
        .sample
        .iter()
        .filter(|s| s.label.iter().any(|l| p.string_table[l.key as usize] == "thread id" && l.num == tid as i64));
    mine.fold((0, 0), |(n, bad), s| (n + s.value[0], bad + if synthetic(s) { s.value[0] } else { 0 }))
}

#[test]
fn every_sample_taken_is_in_exactly_one_file() {
    let dir = std::env::temp_dir().join(format!("osprey-lossless-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).period(Duration::from_millis(250)).start().unwrap();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(|| {
                let registration = osprey::register_current_thread().expect("registered");
                let reg = osprey::internals::registry::Registry::get().unwrap();
                let (_, rec) = reg.lookup(osprey::internals::signal::sys::gettid()).unwrap();
                burn(Duration::from_millis(1500));
                // Unregistering disarms the clock: no sample is taken after this.
                drop(registration);
                (osprey::internals::signal::sys::gettid(), rec.samples.load(Relaxed))
            })
        })
        .collect();
    let taken: Vec<(i32, u64)> = workers.into_iter().map(|h| h.join().unwrap()).collect();
    let files = p.stop();
    assert!(files.len() >= 4, "expected a file every 250 ms, got {}", files.len());
    let profiles: Vec<Profile> = files.iter().map(|f| osprey_pprof::read_profile(f).unwrap()).collect();
    for (tid, n) in taken {
        let (exported, unresolved) =
            profiles.iter().map(|p| samples_of(p, tid)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert!(n > 300, "thread {tid} took only {n} samples");
        assert_eq!(exported, n as i64, "thread {tid}: took {n} samples, the files hold {exported}");
        assert_eq!(unresolved, 0, "thread {tid}: {unresolved} samples without their stack");
    }
    let _ = std::fs::remove_dir_all(dir);
}
