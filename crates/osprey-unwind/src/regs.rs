//! Registers from a signal handler's `ucontext_t`, and a bounded stack reader.
//!
//! **Signal-safe module**: reads a struct and memory the caller vouches for;
//! no libc call.

use crate::unwind::Regs;

impl Regs {
    /// Reads pc/sp/fp from a signal handler's `ucontext_t`.
    ///
    /// # Safety
    /// `uc` must be the third argument of an `SA_SIGINFO` handler (x86_64).
    #[inline(always)]
    pub unsafe fn from_ucontext(uc: *const libc::c_void) -> Regs {
        // SAFETY: the caller passes the kernel-provided ucontext_t.
        let g = unsafe { &(*(uc as *const libc::ucontext_t)).uc_mcontext.gregs };
        let reg = |i: libc::c_int| g.get(i as usize).map_or(0, |&v| v as u64);
        Regs { pc: reg(libc::REG_RIP), sp: reg(libc::REG_RSP), fp: reg(libc::REG_RBP) }
    }
}

/// Reads 8-byte words inside `[lo, hi)`: the closure the unwinder gets when
/// walking the live stack of the interrupted thread.
#[derive(Clone, Copy, Debug)]
pub struct StackReader {
    /// Lowest readable address.
    pub lo: u64,
    /// One past the highest readable address.
    pub hi: u64,
}

impl StackReader {
    /// # Safety
    /// All of `[lo, hi)` must stay mapped and readable while the reader is used
    /// (e.g. the current thread's stack mapping, from its sp to its top).
    pub unsafe fn new(lo: u64, hi: u64) -> StackReader {
        StackReader { lo, hi }
    }

    /// The word at `addr`, if `addr` is 8-byte aligned and `[addr, addr+8)` is
    /// inside the window.
    #[inline(always)]
    pub fn read(&self, addr: u64) -> Option<u64> {
        if addr % 8 != 0 || addr < self.lo || addr.checked_add(8)? > self.hi {
            return None;
        }
        // SAFETY: `[addr, addr + 8)` lies in `[lo, hi)`, which `new`'s caller
        // guarantees mapped; aligned. Volatile: the memory is another frame's.
        Some(unsafe { std::ptr::read_volatile(addr as *const u64) })
    }
}

/// A copy of a stack taken elsewhere (out of process): `bytes` held the memory
/// at `[base, base + bytes.len())`.
#[derive(Clone, Copy, Debug)]
pub struct CopiedStack<'a> {
    /// The address `bytes[0]` was copied from.
    pub base: u64,
    /// The copy.
    pub bytes: &'a [u8],
}

impl CopiedStack<'_> {
    /// The little-endian word copied from `addr`, if all 8 bytes of it were.
    #[inline]
    pub fn read(&self, addr: u64) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let b = self.bytes.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}
