//! Fork: the child starts with a registry holding only its one
//! thread and keeps profiling into its own files; with `OSPREY_FORK=stop`
//! semantics (`continue_after_fork = false`) it stops cleanly.

use osprey::internals::record::RecordState;
use osprey::internals::registry::Registry;
use osprey_testkit::run::{burn_cpu, serial};
use std::time::Duration;

fn burn(d: Duration) {
    burn_cpu(d);
}

fn files_of(dir: &std::path::Path, pid: i32) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("osprey-{pid}-")))
        .count()
}

#[test]
fn child_keeps_profiling_with_a_clean_registry() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("osprey-fork-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).start().unwrap();
    // Some busy threads in the parent, so the child has records to drop.
    let hs: Vec<_> = (0..3).map(|_| std::thread::spawn(|| burn(Duration::from_millis(600)))).collect();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: the child only runs async-signal-safe work and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // Child: one thread, one claimed record, and it is ours.
        let code = std::panic::catch_unwind(|| {
            let reg = Registry::get().unwrap();
            let me = osprey::internals::signal::sys::gettid();
            let mut claimed = vec![];
            reg.for_each_active(|_, r| {
                if r.state() == RecordState::Claimed {
                    claimed.push(r.tid.load(std::sync::atomic::Ordering::Relaxed));
                }
            });
            assert_eq!(claimed, vec![me], "child registry: {claimed:?}");
            burn(Duration::from_millis(500));
            let files = p.stop();
            assert_eq!(files.len(), 1, "child wrote {files:?}");
            let prof = osprey_pprof::read_profile(&files[0]).unwrap();
            assert!(prof.sample.iter().map(|s| s.value[0]).sum::<i64>() > 100, "child barely sampled");
        });
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(if code.is_ok() { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status:#x}");
    for h in hs {
        h.join().unwrap();
    }
    let parent_files = p.stop();
    assert!(!parent_files.is_empty(), "parent wrote nothing after the fork");
    assert_eq!(files_of(&dir, pid), 1, "child's profile not found");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn child_stops_cleanly_when_asked() {
    let _s = serial();
    let dir = std::env::temp_dir().join(format!("osprey-fork-stop-{}", std::process::id()));
    let cfg = osprey::Config { continue_after_fork: false, out_dir: dir.clone(), hz: 1000, ..Default::default() };
    let p = osprey::Profiler::builder().config(cfg).start().unwrap();
    // SAFETY: the child only runs async-signal-safe work and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            assert!(!osprey::internals::agent::is_running(), "profiling went on in the child");
            burn(Duration::from_millis(300));
            assert!(p.stop().is_empty(), "child wrote a profile although asked to stop");
        })
        .is_ok();
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status:#x}");
    burn(Duration::from_millis(200));
    assert!(!p.stop().is_empty());
    assert_eq!(files_of(&dir, pid), 0);
    let _ = std::fs::remove_dir_all(dir);
}
