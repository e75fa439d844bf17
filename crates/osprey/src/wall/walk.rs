//! The CFI walk of a blocked thread's copied stack, starting without a frame
//! pointer.
//!
//! `/proc/self/task/TID/syscall` gives `sp` and `pc`, never `rbp`. The walk
//! follows the same tables and rules as `osprey_unwind::unwind`; the frame
//! pointer is unknown until a frame's CFI says where the caller's `rbp` was
//! saved. When a frame's CFA is `rbp`-based while `rbp` is still unknown, it
//! is recovered from the copy: the lowest CFA candidate above `sp` whose
//! return-address slot holds an address with CFI (a caller that can itself
//! be walked) and, when the rule saves `rbp`, whose saved-`rbp` slot is 0 or
//! points higher up the stack. No candidate within [`RECOVER_SCAN`] bytes
//! ends the walk as truncated.

use osprey_unwind::{CopiedStack, Kind, ModuleSet, Rule};

/// How far above `sp` a frame's CFA is searched for when `rbp` is unknown.
pub const RECOVER_SCAN: u64 = 16 << 10;

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walked {
    /// Frames written, leaf first.
    pub len: usize,
    /// The walk did not reach an outermost frame.
    pub truncated: bool,
    /// Frame pointers recovered by scanning.
    pub recovered: u32,
}

/// Walks from `pc`/`sp` over `stack` (the copy of `[sp, top)`), writing
/// leaf-first addresses into `frames`. `frames[0]` is `pc`; the others are
/// return addresses.
pub fn walk(set: &ModuleSet, pc: u64, sp: u64, stack: &CopiedStack<'_>, frames: &mut [u64]) -> Walked {
    let (mut pc, mut sp, mut fp) = (pc, sp, None::<u64>);
    let mut leaf = true;
    let mut module = usize::MAX;
    let mut len = 0;
    let mut recovered = 0;
    let end = |len, truncated, recovered| Walked { len, truncated, recovered };
    loop {
        let Some(slot) = frames.get_mut(len) else { return end(len, true, recovered) };
        *slot = pc;
        len += 1;
        let at = if leaf { pc } else { pc.wrapping_sub(1) };
        let Some(rule) = set.rule_near(at, &mut module) else { return end(len, true, recovered) };
        let cfa = match rule.kind() {
            Kind::Rsp => sp.checked_add(rule.cfa_offset()),
            Kind::Rbp => match fp {
                Some(f) => f.checked_add(rule.cfa_offset()),
                None => {
                    let c = recover_cfa(set, sp, rule, stack);
                    recovered += u32::from(c.is_some());
                    c
                }
            },
            Kind::End => return end(len, false, recovered),
            Kind::Stop => return end(len, true, recovered),
        };
        let Some(cfa) = cfa.filter(|&c| c > sp) else { return end(len, true, recovered) };
        let Some(ra) = stack.read(cfa.wrapping_sub(8)) else { return end(len, true, recovered) };
        if let Some(below) = rule.rbp_below_cfa() {
            match cfa.checked_sub(below).and_then(|a| stack.read(a)) {
                Some(v) => fp = Some(v),
                None => return end(len, true, recovered),
            }
        }
        if ra == 0 {
            return end(len, false, recovered);
        }
        pc = ra;
        sp = cfa;
        leaf = false;
    }
}

/// The lowest plausible CFA above `sp` for an `rbp`-based `rule` (see the
/// module docs), or `None`.
fn recover_cfa(set: &ModuleSet, sp: u64, rule: Rule, stack: &CopiedStack<'_>) -> Option<u64> {
    let first = sp.checked_add(8)?.next_multiple_of(8);
    let last = sp.checked_add(RECOVER_SCAN)?;
    let mut cfa = first;
    while cfa <= last {
        let ra = stack.read(cfa - 8)?;
        if returns_into_cfi(set, ra) && saved_rbp_plausible(rule, cfa, stack) {
            return Some(cfa);
        }
        cfa += 8;
    }
    None
}

/// `ra` is a return address into code with CFI the walk can continue from.
fn returns_into_cfi(set: &ModuleSet, ra: u64) -> bool {
    ra > 1 && set.rule_for(ra - 1).is_some_and(|r| r.kind() != Kind::Stop)
}

/// When `rule` saves the caller's `rbp`, the saved value is 0 (outermost) or
/// a higher stack address.
fn saved_rbp_plausible(rule: Rule, cfa: u64, stack: &CopiedStack<'_>) -> bool {
    let Some(below) = rule.rbp_below_cfa() else { return true };
    match cfa.checked_sub(below).and_then(|a| stack.read(a)) {
        Some(0) => true,
        Some(v) => v >= cfa && stack.read(v).is_some(),
        None => false,
    }
}
