//! perf_event `cpu-clock` per thread: an hrtimer that fires on time at any
//! rate, its overflow delivered as the sampling signal to the thread that
//! consumed the CPU (`F_SETOWN_EX(F_OWNER_TID)`). Costs one descriptor per
//! thread; every overflow queues one signal.

use std::io;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const F_SETSIG: libc::c_int = 10;
const F_GETOWN_EX: libc::c_int = 16;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;

/// `struct perf_event_attr`, ABI version 5 (112 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

#[repr(C)]
struct FOwnerEx {
    type_: libc::c_int,
    pid: libc::pid_t,
}

/// Opens and enables a CPU clock for thread `tid` that sends `signal` to it
/// every `period_ns` of its CPU time. Kernel time is counted when allowed;
/// where `perf_event_paranoid` forbids it, user time only. The descriptor is
/// close-on-exec and moved to the top quarter of the soft descriptor limit,
/// out of the low range the program uses; when that range is full this fails
/// with `EMFILE` and the caller falls back to a POSIX timer.
pub fn open(tid: i32, period_ns: u64, signal: i32) -> io::Result<i32> {
    let mut attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: core::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_period: period_ns.max(10_000),
        flags: FLAG_DISABLED | FLAG_EXCLUDE_HV,
        wakeup_events: 1,
        ..Default::default()
    };
    let mut fd = perf_event_open(&attr, tid);
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EACCES) {
        attr.flags |= FLAG_EXCLUDE_KERNEL;
        fd = perf_event_open(&attr, tid);
    }
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = move_high(fd)?;
    let owner = FOwnerEx { type_: F_OWNER_TID, pid: tid };
    // SAFETY: fcntl/ioctl on the fd we just opened.
    let ok = unsafe {
        libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC | libc::O_NONBLOCK) == 0
            && libc::fcntl(fd, F_SETSIG, signal) == 0
            && libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx) == 0
            && libc::ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) == 0
    };
    if !ok {
        let e = io::Error::last_os_error();
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// Stops and closes a clock opened by [`open`] for `tid`, if `fd` still is
/// that clock: a program that closed its descriptors (`close_range`,
/// daemonizing) may have reused the number for a file of its own, which
/// osprey then neither touches nor closes. Returns whether `fd` was ours.
pub fn close(fd: i32, tid: i32) -> bool {
    if !is_ours(fd, tid) {
        return false;
    }
    // SAFETY: our own clock (checked just above).
    unsafe {
        libc::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
        libc::close(fd);
    }
    true
}

/// Stops the clock without closing it (before `execve`; see [`enable`]).
pub fn disable(fd: i32, tid: i32) -> bool {
    // SAFETY: ioctl on our own clock (checked first).
    is_ours(fd, tid) && unsafe { libc::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0) } == 0
}

/// Restarts a clock stopped by [`disable`].
pub fn enable(fd: i32, tid: i32) -> bool {
    // SAFETY: ioctl on our own clock (checked first).
    is_ours(fd, tid) && unsafe { libc::ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) } == 0
}

/// Whether `fd` is still a perf_event descriptor signalling thread `tid`
/// (anonymous `[perf_event]` inode, owner `F_OWNER_TID tid`, or no owner
/// left once that thread is gone).
fn is_ours(fd: i32, tid: i32) -> bool {
    if fd < 0 {
        return false;
    }
    // "/proc/self/fd/" + decimal fd + NUL, built without allocating (callers
    // include the exec path, which may run in a vfork child).
    let mut path = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let (mut n, mut v) = (0, fd as u32);
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..n {
        path[prefix.len() + i] = digits[n - 1 - i];
    }
    let mut link = [0u8; 32];
    // SAFETY: NUL-terminated path (the array is zeroed past the digits), buffer of the stated length.
    let n = unsafe { libc::readlink(path.as_ptr() as *const libc::c_char, link.as_mut_ptr() as *mut libc::c_char, 32) };
    if n <= 0 || !link[..n as usize].starts_with(b"anon_inode:[perf_event]") {
        return false;
    }
    let mut owner = FOwnerEx { type_: -1, pid: 0 };
    // SAFETY: F_GETOWN_EX fills the struct.
    let r = unsafe { libc::fcntl(fd, F_GETOWN_EX, &mut owner as *mut FOwnerEx) };
    // Once the thread has exited the kernel reports its owner as pid 0.
    r == 0 && owner.type_ == F_OWNER_TID && (owner.pid == tid || owner.pid == 0)
}

/// Moves `fd` to the lowest free number in the top quarter of the soft
/// descriptor limit (close-on-exec), closing the original.
fn move_high(fd: i32) -> io::Result<i32> {
    let base = super::high_fd_base();
    if fd >= base {
        return Ok(fd);
    }
    // SAFETY: dup of our own fd, then closing the original.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, base) };
    let err = io::Error::last_os_error();
    // SAFETY: the original is ours; its copy (if any) stays.
    unsafe { libc::close(fd) };
    if high < 0 {
        return Err(err);
    }
    Ok(high)
}

fn perf_event_open(attr: &PerfEventAttr, tid: i32) -> i32 {
    // SAFETY: valid attr pointer; pid = tid, cpu = -1 (any), no group.
    unsafe {
        libc::syscall(libc::SYS_perf_event_open, attr as *const PerfEventAttr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC) as i32
    }
}
