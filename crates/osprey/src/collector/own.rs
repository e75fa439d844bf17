//! osprey's own CPU in this process, reported in each profile under
//! [`super::FRAME_AGENT`] so that a profile accounts for all the CPU of its
//! process, the profiler's share included: the CPU of osprey's threads
//! (the collector, uploads) and of the setup osprey
//! did on the program's threads before their clocks ran (agent start, the
//! child side of `fork`).

use crate::cpu_clock::thread_cpu_ns;
use crate::threads::internal_tids;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Setup CPU spent on program threads, not taken yet.
static SETUP_NS: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the calling (program) thread and counts the CPU it used as
/// osprey's own.
pub(crate) fn setup<R>(f: impl FnOnce() -> R) -> R {
    let me = crate::signal::sys::gettid();
    let before = thread_cpu_ns(me).unwrap_or(0);
    let r = f();
    SETUP_NS.fetch_add(thread_cpu_ns(me).unwrap_or(before).saturating_sub(before), Relaxed);
    r
}

/// In a forked child: the parent's untaken setup CPU is not the child's.
pub(crate) fn forget_inherited() {
    SETUP_NS.store(0, Relaxed);
}

/// Per internal thread, its CPU at the last [`OwnCpu::take`].
#[derive(Default)]
pub(crate) struct OwnCpu {
    last: HashMap<i32, u64>,
    /// A program thread doing the collector's work (a stop's last
    /// profile), and its CPU when it began or was last taken.
    here: Option<(i32, u64)>,
}

impl OwnCpu {
    /// Also counts the calling thread's CPU from now on: it runs the
    /// collector's work.
    pub fn with_current() -> OwnCpu {
        let me = crate::signal::sys::gettid();
        OwnCpu { last: HashMap::new(), here: thread_cpu_ns(me).map(|cpu| (me, cpu)) }
    }

    /// osprey's CPU since the last call (a thread first seen: all of it).
    pub fn take(&mut self) -> u64 {
        let mut total = SETUP_NS.swap(0, Relaxed);
        if let Some((tid, at)) = &mut self.here {
            let now = thread_cpu_ns(*tid).unwrap_or(*at);
            total += now.saturating_sub(*at);
            *at = now;
        }
        let mut now = HashMap::new();
        for tid in internal_tids() {
            let Some(cpu) = thread_cpu_ns(tid) else { continue };
            total += cpu.saturating_sub(self.last.get(&tid).copied().unwrap_or(0));
            now.insert(tid, cpu);
        }
        self.last = now;
        total
    }
}
