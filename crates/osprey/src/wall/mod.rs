//! Wall-time sampling: every thread, running or blocked, accounted in wall
//! time, with the state it was in ([`state`]).
//!
//! Nothing here runs on the signal path.

pub mod state;
