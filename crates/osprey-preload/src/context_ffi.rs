//! C ABI for the trace context (declared in `include/osprey.h`).
//!
//! Every function is callable from any thread at any time outside a signal
//! handler, never unwinds into C, and is a cheap no-op when the thread cannot
//! get a registry record.

use core::ffi::{c_char, c_int, CStr};
use osprey::context;

/// Sets the calling thread's span and local root span ids (tags unchanged).
#[no_mangle]
pub extern "C" fn osprey_set_context(span_id: u64, local_root_span_id: u64) {
    context::set(span_id, local_root_span_id);
}

/// Clears the calling thread's span ids (tags unchanged).
#[no_mangle]
pub extern "C" fn osprey_clear_context() {
    context::clear();
}

/// Borrowed UTF-8 string from C, `None` for NULL or invalid UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn str_arg<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Sets tag `key` to `value` on the calling thread. 0 on success; -1 for a
/// NULL/empty/invalid key or when all tag keys are taken. A NULL value clears
/// the tag.
///
/// # Safety
/// `key` and `value` are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn osprey_set_tag(key: *const c_char, value: *const c_char) -> c_int {
    // SAFETY: the caller's contract for `key`.
    let Some(key) = (unsafe { str_arg(key) }) else { return -1 };
    let r = if value.is_null() {
        context::clear_tag(key)
    } else {
        // Invalid UTF-8 in a value is kept, lossily converted.
        // SAFETY: non-null and NUL-terminated (the caller's contract).
        let v = unsafe { CStr::from_ptr(value) }.to_string_lossy();
        context::set_tag(key, &v)
    };
    status(r)
}

/// Unsets tag `key` on the calling thread. 0 on success, -1 for a bad key.
///
/// # Safety
/// `key` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn osprey_clear_tag(key: *const c_char) -> c_int {
    // SAFETY: the caller's contract for `key`.
    let Some(key) = (unsafe { str_arg(key) }) else { return -1 };
    status(context::clear_tag(key))
}

fn status(r: Result<(), context::TagError>) -> c_int {
    match r {
        Ok(()) => 0,
        // No record: the context cannot be recorded, but the caller did
        // nothing wrong; report success like the no-osprey case.
        Err(context::TagError::NoRecord) => 0,
        Err(context::TagError::BadKey) => -1,
    }
}
