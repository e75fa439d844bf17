//! The osprey agent as a preloadable shared library.
//!
//! `LD_PRELOAD=libosprey_preload.so CMD` (what `osprey exec` does) starts the
//! profiler from a constructor, configured by `OSPREY_*` variables (see
//! `osprey::Config`), writes the last profile at `exit`, and interposes
//! `pthread_create` so every new thread registers itself (thread-start path)
//! before its start routine runs. Threads created any other way are found by
//! the agent's discovery scan. Which processes profile, and which pass the
//! agent on to the programs they exec, is decided in [`launch`]. The exec
//! family is interposed (`exec_shim.c`, `exec_shim.rs`) so that no osprey signal
//! reaches an exec'd program; `abort` and `_exit` write the profile so far
//! first (`shutdown.rs`); a program that installs a handler for one of
//! osprey's signals gets it, osprey steps aside (`sigaction.rs`). The
//! allocators are interposed by a library of their own, preloaded only for
//! allocation profiles (`osprey-alloc`), which the agent attaches to.

mod context_ffi;
mod exec_shim;
mod launch;
mod shutdown;
mod sigaction;

use osprey::internals::threads;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;

type StartRoutine = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartRoutine,
    *mut libc::c_void,
) -> libc::c_int;

static REAL_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);
static EXIT_KEY: AtomicUsize = AtomicUsize::new(usize::MAX);
static PROFILER: Mutex<Option<osprey::Profiler>> = Mutex::new(None);

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    shutdown::resolve();
    sigaction::resolve();
    if launch::decide() != launch::Role::Native {
        return;
    }
    // SAFETY: key with a plain extern "C" destructor, created once.
    unsafe {
        let mut key: libc::pthread_key_t = 0;
        if libc::pthread_key_create(&mut key, Some(thread_exit)) == 0 {
            EXIT_KEY.store(key as usize, Release);
        }
    }
    let descendant = launch::is_descendant();
    if descendant {
        // Processes the command starts are often short-lived (shells,
        // compiler drivers): unwind tables (and the OpenTelemetry process
        // context) once they have lived a while.
        osprey::internals::unwind_tables::defer(DESCENDANT_TABLES_AFTER);
    }
    let cfg = match osprey::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            osprey::say!("osprey: {e}; profiling is off");
            return;
        }
    };
    let alloc = cfg.alloc;
    match osprey::Profiler::builder().config(cfg).start() {
        Ok(p) => {
            context_ffi::start_otel(descendant.then_some(DESCENDANT_TABLES_AFTER));
            if alloc {
                attach_allocators();
            }
            *PROFILER.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(finish) };
        }
        Err(e) => osprey::say!("osprey: {e}; profiling is off"),
    }
}

/// Hands osprey's allocation hooks to the interposed allocators
/// (`libosprey_alloc.so`, preloaded with this library); without them
/// allocation profiling is switched off, with one line.
fn attach_allocators() {
    type Attach = unsafe extern "C" fn(*const osprey::internals::alloc::Hooks) -> bool;
    // SAFETY: looking up a function symbol in the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"osprey_alloc_attach".as_ptr()) };
    // SAFETY: `osprey_alloc_attach` has this signature; the table is 'static.
    let attached = !p.is_null()
        && unsafe { core::mem::transmute::<*mut libc::c_void, Attach>(p)(&osprey::internals::alloc::HOOKS) };
    if !attached {
        osprey::internals::alloc::disarm();
        osprey::say!("osprey: allocation profiling needs {ALLOC_LIB} in LD_PRELOAD (`osprey exec --alloc` preloads it); it is off");
    }
}

/// The interposed allocators' library.
const ALLOC_LIB: &str = "libosprey_alloc.so";

/// How long a process started by the profiled command (`--children`) runs
/// before its agent compiles unwind tables (frame pointers until then).
const DESCENDANT_TABLES_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// At `exit`: stop sampling and write the last profile. Only in the process
/// the agent belongs to: a `vfork` child calling `exit` shares our memory
/// (taking the guard would rob the parent of its last profile), and a raw
/// `clone` child has no collector to stop.
extern "C" fn finish() {
    if !osprey::internals::agent::owns_process() {
        return;
    }
    let p = PROFILER.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = p {
        let files = p.stop_at_exit();
        if std::env::var_os("OSPREY_VERBOSE").is_some_and(|v| v == "1") {
            for f in files.iter().rev().take(1) {
                osprey::say!("osprey: last profile written to {}", f.display());
            }
        }
    }
}

struct Start {
    routine: StartRoutine,
    arg: *mut libc::c_void,
    /// One of osprey's own threads: never registered.
    internal: bool,
}

/// Interposed `pthread_create`: the new thread registers itself before `start` runs.
///
/// # Safety
/// Same contract as libc's `pthread_create`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartRoutine,
    arg: *mut libc::c_void,
) -> libc::c_int {
    let real = real_pthread_create();
    let Some(real) = real else { return libc::EAGAIN };
    let internal = threads::spawning_internal();
    let boxed = Box::into_raw(Box::new(Start { routine: start, arg, internal }));
    // SAFETY: libc's pthread_create with the caller's arguments; `trampoline` takes over `boxed`.
    let rc = unsafe { real(thread, attr, trampoline, boxed as *mut libc::c_void) };
    if rc != 0 {
        // SAFETY: the thread was not created, so `boxed` is still ours.
        drop(unsafe { Box::from_raw(boxed) });
    }
    rc
}

fn real_pthread_create() -> Option<PthreadCreate> {
    let mut p = REAL_PTHREAD_CREATE.load(Acquire);
    if p == 0 {
        // SAFETY: looking up the next definition of a libc symbol.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) } as usize;
        REAL_PTHREAD_CREATE.store(p, Release);
    }
    // SAFETY: p is libc's pthread_create.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, PthreadCreate>(p) })
}

extern "C" fn trampoline(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `p` is the Box made in `pthread_create`, handed over once.
    let start = unsafe { Box::from_raw(p as *mut Start) };
    if start.internal {
        threads::forget_current();
    } else if threads::register_current_with_start(start.routine as usize).is_some() {
        let key = EXIT_KEY.load(Acquire);
        if key != usize::MAX {
            // SAFETY: valid key; non-null marker value so the destructor runs.
            unsafe { libc::pthread_setspecific(key as libc::pthread_key_t, std::ptr::dangling::<libc::c_void>()) };
        }
    }
    (start.routine)(start.arg)
}

extern "C" fn thread_exit(_value: *mut libc::c_void) {
    threads::unregister_current();
}
