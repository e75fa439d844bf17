//! Wall-time sampling: every thread, running or blocked, accounted in wall
//! time, with the state it was in ([`thread_state`]).
//!
//! Nothing here runs on the signal path, and no thread is ever signalled
//! for wall time:
//! - a **blocked** thread is sampled by the collector from
//!   `/proc/self/task/TID/syscall` (its `sp`, `pc` and system call) and a
//!   copy of its stack, walked with the CFI tables ([`blocked`], [`walk`]);
//!   a signal would end its `nanosleep`/`epoll_wait`/`poll`/`select`/timed
//!   futex wait with `EINTR`, `SA_RESTART` or not;
//! - a **running** thread's wall time is left in its record and recorded
//!   by its next CPU-clock sample, with that sample's stack and context
//!   (`signal::wall`). Signalling threads seen running instead would race:
//!   a thread seen running may enter a wait before the signal lands, and
//!   that wait then fails with `EINTR`.
//!
//! | file | what |
//! |---|---|
//! | `thread_state.rs` | the state a wall sample carries, its label |
//! | `sampler.rs` | the tick: schedule, which threads, what weight, where samples go |
//! | `proc.rs` | a thread's state, `sp` and `pc` from `/proc/self/task/TID/syscall` |
//! | `blocked.rs` | one blocked thread's sample: stack copy, walk, consistency check |
//! | `walk.rs` | the CFI walk of a copied stack that starts without `rbp` |
//!
//! # Limits
//! - Time a thread spends runnable but waiting for a CPU (after a wait
//!   ends, or preempted) is in state `running` and charged to the stack of
//!   its next CPU sample, not to where it waited: under CPU contention, time
//!   moves from the function that waited to the one that runs next.
//! - Running time of a thread with no CPU clock (not registered yet, or it
//!   blocks the sampling signal) is accounted without a stack
//!   (`[truncated]`); pending running time of a thread that exits before
//!   its next CPU sample (less than one CPU period) is lost.
//! - A blocked thread whose registers change while its stack is copied and
//!   walked keeps its state and `pc`, not its stack.
//!
//! # Measured (2 shared cores, debug build, `tests/wall.rs` in osprey-cli)
//! - A thread blocked in `read` for 3 s: 93-100% of its life accounted,
//!   100% of it under the C function that called `read`, state `read`.
//! - A thread computing 5 ms and sleeping 5 ms: the profile's split matches
//!   the thread's own measure within a few points on an idle machine; under
//!   contention it moves toward `running` by up to the thread's wake-up
//!   delays (first limit above).
//! - EINTR per 1000 calls of nanosleep, epoll_wait, poll, select and a
//!   timed futex wait: 0 alone, 0 under osprey, 0 under osprey --wall.
//! - Added process CPU at 100 ticks/s, 16 threads a tick: 3-4% of a core
//!   with 10 idle threads, 4-5% with 100, 5-8% with 1000.

pub mod blocked;
pub mod proc;
pub mod sampler;
pub mod thread_state;
pub mod walk;
