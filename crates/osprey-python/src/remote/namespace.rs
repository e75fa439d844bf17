//! Processes in containers, seen from the host.
//!
//! * Files: the target's binary and libraries may exist only in its own
//!   mount namespace or chroot; they are opened through `/proc/PID/root`
//!   (see [`crate::remote::process::target_path`]).
//! * Thread ids: a process in another PID namespace records its threads'
//!   ids in that namespace (`native_thread_id` of a thread state), while
//!   `/proc` here lists the host's ids. The `NSpid:` line of
//!   `/proc/PID/task/TID/status` has both, outermost first.
//! * Permission: reading another process's memory needs ptrace access;
//!   [`permission_hint`] says what is missing.

use std::collections::HashMap;
use std::fs;
use std::io;

/// Is `pid` in the same PID namespace as this process?
pub fn same_pid_ns(pid: i32) -> bool {
    match (fs::read_link("/proc/self/ns/pid"), fs::read_link(format!("/proc/{pid}/ns/pid"))) {
        (Ok(a), Ok(b)) => a == b,
        // Without access to the links, assume the same namespace (the ids
        // are then checked against the thread states anyway).
        _ => true,
    }
}

/// Parses the innermost id of an `NSpid:` line of a status file.
pub fn parse_nspid(status: &str) -> Option<i32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_ascii_whitespace().last()?.parse().ok()
}

/// Host thread id -> the id the thread has in its own PID namespace.
/// Identity when the target shares our namespace.
#[derive(Debug, Default)]
pub struct TidMap {
    other_ns: bool,
    map: HashMap<i32, i32>,
}

impl TidMap {
    pub fn new(pid: i32) -> TidMap {
        TidMap { other_ns: !same_pid_ns(pid), map: HashMap::new() }
    }

    /// The target-namespace id of host thread `tid` of process `pid`.
    pub fn ns_tid(&mut self, pid: i32, tid: i32) -> io::Result<i32> {
        if !self.other_ns {
            return Ok(tid);
        }
        if let Some(&t) = self.map.get(&tid) {
            return Ok(t);
        }
        let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))?;
        let t = parse_nspid(&s).ok_or_else(|| io::Error::other(format!("no NSpid for thread {tid}")))?;
        self.map.insert(tid, t);
        Ok(t)
    }

    pub fn retain(&mut self, live: &[i32]) {
        self.map.retain(|k, _| live.contains(k));
    }
}

/// One sentence on why this process may not read `pid`'s memory and what
/// to do about it.
pub fn permission_hint(pid: i32) -> String {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let their_uid = fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| {
        s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_ascii_whitespace().nth(2)?.parse::<u32>().ok())
    });
    let scope =
        fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse::<u32>().ok());
    let cap = has_cap_sys_ptrace();
    if !cap && their_uid.is_some_and(|u| u != me) {
        return format!(
            "process {pid} belongs to uid {} and osprey runs as uid {me} without CAP_SYS_PTRACE: run osprey as that user or as root (in a container: --cap-add SYS_PTRACE)",
            their_uid.unwrap_or(0)
        );
    }
    match scope {
        Some(s) if s >= 1 && !cap => format!(
            "kernel.yama.ptrace_scope is {s}: run osprey as root or with CAP_SYS_PTRACE (sudo setcap cap_sys_ptrace+ep $(which osprey)), or set it to 0 (sysctl kernel.yama.ptrace_scope=0)"
        ),
        _ => format!(
            "ptrace access to process {pid} was refused (a seccomp or LSM policy, or a container without CAP_SYS_PTRACE): run osprey as root on the host, or give it CAP_SYS_PTRACE"
        ),
    }
}

fn has_cap_sys_ptrace() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(l.split_ascii_whitespace().nth(1)?, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid() {
        assert_eq!(parse_nspid("Name:\tpython3\nNSpid:\t4242\t7\nNSpgid:\t1\n"), Some(7));
        assert_eq!(parse_nspid("NSpid:\t4242\n"), Some(4242));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn own_process_same_ns() {
        let me = std::process::id() as i32;
        assert!(same_pid_ns(me));
        let mut m = TidMap::new(me);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        assert_eq!(m.ns_tid(me, tid).unwrap(), tid);
    }
}
