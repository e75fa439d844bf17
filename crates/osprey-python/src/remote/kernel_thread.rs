//! What the kernel says about another process's thread:
//! `/proc/PID/task/TID/stat` (name, run state) and `.../syscall` (the
//! system call it is blocked in).

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
    /// When it started, in clock ticks since boot.
    pub start_ticks: Option<u64>,
}

/// The name, state and start time of a `/proc/PID/task/TID/stat` text.
pub fn parse_stat(s: &[u8]) -> Option<KernelThread> {
    let stat = osprey_procfs::stat::Stat::parse(s)?;
    Some(KernelThread {
        name: String::from_utf8_lossy(stat.comm).into_owned(),
        state: stat.state as char,
        start_ticks: stat.starttime(),
    })
}

/// Parses `/proc/PID/task/TID/syscall`: "NR ARG1 ... SP PC", "running", or "-1 SP PC".
pub fn parse_syscall(s: &str) -> Option<(i64, u64)> {
    let mut it = s.split_ascii_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    let a1 = it.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()).unwrap_or(0);
    Some((nr, a1))
}

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
        parse_stat(&self.buf[..n]).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_syscall() {
        let k = parse_stat(b"1234 (python3 (x)) S 1 2 3").unwrap();
        assert_eq!(k.name, "python3 (x)");
        assert_eq!(k.state, 'S');
        assert_eq!(parse_syscall("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n"), Some((202, 0x7f00)));
        assert_eq!(parse_syscall("running\n"), None);
    }
}
