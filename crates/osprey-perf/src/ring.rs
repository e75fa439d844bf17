//! The mmap'd ring buffer of one event, read from user space.
//!
//! Layout: one metadata page (`struct perf_event_mmap_page`), then
//! `data_size` bytes (a power of two) of records. The kernel appends at
//! `data_head`, we consume from `data_tail`; both only grow and are taken
//! modulo `data_size`.
//!
//! Ordering invariant (the protocol of `perf_event_mmap_page`'s comment):
//! - the kernel writes a record, then (`smp_wmb`) publishes `data_head`: we
//!   load `data_head` with `Acquire`, so every byte in `[tail, head)` is
//!   visible once `head` is;
//! - we read the records, then store `data_tail` with `Release`, so our reads
//!   of `[old tail, new tail)` happen before the kernel can see the space as
//!   free and overwrite it (it pairs with the kernel's `smp_mb` before it
//!   reads `data_tail`).
//!
//! The ring is mapped writable, which tells the kernel to honour
//! `data_tail`: when full it drops records and later writes a
//! `PERF_RECORD_LOST` instead of overwriting unread ones.
//! Records are 8-byte aligned and at least 8 bytes, so a header never wraps;
//! a record's body may, and is then copied whole into a scratch buffer.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// `offsetof(struct perf_event_mmap_page, data_head)` (checked against the
/// uapi header); `data_tail`, `data_offset` and `data_size` follow.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

/// One event's mapped ring.
pub(crate) struct Ring {
    base: *mut u8,
    /// Whole mapping: metadata page + data.
    len: usize,
    data: Data,
}

// SAFETY: the mapping is owned by the Ring and only read through `&mut self`.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps `1 + data_pages` pages of `fd`; `data_pages` must be a power of two.
    pub(crate) fn map(fd: &OwnedFd, data_pages: usize) -> Result<Ring> {
        let page = crate::sys::page_size();
        let len = (data_pages + 1) * page;
        // SAFETY: a fresh shared mapping of the event's buffer; the kernel
        // checks the size and the fd.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Io { what: "mmap of the perf ring", source: std::io::Error::last_os_error() });
        }
        let base = base.cast::<u8>();
        // SAFETY: the metadata page is mapped; the kernel fills data_offset
        // and data_size at mmap time (since 4.1; 0 before, then the data
        // starts at the second page).
        let (off, size) = unsafe {
            (
                (*(base.add(DATA_OFFSET) as *const AtomicU64)).load(Ordering::Relaxed),
                (*(base.add(DATA_SIZE) as *const AtomicU64)).load(Ordering::Relaxed),
            )
        };
        let (off, size) = match (usize::try_from(off), usize::try_from(size)) {
            (Ok(o), Ok(s)) if s.is_power_of_two() && o.checked_add(s) == Some(len) => (o, s),
            _ => (page, data_pages * page),
        };
        // SAFETY: `[off, off + size)` lies inside the mapping (checked or by construction).
        let data = Data { ptr: unsafe { base.add(off) }, size };
        Ok(Ring { base, len, data })
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: 8-byte aligned field of the mapped metadata page, written
        // by the kernel; accessed atomically only.
        unsafe { &*(self.base.add(DATA_HEAD) as *const AtomicU64) }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as `head`; written by us only.
        unsafe { &*(self.base.add(DATA_TAIL) as *const AtomicU64) }
    }

    /// Bytes written and not yet consumed.
    pub(crate) fn pending(&self) -> u64 {
        self.head().load(Ordering::Acquire).wrapping_sub(self.tail().load(Ordering::Relaxed))
    }

    /// Calls `f` with every complete record in `[tail, head)` (header
    /// included), then frees their space. Returns the number of records.
    pub(crate) fn drain(&mut self, scratch: &mut Vec<u8>, f: &mut dyn FnMut(&[u8])) -> usize {
        let head = self.head().load(Ordering::Acquire);
        let tail = self.tail().load(Ordering::Relaxed);
        let (records, new_tail) = self.data.walk(tail, head, scratch, f);
        self.tail().store(new_tail, Ordering::Release);
        records
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The data area: `size` bytes (a power of two) at `ptr`.
pub(crate) struct Data {
    pub(crate) ptr: *const u8,
    pub(crate) size: usize,
}

impl Data {
    /// `len` bytes at ring offset `off` (`off + len <= size`).
    ///
    /// # Safety
    /// The bytes must lie in `[tail, head)`, which the kernel does not
    /// write until the tail moves past them.
    unsafe fn slice(&self, off: usize, len: usize) -> &[u8] {
        debug_assert!(off + len <= self.size);
        // SAFETY: per the caller, inside the area and stable while borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// Walks the records of `[tail, head)`: see [`Ring::drain`]. Returns
    /// the record count and the new tail. A record whose size is impossible
    /// (under 8 bytes, past `head`) means the ring cannot be trusted: the
    /// rest is skipped (the new tail is `head`).
    pub(crate) fn walk(
        &self,
        mut tail: u64,
        head: u64,
        scratch: &mut Vec<u8>,
        f: &mut dyn FnMut(&[u8]),
    ) -> (usize, u64) {
        let mask = (self.size - 1) as u64;
        let mut records = 0;
        while head.wrapping_sub(tail) >= 8 && head.wrapping_sub(tail) <= self.size as u64 {
            let off = (tail & mask) as usize;
            // SAFETY: the 8-byte header is inside [tail, head) and does not
            // wrap (records are 8-byte aligned, size is a multiple of 8).
            let hdr = unsafe { self.slice(off, 8) };
            let size = u16::from_le_bytes([hdr[6], hdr[7]]) as usize;
            if size < 8 || size as u64 > head.wrapping_sub(tail) {
                return (records, head);
            }
            let first = size.min(self.size - off);
            if first == size {
                // SAFETY: [tail, tail + size) is inside [tail, head), not wrapping.
                f(unsafe { self.slice(off, size) });
            } else {
                scratch.clear();
                // SAFETY: both parts are inside [tail, head): the end of the
                // area, then its start.
                unsafe {
                    scratch.extend_from_slice(self.slice(off, first));
                    scratch.extend_from_slice(self.slice(0, size - first));
                }
                f(scratch);
            }
            records += 1;
            tail = tail.wrapping_add(size as u64);
        }
        (records, head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, size: u16, fill: u8) -> Vec<u8> {
        let mut r = kind.to_le_bytes().to_vec();
        r.extend_from_slice(&0u16.to_le_bytes());
        r.extend_from_slice(&size.to_le_bytes());
        r.resize(size as usize, fill);
        r
    }

    /// Writes `records` into a 64-byte ring starting at `start`, and walks it.
    fn walk_from(start: u64, records: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut area = [0u8; 64];
        let mut at = start;
        for r in records {
            for &b in r {
                area[(at % 64) as usize] = b;
                at += 1;
            }
        }
        let data = Data { ptr: area.as_ptr(), size: 64 };
        let mut out = Vec::new();
        let (n, tail) = data.walk(start, at, &mut Vec::new(), &mut |r| out.push(r.to_vec()));
        assert_eq!((n, tail), (records.len(), at));
        out
    }

    #[test]
    fn records_in_order_without_wrap() {
        let rs = vec![record(9, 24, 1), record(2, 16, 2)];
        assert_eq!(walk_from(0, &rs), rs);
    }

    #[test]
    fn a_record_across_the_end_is_copied_whole() {
        // 48 bytes from offset 40: 24 at the end, 24 at the start.
        let rs = vec![record(9, 48, 7)];
        assert_eq!(walk_from(40 + 64 * 3, &rs), rs);
    }

    #[test]
    fn a_corrupt_size_skips_to_head() {
        let area = [0u8; 64];
        let data = Data { ptr: area.as_ptr(), size: 64 };
        let (n, tail) = data.walk(0, 32, &mut Vec::new(), &mut |_| panic!("no record"));
        assert_eq!((n, tail), (0, 32));
    }
}
