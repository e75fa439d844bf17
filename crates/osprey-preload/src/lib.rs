//! stub

mod context_ffi;
