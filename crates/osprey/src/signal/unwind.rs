//! Frame-pointer unwinder.
//!
//! Runs inside the sampling handler: no allocation, no locks, no panics (no
//! slice indexing that can fail), no libc. The stack usage is the caller's
//! frame array plus a few registers.
//!
//! # Why it never faults
//! Every load is from `[fp, fp + 16)` with `sp <= fp`, `fp + 16 <= stack_hi`,
//! `fp` 8-byte aligned, and `fp` strictly increasing from frame to frame. All
//! of `[sp, stack_hi)` is mapped: `sp` is the interrupted thread's stack
//! pointer and `stack_hi` the top of the mapping that contains it (learned
//! outside the handler at registration). A garbage frame pointer outside that
//! window ends the walk instead of being dereferenced.
//!
//! # Why it does not record garbage
//! Code built without frame pointers uses `rbp` as an ordinary register; a
//! value that happens to point into the stack passes the checks above and
//! yields "return addresses" that are data (strings, small integers, stack
//! addresses). When the loaded modules' code ranges are known
//! ([`CodeRanges`]), a return address outside them ends the walk, marked
//! truncated.

use super::arch::leaf_return_address;
pub use super::arch::Regs;

/// Result of a walk: `frames[..len]` hold leaf-first addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Frames written.
    pub len: usize,
    /// The chain went on but `frames` was full.
    pub truncated: bool,
}

/// The executable ranges of the loaded modules, sorted and disjoint: which
/// words may be return addresses. Built outside handlers; [`contains`]
/// (a binary search) is signal-safe.
///
/// [`contains`]: CodeRanges::contains
#[derive(Debug, Default)]
pub struct CodeRanges {
    ranges: Box<[(u64, u64)]>,
}

impl CodeRanges {
    /// From `[start, end)` ranges in any order; overlapping or adjacent
    /// ones are merged, so the set is sorted and disjoint.
    pub fn new(mut ranges: Vec<(u64, u64)>) -> CodeRanges {
        ranges.retain(|&(lo, hi)| lo < hi);
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        CodeRanges { ranges: merged.into() }
    }

    /// Signal-safe. Whether `addr` is in one of the ranges.
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        // Disjoint and sorted: only the last range starting at or below `addr` can hold it.
        let i = self.ranges.partition_point(|&(lo, _)| lo <= addr);
        i.checked_sub(1).and_then(|i| self.ranges.get(i)).is_some_and(|&(_, hi)| addr < hi)
    }
}

/// Walks the frame-pointer chain. `frames[0]` is the interrupted pc (the leaf
/// is kept); the rest are return addresses. `stack_lo..stack_hi` is the
/// thread's stack mapping; with `stack_hi == 0` (bounds unknown yet) or `sp`
/// outside the mapping (e.g. on an alternate signal stack) only the leaf is
/// recorded. `is_code(ret)` vets each return address: a `false` ends the
/// walk before it, truncated.
#[inline]
pub fn walk(regs: Regs, stack_lo: u64, stack_hi: u64, frames: &mut [u64], is_code: impl Fn(u64) -> bool) -> Walk {
    let mut len = 0;
    let Some(first) = frames.first_mut() else {
        return Walk { len: 0, truncated: regs.pc != 0 };
    };
    *first = regs.pc;
    len += 1;
    if stack_hi == 0 || regs.sp < stack_lo || regs.sp >= stack_hi {
        return Walk { len, truncated: false };
    }
    let mut fp = regs.fp;
    let mut prev = regs.sp;
    // Leaf interrupted before its frame exists (prologue) or after it is gone
    // (`ret`): its return address sits at the stack pointer and `fp` still
    // belongs to the caller's caller... of the caller. Recover the caller.
    if let Some(ret) = leaf_return_address(regs, stack_hi) {
        if !is_code(ret) {
            return Walk { len, truncated: true };
        }
        match frames.get_mut(len) {
            Some(slot) => *slot = ret,
            None => return Walk { len, truncated: true },
        }
        len += 1;
    }
    loop {
        // Invariant (see module docs): [fp, fp+16) lies in [sp, stack_hi).
        if fp < prev || fp % 8 != 0 || fp.checked_add(16).is_none_or(|end| end > stack_hi) {
            return Walk { len, truncated: false };
        }
        // SAFETY: bounds checked above; the range is mapped stack memory.
        let (next_fp, ret) = unsafe {
            let p = fp as *const u64;
            (core::ptr::read_volatile(p), core::ptr::read_volatile(p.add(1)))
        };
        if ret == 0 {
            return Walk { len, truncated: false };
        }
        if !is_code(ret) {
            return Walk { len, truncated: true };
        }
        match frames.get_mut(len) {
            Some(slot) => *slot = ret,
            None => return Walk { len, truncated: true },
        }
        len += 1;
        if next_fp <= fp {
            return Walk { len, truncated: false };
        }
        prev = fp + 16;
        fp = next_fp;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a fake stack: frames at increasing addresses, each `[next_fp, ret]`.
    fn fake_stack(depth: usize) -> (Vec<u64>, u64, u64) {
        let mut mem = vec![0u64; depth * 4 + 8];
        let base = mem.as_ptr() as u64;
        for i in 0..depth {
            let at = 2 + i * 4;
            let next = if i + 1 < depth { base + ((2 + (i + 1) * 4) * 8) as u64 } else { 0 };
            mem[at] = next;
            mem[at + 1] = 0x1000 + i as u64;
        }
        let hi = base + (mem.len() * 8) as u64;
        (mem, base, hi)
    }

    #[test]
    fn walks_chain_and_keeps_leaf() {
        let (mem, base, hi) = fake_stack(5);
        let mut out = [0u64; 16];
        let w = walk(Regs { pc: 0xabc, fp: base + 16, sp: base }, base, hi, &mut out, |_| true);
        assert_eq!(w, Walk { len: 6, truncated: false });
        assert_eq!(out[..6], [0xabc, 0x1000, 0x1001, 0x1002, 0x1003, 0x1004]);
        drop(mem);
    }

    #[test]
    fn recovers_caller_of_a_leaf_in_its_prologue() {
        let (mut mem, base, hi) = fake_stack(2);
        // sp points at a return address; pc at `push %rbp`.
        mem[0] = 0x7777;
        let code: [u8; 8] = [0x55, 0x48, 0x89, 0xe5, 0xc3, 0x90, 0x90, 0x90];
        let pc = code.as_ptr() as u64;
        let mut out = [0u64; 8];
        let w = walk(Regs { pc, fp: base + 16, sp: base }, base, hi, &mut out, |_| true);
        assert_eq!(out[..w.len], [pc, 0x7777, 0x1000, 0x1001]);
        // At `mov %rsp,%rbp`: the return address is one slot up.
        mem[1] = 0x8888;
        let w = walk(Regs { pc: pc + 1, fp: base + 16, sp: base }, base, hi, &mut out, |_| true);
        assert_eq!(out[..w.len], [pc + 1, 0x8888, 0x1000, 0x1001]);
    }

    #[test]
    fn marks_truncation() {
        let (_mem, base, hi) = fake_stack(10);
        let mut out = [0u64; 4];
        let w = walk(Regs { pc: 1, fp: base + 16, sp: base }, base, hi, &mut out, |_| true);
        assert_eq!(w, Walk { len: 4, truncated: true });
    }

    #[test]
    fn garbage_frame_pointer_stops_the_walk() {
        let (_mem, base, hi) = fake_stack(3);
        let mut out = [0u64; 8];
        for fp in [0, 8, base - 64, hi, hi - 8, base + 17, u64::MAX - 7] {
            let w = walk(Regs { pc: 7, fp, sp: base }, base, hi, &mut out, |_| true);
            assert_eq!(w.len, 1, "fp={fp:#x}");
        }
        // Unknown bounds: leaf only.
        assert_eq!(walk(Regs { pc: 7, fp: base + 16, sp: base }, 0, 0, &mut out, |_| true).len, 1);
    }

    #[test]
    fn a_return_address_outside_the_code_ends_the_walk_truncated() {
        // Return addresses 0x1000..=0x1004; the code holds the first two only.
        let (_mem, base, hi) = fake_stack(5);
        let code = CodeRanges::new(vec![(0x1000, 0x1002), (0x9000, 0x9100)]);
        let mut out = [0u64; 16];
        let w = walk(Regs { pc: 0xabc, fp: base + 16, sp: base }, base, hi, &mut out, |ra| code.contains(ra));
        assert_eq!(w, Walk { len: 3, truncated: true });
        assert_eq!(out[..3], [0xabc, 0x1000, 0x1001]);
        // A recovered caller of a leaf in its prologue is vetted too.
        let (mut mem, base, hi) = fake_stack(2);
        mem[0] = 0x7777;
        let prologue: [u8; 4] = [0x55, 0x48, 0x89, 0xe5];
        let pc = prologue.as_ptr() as u64;
        let w = walk(Regs { pc, fp: base + 16, sp: base }, base, hi, &mut out, |ra| code.contains(ra));
        assert_eq!(w, Walk { len: 1, truncated: true });
    }

    #[test]
    fn code_ranges_contain_their_starts_not_their_ends() {
        // Out of order, one empty, and one inside another (merged).
        let ranges = vec![(0x5000, 0x6000), (0x1000, 0x2000), (0x3000, 0x3000), (0x5100, 0x5200)];
        let code = CodeRanges::new(ranges);
        for (a, inside) in [
            (0xfff, false),
            (0x1000, true),
            (0x1fff, true),
            (0x2000, false),
            (0x3000, false),
            (0x5000, true),
            (0x5800, true),
            (0x6000, false),
        ] {
            assert_eq!(code.contains(a), inside, "{a:#x}");
        }
        assert!(!CodeRanges::default().contains(0x1000));
    }
}
