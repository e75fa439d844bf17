//! One wall sample of a blocked thread, taken from the collector thread
//! without signalling it: its `sp`/`pc` from `/proc` ([`super::proc`]), a
//! copy of its stack from `sp` up, the CFI walk of that copy
//! ([`super::walk`]), then `/proc` again: the walk of a thread that moved
//! meanwhile (woke up, even briefly) is discarded.
//!
//! The copy is made with `process_vm_readv` on this very process, one
//! iovec per page, so an unmapped page ends the copy cleanly (the kernel
//! stops at the first page it cannot read) instead of faulting.

use super::proc::{ReadError, Syscall, SyscallFile};
use super::walk::{walk, Walked};
use crate::signal::STATE;
use osprey_unwind::{CopiedStack, ModuleSet, Shared};
use std::sync::atomic::Ordering::Acquire;

/// Most bytes of a blocked thread's stack copied per sample.
pub const MAX_COPY: usize = 64 << 10;

const PAGE: u64 = 4096;

/// The outcome of one attempt.
#[derive(Debug)]
pub enum Blocked {
    /// A consistent sample: `frames[..walk.len]` of the caller's buffer.
    Sample {
        /// The walk.
        walk: Walked,
        /// System call the thread waits in, or -1.
        nr: i64,
    },
    /// The thread runs: it is sampled by its own CPU clock instead.
    Running,
    /// Its registers changed between the two reads: the walk is not to be
    /// trusted; the state and `pc` of the first read are (they were read
    /// together, at the tick).
    Inconsistent {
        /// System call the thread waited in, or -1.
        nr: i64,
        /// Its `pc` then.
        pc: u64,
    },
    /// Its stack could not be read at `sp`.
    Unreadable,
}

/// Reusable buffers of the collector's wall sampler.
pub struct Buffers {
    stack: Vec<u8>,
    /// Frames of the last sample, leaf first.
    pub frames: Vec<u64>,
}

impl Buffers {
    /// Buffers for stacks of up to `max_frames` frames.
    pub fn new(max_frames: usize) -> Buffers {
        Buffers { stack: vec![0; MAX_COPY], frames: vec![0; max_frames.max(1)] }
    }
}

/// Samples thread `tid`, whose stack is `[stack_lo, stack_hi)` (0, 0 when
/// unknown). Never signals it.
pub fn sample(tid: i32, stack_lo: u64, stack_hi: u64, buf: &mut Buffers) -> Result<Blocked, ReadError> {
    let file = SyscallFile::open(tid)?;
    let first = file.read()?;
    let Syscall::Blocked { nr, sp, pc } = first else { return Ok(Blocked::Running) };
    let top = if stack_hi != 0 && (stack_lo..stack_hi).contains(&sp) {
        stack_hi.min(sp.saturating_add(MAX_COPY as u64))
    } else {
        sp.saturating_add(MAX_COPY as u64)
    };
    let copied = copy(sp, top, &mut buf.stack).map_err(ReadError::Unsupported)?;
    if copied < 8 {
        return Ok(Blocked::Unreadable);
    }
    let stack = CopiedStack { base: sp, bytes: buf.stack.get(..copied).unwrap_or(&[]) };
    let walked = unwind(pc, sp, &stack, &mut buf.frames);
    if file.read()? != first {
        return Ok(Blocked::Inconsistent { nr, pc });
    }
    Ok(Blocked::Sample { walk: walked, nr })
}

/// Walks with the published tables; leaf only when there are none yet (or
/// publications raced the read).
fn unwind(pc: u64, sp: u64, stack: &CopiedStack<'_>, frames: &mut [u64]) -> Walked {
    // SAFETY: published by the agent and never freed (see `HandlerState::modules`).
    let shared: Option<&Shared<ModuleSet>> = unsafe { STATE.modules.load(Acquire).as_ref() };
    let leaf_only = |frames: &mut [u64]| match frames.first_mut() {
        Some(f) => {
            *f = pc;
            Walked { len: 1, truncated: true, recovered: 0 }
        }
        None => Walked { len: 0, truncated: true, recovered: 0 },
    };
    match shared {
        Some(s) => match s.read(|set| walk(set, pc, sp, stack, &mut code_before, frames)) {
            Some(w) => w,
            None => leaf_only(frames),
        },
        None => leaf_only(frames),
    }
}

/// The 8 bytes of this process's memory that end at `a` (code: a module
/// may be unloaded meanwhile, so it is read with `process_vm_readv`).
fn code_before(a: u64) -> Option<[u8; 8]> {
    let mut b = [0u8; 8];
    let local = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 8 };
    let remote = libc::iovec { iov_base: a.checked_sub(8)? as usize as *mut libc::c_void, iov_len: 8 };
    // SAFETY: `local` describes `b`; the remote range is only read, by the
    // kernel, which fails cleanly when it is not mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == 8).then_some(b)
}

/// Copies `[from, to)` of this process's memory into `out`, page by page,
/// up to the first page that cannot be read; returns the bytes copied.
/// Errors only when the call itself is refused (ENOSYS, EPERM).
pub fn copy(from: u64, to: u64, out: &mut [u8]) -> std::io::Result<usize> {
    let to = to.min(from.saturating_add(out.len() as u64));
    if to <= from {
        return Ok(0);
    }
    let mut remote: Vec<libc::iovec> = Vec::with_capacity(MAX_COPY / PAGE as usize + 2);
    let mut at = from;
    while at < to {
        let next = ((at / PAGE) + 1).saturating_mul(PAGE).min(to);
        remote.push(libc::iovec { iov_base: at as usize as *mut libc::c_void, iov_len: (next - at) as usize });
        at = next;
    }
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: (to - from) as usize };
    // SAFETY: `local` describes the start of `out`, which we own mutably and
    // is at least `to - from` bytes long; the remote ranges are only read,
    // by the kernel, which fails cleanly on unmapped pages.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), remote.len() as _, 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EFAULT | libc::ESRCH | libc::ENOMEM) => Ok(0),
            _ => Err(e),
        };
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_stops_at_an_unreadable_page() {
        // SAFETY: a fresh anonymous mapping of three pages; the last is made
        // unreadable. (Unmapped, it could be mapped again by another test
        // running meanwhile in this process, and read.)
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                3 * PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as u64;
        // SAFETY: protecting the third page of the mapping above.
        unsafe { libc::mprotect((base + 2 * PAGE) as *mut libc::c_void, PAGE as usize, libc::PROT_NONE) };
        // SAFETY: writing inside the first two (mapped) pages.
        unsafe { ((base + 104) as *mut u64).write(0x1234) };
        let mut out = vec![0u8; 4 * PAGE as usize];
        let n = copy(base + 96, base + 3 * PAGE, &mut out).unwrap();
        assert_eq!(n as u64, 2 * PAGE - 96);
        let stack = CopiedStack { base: base + 96, bytes: &out[..n] };
        assert_eq!(stack.read(base + 104), Some(0x1234));
        assert_eq!(stack.read(base + 2 * PAGE), None);
        assert_eq!(copy(base + 2 * PAGE, base + 3 * PAGE, &mut out).unwrap(), 0);
        // SAFETY: unmapping the mapping.
        unsafe { libc::munmap(base as *mut libc::c_void, 3 * PAGE as usize) };
    }
}
