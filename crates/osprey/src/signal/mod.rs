//! Everything that may run inside osprey's signal handlers, and nothing else.
//!
//! | file | what |
//! |---|---|
//! | `handler.rs` | [`on_sample`] and [`on_prime`], the in-flight and depth guards |
//! | `handler_state.rs` | [`STATE`], the process-wide state handlers read |
//! | `cfi.rs` | the CFI walk over `osprey_unwind`'s published tables |
//! | `unwind.rs` | the frame-pointer walk (no tables yet, or off the thread's stack) |
//! | `wall.rs` | the running thread's pending wall time, recorded with its CPU sample |
//! | `sys.rs` | raw system calls, clocks, the errno guard |
//! | `shutdown.rs` | `on_terminate`: SIGINT/SIGTERM/SIGHUP, last profile, then the default action; `on_sigio`: the kernel's SIGIO fallback for a full signal queue, dropped (a sent SIGIO goes to `on_terminate`) |
//! | `alloc.rs` | the allocation sampler: countdown, sampled path (`malloc` runs it) |
//! | `live.rs` | the set of sampled allocations not freed yet |
//! | `arch/` | registers from `ucontext`, prologue decoding, the `syscall` asm |
//!
//! # Rules for code in this folder
//! No allocation, no lock, no panic (no indexing that can fail, no unwrap),
//! no lazily initialised thread-local, no libc call that is not
//! async-signal-safe; `errno` is saved and restored by every entry point.
//! The interrupted stack holds no frame array (walks write into the
//! thread's record, [`MAX_FRAMES`] words): only locals, 528 bytes below
//! the interrupted frame for `on_sample` with its callees (`benches/handler.rs`,
//! release; 544 in the shipped agent's LTO build) and under 1 KiB for the
//! sampled allocation path (release).
//!
//! # Imports
//! This folder imports only itself and the signal-safe halves of the shared
//! data structures: [`crate::record`] (thread record layout, context read,
//! sample ring push), [`crate::registry`]'s `lookup.rs` and
//! [`crate::storage`]'s `put.rs`; of other crates, `osprey_unwind`'s
//! signal-safe half (`unwind`, `Shared::read`, `ModuleSet` lookups,
//! `StackReader`). Agent-side code (installing handlers,
//! discovery, the collector) imports from here, never the other way;
//! `tests/layering.rs` checks it.

pub mod alloc;
pub(crate) mod arch;
mod cfi;
mod handler;
mod handler_state;
pub mod live;
pub mod shutdown;
pub mod sys;
pub mod unwind;
mod wall;

pub use handler::in_handler;
pub use handler::on_sample;
pub(crate) use handler::{charge_from_now, on_prime, InFlight};
pub use handler_state::{HandlerState, MAX_FRAMES, STATE};
pub use wall::WALL_RUNNING;
