//! One sample of a thread, taken when the caller asks: the registers and
//! stack of a thread as it runs *now*, without stopping it.
//!
//! [`OneShot::arm`] asks the kernel for a sample after the thread's next
//! [`OneShot::PERIOD_NS`] of CPU time (the shortest period software clocks
//! take) and for nothing after it (`PERF_EVENT_IOC_REFRESH` with a count
//! of 1: the kernel disables the event at that overflow); [`OneShot::take`]
//! stops the event and hands over that sample, if the thread ran long
//! enough for it meanwhile.

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::Result;
use crate::record::RawSample;
use crate::thread::ThreadSampler;

/// A thread's on-demand sample.
pub struct OneShot {
    sampler: ThreadSampler,
    /// The kernel's overflow limit is still 1: the last arm gave no sample.
    /// A refresh adds to that limit, so such an event is resumed instead;
    /// this keeps the limit at 1 (one sample per arm) whatever the order
    /// of arms with and without samples.
    limit_left: bool,
    scratch: Vec<u8>,
}

impl OneShot {
    /// The sample comes after this much of the thread's CPU time from
    /// [`OneShot::arm`]: the kernel's floor for a software clock's period.
    pub const PERIOD_NS: u64 = 10_000;
    /// How long [`OneShot::take`] waits on the CPU before it sleeps.
    pub const SPIN: Duration = Duration::from_micros(50);

    /// Opens the event on thread `tid` (any process the caller may trace),
    /// idle, copying `stack_bytes` of stack per sample.
    pub fn open(tid: u32, stack_bytes: u32) -> Result<OneShot> {
        let hz = u32::try_from(1_000_000_000 / OneShot::PERIOD_NS).unwrap_or(u32::MAX);
        // One record at a time, drained before the next arm.
        let record = u64::from(stack_bytes) + 256;
        let pages = usize::try_from(record.div_ceil(crate::sys::page_size() as u64)).unwrap_or(16).next_power_of_two();
        let config = Config { ring_pages: Some(pages), ..Config::new(hz, stack_bytes) };
        Ok(OneShot { sampler: ThreadSampler::open_paused(tid, &config)?, limit_left: false, scratch: Vec::new() })
    }

    /// Asks for one sample after the thread's next [`OneShot::PERIOD_NS`]
    /// of CPU time.
    pub fn arm(&mut self) -> Result<()> {
        if self.limit_left {
            self.sampler.resume()
        } else {
            self.sampler.refresh(1)?;
            self.limit_left = true;
            Ok(())
        }
    }

    /// Stops the event and passes the sample armed for to `f`, if the
    /// thread ran long enough for it to be taken, waiting up to `wait` for
    /// it. Returns the samples the ring held: 0 or 1.
    pub fn take(&mut self, wait: Duration, f: impl FnOnce(&RawSample<'_>)) -> u64 {
        // The sample is due after the thread's next 10 µs of CPU: waited
        // for on this CPU first, it spares the thread the wakeup of a
        // sleeping poller (an interrupt, often a preemption, on its CPU).
        let start = Instant::now();
        while self.sampler.pending() == 0 && start.elapsed() < OneShot::SPIN.min(wait) {
            std::hint::spin_loop();
        }
        // The record crosses the ring's half: its write wakes a poller. A
        // wakeup nobody polled for stays pending, hence the loop.
        let deadline = start + wait;
        while self.sampler.pending() == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.sampler.wait(left).is_err() {
                break;
            }
        }
        // Disabling is synchronous: after it, the ring holds all there is.
        // It fails only for a thread gone, whose event samples no more.
        let _ = self.sampler.pause();
        let mut f = Some(f);
        let d = self.sampler.drain(&mut self.scratch, &mut |s| {
            if let Some(f) = f.take() {
                f(s)
            }
        });
        if d.samples > 0 {
            self.limit_left = false;
        }
        d.samples
    }
}

impl std::fmt::Debug for OneShot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneShot").field("tid", &self.sampler.tid()).finish()
    }
}
