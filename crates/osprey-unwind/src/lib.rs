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
//! - Table memory: 8 bytes per entry plus a 4-byte page index per 256 bytes
//!   of code: 1.5-1.9 MiB per MiB of `.eh_frame` (libc 1657 KiB/MiB,
//!   libstdc++ 1483, libpython3.11 1914, libz 1784; `examples/tables.rs`).
//!   Compile time 15-18 ms for libc/libstdc++/libpython.
//! - 32-deep unwind of a copied stack (`benches/unwind.rs`): compact tables
//!   p50 581 ns / p99 606 ns; framehop 0.16 warm cache p50 325 / p99 390,
//!   cold cache p50 1128 / p99 1278; both give the same 32 frames.
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
//! - Real programs from Debian packages (stripped, no frame pointers), main
//!   thread. perf: samples reaching `__libc_start_call_main` (the caller of
//!   `main`; `perf record -e cpu-clock -F 500 --call-graph dwarf`).
//!   osprey-unwind: samples whose walk is complete to `_start`
//!   (`examples/preload_sampler.rs`, `LD_PRELOAD`, 500 Hz process CPU timer).
//!
//!   | program | perf --call-graph dwarf | osprey-unwind |
//!   |---|---|---|
//!   | frameless C (`-DFL_MAIN`) | 1107/1107 (100%) | 282/282 (100%) |
//!   | `xz -6 -T1 -c` (9.3 MiB text) | 7051/7051 (100%) | 3733/3737 (99.9%) |
//!   | `zstd -19 --single-thread -c` | 6743/6743 (100%) | 3587/3588 (100%) |
//!   | `sqlite3 :memory:` recursive CTE | 555/556 (99.8%) | 273/277 (98.6%) |
//!
//!   In process, a thread inside the library, reaching the Rust caller
//!   (`tests/real_libs.rs`, 200 `pthread_kill`s): liblzma 195/195, libzstd
//!   194/196, libsqlite3 159/162 (before expanding the PLT's CFA expression:
//!   148/168, sqlite calls its own exports through the PLT).
//!
//! # framehop or compact tables
//! Compact tables. On the same stack framehop with a warm per-thread cache is
//! 1.8x faster (p50 325 vs 581 ns), but 1.9x slower with a cold cache (1128
//! ns): every first sample of a new stack, and most samples of a thread with
//! varied stacks, pay that. Both are well under the 2 us target. What decides:
//! - the handler path of the compact tables is small and ours to audit: two
//!   bounded searches and two reads a frame, no allocation, no panic, no DWARF
//!   evaluation; framehop runs gimli's CFI evaluator in the handler on a miss;
//! - no per-thread state: framehop needs a preallocated cache per thread that
//!   the handler reaches without a thread-local (the agent's thread record),
//!   and the out-of-process Python sampler would need one per target thread;
//! - memory is comparable: 365 KiB of tables for the 7 modules of the bench
//!   against 284 KiB of `.eh_frame` + `.eh_frame_hdr` that framehop keeps.
//!
//! Getting here took two measured changes: trying the caller's module first
//! and a 256-byte page index with start and rule in one word (1458 -> 581 ns).

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
