//! Atomics shim: `std` normally, `loom` under `--cfg loom`, so the publish /
//! reclaim protocol is model-checked on the very same code.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

#[cfg(loom)]
pub(crate) use ::loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use ::loom::sync::Mutex;

/// One step of a wait on other threads (the publisher's for readers, a fork's
/// for calls into the loader); never on the sampling signal's path.
pub(crate) fn wait_step(round: u32) {
    #[cfg(loom)]
    {
        let _ = round;
        ::loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        // A reader may be a handler on a preempted thread: after a short
        // spin, sleep so it can run even on a busy machine.
        if round < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}
