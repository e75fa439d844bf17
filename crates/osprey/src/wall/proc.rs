//! What a thread is doing, from `/proc/self/task/TID/syscall`, without
//! stopping or signalling it.
//!
//! The kernel prints `running` for a thread on a CPU or runnable, `nr a1 ..
//! a6 sp pc` for one blocked in system call `nr`, and `-1 sp pc` for one
//! blocked outside a system call (a page fault, a stop). `sp` and `pc` are
//! the thread's user registers at its kernel entry.
//!
//! The file is opened `O_CLOEXEC` on a descriptor of ours, held for one
//! sample and closed without checking the result: the program may close
//! descriptors at any time, and a failed close of ours must not become its
//! problem. (A descriptor the program closed and reused meanwhile would be
//! read with `pread`, never written, and closed by us: the program's own
//! close-then-reuse race, as with any library's descriptor.)

use std::io;

/// A thread's system-call state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syscall {
    /// On a CPU or runnable.
    Running,
    /// Blocked: in system call `nr`, or outside one when `nr` is -1.
    Blocked {
        /// System call number, or -1.
        nr: i64,
        /// User stack pointer.
        sp: u64,
        /// User program counter (after the `syscall` instruction).
        pc: u64,
    },
}

/// Why a thread's state could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The thread is gone (or its file was unreadable as it exited): skip it.
    Gone,
    /// No descriptor left now: try again at a later tick.
    Transient(io::Error),
    /// This kernel or sandbox does not give the state (no such file,
    /// permission denied): wall sampling of blocked threads cannot work.
    Unsupported(io::Error),
}

/// Reads the state of thread `tid` of this process.
pub fn read_syscall(tid: i32) -> Result<Syscall, ReadError> {
    SyscallFile::open(tid)?.read()
}

/// `/proc/self/task/TID/syscall`, open: read again (from offset 0, which
/// makes the kernel print it anew) without a second path lookup. Closed on
/// drop.
pub struct SyscallFile {
    fd: i32,
    tid: i32,
}

impl SyscallFile {
    /// Opens the file of thread `tid`.
    pub fn open(tid: i32) -> Result<SyscallFile, ReadError> {
        let mut path = [0u8; 48];
        let p = format_path(&mut path, tid);
        // SAFETY: `p` is NUL-terminated.
        let fd = unsafe { libc::open(p.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(classify(io::Error::last_os_error(), tid));
        }
        Ok(SyscallFile { fd, tid })
    }

    /// The thread's state now.
    pub fn read(&self) -> Result<Syscall, ReadError> {
        let mut buf = [0u8; 256];
        // SAFETY: our own descriptor and a buffer of the stated length.
        let n = unsafe { libc::pread(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(classify(io::Error::last_os_error(), self.tid));
        }
        parse(buf.get(..n as usize).unwrap_or(&[])).ok_or(ReadError::Gone)
    }
}

impl Drop for SyscallFile {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor `open` returned; a failure (EBADF:
        // the program closed it meanwhile) is ignored.
        unsafe { libc::close(self.fd) };
    }
}

fn classify(e: io::Error, tid: i32) -> ReadError {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN) => ReadError::Transient(e),
        // ENOENT for a thread that exited; for one still listed it means the
        // kernel has no such file.
        Some(libc::ENOENT | libc::ESRCH) if !task_exists(tid) => ReadError::Gone,
        _ => ReadError::Unsupported(e),
    }
}

fn task_exists(tid: i32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// `/proc/self/task/TID/syscall\0` in `buf`.
fn format_path(buf: &mut [u8; 48], tid: i32) -> &[u8] {
    use std::io::Write;
    let mut w = &mut buf[..];
    let _ = write!(w, "/proc/self/task/{tid}/syscall\0");
    let left = w.len();
    &buf[..48 - left]
}

/// Parses the file's text; `None` when it is not one of the three forms.
pub fn parse(text: &[u8]) -> Option<Syscall> {
    let text = std::str::from_utf8(text).ok()?.trim_end();
    if text == "running" {
        return Some(Syscall::Running);
    }
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    let nr: i64 = fields.first()?.parse().ok()?;
    let expected = if nr < 0 { 3 } else { 9 };
    if fields.len() != expected {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let sp = hex(fields.get(expected - 2)?)?;
    let pc = hex(fields.get(expected - 1)?)?;
    Some(Syscall::Blocked { nr: nr.max(-1), sp, pc })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(parse(b"running\n"), Some(Syscall::Running));
        assert_eq!(
            parse(b"0 0x3 0x7ffc 0x10 0x0 0x0 0x0 0x7ffd1000 0x7f0011\n"),
            Some(Syscall::Blocked { nr: 0, sp: 0x7ffd1000, pc: 0x7f0011 })
        );
        assert_eq!(parse(b"-1 0x7ffd2000 0x401000\n"), Some(Syscall::Blocked { nr: -1, sp: 0x7ffd2000, pc: 0x401000 }));
        assert_eq!(parse(b"0 0x3 0x7ffc\n"), None);
        assert_eq!(parse(b""), None);
    }

    #[test]
    fn a_blocked_thread_reads_as_blocked_in_read() {
        let mut fds = [0; 2];
        // SAFETY: valid out array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tx.send(crate::signal::sys::gettid()).unwrap();
            let mut b = [0u8; 1];
            // SAFETY: reading into a local buffer from our pipe.
            unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) }
        });
        let tid = rx.recv().unwrap();
        let mut seen = None;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(5));
            if let Ok(s @ Syscall::Blocked { nr: 0, .. }) = read_syscall(tid) {
                seen = Some(s);
                break;
            }
        }
        // SAFETY: writing one byte to our pipe, then closing both ends.
        unsafe {
            libc::write(fds[1], b"x".as_ptr().cast(), 1);
        }
        assert_eq!(h.join().unwrap(), 1);
        // SAFETY: our pipe's descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let Some(Syscall::Blocked { sp, pc, .. }) = seen else { panic!("never seen blocked in read") };
        assert!(sp != 0 && pc != 0);
        // `join` returns once the kernel clears the thread's tid word, a
        // little before its `/proc` entry goes: wait for that, 1 s at most.
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            matches!(read_syscall(tid), Err(ReadError::Gone))
        });
        assert!(gone, "thread {tid} still readable 1 s after its join: {:?}", read_syscall(tid).map(|_| ()));
    }
}
