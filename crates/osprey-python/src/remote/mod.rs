//! Access to another process, nothing of it Python: its memory and ELF
//! modules, its threads as the kernel sees them, their CPU clocks, stopping
//! one for a moment, and the namespaces it may run in.

pub(crate) mod elf;
pub(crate) mod kernel_thread;
pub(crate) mod namespace;
pub mod process;
pub mod ptrace;
pub(crate) mod thread_cpu;
