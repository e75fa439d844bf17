//! The snapshot: memory a walk reads in one system call before it starts.

use std::collections::HashSet;

use super::frame::LiveFlag;
use crate::layout::Layout;
use crate::remote::process::rd_u64;
use crate::target::Target;

/// Memory read in one `process_vm_readv` before a walk: the frames of the
/// thread's previous walks and the pointers that say which is innermost
/// now, so the walk sees the stack of one instant. Asks are merged into as
/// few ranges as they fit (same or adjacent pages), never a page nothing was
/// asked from (it may be a guard page, which would end the read). The frame
/// pointer is asked before anything the thread writes (see
/// docs/design/python-walk.md, "The snapshot").
pub(crate) struct Snapshot {
    /// The asks that were copied, (address, longest length asked), in
    /// address order.
    asked: Vec<(u64, usize)>,
    /// Every range copied whole, by start address: a frame that lies in
    /// one, asked for or not, was copied in the same instant as the rest.
    ranges: Vec<(u64, Vec<u8>)>,
}

impl Snapshot {
    /// Reads `asks` (address, length). The ranges are copied in the order
    /// of the first ask each holds.
    pub(crate) fn read(t: &Target, asks: &[(u64, usize)]) -> Snapshot {
        const PAGE: u64 = 4096;
        const MAX_RANGE: u64 = 256 << 10;
        // The kernel takes at most `UIO_MAXIOV` iovecs a call.
        const MAX_IOV: usize = 1024;
        // (address, length, rank in `asks`), in address order.
        let mut asks: Vec<(u64, usize, usize)> =
            asks.iter().enumerate().filter(|a| a.1 .0 != 0 && a.1 .1 > 0).map(|(i, a)| (a.0, a.1, i)).collect();
        asks.sort_unstable();
        // (start, end, first rank) of each range, in address order.
        let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
        for &(a, n, i) in &asks {
            let end = a.saturating_add(n as u64);
            match ranges.last_mut() {
                Some(r) if a / PAGE <= (r.1 - 1) / PAGE + 1 && end.max(r.1) - r.0 <= MAX_RANGE => {
                    r.1 = r.1.max(end);
                    r.2 = r.2.min(i);
                }
                _ => ranges.push((a, end, i)),
            }
        }
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_unstable_by_key(|&k| ranges[k].2);
        // What does not fit is what was asked last.
        order.truncate(MAX_IOV);
        let mut bufs: Vec<Vec<u8>> = order.iter().map(|&k| vec![0u8; (ranges[k].1 - ranges[k].0) as usize]).collect();
        let local: Vec<libc::iovec> =
            bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
        let remote: Vec<libc::iovec> = order
            .iter()
            .map(|&k| {
                let r = ranges[k];
                libc::iovec { iov_base: r.0 as usize as *mut libc::c_void, iov_len: (r.1 - r.0) as usize }
            })
            .collect();
        // SAFETY: `local` describes `bufs`, owned here and outliving the
        // call; the remote iovecs are only interpreted by the kernel.
        let n = unsafe {
            libc::process_vm_readv(t.mem.pid, local.as_ptr(), local.len() as _, remote.as_ptr(), remote.len() as _, 0)
        };
        // The kernel stops at the first remote iovec it cannot read: only
        // what came whole before it counts.
        let mut left = n.max(0) as u64;
        let mut asked: Vec<(u64, usize)> = Vec::with_capacity(asks.len());
        let mut whole = Vec::with_capacity(bufs.len());
        for (&k, b) in order.iter().zip(bufs) {
            let r = ranges[k];
            if left < r.1 - r.0 {
                break;
            }
            left -= r.1 - r.0;
            let from = asks.partition_point(|a| a.0 < r.0);
            asked.extend(asks[from..].iter().take_while(|a| a.0 < r.1).map(|a| (a.0, a.1)));
            whole.push((r.0, b));
        }
        // Asks of one address sort by length: the last is the longest.
        asked.sort_unstable();
        asked.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = kept.1.max(later.1);
            }
            same
        });
        whole.sort_unstable_by_key(|w| w.0);
        Snapshot { asked, ranges: whole }
    }

    /// A snapshot of copies made elsewhere (address, bytes): the frames a
    /// program copied at the sampling interrupt.
    pub(crate) fn of(mut copies: Vec<(u64, Vec<u8>)>) -> Snapshot {
        copies.sort_unstable_by_key(|c| c.0);
        copies.dedup_by_key(|c| c.0);
        Snapshot { asked: copies.iter().map(|c| (c.0, c.1.len())).collect(), ranges: copies }
    }

    /// The `len` bytes at `addr`, if copied: asked for, or inside a range
    /// (a frame pushed where the thread's earlier walks had none, between
    /// frames they had).
    pub(crate) fn copy(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let i = self.ranges.partition_point(|r| r.0 <= addr).checked_sub(1)?;
        let (start, b) = &self.ranges[i];
        let at = usize::try_from(addr - start).ok()?;
        b.get(at..at.checked_add(len)?)
    }

    /// The pointer at `addr`, if it was copied.
    pub(crate) fn u64(&self, addr: u64) -> Option<u64> {
        self.copy(addr, 8).map(|b| rd_u64(b, 0))
    }

    /// Candidate innermost frames of the snapshot itself: running frames
    /// that no other running frame of the snapshot has as its caller. Used
    /// when the stack moved between reading the thread's frame pointer and
    /// its frames; a frame that was popped and pushed again while the
    /// snapshot was copied leaves more than one.
    pub(crate) fn own_tops(&self, l: &Layout, live: LiveFlag) -> Vec<u64> {
        let running: Vec<(u64, u64)> = self
            .asked
            .iter()
            .filter_map(|&(a, n)| Some((a, self.copy(a, n)?)))
            .filter(|(_, b)| b.len() > live.0 && b.len() >= l.frame_previous as usize + 8 && live.1(b[live.0]))
            .map(|(a, b)| (a, rd_u64(b, l.frame_previous as usize)))
            .collect();
        let callers: HashSet<u64> = running.iter().map(|r| r.1).collect();
        running.iter().filter(|r| !callers.contains(&r.0)).map(|r| r.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_finds_bytes_inside_a_range_only() {
        let snap =
            Snapshot { asked: vec![(0x1010, 8)], ranges: vec![(0x1000, (0..64).collect()), (0x2000, vec![9; 16])] };
        assert_eq!(snap.copy(0x1010, 8), Some(&[16u8, 17, 18, 19, 20, 21, 22, 23][..]));
        assert_eq!(snap.copy(0x1020, 4), Some(&[32u8, 33, 34, 35][..]));
        assert_eq!(snap.copy(0x1038, 8).map(|b| b[7]), Some(63));
        // Past a range's end, before the first, between two.
        assert_eq!(snap.copy(0x1039, 8), None);
        assert_eq!(snap.copy(0xfff, 1), None);
        assert_eq!(snap.copy(0x1800, 8), None);
        assert_eq!(snap.copy(0x2008, 8), Some(&[9u8; 8][..]));
    }

    #[test]
    fn copies_made_elsewhere_are_found_by_their_address() {
        // Out of order, one twice: each found at its own address, whole.
        let snap = Snapshot::of(vec![(0x3000, vec![3; 16]), (0x1000, vec![1; 16]), (0x1000, vec![1; 16])]);
        assert_eq!(snap.copy(0x1000, 16), Some(&[1u8; 16][..]));
        assert_eq!(snap.copy(0x3008, 8), Some(&[3u8; 8][..]));
        assert_eq!(snap.copy(0x2000, 8), None);
        assert_eq!(snap.asked, vec![(0x1000, 16), (0x3000, 16)]);
    }
}
