//! Raw Linux system calls and small helpers.
//!
//! **Signal-safe module.** Everything here may be called from a signal handler:
//! no allocation, no locks, no libc wrappers that touch `errno` (raw `syscall`
//! instructions instead), no panics.

use core::arch::asm;

/// `gettid(2)` without libc: safe on threads that have no valid TLS (raw `clone`).
#[inline(always)]
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { raw_syscall0(libc::SYS_gettid) as i32 }
}

/// `getpid(2)` without libc.
#[inline(always)]
pub fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { raw_syscall0(libc::SYS_getpid) as i32 }
}

/// `tgkill(2)`; returns 0 or a negative errno. Never touches `errno`.
#[inline]
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> i64 {
    // SAFETY: tgkill takes plain integers.
    unsafe { raw_syscall3(libc::SYS_tgkill, pid as usize, tid as usize, sig as usize) as i64 }
}

/// `CLOCK_MONOTONIC` in nanoseconds (async-signal-safe per POSIX; vDSO, no errno on success).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; CLOCK_MONOTONIC always exists, so errno is never written.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME` in nanoseconds since the epoch.
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Saves `errno` on creation and restores it on drop. Every signal handler
/// entry point holds one.
pub struct ErrnoGuard(i32);

impl ErrnoGuard {
    #[inline(always)]
    pub fn save() -> Self {
        // SAFETY: __errno_location is async-signal-safe and always returns a valid pointer.
        ErrnoGuard(unsafe { *libc::__errno_location() })
    }
}

impl Drop for ErrnoGuard {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

#[inline(always)]
unsafe fn raw_syscall0(n: libc::c_long) -> usize {
    let ret: usize;
    asm!("syscall", inlateout("rax") n as usize => ret, out("rcx") _, out("r11") _,
         options(nostack, preserves_flags));
    ret
}

#[inline(always)]
unsafe fn raw_syscall3(n: libc::c_long, a: usize, b: usize, c: usize) -> usize {
    let ret: usize;
    asm!("syscall", inlateout("rax") n as usize => ret, in("rdi") a, in("rsi") b, in("rdx") c,
         out("rcx") _, out("r11") _, options(nostack, preserves_flags));
    ret
}

/// Anonymous, zeroed, lazily-committed memory that lives for the rest of the
/// process. Not signal-safe (mmap is a syscall, but callers run outside handlers).
pub fn map_zeroed(bytes: usize) -> std::io::Result<*mut u8> {
    // SAFETY: anonymous private mapping, no file.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            bytes.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// Releases memory obtained from [`map_zeroed`].
///
/// # Safety
/// `p`/`bytes` must come from one `map_zeroed` call and nothing may use the memory afterwards.
pub unsafe fn unmap(p: *mut u8, bytes: usize) {
    libc::munmap(p as *mut libc::c_void, bytes.max(1));
}

#[cfg(test)]
mod tests {
    #[test]
    fn raw_ids_match_libc() {
        assert_eq!(super::gettid(), unsafe { libc::gettid() });
        assert_eq!(super::getpid(), unsafe { libc::getpid() });
    }
}
