//! The period grid of a `--children` tree's spool: every writer ends its
//! periods at `origin + k × period` on `CLOCK_MONOTONIC` (one clock for all
//! processes of the machine), and `osprey exec` merges [`Grid::merge_delay`]
//! after each end. A merged file then holds one period of each process, not
//! one part just before a merge and one just after; a part published later
//! than the delay joins the next file (nothing is lost either way).

use std::time::Duration;

/// The variable that hands a tree's grid origin (nanoseconds of
/// `CLOCK_MONOTONIC`) to its agents.
pub const ORIGIN_ENV: &str = "OSPREY_PERIOD_ORIGIN";

/// Period ends shared by the writers of one spool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    origin_ns: u64,
    period_ns: u64,
}

impl Grid {
    /// Periods of `period` (at least 1 ms) from `origin_ns`.
    pub fn new(origin_ns: u64, period: Duration) -> Grid {
        Grid { origin_ns, period_ns: (period.as_nanos() as u64).max(1_000_000) }
    }

    /// A grid starting now.
    pub fn starting_now(period: Duration) -> Grid {
        Grid::new(monotonic_ns(), period)
    }

    /// The grid an agent was handed in [`ORIGIN_ENV`]; None if `value` is
    /// not a number of nanoseconds.
    pub fn from_env(value: &str, period: Duration) -> Option<Grid> {
        value.trim().parse().ok().map(|origin| Grid::new(origin, period))
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The origin, as [`ORIGIN_ENV`] carries it.
    pub fn origin_env(&self) -> String {
        self.origin_ns.to_string()
    }

    /// The first period end strictly after `now_ns`.
    pub fn next_end(&self, now_ns: u64) -> u64 {
        let done = now_ns.saturating_sub(self.origin_ns) / self.period_ns;
        self.origin_ns + (done + 1) * self.period_ns
    }

    /// How long until the next period end.
    pub fn until_next_end(&self) -> Duration {
        let now = monotonic_ns();
        Duration::from_nanos(self.next_end(now) - now)
    }

    /// How long after a period end `osprey exec` merges: time for the
    /// writers to publish their parts (a quarter period, at most 2 s).
    pub fn merge_delay(&self) -> Duration {
        Duration::from_nanos(self.period_ns / 4).min(Duration::from_secs(2))
    }

    /// How long until the next merge: [`Grid::merge_delay`] after the
    /// latest period end whose merge is still to come.
    pub fn until_next_merge(&self) -> Duration {
        let (now, delay) = (monotonic_ns(), self.merge_delay().as_nanos() as u64);
        let end = self.next_end(now.saturating_sub(delay));
        Duration::from_nanos((end + delay).saturating_sub(now))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_fall_on_the_grid_after_now() {
        let g = Grid::new(1_000, Duration::from_millis(10));
        assert_eq!(g.next_end(0), 10_001_000, "before the origin: its first end");
        assert_eq!(g.next_end(1_000), 10_001_000);
        assert_eq!(g.next_end(10_000_999), 10_001_000);
        assert_eq!(g.next_end(10_001_000), 20_001_000, "an end is not after itself");
        assert_eq!(g.next_end(35_000_000), 40_001_000);
    }

    #[test]
    fn a_merge_comes_a_delay_after_each_end() {
        let g = Grid::starting_now(Duration::from_millis(400));
        assert_eq!(g.merge_delay(), Duration::from_millis(100));
        let until = g.until_next_merge();
        assert!(until > Duration::from_millis(400) && until <= Duration::from_millis(500), "{until:?}");
        let long = Grid::starting_now(Duration::from_secs(60));
        assert_eq!(long.merge_delay(), Duration::from_secs(2));
    }

    #[test]
    fn the_origin_travels_through_the_environment() {
        let g = Grid::new(123_456_789, Duration::from_secs(1));
        assert_eq!(Grid::from_env(&g.origin_env(), Duration::from_secs(1)), Some(g));
        assert_eq!(Grid::from_env("soon", Duration::from_secs(1)), None);
    }
}
