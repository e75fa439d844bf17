//! The kernel interface: `struct perf_event_attr`, the constants this crate
//! uses, and the `perf_event_open` / `ioctl` / `mmap` calls.
//!
//! [`Attr`] is written out from the uapi header `linux/perf_event.h`
//! (`PERF_ATTR_SIZE_VER7`, 128 bytes); the offsets the kernel reads are
//! checked by the `layout` test below against the header's own
//! `offsetof` values. Older kernels accept a larger `size` as long as the
//! bytes they don't know are zero, which they are here unless a field is set.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// `PERF_TYPE_SOFTWARE`.
pub const TYPE_SOFTWARE: u32 = 1;
/// `PERF_COUNT_SW_CPU_CLOCK`: an hrtimer per event, counting while the task runs.
pub const COUNT_SW_CPU_CLOCK: u64 = 0;
/// `PERF_COUNT_SW_TASK_CLOCK`: the task's own run time.
pub const COUNT_SW_TASK_CLOCK: u64 = 1;
/// `PERF_COUNT_SW_DUMMY`: counts nothing.
pub const COUNT_SW_DUMMY: u64 = 9;

/// `PERF_SAMPLE_IP`.
pub const SAMPLE_IP: u64 = 1 << 0;
/// `PERF_SAMPLE_TID`.
pub const SAMPLE_TID: u64 = 1 << 1;
/// `PERF_SAMPLE_TIME`.
pub const SAMPLE_TIME: u64 = 1 << 2;
/// `PERF_SAMPLE_PERIOD`.
pub const SAMPLE_PERIOD: u64 = 1 << 8;
/// `PERF_SAMPLE_REGS_USER`.
pub const SAMPLE_REGS_USER: u64 = 1 << 12;
/// `PERF_SAMPLE_STACK_USER`.
pub const SAMPLE_STACK_USER: u64 = 1 << 13;

/// `PERF_REG_X86_BP` (asm/perf_regs.h). The registers the unwinder starts
/// from; in a sample they appear in increasing bit order.
pub const REG_BP: u32 = 6;
/// `PERF_REG_X86_SP`.
pub const REG_SP: u32 = 7;
/// `PERF_REG_X86_IP`.
pub const REG_IP: u32 = 8;

/// `PERF_SAMPLE_REGS_ABI_64`: the sampled user context was 64-bit.
pub const REGS_ABI_64: u64 = 2;

/// `PERF_FORMAT_LOST` (Linux 6.0): `read()` also returns the records lost.
pub const FORMAT_LOST: u64 = 1 << 4;

/// `PERF_RECORD_LOST`: the kernel dropped records, the ring being full.
pub const RECORD_LOST: u32 = 2;
/// `PERF_RECORD_COMM`: a thread's name set, or a process's at its exec.
pub const RECORD_COMM: u32 = 3;
/// `PERF_RECORD_EXIT`: a thread exited.
pub const RECORD_EXIT: u32 = 4;
/// `PERF_RECORD_FORK`: a thread or process was created.
pub const RECORD_FORK: u32 = 7;
/// `PERF_RECORD_READ`: an inherited event's count at its thread's exit
/// (with `inherit_stat`).
pub const RECORD_READ: u32 = 8;
/// `PERF_RECORD_SAMPLE`.
pub const RECORD_SAMPLE: u32 = 9;
/// `PERF_RECORD_MMAP2`: an executable mapping was made.
pub const RECORD_MMAP2: u32 = 10;

/// `PERF_RECORD_MISC_COMM_EXEC`: the COMM record of an exec.
pub const MISC_COMM_EXEC: u16 = 1 << 13;
/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: the MMAP2 record carries a build id
/// instead of the file's device and inode.
pub const MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// `PERF_FLAG_FD_CLOEXEC`.
pub const FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// `PERF_EVENT_IOC_ENABLE` (`_IO('$', 0)`).
pub const IOC_ENABLE: libc::c_ulong = 0x2400;
/// `PERF_EVENT_IOC_DISABLE` (`_IO('$', 1)`).
pub const IOC_DISABLE: libc::c_ulong = 0x2401;
/// `PERF_EVENT_IOC_REFRESH` (`_IO('$', 2)`): enable for N more overflows,
/// after which the kernel disables the event itself.
pub const IOC_REFRESH: libc::c_ulong = 0x2402;
/// `PERF_EVENT_IOC_SET_BPF` (`_IOW('$', 8, __u32)`): a program run at each overflow.
pub const IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// `CLOCK_MONOTONIC`: the clock of the samples' `time` (with `use_clockid`),
/// so that it compares with the caller's `clock_gettime`.
pub const CLOCK_MONOTONIC: i32 = libc::CLOCK_MONOTONIC;

/// Bit positions in [`Attr::flags`] (the C bitfield, LSB first).
pub mod flag {
    /// Created stopped; `IOC_ENABLE` starts it.
    pub const DISABLED: u64 = 1 << 0;
    /// Copied into every thread and process the task creates from then on.
    pub const INHERIT: u64 = 1 << 1;
    /// Don't sample while the thread runs in the kernel.
    pub const EXCLUDE_KERNEL: u64 = 1 << 5;
    /// Don't sample in the hypervisor.
    pub const EXCLUDE_HV: u64 = 1 << 6;
    /// `PERF_RECORD_MMAP(2)` for executable mappings.
    pub const MMAP: u64 = 1 << 8;
    /// `PERF_RECORD_COMM` when a thread's name changes.
    pub const COMM: u64 = 1 << 9;
    /// Each inherited copy keeps its own count, and reports it at its
    /// thread's exit (`PERF_RECORD_READ`).
    pub const INHERIT_STAT: u64 = 1 << 11;
    /// Enabled by the task's next exec.
    pub const ENABLE_ON_EXEC: u64 = 1 << 12;
    /// `PERF_RECORD_FORK` and `PERF_RECORD_EXIT`.
    pub const TASK: u64 = 1 << 13;
    /// Wake pollers by bytes written ([`super::Attr::wakeup_watermark`]).
    pub const WATERMARK: u64 = 1 << 14;
    /// The sample's thread and time also at the end of every other record.
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    /// The `MMAP2` form of mapping records (with [`MMAP`]).
    pub const MMAP2: u64 = 1 << 23;
    /// COMM records of an exec are marked [`super::MISC_COMM_EXEC`].
    pub const COMM_EXEC: u64 = 1 << 24;
    /// Timestamps from [`super::Attr::clockid`].
    pub const USE_CLOCKID: u64 = 1 << 25;
    /// MMAP2 records carry the file's build id (Linux 5.12).
    pub const BUILD_ID: u64 = 1 << 34;
}

/// `struct perf_event_attr` as of `PERF_ATTR_SIZE_VER7`; unions are named
/// after the member this crate uses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Attr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    /// `sample_period` (the union's `sample_freq` is not used: for the
    /// software clocks the kernel turns a frequency into this period anyway).
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    /// The bitfield `disabled:1, inherit:1, ...` (see [`flag`]).
    pub flags: u64,
    /// `wakeup_events`, or `wakeup_watermark` (bytes) with [`flag::WATERMARK`].
    pub wakeup_watermark: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved_2: u16,
    pub aux_sample_size: u32,
    pub reserved_3: u32,
    pub sig_data: u64,
}

/// `PERF_ATTR_SIZE_VER7`.
pub const ATTR_SIZE: u32 = 128;
const _: () = assert!(std::mem::size_of::<Attr>() == ATTR_SIZE as usize);

/// `perf_event_open(attr, tid, cpu = -1, group = -1, FD_CLOEXEC)`: an event
/// following thread `tid` on whichever CPU it runs.
pub fn perf_event_open(attr: &Attr, tid: i32) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid, fully initialized perf_event_attr of the
    // size it declares; the kernel only reads it.
    let r =
        unsafe { libc::syscall(libc::SYS_perf_event_open, attr as *const Attr, tid, -1i32, -1i32, FLAG_FD_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(r).map_err(|_| io::Error::other("perf_event_open: fd out of range"))?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `perf_event_open(attr, pid, cpu, group = -1, FD_CLOEXEC)`: an event
/// following task `pid` (0: the calling thread) while it runs on `cpu`.
pub fn perf_event_open_on(attr: &Attr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    // SAFETY: as in `perf_event_open`.
    let r = unsafe { libc::syscall(libc::SYS_perf_event_open, attr as *const Attr, pid, cpu, -1i32, FLAG_FD_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(r).map_err(|_| io::Error::other("perf_event_open: fd out of range"))?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The CPUs online now (`/sys/devices/system/cpu/online`, e.g. `0-3,6`);
/// without it, `0..` the count the C library gives.
pub fn online_cpus() -> Vec<i32> {
    let parsed = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|s| parse_cpu_list(s.trim()));
    parsed.unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        (0..i32::try_from(n).unwrap_or(1).max(1)).collect()
    })
}

/// A kernel CPU list (`0-3,6`).
fn parse_cpu_list(s: &str) -> Option<Vec<i32>> {
    let mut cpus = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (i32, i32) = (lo.parse().ok()?, hi.parse().ok()?);
        cpus.extend(lo..=hi);
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// `ioctl(fd, request, 0)` for the argument-less perf ioctls.
pub fn ioctl(fd: &OwnedFd, request: libc::c_ulong) -> io::Result<()> {
    ioctl_arg(fd, request, 0)
}

/// `ioctl(fd, request, arg)` for the perf ioctls that take a number.
pub fn ioctl_arg(fd: &OwnedFd, request: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: ENABLE/DISABLE/REFRESH take no pointer; a bad fd is an error return.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `poll(fds, POLLIN, timeout)`: the number of descriptors ready (with
/// `revents` filled), 0 on timeout or `EINTR`.
pub fn poll(fds: &mut [libc::pollfd], timeout: std::time::Duration) -> io::Result<usize> {
    // ppoll: a timeout finer than a millisecond.
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    // SAFETY: `fds` is a live array of `fds.len()` pollfds; `ts` outlives the call.
    let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    match usize::try_from(n) {
        Ok(n) => Ok(n),
        Err(_) => {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                Ok(0)
            } else {
                Err(e)
            }
        }
    }
}

/// Reads the event's count: `[value, lost]` with [`FORMAT_LOST`], else
/// `[value, 0]`.
pub fn read_count(fd: &OwnedFd, with_lost: bool) -> io::Result<[u64; 2]> {
    use std::os::fd::AsRawFd;
    let mut v = [0u64; 2];
    let len = if with_lost { 16 } else { 8 };
    // SAFETY: reads at most `len` <= 16 bytes into `v`.
    let n = unsafe { libc::read(fd.as_raw_fd(), v.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// `/proc/sys/kernel/perf_event_paranoid`, if readable.
pub fn paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok()?.trim().parse().ok()
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// Offsets from `offsetof(struct perf_event_attr, ...)` with this
    /// machine's linux/perf_event.h.
    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn layout() {
        assert_eq!(offset_of!(Attr, config), 8);
        assert_eq!(offset_of!(Attr, sample_period), 16);
        assert_eq!(offset_of!(Attr, sample_type), 24);
        assert_eq!(offset_of!(Attr, read_format), 32);
        assert_eq!(offset_of!(Attr, flags), 40);
        assert_eq!(offset_of!(Attr, wakeup_watermark), 48);
        assert_eq!(offset_of!(Attr, bp_type), 52);
        assert_eq!(offset_of!(Attr, config1), 56);
        assert_eq!(offset_of!(Attr, config2), 64);
        assert_eq!(offset_of!(Attr, branch_sample_type), 72);
        assert_eq!(offset_of!(Attr, sample_regs_user), 80);
        assert_eq!(offset_of!(Attr, sample_stack_user), 88);
        assert_eq!(offset_of!(Attr, clockid), 92);
        assert_eq!(offset_of!(Attr, sample_regs_intr), 96);
        assert_eq!(offset_of!(Attr, aux_watermark), 104);
        assert_eq!(offset_of!(Attr, sample_max_stack), 108);
        assert_eq!(offset_of!(Attr, aux_sample_size), 112);
        assert_eq!(offset_of!(Attr, sig_data), 120);
    }
}
