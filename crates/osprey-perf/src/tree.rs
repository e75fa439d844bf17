//! Every process and thread a child starts, sampled through one inherited
//! event per CPU: nothing runs inside the sampled processes, and a short
//! one costs only the kernel's copy of the events when it is forked.
//!
//! [`TreeSampler::open`] opens, on the calling thread, one `task-clock`
//! event per online CPU, disabled there and enabled in a process that
//! thread then forks, at that process's exec (`enable_on_exec`). Every
//! thread and process started from then on inherits the events; their
//! samples and side-band records (executable mappings, names, forks, exits,
//! and each thread's count at its exit) go to the ring of the CPU they ran
//! on. [`TreeSampler::drain`] hands them over in time order.
//!
//! Invariants:
//! - it is opened before the child is forked, on the thread that forks it:
//!   a task's events are copied into the tasks it creates afterwards only;
//! - the calling process is never sampled: its own copies stay disabled,
//!   as do those of the threads it creates later (none of them execs);
//! - the calling thread's events never move to a process of the tree: the
//!   kernel swaps the event contexts of a task and its child at a context
//!   switch between them while the child's is an exact copy, and a task
//!   that exits holding the original events reports no count at its exit.
//!   A non-inherited event beside them (`anchor`) makes every child's
//!   context other than a copy.
//! - records leave [`TreeSampler::drain`] in time order across the rings: a
//!   record newer than the drain's horizon (when the first ring was read,
//!   less [`HOLD`]) waits for the next drain, since a ring read before it
//!   was written could still receive an older one.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::record::{self, Record};
use crate::ring::Ring;
use crate::sys::{self, flag, Attr};

/// How long after its timestamp a record may still be on its way into its
/// ring (the kernel stamps it, then copies it).
pub const HOLD: Duration = Duration::from_millis(2);

/// The most data pages per CPU's ring by default: 2 MiB.
const MAX_RING_PAGES: usize = 512;

/// Data pages per CPU's ring unless [`Config::ring_pages`] says otherwise:
/// a quarter second of one busy CPU's samples, between 64 and 512 pages
/// (256 KiB-2 MiB; 512 KiB at 100 Hz with 16 KiB stacks). Their pages are
/// zeroed and pinned when the ring is mapped. Halved while the kernel
/// refuses them: an unprivileged user may lock `perf_event_mlock_kb`
/// (516 KiB) per CPU.
fn default_ring_pages(config: &Config) -> usize {
    let quarter_second = (u64::from(config.stack_bytes) + 128) * u64::from(config.hz) / 4;
    let pages = quarter_second.div_ceil(sys::page_size() as u64);
    usize::try_from(pages).unwrap_or(MAX_RING_PAGES).next_power_of_two().clamp(64, MAX_RING_PAGES)
}

/// Counts of what the rings held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeCounts {
    /// Samples handed over.
    pub samples: u64,
    /// Records the kernel dropped, a ring being full (`PERF_RECORD_LOST`).
    pub lost: u64,
    /// Records that could not be decoded.
    pub malformed: u64,
}

/// A disabled event that is not inherited (see the module doc).
fn anchor() -> std::io::Result<OwnedFd> {
    let attr = Attr {
        type_: sys::TYPE_SOFTWARE,
        size: sys::ATTR_SIZE,
        config: sys::COUNT_SW_DUMMY,
        flags: flag::DISABLED | flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV,
        ..Attr::default()
    };
    sys::perf_event_open_on(&attr, 0, -1)
}

struct CpuRing {
    ring: Ring,
    /// After `ring`: the mapping goes before the descriptor closes.
    fd: OwnedFd,
}

/// The events of a tree of processes, one per CPU.
pub struct TreeSampler {
    rings: Vec<CpuRing>,
    /// Records read and held back: (time, bytes), sorted by time.
    held: Vec<(u64, Vec<u8>)>,
    scratch: Vec<u8>,
    counts: TreeCounts,
    /// Samples while the thread runs in the kernel too (its user registers
    /// and stack are the system call's): the kernel allowed it.
    with_kernel: bool,
    _anchor: OwnedFd,
}

impl TreeSampler {
    /// Opens the events on the calling thread (see the module doc): the
    /// next process this thread forks is sampled from its exec on, with
    /// everything it starts. Time in the kernel is sampled when allowed
    /// (not with `perf_event_paranoid` 2 without CAP_PERFMON): its samples
    /// carry the user registers and stack of the system call.
    pub fn open(config: &Config) -> Result<TreeSampler> {
        let mut pages = config.ring_pages.unwrap_or_else(|| default_ring_pages(config));
        let config = config.validated()?;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let anchor = anchor().map_err(|e| Error::open(me, e))?;
        let cpus = sys::online_cpus();
        let mut with_kernel = true;
        let mut build_id = true;
        loop {
            match Self::open_all(&config, &cpus, pages, with_kernel, build_id) {
                Ok(rings) => {
                    return Ok(TreeSampler {
                        rings,
                        held: Vec::new(),
                        scratch: Vec::new(),
                        counts: TreeCounts::default(),
                        with_kernel,
                        _anchor: anchor,
                    })
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EACCES) if with_kernel => with_kernel = false,
                    // Before Linux 5.12: no build ids in mapping records.
                    Some(libc::EINVAL) if build_id => build_id = false,
                    // The locked-memory limit (`perf_event_mlock_kb`): smaller rings.
                    Some(libc::EPERM) if pages > 8 => pages /= 2,
                    _ => return Err(Error::open(me, e)),
                },
            }
        }
    }

    fn open_all(
        config: &Config,
        cpus: &[i32],
        pages: usize,
        with_kernel: bool,
        build_id: bool,
    ) -> std::io::Result<Vec<CpuRing>> {
        let mut flags = flag::DISABLED
            | flag::INHERIT
            | flag::EXCLUDE_HV
            | flag::MMAP
            | flag::COMM
            | flag::INHERIT_STAT
            | flag::ENABLE_ON_EXEC
            | flag::TASK
            | flag::SAMPLE_ID_ALL
            | flag::MMAP2
            | flag::COMM_EXEC;
        if !with_kernel {
            flags |= flag::EXCLUDE_KERNEL;
        }
        if build_id {
            flags |= flag::BUILD_ID;
        }
        let attr = record::sampling_attr(config, sys::COUNT_SW_TASK_CLOCK, flags, pages);
        let mut rings = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let fd = sys::perf_event_open_on(&attr, 0, cpu)?;
            let ring = Ring::map(&fd, pages).map_err(|e| match e {
                Error::Io { source, .. } => source,
                e => std::io::Error::other(e.to_string()),
            })?;
            rings.push(CpuRing { ring, fd });
        }
        Ok(rings)
    }

    /// Whether samples include time in the kernel (see [`TreeSampler::open`]).
    pub fn with_kernel(&self) -> bool {
        self.with_kernel
    }

    /// Waits up to `timeout` for a ring to be half full; true if one is.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .iter()
            .map(|r| libc::pollfd { fd: r.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        let n = sys::poll(&mut fds, timeout).map_err(|source| Error::Io { what: "poll", source })?;
        Ok(n > 0)
    }

    /// Passes the records read so far to `f`, oldest first: those older
    /// than the horizon (see the module doc), or all of them when `all`
    /// (the tree has ended).
    pub fn drain(&mut self, all: bool, f: &mut dyn FnMut(Record<'_>)) {
        let horizon = crate::now_ns().saturating_sub(HOLD.as_nanos() as u64);
        let held = &mut self.held;
        let counts = &mut self.counts;
        for r in &mut self.rings {
            r.ring.drain(&mut self.scratch, &mut |bytes| match record::time_of(bytes) {
                Some(t) => held.push((t, bytes.to_vec())),
                None => counts.malformed += 1,
            });
        }
        // Each ring is in time order: a stable sort keeps a ring's order for equal times.
        held.sort_by_key(|h| h.0);
        let ready = if all { held.len() } else { held.partition_point(|h| h.0 < horizon) };
        for (_, bytes) in held.drain(..ready) {
            let rec = record::parse(&bytes);
            match rec {
                Record::Sample(_) => counts.samples += 1,
                Record::Lost(n) => counts.lost += n,
                Record::Malformed => counts.malformed += 1,
                _ => {}
            }
            f(rec);
        }
    }

    /// What the drains handed over so far.
    pub fn counts(&self) -> TreeCounts {
        self.counts
    }
}

impl std::fmt::Debug for TreeSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeSampler").field("cpus", &self.rings.len()).field("held", &self.held.len()).finish()
    }
}
