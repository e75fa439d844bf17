//! Thread states: what the kernel says (`/proc/PID/task/TID/stat` and
//! `.../syscall`) combined with who holds the GIL.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Kernel view of one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelThread {
    pub name: String,
    /// 'R', 'S', 'D', 'T', 't', 'Z', ...
    pub state: char,
}

/// Parses the start of `/proc/PID/task/TID/stat`: "tid (comm) S ...".
pub fn parse_stat(s: &str) -> Option<KernelThread> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let name = s.get(open + 1..close)?.to_string();
    let state = s.get(close + 1..)?.trim_start().chars().next()?;
    Some(KernelThread { name, state })
}

/// Parses `/proc/PID/task/TID/syscall`: "NR ARG1 ... SP PC", "running", or "-1 SP PC".
pub fn parse_syscall(s: &str) -> Option<(i64, u64)> {
    let mut it = s.split_ascii_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    let a1 = it.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()).unwrap_or(0);
    Some((nr, a1))
}

const SYS_FUTEX: i64 = 202;
const SLEEP_SYSCALLS: &[i64] = &[
    35,  // nanosleep
    230, // clock_nanosleep
    23,  // select
    270, // pselect6
    7,   // poll
    271, // ppoll
    232, // epoll_wait
    281, // epoll_pwait
    441, // epoll_pwait2
    34,  // pause
];

/// Open /proc files per thread, re-read with pread.
#[derive(Default)]
pub struct ProcFiles {
    stat: HashMap<i32, File>,
    syscall: HashMap<i32, Option<File>>,
    buf: Vec<u8>,
}

impl ProcFiles {
    pub fn retain(&mut self, live: &[i32]) {
        self.stat.retain(|k, _| live.contains(k));
        self.syscall.retain(|k, _| live.contains(k));
    }

    fn pread(f: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
        buf.resize(512, 0);
        f.read_at(buf, 0)
    }

    pub fn kernel(&mut self, pid: i32, tid: i32) -> io::Result<KernelThread> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.stat.entry(tid) {
            let f = File::open(format!("/proc/{pid}/task/{tid}/stat"))?;
            e.insert(f);
        }
        let f = &self.stat[&tid];
        let n = Self::pread(f, &mut self.buf)?;
        let s = String::from_utf8_lossy(&self.buf[..n]);
        parse_stat(&s).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat"))
    }

    /// What the thread is doing right now, from `/proc/.../syscall`.
    pub fn syscall(&mut self, pid: i32, tid: i32) -> Sys {
        let Some(f) = self
            .syscall
            .entry(tid)
            .or_insert_with(|| File::open(format!("/proc/{pid}/task/{tid}/syscall")).ok())
            .as_ref()
        else {
            return Sys::Unknown;
        };
        let Ok(n) = Self::pread(f, &mut self.buf) else { return Sys::Unknown };
        let s = String::from_utf8_lossy(&self.buf[..n]);
        if s.starts_with("running") {
            return Sys::Running;
        }
        match parse_syscall(&s) {
            Some((nr, a1)) => Sys::In(nr, a1),
            None => Sys::Unknown,
        }
    }
}

/// A thread's activity per `/proc/PID/task/TID/syscall`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sys {
    /// On a CPU or runnable.
    Running,
    /// Blocked in (syscall number, first argument); -1 = not in a syscall.
    In(i64, u64),
    Unknown,
}

/// What a thread was doing when sampled (its `state` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Holds the GIL.
    Running,
    /// On a CPU without the GIL: C code such as zlib, or about to take it.
    Native,
    /// Blocked on the GIL's futexes.
    WaitingForGil,
    /// Blocked in a sleep- or poll-like call: uses no CPU.
    Sleeping,
    /// Any other wait: locks, I/O, D state.
    Blocked,
}

impl State {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Native => "native",
            State::WaitingForGil => "waiting for gil",
            State::Sleeping => "sleeping",
            State::Blocked => "blocked",
        }
    }
}

/// A sample's state from the GIL, the kernel's run state and the syscall
/// the thread is in.
pub fn classify(holds_gil: bool, kstate: char, sys: Sys, gil_ranges: &[(u64, u64)]) -> State {
    if holds_gil {
        return State::Running;
    }
    if sys == Sys::Running || (sys == Sys::Unknown && kstate == 'R') {
        return State::Native;
    }
    if let Sys::In(nr, a1) = sys {
        if nr == SYS_FUTEX && gil_ranges.iter().any(|&(lo, hi)| a1 >= lo && a1 < hi) {
            return State::WaitingForGil;
        }
        if kstate != 'D' && SLEEP_SYSCALLS.contains(&nr) {
            return State::Sleeping;
        }
    }
    State::Blocked
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn stat_and_syscall() {
        let k = parse_stat("1234 (python3 (x)) S 1 2 3").unwrap();
        assert_eq!(k.name, "python3 (x)");
        assert_eq!(k.state, 'S');
        assert_eq!(parse_syscall("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n"), Some((202, 0x7f00)));
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(classify(true, 'S', Sys::Unknown, &[]), State::Running);
        assert_eq!(classify(false, 'R', Sys::Unknown, &[]), State::Native);
        assert_eq!(classify(false, 'S', Sys::Running, &[]), State::Native);
        assert_eq!(classify(false, 'S', Sys::In(202, 0x1010), &[(0x1000, 0x10d0)]), State::WaitingForGil);
        assert_eq!(classify(false, 'S', Sys::In(202, 0x2000), &[(0x1000, 0x10d0)]), State::Blocked);
        assert_eq!(classify(false, 'S', Sys::In(230, 0), &[]), State::Sleeping);
        assert_eq!(classify(false, 'D', Sys::In(0, 3), &[]), State::Blocked);
        assert_eq!(State::WaitingForGil.label(), "waiting for gil");
    }
}
