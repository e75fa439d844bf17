//! The C allocator interposed: `malloc`, `calloc`, `realloc`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`,
//! `malloc_usable_size`, and C++'s `operator new`/`delete` (every
//! throwing, nothrow, sized and aligned variant, forwarded to the malloc
//! family as libstdc++'s are). Each forwards to the next definition
//! (`dlsym(RTLD_NEXT)`: libc's, or jemalloc's/tcmalloc's when they come after
//! this library) and reports to osprey's sampler (`osprey::internals::alloc`),
//! which costs a load while allocation profiling is off and a thread-local
//! countdown while it is on.
//!
//! # Bootstrap
//! `dlsym` may allocate (`calloc` for its error buffer) before the real
//! functions are known: those requests are served from [`BOOT`], a static
//! bump buffer, whose blocks `free` ignores and `realloc` moves out.
//!
//! Everything here obeys the rules of `osprey::internals::signal` (no
//! allocation, no lock, no panic): it runs inside the program's `malloc`.

use osprey::internals::alloc::{armed, on_alloc, on_free};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

type Malloc = unsafe extern "C" fn(usize) -> *mut libc::c_void;
type Free = unsafe extern "C" fn(*mut libc::c_void);
type Calloc = unsafe extern "C" fn(usize, usize) -> *mut libc::c_void;
type Realloc = unsafe extern "C" fn(*mut libc::c_void, usize) -> *mut libc::c_void;
type PosixMemalign = unsafe extern "C" fn(*mut *mut libc::c_void, usize, usize) -> libc::c_int;
type Aligned = unsafe extern "C" fn(usize, usize) -> *mut libc::c_void;
type UsableSize = unsafe extern "C" fn(*mut libc::c_void) -> usize;

const MALLOC: usize = 0;
const FREE: usize = 1;
const CALLOC: usize = 2;
const REALLOC: usize = 3;
const POSIX_MEMALIGN: usize = 4;
const ALIGNED_ALLOC: usize = 5;
const MEMALIGN: usize = 6;
const VALLOC: usize = 7;
const PVALLOC: usize = 8;
const USABLE_SIZE: usize = 9;
const NAMES: [&std::ffi::CStr; 10] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"posix_memalign",
    c"aligned_alloc",
    c"memalign",
    c"valloc",
    c"pvalloc",
    c"malloc_usable_size",
];

/// The next definitions, by the indices above (0: not looked up yet).
static REAL: [AtomicUsize; 10] = [const { AtomicUsize::new(0) }; 10];
/// A thread is inside `dlsym` looking them up: allocations come from [`BOOT`].
static RESOLVING: AtomicBool = AtomicBool::new(false);

/// From the constructor: when the program was started with this library in
/// `LD_PRELOAD` (not `dlopen`ed), its thread-locals are in static TLS and the
/// sampler's countdown is read at a fixed offset from the thread pointer.
pub fn init() {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr fills `info` for an address of this library (a function).
    let found = unsafe { libc::dladdr(init as *const libc::c_void, &mut info) } != 0 && !info.dli_fname.is_null();
    if !found {
        return;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
    let me = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let preloaded = std::env::var_os("LD_PRELOAD")
        .is_some_and(|v| v.to_string_lossy().split([':', ' ']).any(|p| !p.is_empty() && base(p) == base(&me)));
    if preloaded {
        osprey::internals::alloc::use_static_tls();
    }
}

fn unsafe_zeroed() -> libc::Dl_info {
    // SAFETY: Dl_info is plain pointers: all-zero is valid.
    unsafe { core::mem::zeroed() }
}

/// Looks every real function up (once; again if a lookup failed).
#[cold]
fn resolve() {
    if RESOLVING.swap(true, Acquire) {
        return; // re-entered from dlsym, or another thread is at it
    }
    for (slot, name) in REAL.iter().zip(NAMES) {
        if slot.load(Relaxed) == 0 {
            // SAFETY: looking up the next definition of a libc symbol.
            let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
            slot.store(p, Release);
        }
    }
    RESOLVING.store(false, Release);
}

/// The real function `i` as a `usize` (0 while unknown: bootstrap).
#[inline(always)]
fn real(i: usize) -> usize {
    let Some(slot) = REAL.get(i) else { return 0 };
    let p = slot.load(Acquire);
    if p != 0 {
        return p;
    }
    resolve();
    slot.load(Acquire)
}

macro_rules! real_fn {
    ($i:expr, $t:ty) => {{
        let p = real($i);
        // SAFETY: `p` is the address dlsym returned for NAMES[$i], of type $t.
        (p != 0).then(|| unsafe { core::mem::transmute::<usize, $t>(p) })
    }};
}

/// Bootstrap buffer: bump-allocated, never reused; each block is preceded
/// by a 16-byte header holding its size.
#[repr(C, align(4096))]
struct Boot(UnsafeCell<[u8; BOOT_SIZE]>);
const BOOT_SIZE: usize = 64 * 1024;
// SAFETY: blocks are handed out once each by an atomic bump pointer.
unsafe impl Sync for Boot {}
static BOOT: Boot = Boot(UnsafeCell::new([0; BOOT_SIZE]));
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

fn in_boot(p: *mut libc::c_void) -> bool {
    let base = BOOT.0.get() as usize;
    (base..base + BOOT_SIZE).contains(&(p as usize))
}

/// A zeroed block of `size` bytes aligned to `align` (a power of two, at
/// least 16) from the bootstrap buffer, or null when it is exhausted.
fn boot_alloc(size: usize, align: usize) -> *mut libc::c_void {
    let base = BOOT.0.get() as usize;
    let align = align.max(16);
    let mut used = BOOT_USED.load(Relaxed);
    loop {
        let start = (base + used + 16).next_multiple_of(align);
        let Some(end) = start.checked_add(size) else { return core::ptr::null_mut() };
        if end > base + BOOT_SIZE {
            return core::ptr::null_mut();
        }
        match BOOT_USED.compare_exchange_weak(used, end - base, Relaxed, Relaxed) {
            Ok(_) => {
                // SAFETY: [start - 16, end) is inside BOOT and now ours alone.
                unsafe { ((start - 16) as *mut usize).write(size) };
                return start as *mut libc::c_void;
            }
            Err(u) => used = u,
        }
    }
}

fn boot_size(p: *mut libc::c_void) -> usize {
    // SAFETY: `p` is a bootstrap block: its header precedes it.
    unsafe { ((p as usize - 16) as *const usize).read() }
}

#[inline(always)]
fn malloc_impl(size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(MALLOC, Malloc) else { return boot_alloc(size, 16) };
    if !armed() {
        // SAFETY: the real malloc (a tail call).
        return unsafe { f(size) };
    }
    // SAFETY: the real malloc (`black_box`: a call of its own, so the
    // compiler does not merge it with the tail call above).
    let p = unsafe { core::hint::black_box(f)(size) };
    on_alloc(p as *mut u8, size);
    p
}

#[inline(always)]
fn free_impl(p: *mut libc::c_void) {
    if p.is_null() || in_boot(p) {
        return;
    }
    on_free(p as *mut u8);
    if let Some(f) = real_fn!(FREE, Free) {
        // SAFETY: the real free, with a block the real allocator returned.
        unsafe { f(p) }
    }
}

#[inline(always)]
fn aligned_impl(align: usize, size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(MEMALIGN, Aligned) else { return boot_alloc(size, align) };
    // SAFETY: the real memalign.
    let p = unsafe { f(align, size) };
    on_alloc(p as *mut u8, size);
    p
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
    let Some(f) = real_fn!(CALLOC, Calloc) else { return boot_alloc(total, 16) };
    if !armed() {
        // SAFETY: the real calloc (a tail call).
        return unsafe { f(n, size) };
    }
    // SAFETY: the real calloc (`black_box`: see `malloc_impl`).
    let p = unsafe { core::hint::black_box(f)(n, size) };
    on_alloc(p as *mut u8, total);
    p
}

/// Interposed `realloc`: a free of the old block and an allocation of the new.
///
/// # Safety
/// `p` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void {
    if in_boot(p) {
        let q = malloc_impl(size);
        if !q.is_null() {
            // SAFETY: both blocks hold at least the bytes copied.
            unsafe { core::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, boot_size(p).min(size)) };
        }
        return q;
    }
    let Some(f) = real_fn!(REALLOC, Realloc) else { return boot_alloc(size, 16) };
    if !p.is_null() {
        on_free(p as *mut u8);
    }
    if !armed() {
        // SAFETY: the real realloc with the caller's block (a tail call).
        return unsafe { f(p, size) };
    }
    // SAFETY: the real realloc with the caller's block (`black_box`: see `malloc_impl`).
    let q = unsafe { core::hint::black_box(f)(p, size) };
    on_alloc(q as *mut u8, size);
    q
}

/// Interposed `posix_memalign`.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut libc::c_void, align: usize, size: usize) -> libc::c_int {
    let Some(f) = real_fn!(POSIX_MEMALIGN, PosixMemalign) else {
        let p = boot_alloc(size, align);
        // SAFETY: the caller's out pointer.
        unsafe { *out = p };
        return if p.is_null() { libc::ENOMEM } else { 0 };
    };
    // SAFETY: the real posix_memalign with the caller's arguments.
    let rc = unsafe { f(out, align, size) };
    if rc == 0 {
        // SAFETY: written by a successful call.
        on_alloc(unsafe { *out } as *mut u8, size);
    }
    rc
}

/// Interposed `aligned_alloc`.
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(ALIGNED_ALLOC, Aligned) else { return boot_alloc(size, align) };
    // SAFETY: the real aligned_alloc.
    let p = unsafe { f(align, size) };
    on_alloc(p as *mut u8, size);
    p
}

/// Interposed `memalign`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut libc::c_void {
    aligned_impl(align, size)
}

/// Interposed `valloc`.
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(VALLOC, Malloc) else { return boot_alloc(size, 4096) };
    // SAFETY: the real valloc.
    let p = unsafe { f(size) };
    on_alloc(p as *mut u8, size);
    p
}

/// Interposed `pvalloc`.
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut libc::c_void {
    let Some(f) = real_fn!(PVALLOC, Malloc) else { return boot_alloc(size.next_multiple_of(4096), 4096) };
    // SAFETY: the real pvalloc.
    let p = unsafe { f(size) };
    on_alloc(p as *mut u8, size.next_multiple_of(4096));
    p
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
    if in_boot(p) {
        return boot_size(p);
    }
    match real_fn!(USABLE_SIZE, UsableSize) {
        // SAFETY: the real malloc_usable_size with a block of its allocator.
        Some(f) => unsafe { f(p) },
        None => 0,
    }
}

/// `operator new` failed: libstdc++'s own definition retries through
/// `malloc`, runs the new-handler and throws `std::bad_alloc`.
#[cold]
fn new_failed(name: &std::ffi::CStr, size: usize, align: Option<usize>) -> *mut libc::c_void {
    // SAFETY: looking up the next definition of a C++ runtime symbol.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if p == 0 {
        // SAFETY: no C++ runtime to throw: abort, as an uncaught bad_alloc would.
        unsafe { libc::abort() };
    }
    // SAFETY: `p` is that symbol, with the matching signature.
    unsafe {
        match align {
            None => core::mem::transmute::<usize, Malloc>(p)(size),
            Some(a) => core::mem::transmute::<usize, Aligned>(p)(size, a),
        }
    }
}

macro_rules! operator_new {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[no_mangle]
        pub extern "C" fn $name(size: usize) -> *mut libc::c_void {
            let p = malloc_impl(size);
            if p.is_null() {
                return new_failed(
                    // SAFETY: a NUL-terminated literal.
                    unsafe {
                        std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes())
                    },
                    size,
                    None,
                );
            }
            p
        }
    };
    ($name:ident, aligned, $doc:literal) => {
        #[doc = $doc]
        #[no_mangle]
        pub extern "C" fn $name(size: usize, align: usize) -> *mut libc::c_void {
            let p = aligned_impl(align, size);
            if p.is_null() {
                return new_failed(
                    // SAFETY: a NUL-terminated literal.
                    unsafe {
                        std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes())
                    },
                    size,
                    Some(align),
                );
            }
            p
        }
    };
}

operator_new!(_Znwm, "`operator new(size_t)`.");
operator_new!(_Znam, "`operator new[](size_t)`.");
operator_new!(_ZnwmSt11align_val_t, aligned, "`operator new(size_t, align_val_t)`.");
operator_new!(_ZnamSt11align_val_t, aligned, "`operator new[](size_t, align_val_t)`.");

/// `operator new(size_t, const nothrow_t&)`.
#[no_mangle]
pub extern "C" fn _ZnwmRKSt9nothrow_t(size: usize, _nt: *const libc::c_void) -> *mut libc::c_void {
    malloc_impl(size)
}

/// `operator new[](size_t, const nothrow_t&)`.
#[no_mangle]
pub extern "C" fn _ZnamRKSt9nothrow_t(size: usize, _nt: *const libc::c_void) -> *mut libc::c_void {
    malloc_impl(size)
}

/// `operator new(size_t, align_val_t, const nothrow_t&)`.
#[no_mangle]
pub extern "C" fn _ZnwmSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _nt: *const libc::c_void,
) -> *mut libc::c_void {
    aligned_impl(align, size)
}

/// `operator new[](size_t, align_val_t, const nothrow_t&)`.
#[no_mangle]
pub extern "C" fn _ZnamSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _nt: *const libc::c_void,
) -> *mut libc::c_void {
    aligned_impl(align, size)
}

macro_rules! operator_delete {
    ($($name:ident($($arg:ident: $t:ty),*) $doc:literal;)*) => {$(
        #[doc = $doc]
        ///
        /// # Safety
        /// `p` is null or a live block of this allocator.
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *mut libc::c_void, $(_: $t),*) {
            free_impl(p)
        }
    )*};
}

operator_delete! {
    _ZdlPv() "`operator delete(void*)`.";
    _ZdaPv() "`operator delete[](void*)`.";
    _ZdlPvm(size: usize) "`operator delete(void*, size_t)`.";
    _ZdaPvm(size: usize) "`operator delete[](void*, size_t)`.";
    _ZdlPvSt11align_val_t(align: usize) "`operator delete(void*, align_val_t)`.";
    _ZdaPvSt11align_val_t(align: usize) "`operator delete[](void*, align_val_t)`.";
    _ZdlPvmSt11align_val_t(size: usize, align: usize) "`operator delete(void*, size_t, align_val_t)`.";
    _ZdaPvmSt11align_val_t(size: usize, align: usize) "`operator delete[](void*, size_t, align_val_t)`.";
    _ZdlPvRKSt9nothrow_t(nt: *const libc::c_void) "`operator delete(void*, const nothrow_t&)`.";
    _ZdaPvRKSt9nothrow_t(nt: *const libc::c_void) "`operator delete[](void*, const nothrow_t&)`.";
    _ZdlPvSt11align_val_tRKSt9nothrow_t(align: usize, nt: *const libc::c_void)
        "`operator delete(void*, align_val_t, const nothrow_t&)`.";
    _ZdaPvSt11align_val_tRKSt9nothrow_t(align: usize, nt: *const libc::c_void)
        "`operator delete[](void*, align_val_t, const nothrow_t&)`.";
}
