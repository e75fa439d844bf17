//! `sigaction`, `signal`, `sigset`, `bsd_signal` and `sysv_signal`,
//! interposed: when the program installs a disposition for one of osprey's
//! real-time signals, osprey steps aside first (one line on stderr,
//! sampling stops, see `osprey::internals::takeover::step_aside`), then
//! the program's disposition is installed exactly as it asked. Where osprey's
//! termination handler stands in for `SIG_DFL`, the program is told `SIG_DFL`.

use osprey::internals::shutdown::disguised;
use osprey::internals::takeover::step_aside;
use std::sync::atomic::{AtomicUsize, Ordering::*};

type Sigaction = unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;
type Signal = unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;

static REAL: [AtomicUsize; 5] = [const { AtomicUsize::new(0) }; 5];
const NAMES: [&std::ffi::CStr; 5] = [c"sigaction", c"signal", c"sigset", c"bsd_signal", c"sysv_signal"];

/// libc's definition of `NAMES[i]` (looked up once; from the constructor
/// before any osprey handler exists).
fn real(i: usize) -> usize {
    let mut p = REAL[i].load(Acquire);
    if p == 0 {
        // SAFETY: looking up the next definition of a libc symbol.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, NAMES[i].as_ptr()) } as usize;
        REAL[i].store(p, Release);
    }
    p
}

/// Resolves every real function (from the library constructor).
pub fn resolve() {
    for i in 0..NAMES.len() {
        real(i);
    }
}

fn takes_over(handler: usize) -> bool {
    handler != libc::SIG_DFL
}

/// Interposed `sigaction`.
///
/// # Safety
/// Same contract as libc's `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    oact: *mut libc::sigaction,
) -> libc::c_int {
    // SAFETY: `act` is null or valid, per the caller's contract.
    if let Some(a) = unsafe { act.as_ref() } {
        if takes_over(a.sa_sigaction) {
            step_aside(sig, a.sa_sigaction);
        }
    }
    let f = real(0);
    if f == 0 {
        // SAFETY: errno of this thread.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: `f` is libc's sigaction; the caller's arguments.
    let rc = unsafe { core::mem::transmute::<usize, Sigaction>(f)(sig, act, oact) };
    // SAFETY: `oact` is null or valid, per the caller's contract.
    if let Some(o) = unsafe { oact.as_mut() } {
        if rc == 0 && disguised(o.sa_sigaction) != o.sa_sigaction {
            // SAFETY: a zeroed sigaction is SIG_DFL with no flags and an empty mask.
            *o = unsafe { core::mem::zeroed() };
        }
    }
    rc
}

/// One of the `signal`-like functions: step aside, then libc's.
unsafe fn signal_like(i: usize, sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if takes_over(handler) {
        step_aside(sig, handler);
    }
    let f = real(i);
    if f == 0 {
        // SAFETY: errno of this thread.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return libc::SIG_ERR;
    }
    // SAFETY: `f` is libc's function of that name; the caller's arguments.
    disguised(unsafe { core::mem::transmute::<usize, Signal>(f)(sig, handler) })
}

/// Interposed `signal`.
///
/// # Safety
/// Same contract as libc's `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: forwarded contract.
    unsafe { signal_like(1, sig, handler) }
}

/// Interposed `sigset`.
///
/// # Safety
/// Same contract as libc's `sigset`.
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: forwarded contract.
    unsafe { signal_like(2, sig, handler) }
}

/// Interposed `bsd_signal`.
///
/// # Safety
/// Same contract as libc's `bsd_signal`.
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: forwarded contract.
    unsafe { signal_like(3, sig, handler) }
}

/// Interposed `sysv_signal`.
///
/// # Safety
/// Same contract as libc's `sysv_signal`.
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: forwarded contract.
    unsafe { signal_like(4, sig, handler) }
}
