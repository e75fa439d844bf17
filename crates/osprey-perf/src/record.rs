//! Decoding the ring's records for the one `sample_type` this crate asks
//! for ([`SAMPLE_TYPE`], registers [`REGS_MASK`]), and the side-band
//! records of a tree's events (`crate::tree`): mappings, names, threads
//! created and gone, counts at exit.
//!
//! `PERF_RECORD_SAMPLE` body, in this order (linux/perf_event.h):
//! `u64 ip; u32 pid, tid; u64 time; u64 period; u64 abi; u64 regs[3]`
//! (bp, sp, ip: increasing register number; absent when `abi` is 0, a
//! kernel thread), then `u64 size; u8 data[size]; u64 dyn_size` (`dyn_size`
//! only when `size` is not 0). Only `data[..dyn_size]` was copied from the
//! thread's stack.

use crate::sys;

/// The fields every sample carries.
pub(crate) const SAMPLE_TYPE: u64 = sys::SAMPLE_IP
    | sys::SAMPLE_TID
    | sys::SAMPLE_TIME
    | sys::SAMPLE_PERIOD
    | sys::SAMPLE_REGS_USER
    | sys::SAMPLE_STACK_USER;

/// The user registers copied: what `osprey_unwind::Regs` starts from.
pub(crate) const REGS_MASK: u64 = (1 << sys::REG_BP) | (1 << sys::REG_SP) | (1 << sys::REG_IP);

/// The attributes of a sampling event of `config`'s rate and stack copy
/// on software clock `event`, with `flags`, waking a poller when its ring
/// of `pages` data pages is half full: what this module decodes.
pub(crate) fn sampling_attr(config: &crate::Config, event: u64, flags: u64, pages: usize) -> sys::Attr {
    sys::Attr {
        type_: sys::TYPE_SOFTWARE,
        size: sys::ATTR_SIZE,
        config: event,
        sample_period: config.period_ns(),
        sample_type: SAMPLE_TYPE,
        flags: flags | sys::flag::WATERMARK | sys::flag::USE_CLOCKID,
        wakeup_watermark: u32::try_from(pages * sys::page_size() / 2).unwrap_or(u32::MAX),
        sample_regs_user: REGS_MASK,
        sample_stack_user: config.stack_bytes,
        clockid: sys::CLOCK_MONOTONIC,
        ..sys::Attr::default()
    }
}

/// User-mode registers at the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegs {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer: the copied stack starts here.
    pub sp: u64,
    /// Frame pointer (`rbp`).
    pub bp: u64,
}

/// One sample as the kernel wrote it, borrowing the ring (or its scratch
/// copy): valid for the duration of the drain callback.
#[derive(Clone, Copy, Debug)]
pub struct RawSample<'a> {
    /// Process id (thread group).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub time: u64,
    /// CPU time this sample stands for, in nanoseconds (the event's period).
    pub period: u64,
    /// The sampled instruction pointer (a kernel address when the event
    /// counts kernel time and the thread was in a system call).
    pub ip: u64,
    /// The thread's user registers; `None` when it had no user context
    /// (a kernel thread) or was not 64-bit.
    pub regs: Option<UserRegs>,
    /// The copy of the user stack from `regs.sp` upwards (the part the
    /// kernel could copy: it stops at the end of the stack mapping).
    pub stack: &'a [u8],
}

/// A decoded record.
#[derive(Clone, Copy, Debug)]
pub enum Record<'a> {
    /// A sample.
    Sample(RawSample<'a>),
    /// The kernel dropped this many samples, the ring being full.
    Lost(u64),
    /// An executable mapping made (`PERF_RECORD_MMAP2`).
    Mmap(Mmap<'a>),
    /// A thread's name set, or its process's at an exec (`PERF_RECORD_COMM`).
    Comm(Comm<'a>),
    /// A thread or process created or gone (`PERF_RECORD_FORK`/`EXIT`).
    Task(Task),
    /// An inherited event's count at its thread's exit (`PERF_RECORD_READ`).
    Read(Read),
    /// Another record type (not requested; skipped).
    Other(u32),
    /// A sample record too short for its declared fields.
    Malformed,
}

/// `PERF_RECORD_MMAP2`.
#[derive(Clone, Copy, Debug)]
pub struct Mmap<'a> {
    /// Process and thread that made the mapping.
    pub pid: u32,
    /// See `pid`.
    pub tid: u32,
    /// First address mapped.
    pub start: u64,
    /// Bytes mapped.
    pub len: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The file's GNU build id, when the kernel could read it (Linux 5.12,
    /// the notes in the page cache).
    pub build_id: Option<&'a [u8]>,
    /// `PROT_*` of the mapping.
    pub prot: u32,
    /// The file's path as the process sees it, or a pseudo name (`[vdso]`).
    pub path: &'a [u8],
}

/// `PERF_RECORD_COMM`.
#[derive(Clone, Copy, Debug)]
pub struct Comm<'a> {
    /// Process of the thread.
    pub pid: u32,
    /// The thread named.
    pub tid: u32,
    /// Its name (at most 15 bytes).
    pub name: &'a [u8],
    /// Set by an exec: the process runs a new image from now on.
    pub exec: bool,
}

/// `PERF_RECORD_FORK` (`exit` false) or `PERF_RECORD_EXIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// The thread exited rather than was created.
    pub exit: bool,
    /// Process of the thread.
    pub pid: u32,
    /// Process of its creator (of the thread itself for an exit).
    pub ppid: u32,
    /// The thread.
    pub tid: u32,
    /// Its creator.
    pub ptid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds (with `use_clockid`).
    pub time: u64,
}

/// `PERF_RECORD_READ` with `read_format` 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// Process of the thread.
    pub pid: u32,
    /// The thread that exited.
    pub tid: u32,
    /// The count of its copy of the event (a clock: nanoseconds it ran
    /// while that copy was scheduled).
    pub value: u64,
}

/// Little-endian reads over a record.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let (v, rest) = self.b.split_first_chunk::<8>()?;
        self.b = rest;
        Some(u64::from_le_bytes(*v))
    }

    fn u32(&mut self) -> Option<u32> {
        let (v, rest) = self.b.split_first_chunk::<4>()?;
        self.b = rest;
        Some(u32::from_le_bytes(*v))
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (v, rest) = self.b.split_at_checked(n)?;
        self.b = rest;
        Some(v)
    }

    /// A NUL-terminated string padded to 8 bytes (what follows it, a
    /// `sample_id` trailer, is not read).
    fn string(&mut self) -> Option<&'a [u8]> {
        let end = self.b.iter().position(|&b| b == 0)?;
        let s = &self.b[..end];
        self.b = &self.b[(end + 8) & !7..];
        Some(s)
    }
}

/// Decodes one record (header included).
pub fn parse(record: &[u8]) -> Record<'_> {
    let mut c = Cursor { b: record };
    let Some(kind) = c.u32() else { return Record::Malformed };
    // misc, then size: the ring walk already used the size.
    let Some(misc) = c.u32().map(|v| v as u16) else { return Record::Malformed };
    let parsed = match kind {
        sys::RECORD_SAMPLE => sample(&mut c).map(Record::Sample),
        // `u64 id; u64 lost;`
        sys::RECORD_LOST => c.u64().and_then(|_| c.u64()).map(Record::Lost),
        sys::RECORD_MMAP2 => mmap2(&mut c, misc).map(Record::Mmap),
        sys::RECORD_COMM => (|| {
            let (pid, tid) = (c.u32()?, c.u32()?);
            Some(Record::Comm(Comm { pid, tid, name: c.string()?, exec: misc & sys::MISC_COMM_EXEC != 0 }))
        })(),
        sys::RECORD_FORK | sys::RECORD_EXIT => (|| {
            let (pid, ppid, tid, ptid, time) = (c.u32()?, c.u32()?, c.u32()?, c.u32()?, c.u64()?);
            Some(Record::Task(Task { exit: kind == sys::RECORD_EXIT, pid, ppid, tid, ptid, time }))
        })(),
        sys::RECORD_READ => (|| Some(Record::Read(Read { pid: c.u32()?, tid: c.u32()?, value: c.u64()? })))(),
        k => Some(Record::Other(k)),
    };
    parsed.unwrap_or(Record::Malformed)
}

/// `u32 pid, tid; u64 addr, len, pgoff;` then either `u32 maj, min; u64
/// ino, ino_generation;` or `u8 build_id_size; u8, u16 reserved; u8
/// build_id[20];`, then `u32 prot, flags; char filename[];`.
fn mmap2<'a>(c: &mut Cursor<'a>, misc: u16) -> Option<Mmap<'a>> {
    let (pid, tid) = (c.u32()?, c.u32()?);
    let (start, len, pgoff) = (c.u64()?, c.u64()?, c.u64()?);
    let file = c.bytes(24)?;
    let build_id = (misc & sys::MISC_MMAP_BUILD_ID != 0).then(|| &file[4..4 + usize::from(file[0]).min(20)]);
    let (prot, _flags) = (c.u32()?, c.u32()?);
    Some(Mmap { pid, tid, start, len, pgoff, build_id, prot, path: c.string()? })
}

/// The `CLOCK_MONOTONIC` time of a record of an event opened with
/// `sample_id_all` and this crate's [`SAMPLE_TYPE`]: a sample's own, else
/// the `sample_id` trailer's (`u32 pid, tid; u64 time`, last in the record).
pub fn time_of(record: &[u8]) -> Option<u64> {
    let kind = u32::from_le_bytes(record.get(..4)?.try_into().ok()?);
    let at = if kind == sys::RECORD_SAMPLE { 24 } else { record.len().checked_sub(8)? };
    Some(u64::from_le_bytes(record.get(at..at + 8)?.try_into().ok()?))
}

fn sample<'a>(c: &mut Cursor<'a>) -> Option<RawSample<'a>> {
    let ip = c.u64()?;
    let pid = c.u32()?;
    let tid = c.u32()?;
    let time = c.u64()?;
    let period = c.u64()?;
    let abi = c.u64()?;
    let regs = if abi == 0 {
        None
    } else {
        let (bp, sp, rip) = (c.u64()?, c.u64()?, c.u64()?);
        Some(UserRegs { ip: rip, sp, bp }).filter(|_| abi == sys::REGS_ABI_64)
    };
    let size = usize::try_from(c.u64()?).ok()?;
    let stack = if size == 0 {
        &[][..]
    } else {
        let data = c.bytes(size)?;
        let dyn_size = usize::try_from(c.u64()?).ok()?;
        data.get(..dyn_size).unwrap_or(data)
    };
    Some(RawSample { pid, tid, time, period, ip, regs, stack })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_record(abi: u64, stack: &[u8], dyn_size: u64) -> Vec<u8> {
        let mut b = Vec::new();
        let u64s = |b: &mut Vec<u8>, vs: &[u64]| vs.iter().for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        b.extend_from_slice(&sys::RECORD_SAMPLE.to_le_bytes());
        b.extend_from_slice(&[0, 0, 0, 0]);
        u64s(&mut b, &[0x401000]);
        b.extend_from_slice(&10u32.to_le_bytes());
        b.extend_from_slice(&11u32.to_le_bytes());
        u64s(&mut b, &[123, 5_000_000, abi]);
        if abi != 0 {
            u64s(&mut b, &[0xb0, 0x7ff0, 0x401001]);
        }
        u64s(&mut b, &[stack.len() as u64]);
        b.extend_from_slice(stack);
        if !stack.is_empty() {
            u64s(&mut b, &[dyn_size]);
        }
        let size = b.len() as u16;
        b[6..8].copy_from_slice(&size.to_le_bytes());
        b
    }

    #[test]
    fn a_sample_with_registers_and_a_partial_stack() {
        let rec = sample_record(2, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], 8);
        let Record::Sample(s) = parse(&rec) else { panic!("{:?}", parse(&rec)) };
        assert_eq!((s.pid, s.tid, s.time, s.period, s.ip), (10, 11, 123, 5_000_000, 0x401000));
        assert_eq!(s.regs, Some(UserRegs { ip: 0x401001, sp: 0x7ff0, bp: 0xb0 }));
        assert_eq!(s.stack, &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_sample_without_user_context() {
        let rec = sample_record(0, &[], 0);
        let Record::Sample(s) = parse(&rec) else { panic!() };
        assert_eq!((s.regs, s.stack.len()), (None, 0));
    }

    /// A side-band record: `kind`, `misc`, `body`, then the `sample_id`
    /// trailer (pid, tid, time), size filled in.
    fn side_band(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
        let mut b = kind.to_le_bytes().to_vec();
        b.extend_from_slice(&misc.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(body);
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&999u64.to_le_bytes());
        let size = b.len() as u16;
        b[6..8].copy_from_slice(&size.to_le_bytes());
        b
    }

    fn words(vs: &[u64]) -> Vec<u8> {
        vs.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn mmap2_with_a_build_id_and_a_padded_path() {
        let mut body = words(&[(8 << 32) | 7, 0x7f00_0000_1000, 0x2000, 0x1000]);
        let mut id = [0u8; 24];
        id[0] = 20;
        id[4..24].copy_from_slice(&[0xab; 20]);
        body.extend_from_slice(&id);
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(b"/usr/lib/libc.so.6\0\0\0\0\0\0");
        let rec = side_band(sys::RECORD_MMAP2, sys::MISC_MMAP_BUILD_ID, &body);
        let Record::Mmap(m) = parse(&rec) else { panic!("{:?}", parse(&rec)) };
        assert_eq!((m.pid, m.tid, m.start, m.len, m.pgoff, m.prot), (7, 8, 0x7f00_0000_1000, 0x2000, 0x1000, 5));
        assert_eq!(m.build_id, Some(&[0xab; 20][..]));
        assert_eq!(m.path, b"/usr/lib/libc.so.6");
        assert_eq!(time_of(&rec), Some(999));
        // Without the flag the same bytes are a device and an inode: no build id.
        let rec = side_band(sys::RECORD_MMAP2, 0, &body);
        assert!(matches!(parse(&rec), Record::Mmap(Mmap { build_id: None, .. })));
    }

    #[test]
    fn comm_task_and_read_records() {
        let mut body = words(&[(8 << 32) | 7]);
        body.extend_from_slice(b"cc1\0\0\0\0\0");
        let rec = side_band(sys::RECORD_COMM, sys::MISC_COMM_EXEC, &body);
        assert!(matches!(parse(&rec), Record::Comm(Comm { pid: 7, tid: 8, name: b"cc1", exec: true })));
        let rec = side_band(sys::RECORD_COMM, 0, &body);
        assert!(matches!(parse(&rec), Record::Comm(Comm { exec: false, .. })));
        let body = [&words(&[(6 << 32) | 7, (5 << 32) | 8])[..], &words(&[1234])].concat();
        let fork = Task { exit: false, pid: 7, ppid: 6, tid: 8, ptid: 5, time: 1234 };
        assert!(matches!(parse(&side_band(sys::RECORD_FORK, 0, &body)), Record::Task(t) if t == fork));
        assert!(matches!(parse(&side_band(sys::RECORD_EXIT, 0, &body)), Record::Task(t) if t.exit));
        let read = side_band(sys::RECORD_READ, 0, &words(&[(8 << 32) | 7, 42_000]));
        assert!(matches!(parse(&read), Record::Read(Read { pid: 7, tid: 8, value: 42_000 })));
        // A name without its NUL is no record.
        let rec = side_band(sys::RECORD_COMM, 0, &words(&[(8 << 32) | 7, u64::from_le_bytes(*b"abcdefgh")]));
        assert!(!matches!(parse(&rec[..rec.len() - 16]), Record::Comm(_)));
    }

    #[test]
    fn lost_and_truncated_records() {
        let mut lost = sys::RECORD_LOST.to_le_bytes().to_vec();
        lost.extend_from_slice(&[0, 0, 24, 0]);
        lost.extend_from_slice(&1u64.to_le_bytes());
        lost.extend_from_slice(&42u64.to_le_bytes());
        assert!(matches!(parse(&lost), Record::Lost(42)));
        let rec = sample_record(2, &[0; 16], 16);
        assert!(matches!(parse(&rec[..rec.len() - 9]), Record::Malformed));
    }
}
