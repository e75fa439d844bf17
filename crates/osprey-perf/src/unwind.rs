//! Turning samples into native stacks, after the fact, with the target's
//! CFI tables (`osprey_unwind::unwind` over the copied stack bytes).
//!
//! A walk that stops at code outside every known module (a library
//! `dlopen`ed since the last read of the maps) re-reads the maps, at most
//! once per [`UNKNOWN_RESCAN`], and is retried if the set changed; the maps
//! are also re-read every [`RESCAN`] of sample time, so that unloaded
//! libraries leave. A sample older than the last rebuild is unwound with the
//! newer set: only a library unloaded and replaced in between could misname
//! it.

use std::time::Duration;

use osprey_unwind::{unwind, CopiedStack, ModuleSet, Regs};

use crate::modules::Modules;
use crate::record::{RawSample, UserRegs};

/// Frames per stack, at most.
pub const MAX_FRAMES: usize = 256;
/// Periodic re-read of the maps, in sample time.
pub const RESCAN: Duration = Duration::from_secs(5);
/// Least interval between re-reads caused by unknown code (JIT code is
/// unknown for ever).
pub const UNKNOWN_RESCAN: Duration = Duration::from_millis(200);

/// One unwound sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// The sampled thread.
    pub tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub time: u64,
    /// CPU nanoseconds this sample stands for.
    pub period: u64,
    /// Leaf first: the interrupted pc, then return addresses (name those
    /// at `pc - 1`). Empty when the sample had no user registers.
    pub pcs: Vec<u64>,
    /// The walk did not reach an outermost frame (stack copy too short,
    /// code without CFI, unknown code, [`MAX_FRAMES`] reached).
    pub truncated: bool,
}

/// Unwinds the samples of one process.
pub struct Unwinder {
    modules: Modules,
    /// Sample time of the last re-read of the maps (any cause), and of the
    /// last one caused by unknown code.
    scanned: u64,
    unknown_scanned: Option<u64>,
    frames: Vec<u64>,
}

impl Unwinder {
    /// Reads the modules of `pid` and compiles their tables.
    pub fn new(pid: u32) -> Unwinder {
        Unwinder { modules: Modules::new(pid), scanned: now_ns(), unknown_scanned: None, frames: vec![0; MAX_FRAMES] }
    }

    /// The modules as of the last re-read (for naming the frames).
    pub fn modules(&self) -> &ModuleSet {
        self.modules.set()
    }

    /// Re-reads the target's maps now; true if the modules changed.
    pub fn rescan(&mut self) -> bool {
        self.scanned = now_ns();
        self.modules.rescan()
    }

    /// The native stack of `sample`.
    pub fn unwind(&mut self, sample: &RawSample<'_>) -> Stack {
        if sample.time.saturating_sub(self.scanned) >= RESCAN.as_nanos() as u64 {
            self.rescan();
        }
        let mut stack =
            Stack { tid: sample.tid, time: sample.time, period: sample.period, pcs: Vec::new(), truncated: true };
        let Some(r) = sample.regs else { return stack };
        let regs = Regs { pc: r.ip, sp: r.sp, fp: r.bp };
        let read = |a: u64| sample.read_stack(a);
        let mut walk = unwind(self.modules.set(), regs, read, &mut self.frames);
        if walk.truncated && self.unknown_at(walk.len) && self.may_rescan_for_unknown(sample.time) && self.rescan() {
            walk = unwind(self.modules.set(), regs, read, &mut self.frames);
        }
        stack.pcs.extend_from_slice(&self.frames[..walk.len]);
        stack.truncated = walk.truncated;
        stack
    }

    /// The walk's last frame is in no known module.
    fn unknown_at(&self, len: usize) -> bool {
        let leaf = len == 1;
        len.checked_sub(1)
            .and_then(|i| self.frames.get(i))
            .is_some_and(|&pc| self.modules.set().module_for(if leaf { pc } else { pc.wrapping_sub(1) }).is_none())
    }

    fn may_rescan_for_unknown(&mut self, time: u64) -> bool {
        let due = self.unknown_scanned.is_none_or(|t| time.saturating_sub(t) >= UNKNOWN_RESCAN.as_nanos() as u64);
        if due {
            self.unknown_scanned = Some(time);
        }
        due
    }
}

impl std::fmt::Debug for Unwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unwinder").field("modules", &self.modules.set().modules().len()).finish()
    }
}

impl RawSample<'_> {
    /// The 8 bytes of the sampled thread's stack at `addr`, as an unwinder
    /// reads them: from the copy, or (a leaf's epilogue) from just below
    /// `sp`; `None` outside both or without user registers.
    pub fn read_stack(&self, addr: u64) -> Option<u64> {
        let r = self.regs?;
        below_sp(r, addr).or_else(|| CopiedStack { base: r.sp, bytes: self.stack }.read(addr))
    }
}

/// A read below the sampled stack pointer, which the copy does not hold.
/// CFI asks for one only in a leaf's epilogue after `pop %rbp`: compilers
/// leave rbp's rule as "saved at CFA-16" until the `ret` (LLVM always, GCC
/// for rbp used as a callee-saved register), and the slot is then below sp.
/// The value there is the one just popped, that is, the current rbp.
/// Return addresses are never below sp (the CFA is above it).
fn below_sp(r: UserRegs, addr: u64) -> Option<u64> {
    (addr < r.sp && r.sp - addr <= RED_ZONE).then_some(r.bp)
}

/// The x86_64 ABI's red zone: the most a leaf keeps below its sp.
const RED_ZONE: u64 = 128;

/// `CLOCK_MONOTONIC` now, in nanoseconds: the samples' clock.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}
