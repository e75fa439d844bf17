//! The CFI walk of a blocked thread's copied stack, starting without a frame
//! pointer.
//!
//! `/proc/self/task/TID/syscall` gives `sp` and `pc`, never `rbp`. The walk
//! follows the same tables and rules as `osprey_unwind::unwind`; the frame
//! pointer is unknown until a frame's CFI says where the caller's `rbp` was
//! saved. When a frame's CFA is `rbp`-based while `rbp` is still unknown, it
//! is recovered from the copy: the lowest CFA candidate above `sp` whose
//! return-address slot holds an address that follows a call instruction in
//! code with CFI (a caller that can itself be walked), not at a function's
//! entry. (The saved-`rbp` slot is not checked: a caller without frame
//! pointers leaves any value there.) No candidate within [`RECOVER_SCAN`] bytes ends the walk as truncated.

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
/// return addresses. `code(a)` gives the 8 bytes of code that end at `a`
/// (`None` when unreadable), to check that a recovered return address
/// follows a call.
pub fn walk(
    set: &ModuleSet,
    pc: u64,
    sp: u64,
    stack: &CopiedStack<'_>,
    code: &mut dyn FnMut(u64) -> Option<[u8; 8]>,
    frames: &mut [u64],
) -> Walked {
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
                    let c = recover_cfa(set, sp, stack, code);
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

/// The lowest plausible CFA above `sp` for a frame whose CFA is `rbp`-based
/// while `rbp` is unknown (see the module docs), or `None`.
fn recover_cfa(
    set: &ModuleSet,
    sp: u64,
    stack: &CopiedStack<'_>,
    code: &mut dyn FnMut(u64) -> Option<[u8; 8]>,
) -> Option<u64> {
    let first = sp.checked_add(8)?.next_multiple_of(8);
    let last = sp.checked_add(RECOVER_SCAN)?;
    let mut cfa = first;
    while cfa <= last {
        let ra = stack.read(cfa - 8)?;
        if returns_into_cfi(set, ra) && code(ra).is_some_and(follows_call) {
            return Some(cfa);
        }
        cfa += 8;
    }
    None
}

/// `ra` is a return address into code with CFI the walk can continue from,
/// and not a function's entry: a call that returns is never its function's
/// last instruction, and an ABI-conforming call site has moved `rsp` off
/// its entry value, so the rule at a real return address is never the
/// entry rule `CFA = rsp + 8` (a function pointer that follows a `noreturn`
/// call, such as `main`'s address kept by `__libc_start_main`, is).
fn returns_into_cfi(set: &ModuleSet, ra: u64) -> bool {
    let entry = |r: Rule| r.kind() == Kind::Rsp && r.cfa_offset() == 8;
    ra > 1
        && set.rule_for(ra - 1).is_some_and(|r| r.kind() != Kind::Stop)
        && set.rule_for(ra).is_some_and(|r| r.kind() != Kind::Stop && !entry(r))
}

/// The 8 bytes before a return address end with a call: `E8 rel32`, or
/// `FF /2` (an indirect call through a register or memory, a REX prefix
/// before it or not) whose length ends exactly at the return address.
pub fn follows_call(before: [u8; 8]) -> bool {
    if before[3] == 0xE8 {
        return true;
    }
    (0..7).any(|op| {
        let (modrm, sib) = (before[op + 1], before.get(op + 2).copied().unwrap_or(0));
        before[op] == 0xFF && (modrm >> 3) & 7 == 2 && op + call_len(modrm, sib) == 8
    })
}

/// Length of an `FF /2` call (opcode, ModRM, SIB, displacement) from its
/// ModRM and SIB bytes.
fn call_len(modrm: u8, sib: u8) -> usize {
    let (md, rm) = (modrm >> 6, modrm & 7);
    if md == 3 {
        return 2;
    }
    let has_sib = rm == 4;
    let disp = match md {
        0 if rm == 5 || (has_sib && sib & 7 == 5) => 4,
        0 => 0,
        1 => 1,
        _ => 4,
    };
    2 + usize::from(has_sib) + disp
}

#[cfg(test)]
mod tests {
    use super::follows_call;

    fn ending(code: &[u8]) -> [u8; 8] {
        let mut b = [0x90u8; 8];
        b[8 - code.len()..].copy_from_slice(code);
        b
    }

    #[test]
    fn call_forms() {
        assert!(follows_call(ending(&[0xE8, 1, 2, 3, 4]))); // call rel32
        assert!(follows_call(ending(&[0xFF, 0xD0]))); // call *%rax
        assert!(follows_call(ending(&[0x41, 0xFF, 0xD3]))); // call *%r11
        assert!(follows_call(ending(&[0xFF, 0x15, 1, 2, 3, 4]))); // call *rel(%rip)
        assert!(follows_call(ending(&[0xFF, 0x50, 0x08]))); // call *8(%rax)
        assert!(follows_call(ending(&[0xFF, 0x14, 0x25, 1, 2, 3, 4]))); // call *abs32
        assert!(follows_call(ending(&[0xFF, 0x54, 0x24, 0x08]))); // call *8(%rsp)
        assert!(!follows_call(ending(&[0x48, 0x89, 0xE5]))); // mov %rsp,%rbp
        assert!(!follows_call(ending(&[0xFF, 0xE0]))); // jmp *%rax
        assert!(!follows_call([0x90; 8]));
    }
}
