//! One sampled thread: a `perf_event_open` event following it and the
//! event's ring.
//!
//! The target is never stopped nor signalled: at each period of the
//! thread's CPU time the kernel copies its user registers and the top of
//! its stack into the ring, and that is all it pays.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::config::{Clock, Config};
use crate::error::{Error, Result};
use crate::record::{self, Record};
use crate::ring::Ring;
use crate::sys::{self, flag, Attr};

/// Counts from a drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Samples passed to the callback.
    pub samples: u64,
    /// Samples the kernel dropped (`PERF_RECORD_LOST`): the ring was full.
    pub lost: u64,
    /// Records that could not be decoded.
    pub malformed: u64,
}

impl std::ops::AddAssign for Drained {
    fn add_assign(&mut self, o: Drained) {
        self.samples += o.samples;
        self.lost += o.lost;
        self.malformed += o.malformed;
    }
}

/// The event's own count, read without the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// The clock's value: the thread's CPU nanoseconds since the event
    /// started (while it was enabled).
    pub cpu_ns: u64,
    /// Samples the kernel could not write, the ring being full; `None` on
    /// kernels before 6.0 (no `PERF_FORMAT_LOST`: losses then show as
    /// [`Drained::lost`], once the ring has room again).
    pub lost: Option<u64>,
}

/// A sampling event on one thread (any process the caller may trace).
/// Sampling starts in [`ThreadSampler::open`] and stops when it is dropped.
pub struct ThreadSampler {
    tid: u32,
    /// Opened with `PERF_FORMAT_LOST`.
    format_lost: bool,
    ring: Ring,
    /// After `ring`: the mapping goes before the descriptor closes.
    fd: OwnedFd,
}

impl ThreadSampler {
    /// Samples thread `tid` `hz` times a second of its CPU time, copying
    /// `stack_bytes` of its stack each time.
    pub fn open(tid: u32, hz: u32, stack_bytes: u32) -> Result<ThreadSampler> {
        ThreadSampler::open_with(tid, &Config::new(hz, stack_bytes))
    }

    /// As [`ThreadSampler::open`] with every setting.
    pub fn open_with(tid: u32, config: &Config) -> Result<ThreadSampler> {
        let s = ThreadSampler::open_paused(tid, config)?;
        s.resume()?;
        Ok(s)
    }

    /// As [`ThreadSampler::open_with`], but not sampling until
    /// [`ThreadSampler::resume`] or [`ThreadSampler::refresh`].
    pub fn open_paused(tid: u32, config: &Config) -> Result<ThreadSampler> {
        let config = config.validated()?;
        let (fd, format_lost) = Self::event(tid, &config)?;
        let ring = Ring::map(&fd, config.ring_pages.unwrap_or(8))?;
        Ok(ThreadSampler { tid, format_lost, ring, fd })
    }

    /// A disabled sampling event on thread `tid` for a validated `config`, and
    /// whether it reports losses (`PERF_FORMAT_LOST`).
    fn event(tid: u32, config: &Config) -> Result<(OwnedFd, bool)> {
        let pages = config.ring_pages.unwrap_or(8);
        let mut flags = flag::DISABLED | flag::EXCLUDE_HV;
        if !config.include_kernel {
            flags |= flag::EXCLUDE_KERNEL;
        }
        let event = match config.clock {
            Clock::Task => sys::COUNT_SW_TASK_CLOCK,
            Clock::Cpu => sys::COUNT_SW_CPU_CLOCK,
        };
        let attr = record::sampling_attr(config, event, flags, pages);
        let tid_c = i32::try_from(tid).map_err(|_| Error::NoSuchThread { tid })?;
        let with_lost = Attr { read_format: sys::FORMAT_LOST, ..attr };
        match sys::perf_event_open(&with_lost, tid_c) {
            Ok(fd) => Ok((fd, true)),
            // Before 6.0: an unknown read_format bit.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                Ok((sys::perf_event_open(&attr, tid_c).map_err(|e| Error::open(tid, e))?, false))
            }
            Err(e) => Err(Error::open(tid, e)),
        }
    }

    /// The sampled thread.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// The event's descriptor: readable (`poll`) when the ring is half
    /// full; `POLLHUP` once the thread has exited.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Waits up to `timeout` for the ring to be half full or the thread to
    /// exit; true if one happened.
    pub fn wait(&self, timeout: std::time::Duration) -> Result<bool> {
        use std::os::fd::AsRawFd;
        let mut fds = [libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        let n = sys::poll(&mut fds, timeout).map_err(|source| Error::Io { what: "poll", source })?;
        Ok(n > 0)
    }

    /// The event's count and losses so far.
    pub fn counts(&self) -> Result<Counts> {
        let [cpu_ns, lost] = sys::read_count(&self.fd, self.format_lost)
            .map_err(|source| Error::Io { what: "read of a perf event", source })?;
        Ok(Counts { cpu_ns, lost: self.format_lost.then_some(lost) })
    }

    /// Bytes waiting in the ring.
    pub fn pending(&self) -> u64 {
        self.ring.pending()
    }

    /// Stops sampling (the ring keeps what it has). Synchronous: no sample
    /// is written after it returns.
    pub fn pause(&self) -> Result<()> {
        sys::ioctl(&self.fd, sys::IOC_DISABLE).map_err(|source| Error::Io { what: "PERF_EVENT_IOC_DISABLE", source })
    }

    /// Starts (again) sampling.
    pub fn resume(&self) -> Result<()> {
        sys::ioctl(&self.fd, sys::IOC_ENABLE).map_err(|source| Error::Io { what: "PERF_EVENT_IOC_ENABLE", source })
    }

    /// Runs `chain`'s program at each overflow instead of writing a sample
    /// (see [`crate::chain`]).
    pub fn attach(&self, chain: &crate::chain::Chain) -> Result<()> {
        let prog = libc::c_ulong::try_from(chain.prog_fd()).unwrap_or_default();
        sys::ioctl_arg(&self.fd, sys::IOC_SET_BPF, prog)
            .map_err(|source| Error::Io { what: "PERF_EVENT_IOC_SET_BPF", source })
    }

    /// Samples for `n` more periods, then the kernel stops the event by
    /// itself. The count adds to what is left of an earlier refresh.
    pub fn refresh(&self, n: u32) -> Result<()> {
        sys::ioctl_arg(&self.fd, sys::IOC_REFRESH, libc::c_ulong::from(n))
            .map_err(|source| Error::Io { what: "PERF_EVENT_IOC_REFRESH", source })
    }

    /// Passes every sample in the ring to `f`, oldest first, and frees the
    /// ring. `scratch` holds a record that wraps around the ring's end.
    pub fn drain(&mut self, scratch: &mut Vec<u8>, f: &mut dyn FnMut(&record::RawSample<'_>)) -> Drained {
        let mut d = Drained::default();
        self.ring.drain(scratch, &mut |bytes| match record::parse(bytes) {
            Record::Sample(s) => {
                d.samples += 1;
                f(&s);
            }
            Record::Lost(n) => d.lost += n,
            Record::Mmap(_) | Record::Comm(_) | Record::Task(_) | Record::Read(_) | Record::Other(_) => {}
            Record::Malformed => d.malformed += 1,
        });
        d
    }
}

impl std::fmt::Debug for ThreadSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadSampler").field("tid", &self.tid).field("pending", &self.pending()).finish()
    }
}
