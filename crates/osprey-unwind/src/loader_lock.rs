//! osprey's calls into the loader (`dl_iterate_phdr`, through
//! [`crate::loaded::each_object`]) and `fork`.
//!
//! `dl_iterate_phdr` takes a lock of the loader that glibc (2.36 at least)
//! does not reset in the child of a `fork`: copied held, it stays held there
//! for good, and the child's first call waits forever. Two cases:
//! - an osprey thread (the collector) was in the call at the fork: the fork
//!   hooks ([`fork_prepare`]..[`fork_parent`]) keep osprey's calls and
//!   forks apart, so it never is;
//! - a thread of the program was in the loader (`dlopen`, `dlclose`,
//!   exception unwinding): [`fork_child`] looks at the lock, located once
//!   in the parent, and a child that got it held makes no call at all
//!   ([`usable`] is false, [`crate::loaded::each_object`] reports nothing).
//!
//! Invariant (Dekker pair, all SeqCst): a caller counts itself in `CALLS`
//! and then checks `FORKS`; a fork counts itself in `FORKS` and then waits
//! for `CALLS` to be 0. So no call is in progress while a fork copies memory.

use crate::sync::{fence, wait_step, AtomicU32, Ordering::SeqCst};
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// The loader's lock: 0 not looked for yet, 1 not found, else its address.
static LOCK: AtomicUsize = AtomicUsize::new(0);
/// Set in a child that got the loader's lock held: no call is made.
static LOST: AtomicBool = AtomicBool::new(false);

/// Keeps osprey's calls into the loader and forks apart; see the module's
/// invariant (checked by the loom model below).
struct Gate {
    /// osprey's threads inside `dl_iterate_phdr`.
    calls: AtomicU32,
    /// Forks in progress in this process (between prepare and parent).
    forks: AtomicU32,
}

impl Gate {
    #[cfg(not(loom))]
    const fn new() -> Gate {
        Gate { calls: AtomicU32::new(0), forks: AtomicU32::new(0) }
    }

    #[cfg(loom)]
    fn new() -> Gate {
        Gate { calls: AtomicU32::new(0), forks: AtomicU32::new(0) }
    }

    /// Returns once no fork is in progress and this call is counted in.
    fn enter(&self) {
        let mut round = 0u32;
        loop {
            while self.forks.load(SeqCst) != 0 {
                wait_step(round);
                round = round.saturating_add(1);
            }
            self.calls.fetch_add(1, SeqCst);
            // The pair's fences: the counts are SeqCst already, but loom
            // models SeqCst accesses as AcqRel and only fences as SeqCst.
            fence(SeqCst);
            if self.forks.load(SeqCst) == 0 {
                return;
            }
            self.calls.fetch_sub(1, SeqCst);
        }
    }

    fn leave(&self) {
        self.calls.fetch_sub(1, SeqCst);
    }

    /// Returns once no call is in progress; none starts until [`Gate::fork_end`].
    fn fork_begin(&self) {
        self.forks.fetch_add(1, SeqCst);
        fence(SeqCst);
        let mut round = 0u32;
        while self.calls.load(SeqCst) != 0 {
            wait_step(round);
            round = round.saturating_add(1);
        }
    }

    fn fork_end(&self) {
        self.forks.fetch_sub(1, SeqCst);
    }

    /// In the child (one thread): the counts of the parent's threads are void.
    fn reset(&self) {
        self.forks.store(0, SeqCst);
        self.calls.store(0, SeqCst);
    }
}

#[cfg(not(loom))]
static GATE: Gate = Gate::new();

#[cfg(not(loom))]
fn gate() -> &'static Gate {
    &GATE
}

#[cfg(loom)]
fn gate() -> &'static Gate {
    ::loom::lazy_static! {
        static ref GATE: Gate = Gate::new();
    }
    &GATE
}

/// Whether osprey may call into the loader in this process.
pub fn usable() -> bool {
    !LOST.load(SeqCst)
}

/// One osprey call into the loader; see the module's invariant.
pub(crate) struct Call(());

impl Call {
    /// Waits while a fork is in progress; `None` when calls are not [`usable`].
    pub(crate) fn enter() -> Option<Call> {
        if !usable() {
            return None;
        }
        gate().enter();
        Some(Call(()))
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        gate().leave();
    }
}

/// `pthread_atfork` prepare hook: waits for osprey's calls in progress
/// (short: a walk of the loaded objects) and locates the loader's lock the
/// first time. Allocates nothing (a program may fork from a signal handler).
pub fn fork_prepare() {
    gate().fork_begin();
    if LOCK.load(SeqCst) == 0 {
        LOCK.store(locate().unwrap_or(1), SeqCst);
    }
}

/// `pthread_atfork` parent hook.
pub fn fork_parent() {
    gate().fork_end();
}

/// `pthread_atfork` child hook (one thread): no fork is in progress here, and
/// calls are off if the loader's lock came held.
pub fn fork_child() {
    gate().reset();
    let at = LOCK.load(SeqCst);
    // The lock word, not the owner: a holder is recorded only after the
    // word is taken, and a fork can fall between the two.
    // SAFETY: `at` is the mutex `locate` found in the loader's data, which
    // lives as long as the process. Only its lock word is read.
    if at > 1 && unsafe { (at as *const i32).read_volatile() } != 0 {
        LOST.store(true, SeqCst);
    }
}

/// Index of `__owner` (a thread id; `__lock` is 0) in glibc's `pthread_mutex_t`, in `i32`s:
/// `{ int __lock; unsigned __count; int __owner; unsigned __nusers; int __kind; ... }`.
const OWNER: usize = 2;

/// `dladdr1`'s flag asking for the symbol's `Elf64_Sym` (`<dlfcn.h>`).
const RTLD_DL_SYMENT: libc::c_int = 1;

/// The address of the loader's lock: the one recursive mutex in the loader's
/// global data (`_rtld_global`) held by this thread, once, while inside
/// `dl_iterate_phdr`, and free outside it. `None` if not exactly one is.
fn locate() -> Option<usize> {
    // SAFETY: looking a data symbol up by name, and its size (no lock of
    // the loader is held here: `dladdr1` takes the one `dlopen` takes first).
    let (base, words) = unsafe {
        let base = libc::dlsym(libc::RTLD_DEFAULT, c"_rtld_global".as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        let mut sym: *const libc::Elf64_Sym = std::ptr::null();
        let found = libc::dladdr1(base, &mut info, &mut sym as *mut _ as *mut *mut libc::c_void, RTLD_DL_SYMENT);
        if base.is_null() || found == 0 || sym.is_null() {
            return None;
        }
        (base as *const i32, (*sym).st_size as usize / 4)
    };
    // SAFETY: a plain id query.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    // How many candidates, and the first: no allocation in a fork hook.
    let (mut held, mut first) = (0usize, 0usize);
    extern "C" fn scan(_: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `data` is the `&mut dyn FnMut()` passed below.
        unsafe { (*(data as *mut &mut dyn FnMut()))() };
        1
    }
    let mut look = || {
        for i in 0..words.saturating_sub(5) {
            // SAFETY: within the symbol's extent, in the loader's data.
            let w = |k: usize| unsafe { base.add(i + k).read_volatile() };
            if i % 2 == 0 && w(0) != 0 && w(1) == 1 && w(OWNER) == me && w(4) & 3 == libc::PTHREAD_MUTEX_RECURSIVE {
                first = if held == 0 { i } else { first };
                held += 1;
            }
        }
    };
    let mut f: &mut dyn FnMut() = &mut look;
    // SAFETY: `scan` matches the callback contract; `f` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(scan), &mut f as *mut _ as *mut libc::c_void) };
    if held != 1 {
        return None;
    }
    let i = first;
    // SAFETY: as above; outside the call the lock must be free.
    let owner = unsafe { base.add(i + OWNER).read_volatile() };
    (owner == 0).then(|| base as usize + i * 4)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The loader's lock is found on this glibc.
    #[test]
    fn the_loaders_lock_is_found() {
        assert!(locate().is_some(), "no single recursive mutex of _rtld_global held inside dl_iterate_phdr");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Run: `RUSTFLAGS="--cfg loom" cargo test -p osprey-unwind --release --lib loom`
    //! Checks that no call is inside the loader while a fork copies memory.
    use super::*;
    use ::loom::sync::atomic::AtomicBool;
    use ::loom::sync::Arc;
    use ::loom::thread;

    fn call(g: &Gate, inside: &AtomicBool) {
        g.enter();
        inside.store(true, SeqCst);
        inside.store(false, SeqCst);
        g.leave();
    }

    fn fork(g: &Gate, inside: &AtomicBool) {
        g.fork_begin();
        assert!(!inside.load(SeqCst), "a fork copied a call into the loader in progress");
        g.fork_end();
    }

    #[test]
    fn loom_a_call_and_a_fork() {
        ::loom::model(|| {
            let (g, inside) = (Arc::new(Gate::new()), Arc::new(AtomicBool::new(false)));
            let (g2, inside2) = (g.clone(), inside.clone());
            let t = thread::spawn(move || call(&g2, &inside2));
            fork(&g, &inside);
            t.join().unwrap();
        });
    }

    #[test]
    fn loom_two_forks_and_a_call() {
        let mut b = ::loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.max_branches = 100_000;
        b.check(|| {
            let (g, inside) = (Arc::new(Gate::new()), Arc::new(AtomicBool::new(false)));
            let (g2, inside2) = (g.clone(), inside.clone());
            let (g3, inside3) = (g.clone(), inside.clone());
            let c = thread::spawn(move || call(&g2, &inside2));
            let f = thread::spawn(move || fork(&g3, &inside3));
            fork(&g, &inside);
            c.join().unwrap();
            f.join().unwrap();
        });
    }
}
