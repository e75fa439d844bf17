//! The agent side of the interposed exec family (`exec_shim.c`): before the
//! real call, no osprey signal may be pending on or coming to the calling
//! thread; after a failed call, its clock comes back. See
//! `osprey::internals::exec_guard`.

use osprey::internals::exec_guard::{self, ExecPrep};

/// Called by the shim before the real exec call; returns what to pass to
/// [`osprey_exec_failed`].
#[no_mangle]
pub extern "C" fn osprey_exec_prepare() -> libc::c_int {
    match exec_guard::prepare() {
        ExecPrep::Nothing => 0,
        ExecPrep::ClockStopped => 1,
    }
}

/// Called by the shim after the real exec call returned (it failed);
/// leaves `errno` as the failed call set it.
#[no_mangle]
pub extern "C" fn osprey_exec_failed(prep: libc::c_int) {
    exec_guard::exec_failed(if prep == 1 { ExecPrep::ClockStopped } else { ExecPrep::Nothing });
}
