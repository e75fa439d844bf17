//! `osprey attach` from the host on CPython 3.13-3.15 running the way
//! containers run it: in a chroot (Debian testing's interpreters, whose
//! files exist only under /proc/PID/root), in a new PID namespace, and the
//! one-line answer when permission is missing.
//!
//! The chroot is built (once, cached) by osprey-python's
//! `tests/chroot/build-forky.sh`; if it cannot be built the tests fail
//! unless OSPREY_SKIP_MISSING_PYTHON=1.

use osprey_testkit::cli::attach_into;
use osprey_testkit::python::{forky, workload_path};
use osprey_testkit::run::serial;
use osprey_testkit::{osprey, tempdir};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A process tree killed on drop (the python, then what started it).
struct Running {
    child: Child,
    pid: i32,
}

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a process this test started.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the shared workload (`exec` mode) with `/usr/bin/pythonV` in the
/// chroot, optionally in a new PID namespace; returns it once it runs Python.
fn start(root: &Path, version: &str, pidns: bool) -> Running {
    let script = workload_path();
    let inner = format!("/tmp/osprey-cli-workload-{}.py", std::process::id());
    let host = root.join(inner.trim_start_matches('/'));
    std::fs::copy(&script, &host).unwrap();
    osprey_testkit::tmp::remove_at_exit(&host);
    let mut c = if pidns {
        let mut c = Command::new("unshare");
        c.arg("--pid").arg("--fork").arg(format!("--mount-proc={}", root.join("proc").display())).arg("chroot");
        c
    } else {
        Command::new("chroot")
    };
    c.arg(root).arg(format!("/usr/bin/python{version}")).arg(&inner).args(["exec", "30"]);
    let child = c.stdout(Stdio::null()).spawn().unwrap();
    let mut pid = child.id() as i32;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(25));
        if let Some(p) = python_under(child.id() as i32) {
            pid = p;
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    Running { child, pid }
}

fn python_under(pid: i32) -> Option<i32> {
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let exe = std::fs::read_link(format!("/proc/{p}/exe")).unwrap_or_default();
        if exe.to_string_lossy().contains("python3.") {
            return Some(p);
        }
        let kids = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        queue.extend(kids.split_whitespace().filter_map(|k| k.parse::<i32>().ok()));
    }
    None
}

/// Attaches for 2 s; returns the summary of the profiles written.
fn attach(pid: i32, tag: &str) -> (osprey_pprof::Summary, String) {
    let out = tempdir(tag);
    let o = attach_into(&out, pid as u32, &["--duration", "2"]);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let files: Vec<PathBuf> = std::fs::read_dir(&out).unwrap().flatten().map(|e| e.path()).collect();
    let profiles: Vec<_> = files.iter().map(|f| osprey_pprof::read_profile(f).unwrap()).collect();
    let _ = std::fs::remove_dir_all(&out);
    (osprey_pprof::summarize(&profiles, Some("samples")).unwrap(), stderr)
}

#[test]
fn attach_from_the_host_to_chroot_interpreters() {
    let Some(root) = forky() else { return };
    let _serial = serial();
    for (v, pidns) in [("3.13", false), ("3.14", false), ("3.15", false), ("3.15", true)] {
        let w = start(&root, v, pidns);
        let tag = format!("{v}{}", if pidns { "-pidns" } else { "" });
        let (s, stderr) = attach(w.pid, &tag);
        let has = |f: &str| s.functions.iter().any(|x| x.name == f);
        eprintln!("{tag}: {} samples; {}", s.samples, stderr.trim());
        assert!(has("f50") && has("sleeper") && has("compressor"), "{tag}: {:?}", s.functions);
        assert!(s.samples > 100, "{tag}: {} samples", s.samples);
        assert!(!stderr.contains("newer than"), "{tag}: {stderr}");
    }
}

#[test]
fn missing_permission_is_one_line_saying_what_to_do() {
    let Some(root) = forky() else { return };
    let _serial = serial();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: needs root to start a process another user cannot read");
        return;
    }
    let w = start(&root, "3.14", false);
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(osprey())
        .args(["attach", "--pid", &w.pid.to_string(), "--duration", "1", "--out", "/tmp"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}");
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.starts_with("osprey: permission denied"), "{err}");
    assert!(err.contains("CAP_SYS_PTRACE") && err.contains("uid 0"), "{err}");
}
