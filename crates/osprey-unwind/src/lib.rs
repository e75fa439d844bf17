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
