//! The C target (`tests/c/split.c`), built here, and helpers to run it
//! under the sampler and name the frames.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use osprey_perf::{ProcessSampler, Stack, Unwinder};
use osprey_unwind::symbols::Symbols;
use osprey_unwind::ModuleSet;

/// `cc -O2 -fomit-frame-pointer -pthread tests/c/split.c`, once per run.
pub fn target() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/split.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("split-{}", std::process::id()));
        let st = Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("cc runs");
        assert!(st.success(), "cc failed");
        out
    })
}

/// The target, started and past its `ready` line.
pub struct Target {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
    /// Lines read so far.
    pub lines: Vec<String>,
}

impl Target {
    pub fn start(args: &[&str]) -> Target {
        let mut child = Command::new(target()).args(args).stdout(Stdio::piped()).spawn().expect("target starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            assert!(stdout.read_line(&mut l).unwrap() > 0, "target ended before ready: {lines:?}");
            lines.push(l.trim_end().to_string());
            if l.trim_end() == "ready" {
                break;
            }
        }
        Target { child, stdout, lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the exit: exit code, the whole output, and the CPU time
    /// (user + system, ns) the target used.
    pub fn finish(mut self) -> (Option<i32>, String, u64) {
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let mut status = 0;
        // SAFETY: zeroed rusage is valid; the child is ours and not yet reaped.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointers.
        let r = unsafe { libc::wait4(self.child.id() as i32, &mut status, 0, &mut ru) };
        assert_eq!(r, self.child.id() as i32);
        let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        let mut out = self.lines.join("\n");
        out.push('\n');
        out.push_str(&rest);
        (code, out, tv(ru.ru_utime) + tv(ru.ru_stime))
    }

    /// Whether the target has exited (without reaping it).
    pub fn exited(&self) -> bool {
        // SAFETY: a zeroed siginfo is valid to write.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: WNOWAIT leaves the child to `finish`'s wait4.
        let r = unsafe {
            libc::waitid(libc::P_PID, self.child.id(), &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
        };
        // SAFETY: filled by waitid when a child changed state (si_pid 0 otherwise).
        r == 0 && unsafe { info.si_pid() } != 0
    }
}

/// What a sampling run collected.
pub struct Run {
    pub stacks: Vec<Stack>,
    pub unwinder: Unwinder,
    pub code: Option<i32>,
    pub output: String,
    /// The target's CPU time (ns), from `wait4`.
    pub cpu_ns: u64,
    /// Every thread that had an event.
    pub tids: Vec<u32>,
    pub lost: u64,
}

/// Samples `t` at `hz` until it exits, refreshing its threads every 100 ms.
pub fn sample_until_exit(t: Target, hz: u32) -> Run {
    let pid = t.pid();
    // 1 MiB rings: at 999 Hz on a busy machine this thread may wait a while.
    let config = osprey_perf::Config { ring_pages: Some(256), ..osprey_perf::Config::new(hz, 16 << 10) };
    let mut sampler = ProcessSampler::attach_with(pid, &config).expect("attach");
    let mut unwinder = Unwinder::new(pid);
    let mut stacks = Vec::new();
    let mut tids: Vec<u32> = sampler.tids().collect();
    let start = Instant::now();
    while !t.exited() && start.elapsed() < Duration::from_secs(60) {
        sampler.wait(Duration::from_millis(100)).unwrap();
        sampler.drain(&mut |s| stacks.push(unwinder.unwind(s)));
        if sampler.refresh_threads().is_ok() {
            tids.extend(sampler.tids());
        }
    }
    sampler.drain(&mut |s| stacks.push(unwinder.unwind(s)));
    tids.sort_unstable();
    tids.dedup();
    let lost = sampler.totals().lost;
    let (code, output, cpu_ns) = t.finish();
    Run { stacks, unwinder, code, output, cpu_ns, tids, lost }
}

/// Names pcs by the ELF symbols of their modules.
#[derive(Default)]
pub struct Namer {
    syms: HashMap<PathBuf, Symbols>,
}

impl Namer {
    /// Names of `pcs` (leaf first; return addresses looked up at pc - 1);
    /// `?` where no symbol holds the address.
    pub fn names(&mut self, set: &ModuleSet, pcs: &[u64]) -> Vec<String> {
        pcs.iter()
            .enumerate()
            .map(|(i, &pc)| {
                let at = if i == 0 { pc } else { pc - 1 };
                let Some(m) = set.module_for(at) else { return "?".into() };
                let syms =
                    self.syms.entry(m.path.clone()).or_insert_with(|| Symbols::load(&m.path).unwrap_or_default());
                syms.lookup(at - m.bias).map_or("?".into(), |s| s.0.to_string())
            })
            .collect()
    }
}
