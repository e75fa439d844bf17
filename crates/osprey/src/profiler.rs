//! (in progress)
pub struct Profiler;
pub struct Builder;
pub struct ThreadRegistration;
pub fn register_current_thread() -> Option<ThreadRegistration> { None }
