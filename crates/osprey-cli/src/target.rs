//! The process `attach` and `dump` are pointed at: checked before anything
//! touches it, and what `/proc` says of it and its threads.

use crate::Failure;

/// `PF_KTHREAD` in the flags of `/proc/PID/stat` (field 9).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Refuses what cannot be profiled, with one line and the CLI's status
/// (2: not a pid at all; 1: no such process, a zombie, a kernel thread).
pub fn check(pid: i32) -> Result<(), Failure> {
    if pid <= 0 {
        return Err(Failure::usage(format!("--pid {pid}: a process id is a positive number")));
    }
    let Ok(text) = std::fs::read(format!("/proc/{pid}/stat")) else {
        return Err(Failure::from(format!("no process with pid {pid} (it may have exited)")));
    };
    let Some(stat) = osprey_procfs::stat::Stat::parse(&text) else {
        return Err(Failure::from(format!("pid {pid}: /proc/{pid}/stat is unreadable")));
    };
    if stat.pid != pid {
        // A thread id of another process: /proc lists those too, hidden.
        return Err(Failure::from(format!("pid {pid} is a thread of process {}, not a process", stat.pid)));
    }
    if matches!(stat.state, b'Z' | b'X') {
        return Err(Failure::from(format!("pid {pid} has exited (a zombie): nothing left to sample")));
    }
    if stat.num::<u64>(9).is_some_and(|f| f & PF_KTHREAD != 0) {
        let name = String::from_utf8_lossy(stat.comm);
        return Err(Failure::from(format!("pid {pid} ({name}) is a kernel thread: it has no user stack to sample")));
    }
    // Readable to whoever may trace it: what both samplers need.
    if let Err(e) = std::fs::File::open(format!("/proc/{pid}/maps")) {
        let hint = osprey_python::permission_hint(pid);
        return Err(Failure::from(format!("permission denied: cannot read process {pid} ({e}): {hint}")));
    }
    Ok(())
}

/// The process still runs (not gone, not a zombie).
pub fn alive(pid: i32) -> bool {
    let Ok(text) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    osprey_procfs::stat::Stat::parse(&text).is_some_and(|s| !matches!(s.state, b'Z' | b'X'))
}

/// `PF_EXITING` in the flags: the thread is on its way out.
const PF_EXITING: u64 = 0x4;

/// Thread `tid` of `pid` is exiting or gone, or the whole process is (a
/// ptrace of an exiting thread is refused with EPERM, as if not allowed).
pub fn exiting(pid: i32, tid: i32) -> bool {
    let Ok(text) = std::fs::read(format!("/proc/{pid}/task/{tid}/stat")) else { return true };
    let Some(s) = osprey_procfs::stat::Stat::parse(&text) else { return true };
    matches!(s.state, b'Z' | b'X') || s.num::<u64>(9).is_some_and(|f| f & PF_EXITING != 0) || !alive(pid)
}

/// `/proc/PID/task/TID/comm`, empty if unreadable.
pub fn thread_name(pid: i32, tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default().trim_end().to_string()
}

/// The threads of `pid`, ascending.
pub fn threads(pid: i32) -> Vec<i32> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// What the kernel says a thread is doing.
#[derive(Clone, Debug, Default)]
pub struct ThreadState {
    /// Field 3 of its `stat`: `R`, `S`, `D`, `T`, `t`, `Z`, ...
    pub code: char,
    /// The system call it waits in (`/proc/PID/task/TID/syscall`), by name
    /// (`syscall N` when osprey has none); `None` when running or unknown.
    pub syscall: Option<String>,
}

impl ThreadState {
    /// `running`, `sleeping`, `disk`, `stopped`, ... for the state code.
    pub fn word(&self) -> &'static str {
        match self.code {
            'R' => "running",
            'S' => "sleeping",
            'D' => "disk",
            'T' => "stopped",
            't' => "traced",
            'Z' => "zombie",
            'X' => "dead",
            'I' => "idle",
            _ => "unknown",
        }
    }
}

/// The state of thread `tid` of `pid` (read before it is stopped to read its stack).
pub fn thread_state(pid: i32, tid: i32) -> ThreadState {
    let stat = std::fs::read(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
    let code = osprey_procfs::stat::Stat::parse(&stat).map_or('?', |s| s.state as char);
    // "NR ARGS... SP PC" while blocked in a call; "running", or "-1 SP PC" otherwise.
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
        .ok()
        .and_then(|t| t.split_ascii_whitespace().next()?.parse::<i64>().ok())
        .filter(|&nr| nr >= 0 && code != 'R')
        .map(|nr| {
            osprey::internals::wall::thread_state::syscall_name(nr)
                .map_or_else(|| format!("syscall {nr}"), str::to_string)
        });
    ThreadState { code, syscall }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_passes_and_bad_pids_are_refused() {
        let me = std::process::id() as i32;
        assert!(check(me).is_ok());
        assert!(alive(me));
        assert_eq!(check(0).err().map(|f| f.code), Some(2));
        assert_eq!(check(-3).err().map(|f| f.code), Some(2));
        assert!(threads(me).contains(&me));
        assert!(!thread_name(me, me).is_empty());
        assert!(!exiting(me, me));
        assert!(exiting(me, i32::MAX), "a thread that is not there counts as gone");
    }

    #[test]
    fn a_thread_blocked_in_a_call_shows_it() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let s = thread_state(std::process::id() as i32, tid);
        drop(tx);
        h.join().unwrap();
        assert_eq!((s.word(), s.syscall.as_deref()), ("sleeping", Some("futex")), "{s:?}");
    }
}
