//! Bootstrap buffer: `dlsym` may allocate (`calloc` for its error buffer)
//! before the real functions are known; those requests are served from
//! here. Its blocks are never reused: `free` ignores them and `realloc`
//! moves them out.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Bump-allocated; each block is preceded by a 16-byte header holding its size.
#[repr(C, align(4096))]
struct Boot(UnsafeCell<[u8; BOOT_SIZE]>);
const BOOT_SIZE: usize = 64 * 1024;
// SAFETY: blocks are handed out once each by an atomic bump pointer.
unsafe impl Sync for Boot {}
static BOOT: Boot = Boot(UnsafeCell::new([0; BOOT_SIZE]));
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

/// Whether `p` is a bootstrap block.
pub fn contains(p: *mut libc::c_void) -> bool {
    let base = BOOT.0.get() as usize;
    (base..base + BOOT_SIZE).contains(&(p as usize))
}

/// A zeroed block of `size` bytes aligned to `align` (a power of two, at
/// least 16) from the bootstrap buffer, or null when it is exhausted.
pub fn alloc(size: usize, align: usize) -> *mut libc::c_void {
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

/// The size asked for bootstrap block `p`.
pub fn size(p: *mut libc::c_void) -> usize {
    // SAFETY: `p` is a bootstrap block: its header precedes it.
    unsafe { ((p as usize - 16) as *const usize).read() }
}
