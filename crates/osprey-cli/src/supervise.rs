//! `osprey exec` stays the parent of the command it runs, invisibly.
//!
//! Invariants while the command runs:
//! - signals someone sends to osprey (`kill`, a supervisor) reach the
//!   command; signals the terminal sends to the foreground group (Ctrl-C,
//!   Ctrl-\, hangup) already reach it and are not sent twice;
//! - osprey itself never dies of them: it outlives the command to write the
//!   last Python profiles and its messages;
//! - at the end osprey exits with the command's status, and a command killed
//!   by a signal makes osprey die of that same signal, so the shell sees what
//!   it would have seen without osprey.

use std::mem::MaybeUninit;
use std::time::Duration;

/// The signals osprey relays (those whose default action would kill osprey
/// before the command).
const RELAYED: [libc::c_int; 8] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGPWR,
];

/// The relayed signals and SIGCHLD (which only wakes [`relay`]: the
/// command ended).
fn relayed_set() -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset takes valid signals.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for s in RELAYED {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        libc::sigaddset(set.as_mut_ptr(), libc::SIGCHLD);
        set.assume_init()
    }
}

/// Blocks the relayed signals in this thread and every thread it starts
/// after this call; they stay pending until [`relay`] takes them. `cmd`
/// unblocks them between its fork and exec, so the command starts with the
/// mask osprey was given.
pub fn block_relayed(cmd: &mut std::process::Command) {
    let set = relayed_set();
    let mut old = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: a valid set, and which of them were blocked already is kept.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, old.as_mut_ptr()) };
    // SAFETY: pthread_sigmask filled `old`.
    let old = unsafe { old.assume_init() };
    let restore = move || {
        // SAFETY: async-signal-safe call on a copied set, in the forked child.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        Ok(())
    };
    // SAFETY: the closure only calls pthread_sigmask, which is async-signal-safe.
    unsafe { std::os::unix::process::CommandExt::pre_exec(cmd, restore) };
}

/// Waits up to `timeout` for a relayed signal and sends it on to `pid` when a
/// process (not the terminal or the kernel) sent it; returns early when a
/// child of osprey ended (SIGCHLD), so the caller sees the exit at once.
pub fn relay(pid: i32, timeout: Duration) {
    let set = relayed_set();
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: valid set, info buffer and timeout.
    let sig = unsafe { libc::sigtimedwait(&set, info.as_mut_ptr(), &ts) };
    if sig <= 0 || sig == libc::SIGCHLD {
        return;
    }
    // SAFETY: sigtimedwait filled `info` for `sig`.
    let code = unsafe { info.assume_init().si_code };
    // SI_USER (kill), SI_QUEUE, SI_TKILL: sent by a process to osprey alone.
    // SI_KERNEL (terminal, hangup): the command's process group got it too.
    if code <= 0 {
        // SAFETY: plain kill of our own child.
        unsafe { libc::kill(pid, sig) };
    }
}

/// How the command ended.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    Exited(u8),
    Signaled(libc::c_int),
}

/// The command's own CPU time and that of its whole tree (itself plus the
/// children it waited for), read while it is a zombie.
#[derive(Clone, Copy, Debug, Default)]
pub struct TreeCpu {
    pub own: Duration,
    pub tree: Duration,
}

/// Has `pid` exited? Leaves it a zombie (its `/proc` entry stays readable).
/// A ptrace stop of its main thread (the Python sampler reading a thread's
/// registers), which `waitid` reports to a tracer even without `WSTOPPED`,
/// is not an exit and is left for the sampler to wait for.
pub fn has_exited(pid: i32) -> bool {
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: valid info buffer; WNOWAIT leaves the child waitable.
    let r = unsafe {
        libc::waitid(libc::P_PID, pid as libc::id_t, info.as_mut_ptr(), libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
    };
    // SAFETY: waitid zero-filled or filled `info`.
    let info = unsafe { info.assume_init() };
    // SAFETY: as above.
    let from_pid = unsafe { info.si_pid() } == pid;
    r == 0 && from_pid && matches!(info.si_code, libc::CLD_EXITED | libc::CLD_KILLED | libc::CLD_DUMPED)
}

/// CPU times of the zombie `pid`, from `/proc/<pid>/stat` (utime, stime,
/// cutime, cstime).
pub fn tree_cpu(pid: i32) -> TreeCpu {
    let Ok(text) = osprey_procfs::stat::read(pid) else { return TreeCpu::default() };
    let Some(s) = osprey_procfs::stat::Stat::parse(&text) else { return TreeCpu::default() };
    let (Some(utime), Some(stime), Some(cutime), Some(cstime)) = (s.utime(), s.stime(), s.cutime(), s.cstime()) else {
        return TreeCpu::default();
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks = |t: u64| Duration::from_nanos(t * 1_000_000_000 / hz);
    TreeCpu { own: ticks(utime + stime), tree: ticks(utime + stime + cutime + cstime) }
}

/// Reaps `pid` (already exited).
pub fn reap(pid: i32) -> Ended {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        return Ended::Exited(1);
    }
    if libc::WIFSIGNALED(status) {
        Ended::Signaled(libc::WTERMSIG(status))
    } else {
        Ended::Exited(libc::WEXITSTATUS(status) as u8)
    }
}

/// Ends osprey the way the command ended: the same exit code, or death by
/// the same signal (without a second core dump). Returns the exit code to
/// use if the signal could not end osprey.
pub fn end_like(e: Ended) -> u8 {
    match e {
        Ended::Exited(c) => c,
        Ended::Signaled(sig) => {
            let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: resetting a disposition, unblocking and raising a signal
            // in a process that is about to end anyway.
            unsafe {
                libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                libc::signal(sig, libc::SIG_DFL);
                let mut set = MaybeUninit::<libc::sigset_t>::uninit();
                libc::sigemptyset(set.as_mut_ptr());
                libc::sigaddset(set.as_mut_ptr(), sig);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, set.as_ptr(), std::ptr::null_mut());
                libc::raise(sig);
            }
            128u8.wrapping_add(sig as u8)
        }
    }
}
