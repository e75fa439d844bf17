//! What a sampler asks of the kernel.

use crate::error::{Error, Result};

/// The software clock that drives sampling. Both count only while the
/// thread runs (a per-thread event is scheduled in and out with it), so a
/// blocked thread gives no samples and each sample weighs its period of CPU
/// time. Hardware counters are not used: VMs often have none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// `PERF_COUNT_SW_TASK_CLOCK`: the thread's run time.
    #[default]
    Task,
    /// `PERF_COUNT_SW_CPU_CLOCK`: what `perf record -e cpu-clock` uses.
    Cpu,
}

/// Sampler settings, shared by every thread of a [`crate::ProcessSampler`].
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Samples per second of the thread's CPU time.
    pub hz: u32,
    /// User stack bytes copied per sample, from the stack pointer up:
    /// a multiple of 8, at most [`Config::MAX_STACK`].
    pub stack_bytes: u32,
    /// Which clock.
    pub clock: Clock,
    /// Data pages per thread's ring (a power of two); `None`: room for about
    /// a quarter second of the thread's samples, between 8 and 64 pages
    /// (32-256 KiB; 64 at 99 Hz with 16 KiB stacks). The pages are pinned:
    /// a process of N threads costs N rings. The reader must drain a ring
    /// before it fills (pollers are woken at half), or samples are lost.
    pub ring_pages: Option<usize>,
    /// Also sample while the thread runs in the kernel (its user registers
    /// and stack are those of the system call it is in). Needs
    /// `kernel.perf_event_paranoid` <= 1 or CAP_PERFMON.
    pub include_kernel: bool,
}

impl Config {
    /// The largest stack copy: a record's size is a `u16`, and the kernel
    /// trims the stack to fit the other fields in it.
    pub const MAX_STACK: u32 = 65528 - 256;

    /// `hz` samples per second of CPU, `stack_bytes` of stack per sample,
    /// the other settings at their defaults.
    pub fn new(hz: u32, stack_bytes: u32) -> Config {
        Config { hz, stack_bytes, clock: Clock::Task, ring_pages: None, include_kernel: false }
    }

    /// The period in nanoseconds of CPU time.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / u64::from(self.hz.max(1))
    }

    /// The ring's data pages: `ring_pages`, else the default for `hz` and
    /// `stack_bytes` (see [`Config::ring_pages`]); 8 for an invalid configuration.
    pub fn ring_pages_or_default(&self) -> usize {
        self.validated().ok().and_then(|c| c.ring_pages).unwrap_or(8)
    }

    /// Checks the values and fills the defaults.
    pub(crate) fn validated(&self) -> Result<Config> {
        if self.hz == 0 || self.hz > 100_000 {
            return Err(Error::Config("hz must be between 1 and 100000"));
        }
        if self.stack_bytes == 0 || self.stack_bytes % 8 != 0 || self.stack_bytes > Config::MAX_STACK {
            return Err(Error::Config("stack_bytes must be a non-zero multiple of 8 up to Config::MAX_STACK"));
        }
        let pages = match self.ring_pages {
            Some(p) if p.is_power_of_two() => p,
            Some(_) => return Err(Error::Config("ring_pages must be a power of two")),
            None => {
                let record = u64::from(self.stack_bytes) + 128;
                let quarter_second = record * u64::from(self.hz) / 4;
                let page = crate::sys::page_size() as u64;
                usize::try_from(quarter_second.div_ceil(page)).unwrap_or(64).next_power_of_two().clamp(8, 64)
            }
        };
        Ok(Config { ring_pages: Some(pages), ..*self })
    }
}

impl Default for Config {
    /// 99 Hz (off the beat of periodic work), 16 KiB of stack.
    fn default() -> Config {
        Config::new(99, 16 << 10)
    }
}
