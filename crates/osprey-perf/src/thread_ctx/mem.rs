//! Another process's memory, read with `process_vm_readv`.

/// The memory of process `pid`.
pub struct Memory {
    pub(super) pid: i32,
}

impl Memory {
    /// `len` bytes at `addr`, `None` unless all of them could be read.
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        // SAFETY: `local` is our buffer of `len` bytes; the kernel checks `remote`.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        (n == len as isize).then_some(buf)
    }

    /// The native-endian word at `addr`.
    pub fn word(&self, addr: u64) -> Option<u64> {
        Some(u64::from_ne_bytes(self.read(addr, 8)?.try_into().ok()?))
    }
}
