//! The CFI unwinder.
//!
//! **Signal-safe module.** No allocation, no lock, no panic (no indexing that
//! can fail, no unwrap, no overflowing arithmetic: only `checked_*` and
//! `wrapping_*`), no syscall, no libc. It reads only the [`ModuleSet`]'s
//! tables and memory through the caller's `read` closure, which bounds what
//! may be read (the thread's stack, or a copied stack out of process).
//!
//! Stack use: [`unwind`] keeps five words of state (pc, sp, fp, len, leaf)
//! plus the module hint and the closure's captures, and no arrays; it calls
//! nothing that is not inlined. Entering the module set, a 32-deep unwind and
//! leaving use 120 bytes of stack below the caller in a release build
//! (`benches/unwind.rs`, painted-stack measurement). The frames array is the
//! caller's.
//!
//! The walk ends with `truncated = false` only at an outermost frame (CFI says
//! the return address is undefined, or it is 0). It ends with
//! `truncated = true` when `frames` is full, when a pc is in no module (JIT,
//! anonymous code, garbage), when the CFI cannot be followed (PLT stubs,
//! `__restore_rt`, no FDE), when a read fails, or when the stack pointer does
//! not grow (a cycle or garbage).

use crate::modules::ModuleSet;
use crate::table::Kind;

/// Registers of the interrupted context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    /// Program counter (RIP).
    pub pc: u64,
    /// Stack pointer (RSP).
    pub sp: u64,
    /// Frame pointer (RBP).
    pub fp: u64,
}

/// Result of a walk: `frames[..len]` hold leaf-first addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Number of frames written.
    pub len: usize,
    /// The walk did not reach an outermost frame.
    pub truncated: bool,
}

/// Unwinds from `regs`. `frames[0]` is the interrupted pc; the others are
/// return addresses (symbolize them at `addr - 1`). `read(addr)` returns the
/// 8-byte word at `addr` or `None` if that address may not be read.
#[inline]
pub fn unwind<F: FnMut(u64) -> Option<u64>>(set: &ModuleSet, regs: Regs, mut read: F, frames: &mut [u64]) -> Walk {
    let Regs { mut pc, mut sp, mut fp } = regs;
    let mut len = 0usize;
    // Only the leaf's pc is exact: a return address is looked up at pc - 1,
    // inside the call instruction (which may be a function's last).
    let mut leaf = true;
    let mut module = usize::MAX;
    let truncated = |len| Walk { len, truncated: true };
    loop {
        let Some(slot) = frames.get_mut(len) else {
            return truncated(len);
        };
        *slot = pc;
        len += 1;
        let at = if leaf { pc } else { pc.wrapping_sub(1) };
        let Some(rule) = set.rule_near(at, &mut module) else {
            return truncated(len);
        };
        let base = match rule.kind() {
            Kind::Rsp => sp,
            Kind::Rbp => fp,
            Kind::End => return Walk { len, truncated: false },
            Kind::Stop => return truncated(len),
        };
        let Some(cfa) = base.checked_add(rule.cfa_offset()) else {
            return truncated(len);
        };
        // The caller's frame is above ours: the stack pointer must grow.
        if cfa <= sp {
            return truncated(len);
        }
        let Some(ra) = read(cfa.wrapping_sub(8)) else {
            return truncated(len);
        };
        if let Some(below) = rule.rbp_below_cfa() {
            match cfa.checked_sub(below).and_then(&mut read) {
                Some(v) => fp = v,
                None => return truncated(len),
            }
        }
        if ra == 0 {
            return Walk { len, truncated: false };
        }
        pc = ra;
        sp = cfa;
        leaf = false;
    }
}
