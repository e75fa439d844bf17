//! Atomics shim: `std` normally, `loom` under `--cfg loom`, so the put /
//! rotation protocol can be model-checked on the very same code.
//!
//! **Signal-safe module** (only re-exports and a spin hint).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use ::loom::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use ::loom::sync::{Mutex, MutexGuard};

/// One step of a collector-side wait loop (never used on the signal path).
#[inline]
pub(crate) fn spin_wait(round: u32) {
    #[cfg(loom)]
    {
        let _ = round;
        ::loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        // A handler holding a hazard may have been preempted: after a short
        // spin, give the CPU away (sleeping lets it run even on a busy machine).
        if round < 64 {
            std::hint::spin_loop();
        } else if round < 128 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

/// Locks, ignoring poisoning (a panicking collector leaves consistent tables:
/// every mutation under the lock happens on tables no handler can reach).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
