//! Which role the agent takes in the process that loaded it.
//!
//! `osprey exec` preloads the agent into the command it starts (the root).
//! Invariants:
//! - the first process to load the agent records its pid in `OSPREY_ROOT_PID`
//!   (inherited by everything it execs or forks);
//! - an exec in the root's own pid (a shim, `env`, a shebang, `sh -c 'exec ..'`)
//!   keeps the agent in `LD_PRELOAD`, so the whole chain is followed without
//!   `OSPREY_CHILDREN`; any other pid keeps it only with `OSPREY_CHILDREN=1`,
//!   and otherwise neither profiles nor passes the agent on;
//! - inside CPython (its `_PyRuntime` or `Py_Version` symbol is defined in the
//!   executable or a loaded libpython), when `OSPREY_PYTHON_SAMPLER` names an
//!   out-of-process sampler watching (`PID:STARTTIME` of `osprey exec`), the
//!   native agent stays off: Python frames come from that sampler, not from
//!   the interpreter's C stack. The watcher is woken with SIGCHLD (which it
//!   waits for) so it attaches at once rather than at its next scan, and so
//!   it is by every child that process forks; the start time, checked
//!   first, keeps a reused pid from being signalled.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

/// What the agent does in this process.
#[derive(Debug, PartialEq, Eq)]
pub enum Role {
    /// Start the native profiler.
    Native,
    /// CPython, sampled from outside by `osprey exec`: stay off.
    Python,
    /// A descendant of the root while children are not profiled.
    Skip,
}

/// Decides the role and fixes `LD_PRELOAD` / `OSPREY_ROOT_PID` for the
/// programs this process will exec. Runs in the constructor, single-threaded.
pub fn decide() -> Role {
    let me = std::process::id();
    let root = match std::env::var("OSPREY_ROOT_PID").ok().and_then(|v| v.parse::<u32>().ok()) {
        Some(r) => r,
        None => {
            set_env("OSPREY_ROOT_PID", Some(&me.to_string()));
            me
        }
    };
    let children = std::env::var_os("OSPREY_CHILDREN").is_some_and(|v| v == "1");
    if me != root && !children {
        remove_self_from_ld_preload();
        return Role::Skip;
    }
    // The symbol lookup first: the watcher's `stat` is read only inside
    // CPython, not in every process of the tree.
    let sampler = std::env::var("OSPREY_PYTHON_SAMPLER").ok();
    match sampler.as_deref().filter(|_| is_cpython()).and_then(watcher) {
        Some((pid, start)) => {
            wake(pid);
            announce_forks(pid, start);
            Role::Python
        }
        _ => Role::Native,
    }
}

/// The watcher's pid and start time, for [`after_fork`]: set once, before any fork.
static WATCHER: (AtomicI32, AtomicU64) = (AtomicI32::new(0), AtomicU64::new(0));

/// A CPython process forks its workers without exec (multiprocessing's
/// `fork` method, prefork servers): no agent starts in them, so each child
/// wakes the watcher itself, which then attaches at once instead of at its
/// next scan of the tree.
fn announce_forks(pid: i32, start: u64) {
    WATCHER.0.store(pid, Relaxed);
    WATCHER.1.store(start, Relaxed);
    // SAFETY: registering a plain extern "C" callback.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork)) };
}

/// In a fork's child: wakes the watcher, if it is still the process named
/// (its start time checked again: a reused pid is never signalled).
/// glibc has reset malloc's locks before child handlers run; the child
/// gets `fork`'s errno back.
extern "C" fn after_fork() {
    let _errno = osprey::internals::signal::sys::ErrnoGuard::save();
    let (pid, start) = (WATCHER.0.load(Relaxed), WATCHER.1.load(Relaxed));
    if osprey::internals::threads::start_ticks(pid) == Some(start) {
        wake(pid);
    }
}

/// SIGCHLD to the watcher `osprey exec`, which blocks it and waits for it.
fn wake(pid: i32) {
    // SAFETY: a plain kill of a process whose start time was just checked.
    unsafe { libc::kill(pid, libc::SIGCHLD) };
}

/// The pid and start time of the watcher `PID:STARTTIME` names, if that
/// process still runs (its start time, field 22 of its `stat`, is the one named).
fn watcher(v: &str) -> Option<(i32, u64)> {
    let (pid, start) = v.split_once(':')?;
    let pid: i32 = pid.parse().ok().filter(|&p| p > 0)?;
    let start: u64 = start.parse().ok().filter(|&s| s > 0)?;
    (osprey::internals::threads::start_ticks(pid)? == start).then_some((pid, start))
}

/// Whether this process is not the command `osprey exec` started (nor what
/// that command exec'd in its own pid). Valid after [`decide`].
pub fn is_descendant() -> bool {
    std::env::var("OSPREY_ROOT_PID").ok().and_then(|v| v.parse::<u32>().ok()).is_some_and(|r| r != std::process::id())
}

/// CPython's runtime state is in this process: the interpreter itself, not a
/// file name, decides.
fn is_cpython() -> bool {
    [c"_PyRuntime", c"Py_Version"].iter().any(|sym| {
        // SAFETY: looking up a data symbol in the global scope; nothing is called.
        !unsafe { libc::dlsym(libc::RTLD_DEFAULT, sym.as_ptr()) }.is_null()
    })
}

/// Programs this process execs load neither the agent nor its allocators.
fn remove_self_from_ld_preload() {
    let Some(v) = std::env::var_os("LD_PRELOAD") else { return };
    let v = v.to_string_lossy().into_owned();
    let ours = |p: &str| ["libosprey_preload.so", crate::ALLOC_LIB].iter().any(|l| p.ends_with(l));
    let kept: Vec<&str> = v.split([':', ' ']).filter(|p| !p.is_empty() && !ours(p)).collect();
    let kept = kept.join(":");
    set_env("LD_PRELOAD", Some(kept.as_str()).filter(|k| !k.is_empty()));
}

/// Sets (`Some`) or removes (`None`) a variable in the process's environment
/// (`environ`) through libc's own `setenv`/`unsetenv`, not the program's.
/// bash defines both: called before its `main`, they create bash's variable
/// table early and write there only, after which bash's `getenv` reads that
/// table instead of `environ`, and every `OSPREY_*` setting read after it
/// (the agent's whole configuration) would be missed. libc's come next after
/// this library in the loader's order; the program's come before it.
fn set_env(key: &str, value: Option<&str>) {
    type Set = unsafe extern "C" fn(*const libc::c_char, *const libc::c_char, libc::c_int) -> libc::c_int;
    type Unset = unsafe extern "C" fn(*const libc::c_char) -> libc::c_int;
    let (Ok(k), Ok(v)) = (std::ffi::CString::new(key), value.map(std::ffi::CString::new).transpose()) else { return };
    let name = if v.is_some() { c"setenv" } else { c"unsetenv" };
    // SAFETY: looking up the next definition of a libc function.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if f.is_null() {
        return;
    }
    // SAFETY: `f` is libc's setenv/unsetenv, called with NUL-terminated
    // strings; the constructor runs before any other thread exists.
    unsafe {
        match &v {
            Some(v) => drop(core::mem::transmute::<*mut libc::c_void, Set>(f)(k.as_ptr(), v.as_ptr(), 1)),
            None => drop(core::mem::transmute::<*mut libc::c_void, Unset>(f)(k.as_ptr())),
        }
    }
}
