//! Wall samples carry the thread's trace context: a thread blocked in
//! `read` (sampled from the collector, off the signal path) and a running
//! thread (its wall time recorded by its CPU samples) each show their span
//! ids (and the W3C trace id, as a `trace id` label of 32 hex digits) on
//! their wall samples.

use osprey_pprof::pprof::Profile;
use std::time::{Duration, Instant};

/// Wall ns per (span id, state) in `p`, with the trace id label.
fn wall_by_span(p: &Profile) -> Vec<(i64, String, i64, String)> {
    let wall = p.sample_type.iter().position(|t| p.string(t.r#type) == "wall").expect("wall sample type");
    p.sample
        .iter()
        .filter(|s| s.value[wall] > 0)
        .map(|s| {
            let num = |k: &str| s.label.iter().find(|l| p.string(l.key) == k).map_or(0, |l| l.num);
            let text = |k: &str| s.label.iter().find(|l| p.string(l.key) == k).map(|l| p.string(l.str).to_string());
            (num("span id"), text("state").unwrap_or_default(), s.value[wall], text("trace id").unwrap_or_default())
        })
        .collect()
}

#[inline(never)]
fn wait_in_read(fd: i32) -> isize {
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a local buffer from our pipe.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) }
}

#[test]
fn wall_samples_carry_span_ids() {
    let dir = std::env::temp_dir().join(format!("osprey-wall-context-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let p = osprey::Profiler::builder().out_dir(&dir).period(Duration::from_secs(60)).wall(true).start().unwrap();
    let mut fds = [0; 2];
    // SAFETY: valid out array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let reader = std::thread::spawn(move || {
        osprey::context::set_trace(0x0af7651916cd43dd8448eb211c80319c, 11, 1, 12);
        wait_in_read(fds[0])
    });
    let runner = std::thread::spawn(|| {
        osprey::context::set(33, 34);
        let end = Instant::now() + Duration::from_millis(1500);
        let mut n = 0u64;
        while Instant::now() < end {
            n = std::hint::black_box(n.wrapping_add(1));
        }
        n
    });
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: writing one byte to our pipe.
    assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
    assert_eq!(reader.join().unwrap(), 1);
    assert!(runner.join().unwrap() > 0);
    drop(p);
    let profiles: Vec<Profile> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".pb.gz"))
        .map(|p| osprey_pprof::read_profile(&p).unwrap())
        .collect();
    let samples: Vec<_> = profiles.iter().flat_map(wall_by_span).collect();
    let ns = |span: i64, state: &str| -> i64 {
        samples.iter().filter(|(s, st, _, _)| *s == span && st == state).map(|(_, _, v, _)| v).sum()
    };
    let traces = |span: i64| -> Vec<&str> {
        let mut t: Vec<&str> = samples.iter().filter(|s| s.0 == span).map(|s| s.3.as_str()).collect();
        t.dedup();
        t
    };
    assert!(ns(11, "read") >= 1_000_000_000, "blocked thread's wall samples with its span: {samples:?}");
    assert!(ns(33, "running") >= 500_000_000, "running thread's wall samples with its span: {samples:?}");
    assert_eq!(traces(11), ["0af7651916cd43dd8448eb211c80319c"], "the W3C trace id as written");
    assert_eq!(traces(33), [""], "no trace id label without a trace id");
}
