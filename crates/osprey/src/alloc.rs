//! Allocation profiling for Rust programs: [`Sampling`] wraps a global
//! allocator and reports sampled allocations to osprey when the profiler
//! runs with allocation profiling on ([`crate::Builder::alloc`]).
//!
//! ```no_run
//! #[global_allocator]
//! static A: osprey::alloc::Sampling<std::alloc::System> = osprey::alloc::Sampling::new(std::alloc::System);
//! ```
//!
//! While allocation profiling is off, each call costs one relaxed load more
//! (and `dealloc` one more when sampled blocks are live); when on, a
//! thread-local countdown, and about once per sampling interval (512 KiB by
//! default) a stack walk. Nothing on either path allocates or locks.

use crate::signal::alloc::{on_alloc, on_free};
use std::alloc::{GlobalAlloc, Layout};

/// A [`GlobalAlloc`] that samples the allocations of the allocator it wraps.
pub struct Sampling<A>(A);

impl<A> Sampling<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> Self {
        Sampling(inner)
    }
}

// SAFETY: every method forwards to `A` with the caller's arguments; the
// sampling hooks never touch the memory handed out.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Sampling<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc(layout) };
        on_alloc(p, layout.size());
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        on_alloc(p, layout.size());
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        on_free(ptr);
        // SAFETY: as above.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        on_free(ptr);
        // SAFETY: as above.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        on_alloc(p, new_size);
        p
    }
}
