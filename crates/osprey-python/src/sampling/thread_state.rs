//! Thread states (a sample's `state` label): who holds the GIL, combined
//! with what the kernel says the thread is doing.

use crate::remote::kernel_thread::Sys;

const SYS_FUTEX: i64 = 202;
const SLEEP_SYSCALLS: &[i64] = &[
    35,  // nanosleep
    230, // clock_nanosleep
    23,  // select
    270, // pselect6
    7,   // poll
    271, // ppoll
    232, // epoll_wait
    281, // epoll_pwait
    441, // epoll_pwait2
    34,  // pause
];

/// What a thread was doing when sampled (its `state` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Holds the GIL (free-threaded builds: on a CPU).
    Running,
    /// On a CPU without the GIL: C code such as zlib, or about to take it
    /// (never in free-threaded builds).
    Native,
    /// Blocked on the GIL's futexes.
    WaitingForGil,
    /// Blocked in a sleep- or poll-like call: uses no CPU.
    Sleeping,
    /// Any other wait: locks, I/O, D state.
    Blocked,
}

impl State {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Native => "native",
            State::WaitingForGil => "waiting for gil",
            State::Sleeping => "sleeping",
            State::Blocked => "blocked",
        }
    }
}

/// A sample's state from the GIL, the kernel's run state and the syscall
/// the thread is in.
pub fn classify(holds_gil: bool, kstate: char, sys: Sys, gil_ranges: &[(u64, u64)]) -> State {
    if holds_gil {
        return State::Running;
    }
    if sys == Sys::Running || (sys == Sys::Unknown && kstate == 'R') {
        return State::Native;
    }
    if let Sys::In(nr, a1) = sys {
        if nr == SYS_FUTEX && gil_ranges.iter().any(|&(lo, hi)| a1 >= lo && a1 < hi) {
            return State::WaitingForGil;
        }
        if kstate != 'D' && SLEEP_SYSCALLS.contains(&nr) {
            return State::Sleeping;
        }
    }
    State::Blocked
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn states() {
        assert_eq!(classify(true, 'S', Sys::Unknown, &[]), State::Running);
        assert_eq!(classify(false, 'R', Sys::Unknown, &[]), State::Native);
        assert_eq!(classify(false, 'S', Sys::Running, &[]), State::Native);
        assert_eq!(classify(false, 'S', Sys::In(202, 0x1010), &[(0x1000, 0x10d0)]), State::WaitingForGil);
        assert_eq!(classify(false, 'S', Sys::In(202, 0x2000), &[(0x1000, 0x10d0)]), State::Blocked);
        assert_eq!(classify(false, 'S', Sys::In(230, 0), &[]), State::Sleeping);
        assert_eq!(classify(false, 'D', Sys::In(0, 3), &[]), State::Blocked);
        assert_eq!(State::WaitingForGil.label(), "waiting for gil");
    }
}
