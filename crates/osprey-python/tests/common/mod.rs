//! Test helpers: finding interpreters at run time, running workloads.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The interpreter for `name`: "3.8".."3.13" (pyenv, shared libpython) or
/// "debian-3.11" (/usr/bin/python3.11, static). A missing interpreter fails
/// the test unless OSPREY_SKIP_MISSING_PYTHON=1 (then None: skip).
pub fn interpreter(name: &str) -> Option<PathBuf> {
    let found = if let Some(v) = name.strip_prefix("debian-") {
        let p = PathBuf::from(format!("/usr/bin/python{v}"));
        p.exists().then_some(p)
    } else {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let root = Path::new(&home).join(".pyenv/versions");
        let prefix = format!("{name}.");
        let mut hits: Vec<PathBuf> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path().join("bin/python3"))
            .filter(|p| p.exists())
            .collect();
        hits.sort();
        hits.pop()
    };
    match found {
        Some(p) => Some(p),
        None if std::env::var("OSPREY_SKIP_MISSING_PYTHON").as_deref() == Ok("1") => {
            eprintln!("skipping: python {name} not found (OSPREY_SKIP_MISSING_PYTHON=1)");
            None
        }
        None => panic!("python {name} not found (set OSPREY_SKIP_MISSING_PYTHON=1 to skip)"),
    }
}

pub fn workload_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/workload.py")
}

/// A running workload, killed on drop.
pub struct Workload {
    pub child: Child,
}

impl Workload {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `python workload.py args...` and waits for its "ready" line.
pub fn start(python: &Path, args: &[&str]) -> Workload {
    let mut child = Command::new(python)
        .arg(workload_path())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn python");
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut r = BufReader::new(out);
    r.read_line(&mut line).expect("read ready");
    assert_eq!(line.trim(), "ready", "workload did not start");
    assert!(Instant::now() < deadline);
    Workload { child }
}

/// CPU slots for workloads: the machine this runs on may have 2 cores, and
/// each workload keeps about one busy (plus its sampler). Tests take slots
/// before starting a workload so that at most [`SLOTS`] run at once,
/// whatever `--test-threads` is.
pub const SLOTS: usize = 2;
static USED: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

/// Holds `n` slots until dropped.
pub struct Slots(usize);

/// Waits for `n` (<= [`SLOTS`]) free slots. A measurement that must not
/// share the CPUs takes them all.
pub fn slots(n: usize) -> Slots {
    let n = n.min(SLOTS);
    let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
    while *used + n > SLOTS {
        used = FREED.wait(used).unwrap_or_else(|e| e.into_inner());
    }
    *used += n;
    Slots(n)
}

impl Drop for Slots {
    fn drop(&mut self) {
        *USED.lock().unwrap_or_else(|e| e.into_inner()) -= self.0;
        FREED.notify_all();
    }
}
