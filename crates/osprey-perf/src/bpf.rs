//! The `bpf(2)` calls this crate makes and an assembler for the one program
//! it loads ([`crate::chain`]): no compiler, no object file, no loader.
//!
//! The assembler is public: a caller may add code of its own to the program
//! ([`crate::chain::Extra`]), reading what it is given through
//! [`ValueMap`]s.
//!
//! Instructions are encoded as `struct bpf_insn` (uapi `linux/bpf.h`):
//! opcode, destination and source registers (4 bits each), a 16-bit offset
//! and a 32-bit immediate. Maps are referred to by descriptor in a
//! two-slot `ld_imm64` with `BPF_PSEUDO_MAP_FD`, as libbpf's loader would
//! rewrite them.

// Registers, opcodes and helpers carry uapi `linux/bpf.h`'s names.
#![allow(missing_docs)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `BPF_MAP_CREATE`.
const MAP_CREATE: i32 = 0;
/// `BPF_PROG_LOAD`.
const PROG_LOAD: i32 = 5;
/// `BPF_MAP_TYPE_ARRAY`.
const MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_F_MMAPABLE` (Linux 5.5): the array's values mapped into our memory.
const F_MMAPABLE: u32 = 1 << 10;
/// `BPF_PROG_TYPE_PERF_EVENT`: run at a perf event's overflow.
const PROG_TYPE_PERF_EVENT: u32 = 7;

/// Helper numbers (`enum bpf_func_id`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    /// The running event's `bpf_perf_event_value` (count, enabled,
    /// running); zeroed on an error.
    pub const PERF_PROG_READ_VALUE: i32 = 56;
    /// Linux 5.5; fails (never faults) on memory not mapped or not resident.
    pub const PROBE_READ_USER: i32 = 112;
}

/// `union bpf_attr` as bytes: the kernel takes a prefix of its size and
/// wants everything past the fields it knows zeroed.
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(mut self, at: usize, v: u32) -> Attr {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, at: usize, v: u64) -> Attr {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(mut self, at: usize, name: &str) -> Attr {
        let n = name.len().min(15);
        self.0[at..at + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
    fn call_status(&self, cmd: i32) -> io::Result<()> {
        // SAFETY: as in `call`; these commands return no descriptor.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_ptr(), self.0.len() as u32) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    fn call(&self, cmd: i32) -> io::Result<OwnedFd> {
        // SAFETY: `self.0` is a valid bpf_attr of the size passed; the
        // pointers it holds (program, license, log) outlive the call.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_ptr(), self.0.len() as u32) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(r).map_err(|_| io::Error::other("bpf: fd out of range"))?;
        // SAFETY: the kernel just returned this descriptor and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// `BPF_MAP_UPDATE_ELEM`.
const MAP_UPDATE_ELEM: i32 = 2;
/// `BPF_MAP_DELETE_ELEM`.
const MAP_DELETE_ELEM: i32 = 3;
/// `BPF_MAP_TYPE_HASH`.
const MAP_TYPE_HASH: u32 = 1;

/// A hash map of `u32` keys to values of `value` bytes, written by us.
pub(crate) struct HashMap {
    fd: OwnedFd,
}

impl HashMap {
    pub(crate) fn create(name: &str, value: u32, entries: u32) -> io::Result<HashMap> {
        let fd = Attr::new()
            .u32(0, MAP_TYPE_HASH)
            .u32(4, 4)
            .u32(8, value)
            .u32(12, entries)
            .name(28, name)
            .call(MAP_CREATE)?;
        Ok(HashMap { fd })
    }
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
    /// Sets `key`'s value (`value` must have the map's value size).
    pub(crate) fn set(&self, key: u32, value: &[u8]) -> io::Result<()> {
        let attr = Attr::new()
            .u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, &key as *const u32 as u64)
            .u64(16, value.as_ptr() as u64);
        attr.call_status(MAP_UPDATE_ELEM)
    }
    /// Removes `key` (absent already: not an error).
    pub(crate) fn remove(&self, key: u32) {
        let attr = Attr::new().u32(0, self.fd.as_raw_fd() as u32).u64(8, &key as *const u32 as u64);
        let _ = attr.call_status(MAP_DELETE_ELEM);
    }
}

/// One value of `size` bytes (a multiple of 8) that we write and a program
/// reads (key 0 of a one-entry array: [`Asm::lookup0`]). A write replaces
/// the value as a whole for runs that start after it; a run under way may
/// see part of it, so a writer changes a value it has published only where
/// every mix of old and new words is sound.
pub struct ValueMap {
    fd: OwnedFd,
    size: usize,
}

impl ValueMap {
    /// A map whose value is all zeros.
    pub fn create(name: &str, size: usize) -> io::Result<ValueMap> {
        let value = u32::try_from(size)
            .ok()
            .filter(|v| v % 8 == 0 && *v > 0)
            .ok_or_else(|| io::Error::other("bpf value size"))?;
        let fd =
            Attr::new().u32(0, MAP_TYPE_ARRAY).u32(4, 4).u32(8, value).u32(12, 1).name(28, name).call(MAP_CREATE)?;
        Ok(ValueMap { fd, size })
    }
    /// The map's descriptor, for [`Asm::map`].
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
    /// Replaces the value (`value` has the map's size).
    pub fn set(&self, value: &[u8]) -> io::Result<()> {
        if value.len() != self.size {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bpf value of the wrong size"));
        }
        let key = 0u32;
        let attr = Attr::new()
            .u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, &key as *const u32 as u64)
            .u64(16, value.as_ptr() as u64);
        attr.call_status(MAP_UPDATE_ELEM)
    }
}

/// An array map of `entries` values of `size` bytes (a multiple of 8),
/// mapped into this process: the program's writes are seen here as made.
pub(crate) struct SharedArray {
    ptr: *mut u8,
    len: usize,
    size: usize,
    /// After the mapping's fields: unmapped before the descriptor closes.
    fd: OwnedFd,
}

// SAFETY: the mapping is owned by this value alone; reads copy bytes out.
unsafe impl Send for SharedArray {}

impl SharedArray {
    pub(crate) fn create(name: &str, size: usize, entries: u32) -> io::Result<SharedArray> {
        let value =
            u32::try_from(size).ok().filter(|v| v % 8 == 0).ok_or_else(|| io::Error::other("bpf array value size"))?;
        let fd = Attr::new()
            .u32(0, MAP_TYPE_ARRAY)
            .u32(4, 4)
            .u32(8, value)
            .u32(12, entries)
            .u32(16, F_MMAPABLE)
            .name(28, name)
            .call(MAP_CREATE)?;
        let page = crate::sys::page_size();
        let len = (size * entries as usize).div_ceil(page) * page;
        // SAFETY: a fresh shared read-only mapping of the map's values,
        // `len` bytes (the kernel rounds the array's data up to pages).
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedArray { ptr: ptr.cast(), len, size, fd })
    }

    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The 8-byte word at `at` of entry `i`, read once (the program may be
    /// writing it on another CPU).
    pub(crate) fn word(&self, i: usize, at: usize) -> u64 {
        let off = i * self.size + at;
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: in bounds and aligned (checked above); a volatile read
        // of memory another CPU writes: a torn entry is caught by its seq.
        unsafe { self.ptr.add(off).cast::<u64>().read_volatile() }
    }

    /// Copies `out.len()` bytes of entry `i` from `at`.
    pub(crate) fn copy(&self, i: usize, at: usize, out: &mut [u8]) {
        let off = i * self.size + at;
        assert!(off + out.len() <= self.len);
        // SAFETY: in bounds (checked above); bytes being written meanwhile
        // are caught by the entry's seq, read before and after.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) };
    }
}

impl Drop for SharedArray {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `create`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Loads a perf-event program; the verifier's log is the error on refusal.
pub(crate) fn load(name: &str, insns: &[Insn]) -> io::Result<OwnedFd> {
    let license = c"Dual MIT/GPL";
    let mut log = vec![0u8; 64 << 10];
    let attr = |level: u32, log: &mut [u8]| {
        Attr::new()
            .u32(0, PROG_TYPE_PERF_EVENT)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(24, level)
            .u32(28, if level > 0 { log.len() as u32 } else { 0 })
            .u64(32, if level > 0 { log.as_mut_ptr() as u64 } else { 0 })
            .name(48, name)
    };
    match attr(0, &mut log).call(PROG_LOAD) {
        Ok(fd) => Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) => {
            // Again, for the verifier's reason.
            let again = attr(1, &mut log).call(PROG_LOAD);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            // The reason is the last line before the statistics.
            let stats = |l: &str| l.is_empty() || l.starts_with("processed ") || l.starts_with("verification time");
            let last = text.lines().map(str::trim).rev().find(|l| !stats(l)).unwrap_or("").to_string();
            match again {
                Ok(fd) => Ok(fd),
                Err(e2) => Err(io::Error::new(e2.kind(), format!("{e}: verifier: {last}"))),
            }
        }
        Err(e) => Err(e),
    }
}

/// One `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// Registers: r0 result, r1-r5 arguments (clobbered by calls), r6-r9
/// kept across calls, r10 the read-only frame pointer.
pub type Reg = u8;
pub const R0: Reg = 0;
pub const R1: Reg = 1;
pub const R2: Reg = 2;
pub const R3: Reg = 3;
pub const R4: Reg = 4;
pub const R5: Reg = 5;
pub const R6: Reg = 6;
pub const R7: Reg = 7;
pub const R8: Reg = 8;
pub const R9: Reg = 9;
pub const R10: Reg = 10;

/// A jump's target, resolved by [`Asm::finish`].
#[derive(Clone, Copy)]
pub struct Label(usize);

/// Conditions of jumps (unsigned compares).
#[derive(Clone, Copy)]
pub enum Cond {
    Eq = 0x10,
    Gt = 0x20,
    Ge = 0x30,
    Ne = 0x50,
}

/// 64-bit arithmetic (`BPF_ALU64` operations).
#[derive(Clone, Copy)]
pub enum Alu {
    Add = 0x00,
    Sub = 0x10,
    Mul = 0x20,
    And = 0x50,
    Lsh = 0x60,
    Rsh = 0x70,
}

/// Builds a program; jumps name labels placed anywhere.
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    /// Per label, the instruction it stands before.
    labels: Vec<Option<usize>>,
    /// (instruction, label) of each jump.
    jumps: Vec<(usize, Label)>,
}

/// Access sizes (`BPF_B`, `BPF_W`, `BPF_DW`); loads zero-extend.
#[derive(Clone, Copy)]
pub enum Size {
    B = 0x10,
    W = 0x00,
    Dw = 0x18,
}

impl Asm {
    fn push(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) {
        self.insns.push(Insn { code, regs: (src << 4) | dst, off, imm });
    }
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    pub fn place(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    /// `dst = imm` (64-bit, sign-extended).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.push(0xb7, dst, 0, 0, imm);
    }
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.push(0xbf, dst, src, 0, 0);
    }
    /// `dst = (u32)src`.
    pub fn mov32(&mut self, dst: Reg, src: Reg) {
        self.push(0xbc, dst, src, 0, 0);
    }
    pub fn add_imm(&mut self, dst: Reg, imm: i32) {
        self.push(0x07, dst, 0, 0, imm);
    }
    /// `dst = dst <op> imm` (shifts: 0..64).
    pub fn alu_imm(&mut self, op: Alu, dst: Reg, imm: i32) {
        self.push(op as u8 | 0x07, dst, 0, 0, imm);
    }
    /// `dst = dst <op> src`.
    pub fn alu(&mut self, op: Alu, dst: Reg, src: Reg) {
        self.push(op as u8 | 0x0f, dst, src, 0, 0);
    }
    /// `dst = *(size *)(src + off)`.
    pub fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) {
        self.push(0x61 | size as u8, dst, src, off, 0);
    }
    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) {
        self.push(0x63 | size as u8, dst, src, off, 0);
    }
    /// `*(size *)(dst + off) = imm`.
    pub fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) {
        self.push(0x62 | size as u8, dst, 0, off, imm);
    }
    /// `dst = map` (the map's descriptor, resolved by the kernel).
    pub fn map(&mut self, dst: Reg, fd: i32) {
        self.push(0x18, dst, 1, 0, fd);
        self.push(0, 0, 0, 0, 0);
    }
    pub fn call(&mut self, helper: i32) {
        self.push(0x85, 0, 0, 0, helper);
    }
    pub fn exit(&mut self) {
        self.push(0x95, 0, 0, 0, 0);
    }
    pub fn jump(&mut self, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.push(0x05, 0, 0, 0, 0);
    }
    /// `if dst <cond> imm goto to`.
    pub fn jump_if(&mut self, cond: Cond, dst: Reg, imm: i32, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.push(0x05 | cond as u8, dst, 0, 0, imm);
    }
    /// `if dst <cond> src goto to`.
    pub fn jump_if_reg(&mut self, cond: Cond, dst: Reg, src: Reg, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.push(0x0d | cond as u8, dst, src, 0, 0);
    }
    /// `R0` = the value of map `fd` at the u32 key stored at `R10 + key_off`,
    /// never null after the jump to `missing`.
    pub fn lookup(&mut self, fd: i32, key_off: i16, missing: Label) {
        self.map(R1, fd);
        self.mov(R2, R10);
        self.add_imm(R2, key_off as i32);
        self.call(helper::MAP_LOOKUP_ELEM);
        self.jump_if(Cond::Eq, R0, 0, missing);
    }
    /// [`Asm::lookup`] of one-entry map `fd` (a [`ValueMap`]): its key 0
    /// stored at `R10 + key_off` first.
    pub fn lookup0(&mut self, fd: i32, key_off: i16, missing: Label) {
        self.store_imm(Size::W, R10, key_off, 0);
        self.lookup(fd, key_off, missing);
    }
    /// `probe_read_user(dst + dst_off, len, src + src_off)`, jumping to
    /// `fault` where it fails. Clobbers R0-R5; `dst` is not R3.
    pub fn read_user(&mut self, dst: Reg, dst_off: i32, len: i32, src: Reg, src_off: i32, fault: Label) {
        debug_assert!(dst != R3);
        self.mov(R3, src);
        if src_off != 0 {
            self.add_imm(R3, src_off);
        }
        self.mov(R1, dst);
        if dst_off != 0 {
            self.add_imm(R1, dst_off);
        }
        self.mov_imm(R2, len);
        self.call(helper::PROBE_READ_USER);
        self.jump_if(Cond::Ne, R0, 0, fault);
    }
    /// Instructions so far.
    pub fn len(&self) -> usize {
        self.insns.len()
    }
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }
    /// The instructions, every jump resolved. Panics on a label never
    /// placed or a jump out of range: a bug of the program's generator.
    pub fn finish(mut self) -> Vec<Insn> {
        for &(at, l) in &self.jumps {
            let to = self.labels[l.0].expect("every label placed");
            let off = to as i64 - at as i64 - 1;
            self.insns[at].off = i16::try_from(off).expect("jump in range");
        }
        self.insns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_the_uapi_header_does() {
        let mut a = Asm::default();
        let end = a.label();
        a.mov_imm(R0, 1); // BPF_MOV64_IMM(BPF_REG_0, 1)
        a.jump_if(Cond::Eq, R1, 0, end);
        a.load(Size::Dw, R2, R10, -16); // BPF_LDX_MEM(BPF_DW, 2, 10, -16)
        a.map(R1, 5);
        a.place(end);
        a.exit();
        let p = a.finish();
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        assert_eq!(p[0], Insn { code: 0xb7, regs: 0x00, off: 0, imm: 1 });
        // Skips the load and both slots of the ld_imm64.
        assert_eq!(p[1], Insn { code: 0x15, regs: 0x01, off: 3, imm: 0 });
        assert_eq!(p[2], Insn { code: 0x79, regs: 0xa2, off: -16, imm: 0 });
        assert_eq!(p[3], Insn { code: 0x18, regs: 0x11, off: 0, imm: 5 });
        assert_eq!(p[5].code, 0x95);
    }

    #[test]
    fn helper_numbers_are_the_uapi_headers() {
        let Ok(h) = std::fs::read_to_string("/usr/include/linux/bpf.h") else {
            eprintln!("SKIPPED: no /usr/include/linux/bpf.h (linux-libc-dev)");
            return;
        };
        // `FN(name)` in order from 0, or `FN(name, number, ...)` since 6.1.
        let mapper = h.split("#define __BPF_FUNC_MAPPER").nth(1).expect("the helper list");
        let number = |name: &str| {
            let mut at = 0;
            for l in mapper.lines().map(str::trim).take_while(|l| l.starts_with("FN(") || l.ends_with('\\')) {
                let Some(args) = l.strip_prefix("FN(").and_then(|l| l.split(')').next()) else { continue };
                let mut parts = args.split(',').map(str::trim);
                let (n, explicit) = (parts.next(), parts.next().and_then(|n| n.parse::<i32>().ok()));
                if n == Some(name) {
                    return explicit.unwrap_or(at);
                }
                at = explicit.unwrap_or(at) + 1;
            }
            panic!("{name} is not in the header");
        };
        assert_eq!(helper::MAP_LOOKUP_ELEM, number("map_lookup_elem"));
        assert_eq!(helper::KTIME_GET_NS, number("ktime_get_ns"));
        assert_eq!(helper::GET_CURRENT_PID_TGID, number("get_current_pid_tgid"));
        assert_eq!(helper::PERF_PROG_READ_VALUE, number("perf_prog_read_value"));
        assert_eq!(helper::PROBE_READ_USER, number("probe_read_user"));
    }

    #[test]
    fn arithmetic_and_register_jumps_encode_as_the_uapi_header_does() {
        let mut a = Asm::default();
        let end = a.label();
        a.alu_imm(Alu::Rsh, R1, 5); // BPF_ALU64_IMM(BPF_RSH, 1, 5)
        a.alu(Alu::Lsh, R2, R1); // BPF_ALU64_REG(BPF_LSH, 2, 1)
        a.jump_if_reg(Cond::Gt, R1, R2, end); // BPF_JMP_REG(BPF_JGT, 1, 2, +1)
        a.load(Size::B, R3, R10, -3); // BPF_LDX_MEM(BPF_B, 3, 10, -3)
        a.place(end);
        a.exit();
        let p = a.finish();
        assert_eq!(p[0], Insn { code: 0x77, regs: 0x01, off: 0, imm: 5 });
        assert_eq!(p[1], Insn { code: 0x6f, regs: 0x12, off: 0, imm: 0 });
        assert_eq!(p[2], Insn { code: 0x2d, regs: 0x21, off: 1, imm: 0 });
        assert_eq!(p[3], Insn { code: 0x71, regs: 0xa3, off: -3, imm: 0 });
    }
}
