//! osprey's side of each allocation, reached through the table the agent
//! hands over at start (`osprey_alloc_attach`, see `osprey::internals::alloc::Hooks`),
//! and the per-thread countdown that decides which allocations it sees.
//!
//! Until the agent attaches (or when it never does: the agent stayed off in
//! this process), every interposed function only forwards. The countdown
//! is a `const` thread-local without destructor; when this library was
//! loaded with the program (`LD_PRELOAD`) it sits in static TLS and is read
//! at its fixed offset from the thread pointer, without `__tls_get_addr`.

use core::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicPtr, AtomicU64, Ordering::*};

/// Mirror of `osprey::internals::alloc::Hooks` (C layout; `size` checked).
#[repr(C)]
pub struct Hooks {
    size: usize,
    live: &'static AtomicU64,
    crossed: unsafe extern "C" fn(addr: *mut u8, size: usize) -> i64,
    forget: unsafe extern "C" fn(addr: *mut u8),
}

/// The agent's table, once attached (never detached: it is `'static`).
static HOOKS: AtomicPtr<Hooks> = AtomicPtr::new(core::ptr::null_mut());
/// Its `live` counter, one load nearer for `free`.
static LIVE: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());

/// Called by the agent once it runs with allocation profiling on: from
/// then on, allocations are counted down and sampled (osprey drops the
/// samples while its sampling is off). Returns false (and changes
/// nothing) for a table of another layout.
///
/// # Safety
/// `hooks` is null or points to a `'static` table of osprey's.
#[no_mangle]
pub unsafe extern "C" fn osprey_alloc_attach(hooks: *const Hooks) -> bool {
    // SAFETY: the caller's contract.
    let Some(h) = (unsafe { hooks.as_ref() }) else { return false };
    if h.size != core::mem::size_of::<Hooks>() {
        return false;
    }
    LIVE.store(h.live as *const AtomicU64 as *mut AtomicU64, Release);
    HOOKS.store(hooks as *mut Hooks, Release);
    true
}

/// Counts an allocation of `size` bytes down: the agent's table when this
/// one crosses zero and is to be handed over ([`sampled`]), else `None`
/// (the caller then tail-calls the real function).
#[inline(always)]
pub fn due(size: usize) -> Option<&'static Hooks> {
    // SAFETY: null or a `'static` table (`osprey_alloc_attach`).
    let h = unsafe { HOOKS.load(Acquire).as_ref() }?;
    let crossed = with_countdown(|c| {
        let left = c.get().wrapping_sub(size as i64);
        c.set(left);
        left < 0
    });
    crossed.then_some(h)
}

/// The allocation [`due`] for a sample returned `addr`: osprey samples it
/// and sets the next countdown. Inlined into the interposed function, so
/// that osprey's walk starts at its caller's. A failed allocation (null)
/// leaves the countdown crossed: the next one is sampled instead.
#[inline(always)]
pub fn sampled(h: &Hooks, addr: *mut libc::c_void, size: usize) {
    if addr.is_null() {
        return;
    }
    // SAFETY: osprey's hook, with a block just allocated.
    let next = unsafe { (h.crossed)(addr as *mut u8, size) };
    with_countdown(|c| c.set(next));
}

/// Before the real `free` of `addr`: osprey forgets it if it was sampled
/// (only asked while sampled blocks are live).
#[inline(always)]
pub fn on_free(addr: *mut libc::c_void) {
    // SAFETY: null or osprey's `'static` counter (`osprey_alloc_attach`).
    let Some(live) = (unsafe { LIVE.load(Acquire).as_ref() }) else { return };
    if live.load(Relaxed) == 0 {
        return;
    }
    // SAFETY: null or a `'static` table (`osprey_alloc_attach`).
    if let Some(h) = unsafe { HOOKS.load(Acquire).as_ref() } {
        // SAFETY: osprey's hook, with a block about to be freed.
        unsafe { (h.forget)(addr as *mut u8) }
    }
}

thread_local! {
    /// Bytes left before the next sample (0 at first: the first allocation
    /// crosses, and osprey draws the thread's first interval).
    static LEFT: Cell<i64> = const { Cell::new(0) };
}

/// Offset of this thread's [`LEFT`] from the thread pointer when this
/// library is in static TLS (0: unknown, use `thread_local!`'s access).
static STATIC_TLS_OFFSET: AtomicIsize = AtomicIsize::new(0);

/// The thread pointer (`fs:0` holds its own address on x86-64 Linux).
#[inline(always)]
fn thread_pointer() -> isize {
    let tp: isize;
    // SAFETY: reads the TCB's self pointer, set up for every libc thread.
    unsafe { core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

#[inline(always)]
fn with_countdown<R>(f: impl FnOnce(&Cell<i64>) -> R) -> R {
    let off = STATIC_TLS_OFFSET.load(Relaxed);
    if off != 0 {
        // SAFETY: this thread's countdown lives at the thread pointer plus
        // `off` (static TLS, see `init`); only this thread touches it.
        f(unsafe { &*(thread_pointer().wrapping_add(off) as *const Cell<i64>) })
    } else {
        LEFT.with(f)
    }
}

/// From the constructor: when the program was started with this library in
/// `LD_PRELOAD` (not `dlopen`ed), its thread-locals are in static TLS, at
/// one offset from every thread's thread pointer.
pub fn init() {
    // SAFETY: Dl_info is plain pointers: all-zero is valid.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr fills `info` for an address of this library (a function).
    let found = unsafe { libc::dladdr(init as *const libc::c_void, &mut info) } != 0 && !info.dli_fname.is_null();
    if !found {
        return;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
    let me = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
    let base = |p: &[u8]| p.rsplit(|&b| b == b'/').next().unwrap_or(p).to_vec();
    let Some(preload) = std::env::var_os("LD_PRELOAD") else { return };
    let preloaded =
        preload.as_encoded_bytes().split(|&b| b == b':' || b == b' ').any(|p| !p.is_empty() && base(p) == base(me));
    if preloaded {
        let off = LEFT.with(|c| c as *const Cell<i64> as isize).wrapping_sub(thread_pointer());
        STATIC_TLS_OFFSET.store(off, Relaxed);
    }
}
