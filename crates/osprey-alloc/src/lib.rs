//! The C and C++ allocators interposed for osprey's allocation profiles:
//! `malloc`, `calloc`, `realloc`, `free`, `posix_memalign`, `aligned_alloc`,
//! `memalign`, `valloc`, `pvalloc`, `malloc_usable_size`, and C++'s
//! `operator new`/`delete` (every throwing, nothrow, sized and aligned
//! variant, forwarded to the malloc family as libstdc++'s are).
//!
//! A library of its own, preloaded next to the agent only when allocation
//! profiling is on (`osprey exec --alloc`): a program profiled without it
//! pays nothing at its allocations. Each function forwards to the next
//! definition ([`real`]) and, once the agent has attached ([`hooks`]),
//! counts the bytes down and hands about one allocation per sampling
//! interval to osprey.
//!
//! Everything here obeys the rules of osprey's signal path (no allocation,
//! no lock, no panic): it runs inside the program's `malloc`, possibly in
//! its signal handlers.

mod boot;
mod cxx;
mod hooks;
mod real;

pub use hooks::osprey_alloc_attach;
use real::*;

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    hooks::init();
}

/// Allocates with `alloc` and hands the block to osprey when it is due for
/// a sample; otherwise `alloc` is the last thing done (a tail call).
macro_rules! counted {
    ($size:expr, $f:ident, $call:expr) => {{
        let size: usize = $size;
        match hooks::due(size) {
            None => {
                // SAFETY: the real function, with the caller's arguments.
                unsafe { $call }
            }
            Some(h) => {
                // `black_box`: a call of its own, so the compiler does not
                // merge it with the tail call above.
                let $f = core::hint::black_box($f);
                // SAFETY: as above.
                let p = unsafe { $call };
                hooks::sampled(h, p, size);
                p
            }
        }
    }};
}

#[inline(always)]
fn malloc_impl(size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(MALLOC, Malloc) else { return boot::alloc(size, 16) };
    counted!(size, f, f(size))
}

#[inline(always)]
fn free_impl(p: *mut libc::c_void) {
    if p.is_null() || boot::contains(p) {
        return;
    }
    hooks::on_free(p);
    if let Some(f) = real_fn!(FREE, Free) {
        // SAFETY: the real free, with a block the real allocator returned.
        unsafe { f(p) }
    }
}

#[inline(always)]
fn aligned_impl(align: usize, size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(MEMALIGN, Aligned) else { return boot::alloc(size, align) };
    counted!(size, f, f(align, size))
}

/// Interposed `malloc`.
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut libc::c_void {
    malloc_impl(size)
}

/// Interposed `free`.
///
/// # Safety
/// `p` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut libc::c_void) {
    free_impl(p)
}

/// Interposed `calloc`.
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut libc::c_void {
    let Some(total) = n.checked_mul(size) else {
        // SAFETY: errno of this thread.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    };
    let Some(f) = real_fn!(CALLOC, Calloc) else { return boot::alloc(total, 16) };
    counted!(total, f, f(n, size))
}

/// Interposed `realloc`: a free of the old block and an allocation of the new.
///
/// # Safety
/// `p` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void {
    if boot::contains(p) {
        let q = malloc_impl(size);
        if !q.is_null() {
            // SAFETY: both blocks hold at least the bytes copied.
            unsafe { core::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, boot::size(p).min(size)) };
        }
        return q;
    }
    let Some(f) = real_fn!(REALLOC, Realloc) else { return boot::alloc(size, 16) };
    if !p.is_null() {
        hooks::on_free(p);
    }
    counted!(size, f, f(p, size))
}

/// Interposed `posix_memalign`.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut libc::c_void, align: usize, size: usize) -> libc::c_int {
    let Some(f) = real_fn!(POSIX_MEMALIGN, PosixMemalign) else {
        let p = boot::alloc(size, align);
        // SAFETY: the caller's out pointer.
        unsafe { *out = p };
        return if p.is_null() { libc::ENOMEM } else { 0 };
    };
    let Some(h) = hooks::due(size) else {
        // SAFETY: the real posix_memalign with the caller's arguments.
        return unsafe { f(out, align, size) };
    };
    // SAFETY: as above (`black_box`: see `counted`).
    let rc = unsafe { core::hint::black_box(f)(out, align, size) };
    // SAFETY: written by a successful call.
    hooks::sampled(h, if rc == 0 { unsafe { *out } } else { core::ptr::null_mut() }, size);
    rc
}

/// Interposed `aligned_alloc`.
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(ALIGNED_ALLOC, Aligned) else { return boot::alloc(size, align) };
    counted!(size, f, f(align, size))
}

/// Interposed `memalign`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut libc::c_void {
    aligned_impl(align, size)
}

/// Interposed `valloc`.
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(VALLOC, Malloc) else { return boot::alloc(size, 4096) };
    counted!(size, f, f(size))
}

/// Interposed `pvalloc`.
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(PVALLOC, Malloc) else { return boot::alloc(size.next_multiple_of(4096), 4096) };
    counted!(size.next_multiple_of(4096), f, f(size))
}

/// Interposed `malloc_usable_size` (bootstrap blocks answer their size).
///
/// # Safety
/// `p` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut libc::c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if boot::contains(p) {
        return boot::size(p);
    }
    match real_fn!(USABLE_SIZE, UsableSize) {
        // SAFETY: the real malloc_usable_size with a block of its allocator.
        Some(f) => unsafe { f(p) },
        None => 0,
    }
}
