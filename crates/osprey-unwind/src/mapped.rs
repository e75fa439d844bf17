//! A read-only, private mapping of a whole file (off the signal path): the
//! compiler reads only `.eh_frame`, `.eh_frame_hdr`, `.debug_frame` and the
//! headers, so only those pages become resident, instead of a copy of the
//! whole file (a binary's debug information can be tens of MiB).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The file's bytes, mapped; unmapped on drop.
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    /// Maps `path` read-only. An empty file maps to an empty slice.
    pub fn open(path: &Path) -> std::io::Result<Mapped> {
        let f = File::open(path)?;
        let len = usize::try_from(f.metadata()?.len()).map_err(std::io::Error::other)?;
        if len == 0 {
            return Ok(Mapped { ptr: std::ptr::null_mut(), len: 0 });
        }
        // SAFETY: a fresh private read-only mapping of an open descriptor.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }

    /// The mapped bytes. A file truncated by someone else while mapped would
    /// fault on access; system libraries and binaries are replaced by rename,
    /// not truncated in place.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` maps `len` readable bytes until `self` is dropped.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping made in `open`, not used after this.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}
