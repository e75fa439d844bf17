//! Sampling: the periodic pass over every thread of the target, running
//! threads' frames copied at their sampling interrupt, what labels each
//! sample (thread state, GIL waits, garbage collection, asyncio task,
//! OpenTelemetry span, Python thread name, native frames), and the profiles
//! they add up to.

pub(crate) mod aggregate;
pub mod asyncio;
pub(crate) mod gc;
pub(crate) mod gilwait;
pub mod interrupt;
pub mod native;
pub mod otel_context;
pub(crate) mod sampler;
pub(crate) mod session;
pub mod span_copy;
pub mod thread_names;
pub(crate) mod thread_state;
