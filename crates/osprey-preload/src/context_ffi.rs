//! C ABI for the trace context (declared in `include/osprey.h`).
//!
//! Every function is callable from any thread at any time outside a signal
//! handler, never unwinds into C, and is a cheap no-op when the thread cannot
//! get a registry record.

use core::ffi::{c_char, c_int, c_void, CStr};
use osprey::context;

extern "C" {
    /// Sets the calling thread's `otel_thread_ctx_v1` (`otel_tls.c`).
    fn osprey_otel_tls_set(record: *const c_void);
}

extern "C" fn publish_tls(record: *const c_void) {
    // SAFETY: stores a pointer in this thread's TLS variable.
    unsafe { osprey_otel_tls_set(record) };
}

/// Publishes the trace context for readers outside the process: threads
/// point `otel_thread_ctx_v1` at their OTEP 4947 record, and the OTEP 4719
/// process context announces its schema. Called once at agent start; the
/// process context `later` than that when given (see `process_ctx::publish_later`).
pub(crate) fn start_otel(later: Option<std::time::Duration>) {
    context::set_tls_publisher(publish_tls);
    if let Some(after) = later {
        context::process_ctx::publish_later(after);
    } else if let Err(e) = context::process_ctx::publish() {
        osprey::say!("osprey: OpenTelemetry process context not published: {e}");
    }
}

/// Sets the calling thread's W3C trace id (`trace_id_high` = its first 8
/// bytes big-endian, `trace_id_low` the last 8), span id, trace flags and
/// local root span id (tags unchanged).
#[no_mangle]
pub extern "C" fn osprey_set_trace_context(
    trace_id_high: u64,
    trace_id_low: u64,
    span_id: u64,
    trace_flags: u8,
    local_root_span_id: u64,
) {
    let trace = (trace_id_high as u128) << 64 | trace_id_low as u128;
    context::set_trace(trace, span_id, trace_flags, local_root_span_id);
}

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
