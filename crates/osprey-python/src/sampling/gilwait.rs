//! GIL waits as time: how much of a sample's time its thread spent waiting
//! for the GIL, counted from when the wait began.
//!
//! A waiting thread sleeps on the GIL's futex and the kernel does not say
//! since when. What the sampler knows is the last pass at which the thread
//! was seen doing something else: the wait began between that pass and the
//! first pass that sees it waiting. The start is taken as the midpoint (an
//! error of at most half an interval either way, zero on average), so the
//! first sample of a wait carries the time since then, not just one
//! interval or nothing; later samples of the same wait carry the time
//! since the previous pass. Summed over a window, the values give each
//! stack's total time waiting for the GIL.

use std::collections::HashMap;
use std::time::Instant;

/// Per thread: the current wait's last accounted instant, or when the
/// thread was last seen not waiting.
#[derive(Default)]
pub struct GilWaits {
    waiting_until: HashMap<i32, Instant>,
    last_not_waiting: HashMap<i32, Instant>,
}

impl GilWaits {
    /// Records thread `tid`'s state at `now`; returns the nanoseconds of
    /// GIL wait this sample accounts for (0 when not waiting).
    pub fn observe(&mut self, tid: i32, waiting: bool, now: Instant) -> i64 {
        if !waiting {
            self.waiting_until.remove(&tid);
            self.last_not_waiting.insert(tid, now);
            return 0;
        }
        let from = match self.waiting_until.get(&tid) {
            Some(&t) => t,
            // A new wait: it began after the thread was last seen otherwise.
            None => match self.last_not_waiting.get(&tid) {
                Some(&t) => t + (now - t) / 2,
                None => now,
            },
        };
        self.waiting_until.insert(tid, now);
        now.saturating_duration_since(from).as_nanos() as i64
    }

    pub fn retain(&mut self, live: &[i32]) {
        self.waiting_until.retain(|k, _| live.contains(k));
        self.last_not_waiting.retain(|k, _| live.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counted_from_the_start_of_the_wait() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut w = GilWaits::default();
        assert_eq!(w.observe(1, false, ms(0)), 0);
        // Seen waiting at 10 ms: began at about 5 ms.
        assert_eq!(w.observe(1, true, ms(10)), 5_000_000);
        assert_eq!(w.observe(1, true, ms(20)), 10_000_000);
        assert_eq!(w.observe(1, false, ms(30)), 0);
        // Another thread first seen waiting: nothing known before.
        assert_eq!(w.observe(2, true, ms(30)), 0);
        assert_eq!(w.observe(2, true, ms(40)), 10_000_000);
        w.retain(&[2]);
        assert_eq!(w.observe(1, true, ms(50)), 0);
    }
}
