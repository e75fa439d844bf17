//! Sampling native threads with `perf_event_open`, from outside them: no
//! signal, no stop, nothing preloaded. At each period of a thread's CPU
//! time the kernel copies its user registers (ip, sp, bp) and the top of its
//! stack into a ring buffer; the stacks are unwound afterwards, on our side,
//! with the target's CFI tables (`osprey-unwind`).
//!
//! - [`ThreadSampler`]: one event on one thread (any process the caller may
//!   trace, or the caller's own threads, whatever their signal mask).
//! - [`ProcessSampler`]: one event per thread of a process, following
//!   threads as they come and go ([`ProcessSampler::refresh_threads`]).
//! - [`TreeSampler`]: every process and thread a child starts, through one
//!   inherited event per CPU; [`Images`] follows their images from the
//!   side-band records and unwinds their samples.
//! - [`OneShot`]: one sample of a thread when the caller asks for it (its
//!   stack as it runs now, without a stop).
//! - [`Unwinder`]: a process's modules and tables; [`Unwinder::unwind`]
//!   turns a [`RawSample`] into a [`Stack`].
//! - [`chain::Chain`]: a linked chain of the thread's memory (a CPython
//!   thread's frames) copied by a BPF program at each overflow of a
//!   [`ThreadSampler`] attached to it, while the thread is interrupted
//!   (root or CAP_BPF + CAP_PERFMON); a caller may add code of its own to
//!   that program ([`chain::Extra`], written with [`bpf::Asm`]).
//! - [`thread_ctx::read_thread_contexts`]: each thread's OpenTelemetry
//!   thread context (OTEP 4947) — trace and span id — read from outside.
//!
//! ```no_run
//! use osprey_perf::{ProcessSampler, Unwinder};
//! # fn main() -> Result<(), osprey_perf::Error> {
//! let pid = 1234;
//! let mut sampler = ProcessSampler::attach(pid, 99, 16 << 10)?;
//! let mut unwinder = Unwinder::new(pid);
//! let mut stacks = Vec::new();
//! for _ in 0..100 {
//!     sampler.wait(std::time::Duration::from_millis(100))?;
//!     sampler.drain(&mut |s| stacks.push(unwinder.unwind(s)));
//!     if sampler.refresh_threads().is_err() {
//!         break; // the process is gone
//!     }
//! }
//! sampler.drain(&mut |s| stacks.push(unwinder.unwind(s)));
//! # Ok(()) }
//! ```
//!
//! Internals: `sys` holds `struct perf_event_attr` and the calls,
//! `ring` the mmap'd ring reader (and its memory-ordering invariant),
//! `record` the decoding of `PERF_RECORD_SAMPLE`, `modules` the target's
//! tables.
//!
//! # Limits
//! - x86_64 only (the register numbers, `osprey-unwind`'s rules).
//! - Software clocks only (`task-clock`, `cpu-clock`): hardware counters are
//!   missing in many VMs, this one included.
//! - A thread started after attach is sampled from the next
//!   [`ProcessSampler::refresh_threads`] on.
//! - A walk needs the frames' stack within the copy: a frame deeper than
//!   `stack_bytes` above the sampled sp ends it (`truncated`).

pub mod bpf;
pub mod chain;
mod config;
mod error;
mod images;
mod modules;
mod oneshot;
mod process;
mod record;
mod ring;
mod sys;
mod thread;
pub mod thread_ctx;
mod tree;
mod unwind;

pub use config::{Clock, Config};
pub use error::{Error, Result};
pub use images::{Images, Mapping};
pub use oneshot::OneShot;
pub use process::{ProcessSampler, Refreshed};
pub use record::{parse, Comm, Mmap, RawSample, Read, Record, Task, UserRegs};
pub use thread::{Counts, Drained, ThreadSampler};
pub use tree::{TreeCounts, TreeSampler, HOLD as TREE_HOLD};
pub use unwind::{now_ns, Stack, Unwinder, MAX_FRAMES, RESCAN, UNKNOWN_RESCAN};
