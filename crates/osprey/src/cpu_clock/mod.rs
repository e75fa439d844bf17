//! Per-thread CPU-time clocks: each registered thread gets a clock that
//! sends the sampling signal to that very thread every `period` of its CPU
//! time.
//!
//! Two kinds, chosen per thread:
//! - a POSIX CPU timer (`timer.rs`) at rates up to [`TIMER_MAX_HZ`]: no
//!   descriptor, cheap to create, at most one pending signal per thread;
//! - a perf_event `cpu-clock` (`perf.rs`) above that rate, where the tick-bound
//!   timers would fold several periods into one signal; it costs one
//!   descriptor, kept in the top quarter of the descriptor limit. When none
//!   is left there, the thread gets a timer instead (its samples are then
//!   weighted by the timer's overrun count, so CPU totals stay right).
//!
//! `Record::clock` holds the armed clock as [`Armed`] encodes it; it is
//! published with a CAS from 0, so two racing `arm`s leave one clock, and
//! taken with a swap to 0, so exactly one `disarm` closes it.

mod perf;
mod timer;

pub use timer::thread_cpu_ns;

use crate::record::{Record, RecordState};
use crate::signal::STATE;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::*};

/// Set once a perf descriptor of osprey's was found closed or reused by the
/// program (`close_range`, daemonizing): from then on every clock is a POSIX
/// timer, which has no descriptor to lose.
static DESCRIPTORS_TAKEN: AtomicBool = AtomicBool::new(false);

/// The error of the first perf clock refused (0: none), until the
/// collector reports it ([`take_perf_refusal`]); -1 once reported.
static PERF_REFUSED: AtomicI32 = AtomicI32::new(0);

/// Highest rate served by POSIX timers: every Linux kernel ticks at least
/// this often, so below it each expiry is its own signal.
pub const TIMER_MAX_HZ: u64 = 100;

/// An armed clock: its kind, the thread it signals, and its kernel handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Armed {
    /// A POSIX timer.
    Timer {
        /// The thread it signals.
        tid: i32,
        /// Kernel timer id.
        id: i32,
    },
    /// A perf_event clock.
    Perf {
        /// The thread it signals.
        tid: i32,
        /// Its descriptor.
        fd: i32,
    },
}

impl Armed {
    /// `kind << 62 | tid << 32 | handle`; never 0.
    pub fn encode(self) -> u64 {
        let (kind, tid, h) = match self {
            Armed::Timer { tid, id } => (1u64, tid, id),
            Armed::Perf { tid, fd } => (2u64, tid, fd),
        };
        kind << 62 | (tid as u32 as u64 & 0x3fff_ffff) << 32 | h as u32 as u64
    }

    /// The clock `v` encodes (`None` for 0).
    pub fn decode(v: u64) -> Option<Armed> {
        let (tid, h) = ((v >> 32 & 0x3fff_ffff) as i32, v as u32 as i32);
        match v >> 62 {
            1 => Some(Armed::Timer { tid, id: h }),
            2 => Some(Armed::Perf { tid, fd: h }),
            _ => None,
        }
    }

    fn close(self) {
        match self {
            Armed::Timer { id, .. } => timer::close(id),
            Armed::Perf { tid, fd } => {
                if !perf::close(fd, tid) {
                    descriptors_taken();
                }
            }
        }
    }
}

/// Gives `rec`'s thread a CPU clock if sampling is on, it has none and does
/// not block the sampling signal. Safe to race with itself and with
/// `disarm`: a clock armed for a record that was retired meanwhile is closed.
pub fn arm(rec: &Record) -> io::Result<()> {
    let tid = rec.tid.load(Relaxed);
    if !STATE.enabled.load(Acquire) || rec.clock.load(Acquire) != 0 || tid <= 0 || rec.blocked.load(Relaxed) != 0 {
        return Ok(());
    }
    let armed = open(tid, STATE.period_ns.load(Relaxed), STATE.sample_signal.load(Relaxed))?;
    if rec.clock.compare_exchange(0, armed.encode(), AcqRel, Acquire).is_err() {
        armed.close();
        return Ok(());
    }
    if rec.state() != RecordState::Claimed || rec.tid.load(Acquire) != tid {
        disarm(rec);
    }
    Ok(())
}

/// Opens the clock `arm` gives thread `tid`: a perf clock above
/// [`TIMER_MAX_HZ`] (unless descriptors were taken), else or when that
/// fails a POSIX timer. The overhead benchmark arms the same clocks with an
/// empty handler to measure the kernel's share of sampling.
pub fn open(tid: i32, period_ns: u64, signal: i32) -> io::Result<Armed> {
    if 1_000_000_000 / period_ns.max(1) > TIMER_MAX_HZ && !DESCRIPTORS_TAKEN.load(Relaxed) {
        match perf::open(tid, period_ns, signal) {
            Ok(fd) => return Ok(Armed::Perf { tid, fd }),
            Err(e) => {
                let _ = PERF_REFUSED.compare_exchange(0, e.raw_os_error().unwrap_or(-1).max(1), Relaxed, Relaxed);
            }
        }
    }
    Ok(Armed::Timer { tid, id: timer::open(tid, period_ns, signal)? })
}

/// The error of the first perf clock refused, once: its thread got a POSIX
/// timer instead, whose periods fold above [`TIMER_MAX_HZ`] (fewer samples,
/// the same CPU time).
pub fn take_perf_refusal() -> Option<io::Error> {
    let e = PERF_REFUSED.load(Relaxed);
    (e > 0 && PERF_REFUSED.compare_exchange(e, -1, Relaxed, Relaxed).is_ok()).then(|| io::Error::from_raw_os_error(e))
}

/// Takes away `rec`'s clock, if any. No signal is generated by it afterwards
/// (one may still be pending).
pub fn disarm(rec: &Record) {
    if let Some(a) = Armed::decode(rec.clock.swap(0, AcqRel)) {
        a.close();
    }
}

/// Gives `rec`'s thread a new clock when its clock stopped working (its
/// CPU time advanced with no sample while it does not block the signal):
/// the program closed the clock's descriptor. The old descriptor number is
/// left alone (it may name the program's file now).
pub fn revive(rec: &Record) -> io::Result<()> {
    if let Some(a) = Armed::decode(rec.clock.swap(0, AcqRel)) {
        a.close();
    }
    arm(rec)
}

/// Lowest number of the top quarter of the soft descriptor limit, where
/// osprey keeps the descriptors it holds for long: programs that assume
/// low numbers are theirs (`dup2` onto 3, loops closing 3..64) miss them.
pub fn high_fd_base() -> i32 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let soft = lim.rlim_cur.min(1 << 20) as i32;
    soft - soft / 4
}

/// Records that the program took osprey's descriptors; says so once.
fn descriptors_taken() {
    if !DESCRIPTORS_TAKEN.swap(true, Relaxed) {
        crate::say!(
            "osprey: the program closed or reused osprey's clock descriptors (left alone); POSIX timers from now on"
        );
    }
}

/// Stops or restarts `rec`'s clock without giving it up (around `execve`).
/// Returns whether there was a clock to act on.
pub fn set_running(rec: &Record, running: bool) -> bool {
    match Armed::decode(rec.clock.load(Acquire)) {
        Some(Armed::Timer { id, .. }) => {
            timer::set_running(id, if running { STATE.period_ns.load(Relaxed) } else { 0 })
        }
        Some(Armed::Perf { tid, fd }) => {
            if running {
                perf::enable(fd, tid)
            } else {
                perf::disable(fd, tid)
            }
        }
        None => false,
    }
}

/// Forgets a clock inherited over `fork` without touching it: the kernel
/// object belongs to the parent's thread (perf descriptors are closed in the
/// child, which holds copies; timers are not inherited at all).
pub fn forget_inherited(rec: &Record) {
    if let Some(Armed::Perf { fd, .. }) = Armed::decode(rec.clock.swap(0, AcqRel)) {
        // SAFETY: the child's copy of a descriptor osprey opened in the parent.
        unsafe { libc::close(fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        for a in [
            Armed::Timer { tid: 1, id: 0 },
            Armed::Perf { tid: 4_194_303, fd: 1_048_575 },
            Armed::Timer { tid: 77, id: i32::MAX },
        ] {
            assert_ne!(a.encode(), 0);
            assert_eq!(Armed::decode(a.encode()), Some(a));
        }
        assert_eq!(Armed::decode(0), None);
    }

    #[test]
    fn thread_cpu_clock_reads_this_thread() {
        let tid = crate::signal::sys::gettid();
        let a = thread_cpu_ns(tid).unwrap();
        let mut x = 0u64;
        while thread_cpu_ns(tid).unwrap() < a + 5_000_000 {
            x = std::hint::black_box(x + 1);
        }
        assert!(x > 0);
    }
}
