//! osprey-python: samples CPython processes from outside.
//!
//! The target is not stopped for sampling (except with [`native`], which
//! stops each running thread for the moment of its read): memory is read
//! with `process_vm_readv`, thread states from `/proc` ([`remote`]). The
//! interpreter's structures are located per version ([`layout`], [`target`]);
//! each OS thread is mapped to its `PyThreadState` (TLS, TSS, interpreter
//! lists, or a cache; see [`target::thread_states`]), its Python stack is
//! walked (see [`walk`]) and labelled with a state and its Python thread
//! name (see [`sampling`]). Profiles are flushed every period in osprey's
//! export format.
//!
//! This file only declares modules and re-exports: no module depends on it.

pub mod error;
pub mod layout;
pub mod remote;
pub mod sampling;
pub mod target;
pub mod walk;

pub use error::Error;
pub use layout::{debug_offsets, objects as object_layout};
pub use remote::namespace::permission_hint;
pub use remote::{process, ptrace};
pub use sampling::session::{attach, attach_with_sink, Options, Summary};
pub use sampling::{asyncio, native, thread_names};
pub use target::thread_states::Method;
pub use target::{
    abi_free_threaded, is_cpython_executable, is_cpython_process, maps_libpython, open_target, runs_cpython_executable,
    Target, Version,
};
pub use walk as stack;

/// Thread-state discovery, under its former path.
pub mod threads {
    pub use crate::target::thread_states::{list_tstates, ThreadStateMap as Discovery};
}
