//! Signal-safe DWARF/CFI unwinding of native x86_64 stacks (issue 13).
//!
//! - [`compile`]: off the signal path, turns a module's `.eh_frame`
//!   (through `.eh_frame_hdr`) and `.debug_frame` (also from its separate
//!   debug file, by build id) into a compact [`Table`].
//! - [`scan::Tracker`]: on the agent thread, finds loaded modules with
//!   `dl_iterate_phdr`, notices `dlopen`/`dlclose` by the loader's
//!   generation counters, and publishes an immutable [`ModuleSet`] through
//!   [`Shared`], which handlers read lock-free.
//! - [`unwind()`]: in the handler, walks the stack from [`Regs`] with the
//!   tables and a caller-bounded memory reader, into the caller's frames.
//! - [`symbols`]: naming helpers for the exporter.
//!
//! # Handler use
//! ```ignore
//! // Agent thread, at start and then on each tick (cheap when nothing changed):
//! let mut tracker = osprey_unwind::scan::Tracker::new(Some(osprey_unwind::compile::DEBUG_ROOT.into()));
//! tracker.refresh();                       // dl_iterate_phdr, compile new modules, publish
//! let shared = tracker.shared().clone();   // Arc<Shared<ModuleSet>>, stored where the handler finds it
//! // Signal handler:
//! let regs = unsafe { Regs::from_ucontext(uc) };
//! let stack = unsafe { StackReader::new(regs.sp, stack_hi) };   // the thread's registered stack top
//! let walk = shared.read(|set| unwind(set, regs, |a| stack.read(a), frames)); // None: raced 4 publications
//! ```
//!
//! # Measured (this machine: 2 shared cores)
//! - Table memory: 8 bytes per entry plus a 4-byte page index per 4 KiB of
//!   code: 1.4-1.8 MiB per MiB of `.eh_frame` (libc 1511 KiB/MiB, libstdc++
//!   1399, libpython3.11 1775, libz 1588; `examples/tables.rs`). Compile time
//!   16-22 ms for libc/libstdc++/libpython.
//! - 32-deep unwind of a copied stack (`benches/unwind.rs`): compact tables
//!   p50 1458 ns / p99 1752 ns; framehop 0.16 warm cache p50 322 / p99 368,
//!   cold cache p50 1114 / p99 1287; both give the same 32 frames.
//! - Frameless C (`tests/c/frameless.c`, `gcc -O2 -fomit-frame-pointer`):
//!
//!   | thread | perf | osprey-unwind |
//!   |---|---|---|
//!   | main thread: reaches `main` | 1107/1107 (100%) | 423/423 (100%) |
//!   | main thread: hot_a / hot_b / hot_c (work 50/30/20) | 49.3 / 29.8 / 20.4% | 52.2 / 30.3 / 17.5% |
//!   | zlib thread (leaf in libz): reaches `fl_zlib_worker` | 1108/1109 (99.9%) | 290/297 (97.6%), all to the thread start |
//!
//!   perf: `perf record -e cpu-clock -F 1000 --call-graph dwarf ./frameless 2`
//!   (built with `-DFL_MAIN`). osprey-unwind main thread:
//!   `examples/sample_frameless.rs` (1 ms thread-CPU timer, unwinding in the
//!   SIGPROF handler; `main` renamed `fl_main`); zlib thread:
//!   `tests/frameless.rs::zlib_thread_reaches_its_caller` (300 `pthread_kill`s).
//!
//! # framehop or compact tables
//! On the measurement above framehop is faster (4.5x warm, 1.3x cold) for
//! about the same memory (it keeps `.eh_frame` + `.eh_frame_hdr`: 283 KiB
//! against 331 KiB of tables for the same 7 modules). The compact tables are
//! what is built here because their handler path is ours to audit (no
//! allocation, no panic, no DWARF evaluation in the handler) and need no
//! per-thread cache; framehop needs a preallocated cache per thread that the
//! handler reaches without a thread-local, and evaluates CFI with gimli in the
//! handler on a cache miss. The lookup cost of the compact tables (~45 ns a
//! frame, dominated by the binary searches) has not been profiled further;
//! if it cannot be brought under framehop's cold figure, switch the handler
//! to framehop behind the same interface (`Shared<_>`, `unwind(set, regs,
//! read, frames) -> Walk`).

pub mod compile;
pub mod error;
pub mod modules;
pub mod publish;
pub mod regs;
pub mod scan;
pub mod symbols;
mod sync;
pub mod table;
pub mod unwind;

pub use error::{Error, Result};
pub use modules::{Module, ModuleSet};
pub use publish::Shared;
pub use regs::{CopiedStack, StackReader};
pub use table::{Kind, Rule, Table};
pub use unwind::{unwind, Regs, Walk};
