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
//! ## Module map
//! | module | what | signal-safe? |
//! |---|---|---|
//! | [`sys`] | raw syscalls, errno guard, mmap | yes |
//! | [`registry`] | per-thread records, tid table, free list | lookup/claim: yes |
//! | [`context`] | per-thread trace context (span ids, tags) | read: yes |
//! | [`storage`] | call trace hash tables, triple buffer, sample rings | put/push: yes |
//! | [`unwind`] | frame-pointer unwinder | yes |
//! | [`handler`] | the signal handlers themselves | yes |
//! | [`sampler`] | per-thread perf_event CPU clocks | no |
//! | [`discovery`] | finding and priming threads nobody announced | no |
//! | [`recorder`] | draining rings, aggregating samples | no |
//! | [`export`] | pprof encoding, symbolization, files | no |
//! | [`profiler`] | configuration, start/stop, the scheduler thread | no |

pub mod config;
pub mod context;
pub mod discovery;
pub mod handler;
pub mod profiler;
pub mod recorder;
pub mod registry;
pub mod sampler;
pub mod storage;
pub mod sys;
pub mod unwind;

pub use config::Config;
pub use profiler::{register_current_thread, Builder, Profiler, ThreadRegistration};
