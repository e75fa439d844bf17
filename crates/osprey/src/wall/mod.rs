//! Wall-time sampling: every thread, running or blocked, accounted in wall
//! time, with the state it was in ([`state`]).
//!
//! Nothing here runs on the signal path.
//!
//! | file | what |
//! |---|---|
//! | `state.rs` | the state a wall sample carries, its label |
//! | `sampler.rs` | the tick: which threads, what weight, where samples go |
//! | `proc.rs` | a thread's state, `sp` and `pc` from `/proc/self/task/TID/syscall` |
//! | `blocked.rs` | one blocked thread's sample: stack copy, walk, consistency check |
//! | `walk.rs` | the CFI walk of a copied stack that starts without `rbp` |

pub mod blocked;
pub mod proc;
pub mod sampler;
pub mod state;
pub mod walk;
