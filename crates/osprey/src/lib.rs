//! # osprey — a continuous profiler agent for Linux
//!
//! Signal-driven sampling of every thread's CPU time, stacks unwound inside
//! the handler without allocating or locking, symbolized at flush, written as
//! gzip-compressed pprof files.
//!
//! ```no_run
//! let _guard = osprey::Profiler::builder().hz(100).out_dir("profiles").start().unwrap();
//! // ... work; dropping the guard stops sampling and writes the last profile.
//! ```
//!
//! The public API is [`Profiler`] and its [`Builder`], [`Config`], [`Error`],
//! the trace [`context`], [`register_current_thread`] and the sampling
//! allocator [`alloc::Sampling`] (allocation profiles of Rust programs). What the preload
//! library, the CLI, tests and benchmarks reach inside is in the hidden
//! `internals` module and may change at any time.
//!
//! ## Module map
//! | module | what | runs in a signal handler? |
//! |---|---|---|
//! | `signal/` | the handlers, their state, the unwinder, raw syscalls, arch code | **yes, all of it** |
//! | `record/` | the per-thread record layout: context record, sample ring | read/push: yes |
//! | `registry/` | the pool of records: `lookup.rs` / `pool.rs` | `lookup.rs` only |
//! | `storage/` | call trace hash tables, triple buffer: `put.rs` / `rotation.rs` | `put.rs` and what it calls |
//! | `dispositions` | choosing, installing and restoring osprey's signals | no |
//! | `cpu_clock` | per-thread CPU clocks: POSIX timers, perf_event above 100 Hz | no |
//! | `threads` | the thread-start path, stack bounds | no |
//! | `unwind_tables` | compiling and publishing the modules' CFI tables | no |
//! | `discovery` | finding and priming threads nobody announced | no |
//! | `collector/` | the background thread: drain, aggregate, write | no |
//! | `wall/` | wall-time sampling of running and blocked threads, thread states | no |
//! | `profiler` | start, stop, fork | no |
//! | `ownership` | which process the agent belongs to | no |
//! | `shutdown` | last profile on SIGINT/SIGTERM/SIGHUP, `abort`, `_exit` | no (its handler is in `signal/`) |
//! | `takeover` | stepping aside when the program takes one of osprey's signals | no |
//! | `exec_guard` | no osprey signal survives into an exec'd program | no |
//! | `context` | the trace-context API for applications | no (writes the record) |
//! | `alloc` | `Sampling`, the sampling `GlobalAlloc` wrapper for Rust programs | its hooks are `signal/alloc.rs` |
//! | `stderr` | osprey's lines, on the file stderr named at start (`say!`) | no |
//! | `config`, `error`, `mmap` | settings, the error type, mappings | no |

pub mod alloc;
mod blocked;
mod collector;
mod config;
pub mod context;
mod cpu_clock;
mod discovery;
mod dispositions;
mod error;
mod exec_guard;
mod fork_lock;
mod mmap;
mod ownership;
mod profiler;
mod record;
mod registry;
mod shutdown;
mod signal;
mod stderr;
mod storage;
mod takeover;
mod threads;
mod unwind_tables;
mod wall;

pub use config::Config;
pub use error::Error;
pub use profiler::{register_current_thread, Builder, Profiler, ThreadRegistration};

/// Internals for the preload library, the CLI, tests and benchmarks. Not a
/// stable API.
#[doc(hidden)]
pub mod internals {
    /// Counters, `is_running`, `owns_process`, `runtime_id`, `check_writable`.
    pub mod agent {
        pub use crate::ownership::owns_process;
        pub use crate::profiler::{check_writable, is_running, runtime_id, stats, Stats};
    }
    /// Per-thread CPU clocks.
    pub mod cpu_clock {
        pub use crate::cpu_clock::*;
    }
    /// Making exec calls safe while sampling.
    pub mod exec_guard {
        pub use crate::exec_guard::*;
    }
    /// The last profile on termination signals, `abort`, `_exit`.
    pub mod shutdown {
        pub use crate::profiler::{flush_at_exit, flush_bounded};
        pub use crate::shutdown::{disguised, FLUSH_WAIT, SIGNALS};
    }
    /// Stepping aside when the program takes over osprey's signal.
    pub mod takeover {
        pub use crate::takeover::step_aside;
    }
    /// osprey's lines on the program's stderr (see [`say!`](crate::say)).
    pub mod stderr {
        pub use crate::stderr::*;
    }
    /// Finding unannounced threads.
    pub mod discovery {
        pub use crate::discovery::*;
    }
    /// The thread-start path.
    pub mod threads {
        pub use crate::threads::*;
    }
    /// Per-thread record layout.
    pub mod record {
        pub use crate::record::*;
    }
    /// The record pool.
    pub mod registry {
        pub use crate::registry::*;
    }
    /// Call trace storage.
    pub mod storage {
        pub use crate::storage::*;
    }
    /// The signal path: state, unwinder, syscalls.
    pub mod signal {
        pub use crate::signal::{in_handler, on_sample, sys, unwind, HandlerState, MAX_FRAMES, STATE};
    }
    /// The allocation sampler (its hooks, state and live set).
    pub mod alloc {
        pub use crate::signal::alloc::{
            arm, armed, disarm, on_alloc, on_free, weights, AllocState, Hooks, ALLOC, DEFAULT_MEAN, HOOKS,
        };
        pub use crate::signal::live::{LiveSet, CAPACITY, LIVE};
    }
    /// Anonymous zeroed mappings.
    pub mod mmap {
        pub use crate::mmap::*;
    }
    /// When the unwind tables are compiled.
    pub mod unwind_tables {
        pub use crate::unwind_tables::defer;
    }
    /// Wall-time sampling and thread states.
    pub mod wall {
        pub use crate::wall::*;
    }
    /// Synthetic frame names the collector writes.
    pub mod collector {
        pub use crate::collector::{
            FRAME_AGENT, FRAME_ALLOC_LOST, FRAME_BLOCKED, FRAME_RING_FULL, FRAME_STORAGE_FULL, FRAME_TRUNCATED,
            FRAME_UNREGISTERED,
        };
    }
}
