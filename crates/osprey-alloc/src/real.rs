//! The next definitions of the interposed functions (`dlsym(RTLD_NEXT)`:
//! libc's, or jemalloc's/tcmalloc's when they come after this library),
//! looked up at the first call.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

pub type Malloc = unsafe extern "C" fn(usize) -> *mut libc::c_void;
pub type Free = unsafe extern "C" fn(*mut libc::c_void);
pub type Calloc = unsafe extern "C" fn(usize, usize) -> *mut libc::c_void;
pub type Realloc = unsafe extern "C" fn(*mut libc::c_void, usize) -> *mut libc::c_void;
pub type PosixMemalign = unsafe extern "C" fn(*mut *mut libc::c_void, usize, usize) -> libc::c_int;
pub type Aligned = unsafe extern "C" fn(usize, usize) -> *mut libc::c_void;
pub type UsableSize = unsafe extern "C" fn(*mut libc::c_void) -> usize;

pub const MALLOC: usize = 0;
pub const FREE: usize = 1;
pub const CALLOC: usize = 2;
pub const REALLOC: usize = 3;
pub const POSIX_MEMALIGN: usize = 4;
pub const ALIGNED_ALLOC: usize = 5;
pub const MEMALIGN: usize = 6;
pub const VALLOC: usize = 7;
pub const PVALLOC: usize = 8;
pub const USABLE_SIZE: usize = 9;
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
/// A thread is inside `dlsym` looking them up: allocations come from the
/// bootstrap buffer.
static RESOLVING: AtomicBool = AtomicBool::new(false);

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
pub fn real(i: usize) -> usize {
    let Some(slot) = REAL.get(i) else { return 0 };
    let p = slot.load(Acquire);
    if p != 0 {
        return p;
    }
    resolve();
    slot.load(Acquire)
}

/// The real function `$i` of type `$t`, or `None` while unknown.
macro_rules! real_fn {
    ($i:expr, $t:ty) => {{
        let p = $crate::real::real($i);
        // SAFETY: `p` is the address dlsym returned for NAMES[$i], of type $t.
        (p != 0).then(|| unsafe { core::mem::transmute::<usize, $t>(p) })
    }};
}
pub(crate) use real_fn;
