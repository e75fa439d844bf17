//! x86-64 pieces of the signal path: registers from a `ucontext_t`,
//! prologue/epilogue decoding for a leaf without a frame yet, and the raw
//! `syscall` instruction. Signal-safe: no allocation, no libc, no panics.

use core::arch::asm;

/// Registers of the interrupted context.
#[derive(Clone, Copy, Debug)]
pub struct Regs {
    /// Program counter.
    pub pc: u64,
    /// Frame pointer (`rbp`).
    pub fp: u64,
    /// Stack pointer.
    pub sp: u64,
}

impl Regs {
    /// Reads pc/fp/sp from a signal handler's `ucontext_t`.
    ///
    /// # Safety
    /// `uc` must be the third argument of an `SA_SIGINFO` handler.
    #[inline(always)]
    pub unsafe fn from_ucontext(uc: *const libc::c_void) -> Regs {
        // SAFETY: the caller's contract: `uc` is a valid ucontext_t.
        let uc = unsafe { &*(uc as *const libc::ucontext_t) };
        let g = &uc.uc_mcontext.gregs;
        Regs {
            pc: g[libc::REG_RIP as usize] as u64,
            fp: g[libc::REG_RBP as usize] as u64,
            sp: g[libc::REG_RSP as usize] as u64,
        }
    }
}

/// `si_code` of a signal sent by a POSIX timer.
const SI_TIMER: i32 = -2;

/// The overrun count of a POSIX timer's signal (expiries folded into this
/// one), 0 for any other signal. x86-64 `siginfo_t`: `si_code` at byte 8, the
/// timer's `si_overrun` at byte 20.
///
/// # Safety
/// `info` is null or the second argument of an `SA_SIGINFO` handler.
#[inline(always)]
pub unsafe fn timer_overrun(info: *const libc::siginfo_t) -> u32 {
    if info.is_null() {
        return 0;
    }
    let p = info as *const u8;
    // SAFETY: `siginfo_t` is 128 bytes; both reads are inside it.
    let (code, overrun) = unsafe { ((p.add(8) as *const i32).read(), (p.add(20) as *const i32).read()) };
    if code == SI_TIMER {
        overrun.max(0) as u32
    } else {
        0
    }
}

/// Where the leaf's return address is when `pc` is at a frame-less point of
/// the leaf: at `endbr64`/`push %rbp` (entry) or `ret`: `[sp]`; at
/// `mov %rsp,%rbp` right after `push %rbp`: `[sp + 8]`. Code bytes are read
/// only within the page of `pc` (the page is mapped: the thread executes it).
#[inline]
pub fn leaf_return_address(regs: Regs, stack_hi: u64) -> Option<u64> {
    let pc = regs.pc;
    if pc < 4096 {
        return None;
    }
    let page_left = 4096 - (pc % 4096); // bytes readable from pc on
                                        // SAFETY: reads within the page containing pc (see above).
    let byte = |off: u64| -> u8 { unsafe { core::ptr::read_volatile((pc + off) as *const u8) } };
    let b0 = byte(0);
    let at_entry =
        b0 == 0x55 || (page_left >= 4 && b0 == 0xf3 && byte(1) == 0x0f && byte(2) == 0x1e && byte(3) == 0xfa);
    let slot = if at_entry || b0 == 0xc3 {
        regs.sp
    } else if page_left >= 3 && b0 == 0x48 && byte(1) == 0x89 && byte(2) == 0xe5 && pc % 4096 != 0 && {
        // SAFETY: pc - 1 is in the same page (pc is not page-aligned).
        unsafe { core::ptr::read_volatile((pc - 1) as *const u8) == 0x55 }
    } {
        regs.sp + 8
    } else {
        return None;
    };
    if slot % 8 != 0 || slot.checked_add(8).is_none_or(|end| end > stack_hi) {
        return None;
    }
    // SAFETY: slot lies in [sp, stack_hi), checked by the caller and above.
    let ret = unsafe { core::ptr::read_volatile(slot as *const u64) };
    (ret != 0).then_some(ret)
}

/// `syscall` with no argument; returns the raw result (a negative errno on failure).
///
/// # Safety
/// `n` must be a system call that takes no arguments and touches no memory.
#[inline(always)]
pub unsafe fn raw_syscall0(n: libc::c_long) -> usize {
    let ret: usize;
    // SAFETY: the `syscall` instruction clobbers rcx and r11 only; the caller vouches for `n`.
    unsafe {
        asm!("syscall", inlateout("rax") n as usize => ret, out("rcx") _, out("r11") _,
         options(nostack, preserves_flags));
    }
    ret
}

/// `syscall` with three integer arguments; returns the raw result.
///
/// # Safety
/// `n` must take three integer arguments and touch no memory through them.
#[inline(always)]
pub unsafe fn raw_syscall3(n: libc::c_long, a: usize, b: usize, c: usize) -> usize {
    let ret: usize;
    // SAFETY: the `syscall` instruction clobbers rcx and r11 only; the caller vouches for `n`.
    unsafe {
        asm!("syscall", inlateout("rax") n as usize => ret, in("rdi") a, in("rsi") b, in("rdx") c,
         out("rcx") _, out("r11") _, options(nostack, preserves_flags));
    }
    ret
}

/// `syscall` with four integer arguments; returns the raw result.
///
/// # Safety
/// `n` and its arguments must make a valid system call; memory it writes
/// must be the caller's.
#[inline(always)]
pub unsafe fn raw_syscall4(n: libc::c_long, a: usize, b: usize, c: usize, d: usize) -> usize {
    let ret: usize;
    // SAFETY: the `syscall` instruction clobbers rcx and r11 only; the caller vouches for `n`.
    unsafe {
        asm!("syscall", inlateout("rax") n as usize => ret, in("rdi") a, in("rsi") b, in("rdx") c, in("r10") d,
         out("rcx") _, out("r11") _, options(nostack, preserves_flags));
    }
    ret
}

/// The calling function's own registers: `pc` is an address inside it, `sp`
/// and `fp` its stack and frame pointers at that address (read by one `asm`
/// block, so the CFI row of `pc` describes that `sp`). Starting a walk from
/// here lists the caller's frames after it. Must be inlined into the
/// function whose frame is meant: it is `#[inline(always)]`.
#[inline(always)]
pub fn current_regs() -> Regs {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads registers only.
    unsafe {
        asm!("lea {pc}, [rip]", "mov {sp}, rsp", "mov {fp}, rbp",
             pc = out(reg) pc, sp = out(reg) sp, fp = out(reg) fp, options(nomem, nostack, preserves_flags));
    }
    Regs { pc, fp, sp }
}
