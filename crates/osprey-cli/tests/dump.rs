//! `osprey dump --pid`: every thread's state, system call and native stack,
//! the target left running as it was.
//!
//! Needs the osprey binary built (`cargo build -p osprey-cli`), a C compiler
//! and ptrace allowed on one's own processes.

use osprey_testkit::cc::Cc;
use osprey_testkit::{osprey, tempdir};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `tests/c/dump_blocked.c` built with `-O2 -fomit-frame-pointer`.
fn blocked_c() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/dump_blocked.c");
    Cc::new("cc").flags(["-O2", "-fomit-frame-pointer", "-pthread"]).build(&src, &tempdir("dump").join("dump_blocked"))
}

/// Starts the program with `threads` sleeping threads; returns once they run.
fn start(bin: &Path, threads: usize) -> Child {
    let mut c =
        Command::new(bin).arg(threads.to_string()).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // Time for main to enter read() and the threads their waits.
    std::thread::sleep(Duration::from_millis(200));
    c
}

fn dump(pid: u32, json: bool) -> String {
    let mut cmd = Command::new(osprey());
    cmd.args(["dump", "--pid", &pid.to_string()]);
    if json {
        cmd.arg("--json");
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{:?}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Closing stdin ends the read: the program exits 0 if nothing was disturbed.
fn finish(mut c: Child) {
    drop(c.stdin.take());
    let status = c.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the target did not end as it would have");
}

#[test]
fn blocked_threads_show_their_state_call_and_frames() {
    let bin = blocked_c();
    let c = start(&bin, 0);
    let pid = c.id();
    let v: serde_json::Value = serde_json::from_str(&dump(pid, true)).unwrap();
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2, "{v}");
    let frames = |t: &serde_json::Value| -> Vec<String> {
        t["frames"].as_array().unwrap().iter().map(|f| f["function"].as_str().unwrap_or("").to_string()).collect()
    };
    let main = threads.iter().find(|t| t["tid"] == pid).unwrap();
    assert_eq!(main["state"], "sleeping", "{main}");
    assert_eq!(main["syscall"], "read", "{main}");
    let f = frames(main);
    assert!(f.iter().any(|n| n == "reads_stdin") && f.iter().any(|n| n == "main"), "{f:?}");
    let waiter = threads.iter().find(|t| t["tid"] != pid).unwrap();
    assert_eq!(waiter["state"], "sleeping", "{waiter}");
    assert_eq!(waiter["syscall"], "futex", "{waiter}");
    let f = frames(waiter);
    assert!(f.iter().any(|n| n == "waits_on_cond") && f.iter().any(|n| n == "start_thread"), "{f:?}");

    let text = dump(pid, false);
    assert!(text.contains("sleeping in read") && text.contains("sleeping in futex"), "{text}");
    assert!(text.contains(" main\n"), "{text}");
    finish(c);
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}

#[test]
fn a_thousand_threads_are_dumped() {
    let bin = blocked_c();
    let c = start(&bin, 1000);
    let t0 = Instant::now();
    let v: serde_json::Value = serde_json::from_str(&dump(c.id(), true)).unwrap();
    eprintln!("dump of 1002 threads: {:.3} s", t0.elapsed().as_secs_f64());
    let threads = v["threads"].as_array().unwrap();
    // main, the condition waiter and the 1000 sleepers.
    assert_eq!(threads.len(), 1002);
    let rooted = threads
        .iter()
        .filter(|t| {
            t["frames"].as_array().unwrap().iter().any(|f| f["function"] == "start_thread" || f["function"] == "main")
        })
        .count();
    assert_eq!(rooted, 1002, "every stack reaches main or start_thread");
    finish(c);
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}

/// A CPython process shows its Python frames and thread names (skipped
/// without `python3`).
#[test]
fn cpython_threads_show_python_frames() {
    let script = "import sys, threading\n\
                  def waits_on_event(ev):\n    ev.wait()\n\
                  def reads_stdin():\n    return sys.stdin.read(1)\n\
                  threading.Thread(target=waits_on_event, args=(threading.Event(),), daemon=True,\n\
                                   name='a-waiter-named-beyond-15-bytes').start()\n\
                  print('ready', flush=True)\n\
                  reads_stdin()\n";
    let Ok(mut c) = Command::new("python3").args(["-c", script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()
    else {
        eprintln!("skipping: no python3");
        return;
    };
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(Duration::from_millis(200));
    let v: serde_json::Value = serde_json::from_str(&dump(c.id(), true)).unwrap();
    let py = |t: &serde_json::Value| -> Vec<String> {
        t["python"].as_array().into_iter().flatten().map(|f| f["function"].as_str().unwrap().to_string()).collect()
    };
    let threads = v["threads"].as_array().unwrap();
    let main = threads.iter().find(|t| t["tid"] == c.id()).unwrap();
    assert_eq!(main["syscall"], "read", "{main}");
    assert_eq!(py(main), ["reads_stdin", "<module>"], "{main}");
    assert_eq!(main["python_name"], "MainThread", "{main}");
    let waiter =
        threads.iter().find(|t| py(t).contains(&"waits_on_event".to_string())).unwrap_or_else(|| panic!("{v}"));
    assert_eq!(waiter["python_name"], "a-waiter-named-beyond-15-bytes", "{waiter}");
    let text = dump(c.id(), false);
    assert!(text.contains(&format!("thread {} \"a-waiter-named-beyond-15-bytes\" (os ", waiter["tid"])), "{text}");
    finish(c);
}

/// CPython 3.14+: each thread shows the asyncio task it is running, by the
/// name the program gave it (two event loops, one per thread).
#[test]
fn cpython_threads_show_their_running_asyncio_task() {
    let Some(py) = osprey_testkit::python::python("forky-3.14") else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/asyncio_tasks.py");
    let w = py.start_script(&script, &[]);
    std::thread::sleep(Duration::from_millis(200));
    let v: serde_json::Value = serde_json::from_str(&dump(w.pid() as u32, true)).unwrap();
    let text = dump(w.pid() as u32, false);
    drop(w);
    let threads = v["threads"].as_array().unwrap();
    let by_name = |n: &str| threads.iter().find(|t| t["python_name"] == n).unwrap_or_else(|| panic!("{n}: {v}"));
    assert_eq!(by_name("MainThread")["task"], "main-blocker", "{v}");
    assert_eq!(by_name("loop-thread")["task"], "side-blocker", "{v}");
    assert_eq!(threads.iter().filter(|t| t.get("task").is_some()).count(), 2, "{v}");
    assert!(text.contains(" task \"side-blocker\""), "{text}");
}

/// A thread has one tracer: a dump while another tracer holds the process
/// (here this test, as a debugger or a second dump would) says so in one
/// line, and the target is left running.
#[test]
fn a_traced_process_is_refused_with_its_tracer() {
    let bin = blocked_c();
    let c = start(&bin, 0);
    let pid = c.id() as i32;
    // SAFETY: seizing our own child's main thread; no stop, detached below.
    assert_eq!(unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize) }, 0);
    let o = Command::new(osprey()).args(["dump", "--pid", &pid.to_string()]).output().unwrap();
    // SAFETY: detaching the thread seized above: a detach needs it stopped, hence the interrupt and wait.
    unsafe {
        libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize);
        let mut st = 0;
        libc::waitpid(pid, &mut st, libc::__WALL);
        libc::ptrace(libc::PTRACE_DETACH, pid, 0usize, 0usize);
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("being traced by pid {}", std::process::id())), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    finish(c);
}

/// A process that exits while it is dumped: either the dump was done first,
/// or one line says it exited (status 1); never a partial dump.
#[test]
fn a_process_exiting_during_the_dump() {
    let bin = blocked_c();
    let mut said_exited = 0;
    for _ in 0..3 {
        let mut c = start(&bin, 1000);
        let d = Command::new(osprey())
            .args(["dump", "--json", "--pid", &c.id().to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(60));
        drop(c.stdin.take());
        let o = d.wait_with_output().unwrap();
        assert_eq!(c.wait().unwrap().code(), Some(0), "the target did not end as it would have");
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["threads"].as_array().unwrap().len(), 1002, "{err}");
        } else {
            assert_eq!(o.status.code(), Some(1), "{err}");
            // During the dump, or already before it began (a zombie).
            assert!(err.contains("exited during the dump") || err.contains("has exited"), "{err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            assert!(o.stdout.is_empty());
            said_exited += 1;
        }
    }
    eprintln!("{said_exited} of 3 dumps saw the exit");
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}
