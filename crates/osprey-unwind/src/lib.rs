//! Signal-safe DWARF/CFI unwinding of native x86_64 stacks.
//!
//! - [`cache`]: compiled tables kept on disk by build id, for the next
//!   process that loads the same library.
//! - [`compile`]: off the signal path, turns a module's `.eh_frame`
//!   (through `.eh_frame_hdr`) and `.debug_frame` (also from its separate
//!   debug file, by build id) into a compact [`Table`].
//! - [`loaded`]: this process's objects (`dl_iterate_phdr`) and another
//!   process's executable mappings (`/proc/<pid>/maps`).
//! - [`loader_lock`]: keeps those `dl_iterate_phdr` calls and `fork` apart
//!   (the agent's fork hooks call it).
//! - [`scan::Tracker`]: on the agent thread, finds loaded modules with
//!   [`loaded`], notices `dlopen`/`dlclose` by the loader's
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
//! Out of process (Python's `--native` mode): build the set from
//! [`loaded::loaded_in`]`(pid)` + [`compile::compile_file`] +
//! [`ModuleSet::new`], and unwind a copied stack with [`CopiedStack::read`].
//!
//! Naming (exporter, off the signal path): [`symbols::Symbols::load_with_debug`]
//! respects symbol sizes (an address past every symbol's end gets no name)
//! and adds the separate debug file's `.symtab`; frames without a symbol are
//! named [`symbols::module_offset_name`] (`libz.so.1+0x3a26`, the ELF virtual
//! address). The exporter should emit one pprof `Mapping` per [`Module`]
//! (`memory_start/limit` = `start/end`, `file_offset` = the file offset
//! mapped at `start`, `filename` = path, `build_id` = hex of
//! [`Module::build_id`]) and give symbol-less frames that mapping, so that
//! `go tool pprof` and backends can symbolize them later. Return addresses
//! (every frame but the leaf) are looked up at `addr - 1`.
//!
//! # Limits
//! - x86_64 only (the rule set, register numbers, `ucontext` layout).
//! - A pc in a module but outside every FDE (hand-written assembly without
//!   CFI) ends the walk as truncated; there is no frame-pointer guess.
//! - Signal trampolines (`__restore_rt`) end the walk: unwinding through a
//!   nested signal frame is not done.
//!
//! # Measured (this machine: 2 shared cores)
//! - Table memory: 4 bytes per entry (start within a 256-byte page + index
//!   into the module's palette of distinct rules), 4 bytes of page index per
//!   256 bytes of code, and the palette: 0.8-1.1 MiB per MiB of `.eh_frame`
//!   (`examples/tables.rs`):
//!
//!   | module | .eh_frame KiB | entries | table KiB | KiB per MiB of .eh_frame | compile ms |
//!   |---|---|---|---|---|---|
//!   | libc.so.6 | 150 | 28376 | 133 | 912 | 14 |
//!   | libstdc++.so.6 | 196 | 36444 | 159 | 828 | 14 |
//!   | libpython3.11.so.1.0 | 334 | 75074 | 340 | 1041 | 18 |
//!   | libz.so.1 | 6 | 1264 | 6 | 1087 | 0 |
//!   | libsqlite3.so.0 | 137 | 31365 | 138 | 1038 | 3 |
//!
//! - 32-deep unwind of a copied stack (`benches/unwind.rs`, same stack,
//!   same 7 modules, both give the same 32 frames):
//!
//!   | unwinder | p50 ns | p99 ns | unwind data kept |
//!   |---|---|---|---|
//!   | osprey-unwind compact tables | 705 | 735 | 205 KiB of tables |
//!   | framehop 0.16, no-alloc, warm per-thread cache | 324 | 434 | 285 KiB (.eh_frame + .eh_frame_hdr) + cache |
//!   | framehop 0.16, no-alloc, cold cache | 1117 | 1317 | same |
//!
//!   Handler stack use (enter + 32-deep unwind + leave): 120 bytes.
//! - Frameless C (`tests/c/frameless.c`, `gcc -O2 -fomit-frame-pointer`):
//!
//!   | thread | perf | osprey-unwind |
//!   |---|---|---|
//!   | main thread: reaches `main` | 1107/1107 (100%) | 407/407 (100%) |
//!   | main thread: hot_a / hot_b / hot_c (work 50/30/20) | 49.3 / 29.8 / 20.4% | 52.8 / 27.0 / 20.1% |
//!   | zlib thread (leaf in libz): reaches `fl_zlib_worker` | 1108/1109 (99.9%) | 290/297 (97.6%), all to the thread start |
//!
//!   perf: `perf record -e cpu-clock -F 1000 --call-graph dwarf ./frameless 2`
//!   (built with `-DFL_MAIN`). osprey-unwind main thread:
//!   `examples/sample_frameless.rs` (1 ms thread-CPU timer, unwinding in the
//!   SIGPROF handler; `main` renamed `fl_main`; the split moves by about 3
//!   points between runs of ~400 samples); zlib thread:
//!   `tests/frameless.rs::zlib_thread_reaches_its_caller` (300 `pthread_kill`s).
//! - Real programs from Debian packages (stripped, no frame pointers), main
//!   thread. perf: samples reaching `__libc_start_call_main` (the caller of
//!   `main`; `perf record -e cpu-clock -F 500 --call-graph dwarf`).
//!   osprey-unwind: samples whose walk is complete to `_start`
//!   (`examples/preload_sampler.rs`, `LD_PRELOAD`, 500 Hz process CPU timer).
//!
//!   | program | perf --call-graph dwarf | osprey-unwind |
//!   |---|---|---|
//!   | frameless C (`-DFL_MAIN`) | 1107/1107 (100%) | 288/288 (100%) |
//!   | `xz -6 -T1 -c` (9.3 MiB of text) | 7051/7051 (100%) | 3979/3980 (100.0%) |
//!   | `zstd -19 --single-thread -c` | 6743/6743 (100%) | 4214/4214 (100%) |
//!   | `sqlite3 :memory:` recursive CTE | 555/556 (99.8%) | 276/280 (98.6%) |
//!
//!   In process, a thread inside the library, reaching the Rust caller
//!   (`tests/real_libs.rs`, 200 `pthread_kill`s): liblzma 195/195, libzstd
//!   194/196, libsqlite3 159/162 (before expanding the PLT's CFA expression:
//!   148/168, sqlite calls its own exports through the PLT).
//!
//! # framehop or compact tables
//! Compact tables. On the same stack framehop with a warm per-thread cache is
//! 2.2x faster (p50 324 vs 705 ns), but 1.6x slower with a cold cache (1117
//! ns), which every first sample of a stack, and most samples of a thread
//! with varied stacks, pay. Both are well under the 2 us target. What decides:
//! - the handler path of the compact tables is small and ours to audit: two
//!   short bounded scans and two reads a frame, no allocation, no panic, no
//!   DWARF evaluation; framehop runs gimli's CFI evaluator in the handler on
//!   a cache miss;
//! - no per-thread state: framehop needs a preallocated cache per thread that
//!   the handler reaches without a thread-local (the agent's thread record),
//!   and the out-of-process Python sampler would need one per target thread;
//! - memory: 205 KiB of tables against the 285 KiB of `.eh_frame` +
//!   `.eh_frame_hdr` framehop keeps for the same modules.
//!
//! How the figure moved (each step measured with `benches/unwind.rs`): plain
//! binary search over `u32` starts 1458 ns; trying the caller's module first
//! and a 256-byte page index with start and rule in one `u64` 581 ns; entries
//! packed to 4 bytes with a rule palette 705 ns (tables 365 -> 205 KiB).

pub mod cache;
pub mod compile;
pub mod error;
pub mod loaded;
pub mod loader_lock;
mod mapped;
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
