//! Architecture-specific parts of the signal path. Only x86-64 is
//! implemented; other targets fail to build with a clear message rather than
//! profile wrongly.

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;

#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "osprey's signal path (register extraction, prologue decoding, raw syscalls) exists for x86-64 Linux only"
);
