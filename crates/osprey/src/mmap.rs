//! Anonymous, zeroed, lazily committed mappings for memory that handlers read
//! (registry records, the tid table, storage tables). Mapping happens outside
//! handlers only: `mmap` is not on the signal path.

/// Anonymous, zeroed, lazily committed memory of at least one byte.
pub fn map_zeroed(bytes: usize) -> std::io::Result<*mut u8> {
    // SAFETY: anonymous private mapping, no file.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            bytes.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// Releases memory obtained from [`map_zeroed`].
///
/// # Safety
/// `p`/`bytes` must come from one `map_zeroed` call and nothing may use the memory afterwards.
pub unsafe fn unmap(p: *mut u8, bytes: usize) {
    // SAFETY: the caller's contract: one mapping of ours, unused from now on.
    unsafe { libc::munmap(p as *mut libc::c_void, bytes.max(1)) };
}
