//! C++'s `operator new` and `delete`, forwarded to the malloc family as
//! libstdc++'s are.

use crate::real::{Aligned, Malloc};
use crate::{aligned_impl, free_impl, malloc_impl};

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
