//! Machine-code patterns (x86-64, decoded with iced-x86) that tell where
//! thread-local data lives in the target:
//!
//! * `_PyThreadState_GetCurrent` (CPython 3.12+) -> where `_Py_tss_tstate` is;
//! * glibc's `pthread_getspecific` -> the layout of `struct pthread`'s key data;
//! * `Py_GetVersion` -> addresses of the strings it formats (PY_VERSION);
//! * `PyGILState_GetThisThreadState` -> where in `_PyRuntime` the gilstate
//!   `autoTSSkey` is (not in `_Py_DebugOffsets`).
//!
//! Each decoder accepts a fixed set of patterns; each pattern has a
//! byte-sequence unit test below.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

/// How `_Py_tss_tstate` is reached from a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsAccess {
    /// `mov %fs:DISP, %rax` (static interpreter, local-exec), or
    /// `mov %fs:0, %rax; lea DISP(%rax)` (debug build): variable at fs_base + DISP.
    FsOffset(i64),
    /// `lea GOT(%rip), %rdi; call __tls_get_addr; mov ADD(%rax)` (shared library,
    /// general- or local-dynamic model): the GOT holds a `tls_index`
    /// {module id, offset}; variable at dtv[module].val + offset + ADD.
    TlsIndexGot { got: u64, add: i64 },
    /// `mov GOT(%rip), %rax; mov %fs:(%rax), %rax` (initial-exec in a shared
    /// library): the GOT holds a TP offset; variable at fs_base + *GOT + ADD.
    TpoffGot { got: u64, add: i64 },
}

/// Result of decoding one function: an answer, or "look into this callee".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsDecode {
    Found(TlsAccess),
    /// The getter only calls a helper (debug builds: `current_fast_get`).
    FollowCall(u64),
}

fn decoder(code: &[u8], ip: u64) -> Decoder<'_> {
    Decoder::with_ip(64, code, ip, DecoderOptions::NONE)
}

fn is_fs_mem(ins: &Instruction, op: u32) -> bool {
    ins.op_kind(op) == OpKind::Memory && ins.memory_segment() == Register::FS
}

/// The 64-bit register containing `r` (general-purpose registers only).
fn full_reg(r: Register) -> Register {
    use Register::*;
    match r {
        EAX => RAX,
        EBX => RBX,
        ECX => RCX,
        EDX => RDX,
        ESI => RSI,
        EDI => RDI,
        EBP => RBP,
        ESP => RSP,
        R8D => R8,
        R9D => R9,
        R10D => R10,
        R11D => R11,
        R12D => R12,
        R13D => R13,
        R14D => R14,
        R15D => R15,
        other => other,
    }
}

/// Decodes a `_PyThreadState_GetCurrent`-like getter.
pub fn decode_tls_getter(code: &[u8], ip: u64) -> Option<TlsDecode> {
    let mut dec = decoder(code, ip);
    let mut ins = Instruction::default();
    // Register holding the thread pointer (after `mov %fs:0, reg`).
    let mut tp_reg: Option<Register> = None;
    // `lea GOT(%rip), %rdi` seen; and then the call.
    let mut tls_index: Option<u64> = None;
    // The general-dynamic sequence is `66 48 8d 3d` (data16 lea): the ABI's
    // marker that lets linkers relax it.
    let mut gd_marker = false;
    let mut called_with_index: Option<(u64, u64)> = None; // (got, call target)
                                                          // `mov GOT(%rip), reg` (a possible TP-offset GOT slot).
    let mut got_load: Option<(Register, u64)> = None;
    let mut first_call: Option<u64> = None;
    let mut count = 0;
    while dec.can_decode() && count < 40 {
        dec.decode_out(&mut ins);
        count += 1;
        if ins.is_invalid() {
            return None;
        }
        match ins.mnemonic() {
            Mnemonic::Ret => break,
            Mnemonic::Call => {
                let target = if ins.op0_kind() == OpKind::NearBranch64 { ins.near_branch_target() } else { 0 };
                if let Some(got) = tls_index.take() {
                    called_with_index = Some((got, target));
                } else if first_call.is_none() && target != 0 {
                    first_call = Some(target);
                }
                continue;
            }
            Mnemonic::Jmp => {
                // A tail call to a helper.
                if ins.op0_kind() == OpKind::NearBranch64 && first_call.is_none() && tp_reg.is_none() {
                    return Some(TlsDecode::FollowCall(ins.near_branch_target()));
                }
                break;
            }
            _ => {}
        }
        let m = ins.mnemonic();
        if m == Mnemonic::Mov && ins.op_count() == 2 && ins.op0_kind() == OpKind::Register {
            let dst = full_reg(ins.op0_register());
            if is_fs_mem(&ins, 1) {
                let base = ins.memory_base();
                let disp = ins.memory_displacement64() as i64;
                if base == Register::None && ins.memory_index() == Register::None {
                    if disp == 0 {
                        tp_reg = Some(dst);
                        continue;
                    }
                    return Some(TlsDecode::Found(TlsAccess::FsOffset(disp)));
                }
                if let Some((r, got)) = got_load {
                    if full_reg(base) == r && ins.memory_index() == Register::None {
                        return Some(TlsDecode::Found(TlsAccess::TpoffGot { got, add: disp }));
                    }
                }
                continue;
            }
            if ins.op1_kind() == OpKind::Memory {
                if ins.is_ip_rel_memory_operand() {
                    got_load = Some((dst, ins.ip_rel_memory_address()));
                    continue;
                }
                let base = full_reg(ins.memory_base());
                let disp = ins.memory_displacement64() as i64;
                if Some(base) == tp_reg && ins.memory_index() == Register::None {
                    return Some(TlsDecode::Found(TlsAccess::FsOffset(disp)));
                }
                if let Some((got, _)) = called_with_index {
                    if base == Register::RAX && ins.memory_index() == Register::None {
                        return Some(TlsDecode::Found(TlsAccess::TlsIndexGot { got, add: disp }));
                    }
                }
            }
        }
        if m == Mnemonic::Lea && ins.op0_kind() == OpKind::Register {
            let dst = full_reg(ins.op0_register());
            if ins.is_ip_rel_memory_operand() && dst == Register::RDI {
                tls_index = Some(ins.ip_rel_memory_address());
                gd_marker = code.get((ins.ip() - ip) as usize) == Some(&0x66);
                continue;
            }
            let base = full_reg(ins.memory_base());
            if Some(base) == tp_reg && ins.memory_index() == Register::None {
                return Some(TlsDecode::Found(TlsAccess::FsOffset(ins.memory_displacement64() as i64)));
            }
        }
        if m == Mnemonic::Add && ins.op0_kind() == OpKind::Register && is_fs_mem(&ins, 1) {
            // `add %fs:0, %rax` after loading a TP offset from the GOT.
            if let Some((r, got)) = got_load {
                if full_reg(ins.op0_register()) == r && ins.memory_displacement64() == 0 {
                    // The value is read next as (%rax): a TP-offset access.
                    return Some(TlsDecode::Found(TlsAccess::TpoffGot { got, add: 0 }));
                }
            }
        }
    }
    if let Some((got, target)) = called_with_index {
        if gd_marker {
            // `__tls_get_addr` returned the variable's address.
            return Some(TlsDecode::Found(TlsAccess::TlsIndexGot { got, add: 0 }));
        }
        // A plain call with an argument (debug builds pass &_PyRuntime to
        // `current_fast_get`): look into the callee.
        if target != 0 && tp_reg.is_none() {
            return Some(TlsDecode::FollowCall(target));
        }
    }
    if let Some(t) = first_call {
        if tp_reg.is_none() {
            return Some(TlsDecode::FollowCall(t));
        }
    }
    None
}

/// glibc's thread-specific data layout, learned from `pthread_getspecific`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PthreadKeyLayout {
    /// fs-relative offset of `header.self` (the `struct pthread *`).
    pub self_off: i64,
    /// offset of `specific_1stblock` in `struct pthread`.
    pub first_block_off: u64,
    /// sizeof(struct pthread_key_data).
    pub key_data_size: u64,
    /// offset of `data` in `struct pthread_key_data`.
    pub data_off: u64,
    /// PTHREAD_KEY_2NDLEVEL_SIZE.
    pub second_level_size: u64,
    /// PTHREAD_KEYS_MAX.
    pub keys_max: u64,
    /// fs-relative offset of `specific[]` (first-level pointers).
    pub specific_off: i64,
}

/// Decodes glibc's `pthread_getspecific` (x86-64).
pub fn decode_pthread_getspecific(code: &[u8], ip: u64) -> Option<PthreadKeyLayout> {
    let mut dec = decoder(code, ip);
    let mut ins = Instruction::default();
    let mut cmps: Vec<u64> = Vec::new();
    let mut add_imm: Option<u64> = None;
    let mut shl: Option<(u32, bool)> = None; // (shift, came after the add)
    let mut self_off: Option<i64> = None;
    let mut data_off: Option<u64> = None;
    let mut specific_off: Option<i64> = None;
    let mut n = 0;
    while dec.can_decode() && n < 60 {
        dec.decode_out(&mut ins);
        n += 1;
        if ins.is_invalid() {
            break;
        }
        match ins.mnemonic() {
            Mnemonic::Cmp if ins.op0_kind() == OpKind::Register && is_imm(ins.op1_kind()) => {
                cmps.push(ins.immediate(1));
            }
            Mnemonic::Add
                if ins.op0_kind() == OpKind::Register
                    && is_imm(ins.op1_kind())
                    && add_imm.is_none()
                    && self_off.is_none() =>
            {
                add_imm = Some(ins.immediate(1));
            }
            Mnemonic::Shl
                if ins.op0_kind() == OpKind::Register
                    && is_imm(ins.op1_kind())
                    && shl.is_none()
                    && self_off.is_none() =>
            {
                shl = Some((ins.immediate(1) as u32, add_imm.is_some()));
            }
            Mnemonic::Add | Mnemonic::Mov if is_fs_mem(&ins, 1) => {
                let disp = ins.memory_displacement64() as i64;
                if ins.memory_index() == Register::None && ins.memory_base() == Register::None {
                    if self_off.is_none() && disp != 0 {
                        self_off = Some(disp);
                    }
                } else if ins.memory_index() != Register::None && ins.memory_index_scale() == 8 {
                    specific_off.get_or_insert(disp);
                }
            }
            Mnemonic::Mov
                if self_off.is_some()
                    && data_off.is_none()
                    && ins.op1_kind() == OpKind::Memory
                    && ins.memory_base() != Register::None
                    && ins.memory_index() == Register::None
                    && !ins.is_ip_rel_memory_operand()
                    && ins.memory_displacement64() != 0 =>
            {
                data_off = Some(ins.memory_displacement64());
            }
            _ => {}
        }
    }
    let (shift, after_add) = shl?;
    let add = add_imm?;
    let first_block_off = if after_add { add << shift } else { add };
    if cmps.len() < 2 {
        return None;
    }
    Some(PthreadKeyLayout {
        self_off: self_off?,
        first_block_off,
        key_data_size: 1 << shift,
        data_off: data_off?,
        second_level_size: cmps[0] + 1,
        keys_max: cmps[1] + 1,
        specific_off: specific_off?,
    })
}

fn is_imm(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Immediate8
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32
            | OpKind::Immediate32to64
            | OpKind::Immediate16
            | OpKind::Immediate8to16
    )
}

/// All rip-relative `lea` targets in a function (for `Py_GetVersion`, whose
/// PY_VERSION argument is one of them).
pub fn rip_lea_targets(code: &[u8], ip: u64) -> Vec<u64> {
    let mut dec = decoder(code, ip);
    let mut ins = Instruction::default();
    let mut out = Vec::new();
    while dec.can_decode() {
        dec.decode_out(&mut ins);
        if ins.is_invalid() || ins.mnemonic() == Mnemonic::Ret {
            break;
        }
        if ins.mnemonic() == Mnemonic::Lea && ins.is_ip_rel_memory_operand() {
            out.push(ins.ip_rel_memory_address());
        }
    }
    out
}

/// An address a function refers to: absolute (rip-relative operand or
/// immediate), or a displacement from a pointer loaded from a GOT slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrRef {
    Abs(u64),
    GotPlus { got: u64, add: i64 },
}

/// Addresses referred to by a short function (up to its first return or
/// tail call), in order. Covers static non-PIE code (`mov $ADDR, %edi`,
/// `cmpl $0, ADDR(%rip)`), PIE/static-PIE code (`lea ADDR(%rip)`) and
/// shared libraries (`mov GOT(%rip), %rax; lea DISP(%rax), %rbx`).
pub fn addr_refs(code: &[u8], ip: u64) -> Vec<AddrRef> {
    let mut dec = decoder(code, ip);
    let mut ins = Instruction::default();
    let mut got_regs: Vec<(Register, u64)> = Vec::new();
    let mut out = Vec::new();
    let mut n = 0;
    while dec.can_decode() && n < 40 {
        dec.decode_out(&mut ins);
        n += 1;
        if ins.is_invalid() {
            break;
        }
        let m = ins.mnemonic();
        if (0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Memory) && ins.is_ip_rel_memory_operand() {
            let a = ins.ip_rel_memory_address();
            out.push(AddrRef::Abs(a));
            if m == Mnemonic::Mov && ins.op0_kind() == OpKind::Register {
                got_regs.push((full_reg(ins.op0_register()), a));
            }
        } else if matches!(m, Mnemonic::Lea | Mnemonic::Mov | Mnemonic::Cmp)
            && ins.op_count() == 2
            && ins.op1_kind() == OpKind::Memory
            && ins.memory_index() == Register::None
        {
            let base = full_reg(ins.memory_base());
            if let Some(&(_, got)) = got_regs.iter().rev().find(|g| g.0 == base) {
                out.push(AddrRef::GotPlus { got, add: ins.memory_displacement64() as i64 });
            }
        } else if m == Mnemonic::Mov && ins.op0_kind() == OpKind::Register && is_imm(ins.op1_kind()) {
            out.push(AddrRef::Abs(ins.immediate(1)));
        }
        if m == Mnemonic::Ret || m == Mnemonic::Jmp {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_fs_offset() {
        // endbr64; mov %fs:0xfffffffffffffff8,%rax; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x64, 0x48, 0x8b, 0x04, 0x25, 0xf8, 0xff, 0xff, 0xff, 0xc3];
        assert_eq!(decode_tls_getter(&code, 0x28a0b0), Some(TlsDecode::Found(TlsAccess::FsOffset(-8))));
    }

    #[test]
    fn debug_build_follows_call_then_fs0_lea() {
        // push %rbp; mov %rsp,%rbp; lea 0x656e15(%rip),%rdi; call +0x10; pop %rbp; ret
        let getter = [
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x8d, 0x3d, 0x15, 0x6e, 0x65, 0x00, 0xe8, 0x10, 0x00, 0x00, 0x00, 0x5d, 0xc3,
        ];
        assert_eq!(decode_tls_getter(&getter, 0x1dad910), Some(TlsDecode::FollowCall(0x1dad930)));
        // current_fast_get: push %rbp; mov %rsp,%rbp; mov %rdi,-8(%rbp);
        // mov %fs:0,%rax; lea -8(%rax),%rax; mov (%rax),%rax; pop %rbp; ret
        let helper = [
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0x7d, 0xf8, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48,
            0x8d, 0x80, 0xf8, 0xff, 0xff, 0xff, 0x48, 0x8b, 0x00, 0x5d, 0xc3,
        ];
        assert_eq!(decode_tls_getter(&helper, 0x1db7c50), Some(TlsDecode::Found(TlsAccess::FsOffset(-8))));
    }

    #[test]
    fn fs0_then_displaced_load() {
        // mov %fs:0,%rax; mov -0x10(%rax),%rax; ret
        let code = [0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x40, 0xf0, 0xc3];
        assert_eq!(decode_tls_getter(&code, 0x1000), Some(TlsDecode::Found(TlsAccess::FsOffset(-16))));
    }

    #[test]
    fn shared_general_dynamic() {
        // libpython3.12.so: sub $8,%rsp; data16 lea 0x26dbd4(%rip),%rdi;
        // data16 data16 rex.W call __tls_get_addr@plt; mov (%rax),%rax; add $8,%rsp; ret
        let code = [
            0x48, 0x83, 0xec, 0x08, 0x66, 0x48, 0x8d, 0x3d, 0xd4, 0xdb, 0x26, 0x00, 0x66, 0x66, 0x48, 0xe8, 0xbb, 0x22,
            0xe3, 0xff, 0x48, 0x8b, 0x00, 0x48, 0x83, 0xc4, 0x08, 0xc3,
        ];
        assert_eq!(
            decode_tls_getter(&code, 0x2d6310),
            Some(TlsDecode::Found(TlsAccess::TlsIndexGot { got: 0x543ef0, add: 0 }))
        );
    }

    #[test]
    fn shared_local_dynamic() {
        // lea 0x100(%rip),%rdi; call rel32; mov 0x28(%rax),%rax; ret
        let code =
            [0x48, 0x8d, 0x3d, 0x00, 0x01, 0x00, 0x00, 0xe8, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x40, 0x28, 0xc3];
        assert_eq!(
            decode_tls_getter(&code, 0x2000),
            Some(TlsDecode::Found(TlsAccess::TlsIndexGot { got: 0x2107, add: 0x28 }))
        );
    }

    #[test]
    fn shared_initial_exec() {
        // mov 0x200(%rip),%rax; mov %fs:(%rax),%rax; ret
        let code = [0x48, 0x8b, 0x05, 0x00, 0x02, 0x00, 0x00, 0x64, 0x48, 0x8b, 0x00, 0xc3];
        assert_eq!(
            decode_tls_getter(&code, 0x3000),
            Some(TlsDecode::Found(TlsAccess::TpoffGot { got: 0x3207, add: 0 }))
        );
        // mov 0x200(%rip),%rax; add %fs:0,%rax; mov (%rax),%rax; ret
        let code2 = [
            0x48, 0x8b, 0x05, 0x00, 0x02, 0x00, 0x00, 0x64, 0x48, 0x03, 0x04, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x00, 0xc3,
        ];
        assert_eq!(
            decode_tls_getter(&code2, 0x3000),
            Some(TlsDecode::Found(TlsAccess::TpoffGot { got: 0x3207, add: 0 }))
        );
    }

    #[test]
    fn autotsskey_refs() {
        // Debian 3.14 static: endbr64; cmpl $0,0x769059(%rip); je +0xa;
        // mov $0xb950e0,%edi; jmp PyThread_tss_get
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x83, 0x3d, 0x59, 0x90, 0x76, 0x00, 0x00, 0x74, 0x0a, 0xbf, 0xe0, 0x50, 0xb9, 0x00,
            0xe9, 0xed, 0x1b, 0x11, 0x00,
        ];
        let r = addr_refs(&code, 0x42c07c);
        assert_eq!(&r[..2], &[AddrRef::Abs(0xb950e0), AddrRef::Abs(0xb950e0)]);
        // pyenv 3.13 shared: mov 0x256be9(%rip),%rax; push %rbx; lea 0x870(%rax),%rbx; ...
        let code = [0x48, 0x8b, 0x05, 0xe9, 0x6b, 0x25, 0x00, 0x53, 0x48, 0x8d, 0x98, 0x70, 0x08, 0x00, 0x00, 0xc3];
        let r = addr_refs(&code, 0x2940c0);
        assert_eq!(r, vec![AddrRef::Abs(0x4eacb0), AddrRef::GotPlus { got: 0x4eacb0, add: 0x870 }]);
    }

    #[test]
    fn rejects_unrelated() {
        // xor %eax,%eax; ret
        assert_eq!(decode_tls_getter(&[0x31, 0xc0, 0xc3], 0), None);
    }

    #[test]
    fn glibc_236_pthread_getspecific() {
        // Debian glibc 2.36 __pthread_getspecific, 0x8ab00..0x8ab7c
        let code: [u8; 124] = [
            0x83, 0xff, 0x1f, 0x77, 0x3b, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x31, 0x48, 0xc1, 0xe0, 0x04, 0x64, 0x48, 0x03,
            0x04, 0x25, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x50, 0x08, 0x48, 0x85, 0xd2, 0x74, 0x57, 0x89, 0xff, 0x48,
            0x8d, 0x0d, 0x56, 0xaf, 0x14, 0x00, 0x48, 0x8b, 0x30, 0x48, 0xc1, 0xe7, 0x04, 0x48, 0x39, 0x34, 0x39, 0x75,
            0x39, 0x48, 0x89, 0xd0, 0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0x81, 0xff, 0xff, 0x03, 0x00, 0x00, 0x77, 0x30,
            0x89, 0xfa, 0x89, 0xf8, 0x83, 0xe2, 0x1f, 0xc1, 0xe8, 0x05, 0x64, 0x48, 0x8b, 0x04, 0xc5, 0x10, 0x05, 0x00,
            0x00, 0x48, 0x85, 0xc0, 0x74, 0x18, 0x48, 0xc1, 0xe2, 0x04, 0x48, 0x01, 0xd0, 0xeb, 0xaf, 0x0f, 0x1f, 0x80,
            0x00, 0x00, 0x00, 0x00, 0x48, 0xc7, 0x40, 0x08, 0x00, 0x00, 0x00, 0x00, 0x31, 0xd2, 0xeb, 0xbb,
        ];
        let l = decode_pthread_getspecific(&code, 0x8ab00).expect("decodes");
        assert_eq!(
            l,
            PthreadKeyLayout {
                self_off: 0x10,
                first_block_off: 0x310,
                key_data_size: 16,
                data_off: 8,
                second_level_size: 32,
                keys_max: 1024,
                specific_off: 0x510,
            }
        );
    }

    #[test]
    fn pthread_getspecific_shift_first() {
        // cmp $0x1f,%edi; ja +X; mov %edi,%eax; shl $4,%rax; add $0x310,%rax;
        // add %fs:0x10,%rax; mov 8(%rax),%rdx; cmp $0x3ff,%edi;
        // mov %fs:0x510(,%rax,8),%rax; ret
        let code = [
            0x83, 0xff, 0x1f, 0x77, 0x10, 0x89, 0xf8, 0x48, 0xc1, 0xe0, 0x04, 0x48, 0x05, 0x10, 0x03, 0x00, 0x00, 0x64,
            0x48, 0x03, 0x04, 0x25, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x50, 0x08, 0x81, 0xff, 0xff, 0x03, 0x00, 0x00,
            0x64, 0x48, 0x8b, 0x04, 0xc5, 0x10, 0x05, 0x00, 0x00, 0xc3,
        ];
        let l = decode_pthread_getspecific(&code, 0).expect("decodes");
        assert_eq!(l.first_block_off, 0x310);
        assert_eq!(l.key_data_size, 16);
        assert_eq!(l.keys_max, 1024);
        assert_eq!(l.specific_off, 0x510);
    }

    #[test]
    fn py_get_version_leas() {
        // 3.10 Py_GetVersion excerpt: lea 0x1d3713(%rip),%rbx; lea 0x107fec(%rip),%rcx; ret
        let code = [0x48, 0x8d, 0x1d, 0x13, 0x37, 0x1d, 0x00, 0x48, 0x8d, 0x0d, 0xec, 0x7f, 0x10, 0x00, 0xc3];
        assert_eq!(rip_lea_targets(&code, 0x1d7f66), vec![0x1d7f66 + 7 + 0x1d3713, 0x1d7f6d + 7 + 0x107fec]);
    }
}
