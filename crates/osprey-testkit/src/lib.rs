//! Helpers shared by osprey's integration tests and benchmarks, one module
//! per topic. Every crate's tests take them from here instead of keeping a
//! copy: the built binaries ([`paths`]), unique temporary directories
//! ([`tmp`]), C fixtures ([`cc`]), measured child runs and CPU clocks
//! ([`run`]), reading profiles back ([`profile`]), CPython interpreters and
//! [`per_interpreter!`] ([`python`]), OpenTelemetry span labels checked
//! against the spans a Python program used ([`otel`]), loopback backends ([`backends`]),
//! the SIGPROF unwinding fixture of osprey-unwind ([`unwind`]), the
//! `osprey` command run as a user does ([`cli`]), real HTTP servers under
//! a load of requests ([`http`]) and the real tools that
//! read its reports ([`readers`]).
//!
//! Nothing here reaches into osprey's internals: the kit must keep working
//! whatever the crates under test reorganise.

pub mod backends;
pub mod cc;
pub mod cli;
pub mod http;
pub mod otel;
pub mod paths;
pub mod profile;
pub mod python;
pub mod readers;
pub mod run;
pub mod tmp;
pub mod unwind;

pub use paths::osprey;
pub use tmp::tempdir;
