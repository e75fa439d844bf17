//! Helpers shared by the integration tests.

use std::time::Duration;

/// The calling thread's CPU time.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Burns `d` of the calling thread's CPU time: on a loaded machine this takes
/// longer in wall time, but the samples expected from it stay the same.
pub fn burn_cpu(d: Duration) -> u64 {
    let end = thread_cpu() + d;
    let mut x = 1u64;
    while thread_cpu() < end {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }
    x
}
