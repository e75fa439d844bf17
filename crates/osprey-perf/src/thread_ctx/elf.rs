//! Where a module's `otel_thread_ctx_v1` lives in a thread's TLS: its
//! `.dynsym` entry (an `STT_TLS` symbol) and how the dynamic linker placed
//! it, from the relocation that names it.

use object::elf;
use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Object, ObjectSymbol, RelocationFlags, RelocationTarget, SymbolKind};

/// The TLS symbol OTEP 4947 readers look for.
pub const SYMBOL: &str = "otel_thread_ctx_v1";

/// How to find the variable from a thread pointer, as read from the file
/// (addresses are link-time; add the module's load bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsSlot {
    /// TLSDESC: the descriptor (resolver, argument) at this GOT address;
    /// the argument is the thread-pointer offset for static TLS.
    Desc(u64),
    /// Initial-exec: the GOT word at this address holds the offset from the
    /// thread pointer.
    TpOffGot(u64),
    /// Legacy general-dynamic: the GOT pair (module id, offset) at this
    /// address, resolved through the thread's DTV.
    ModuleGot(u64),
    /// Local-exec in the main executable: the variable is at this (negative)
    /// offset from the thread pointer.
    TpOff(i64),
}

/// The symbol's TLS slot in `data` (an ELF file), if it exports one.
/// `is_main`: the file is the process's executable (local-exec possible).
pub fn find(data: &[u8], is_main: bool) -> Option<TlsSlot> {
    let file = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let sym = file.dynamic_symbols().find(|s| s.name() == Ok(SYMBOL) && s.kind() == SymbolKind::Tls)?;
    for (offset, rel) in file.dynamic_relocations()? {
        if rel.target() != RelocationTarget::Symbol(sym.index()) {
            continue;
        }
        if let RelocationFlags::Elf { r_type } = rel.flags() {
            match r_type {
                elf::R_X86_64_TLSDESC | elf::R_AARCH64_TLSDESC => return Some(TlsSlot::Desc(offset)),
                elf::R_X86_64_TPOFF64 => return Some(TlsSlot::TpOffGot(offset)),
                elf::R_X86_64_DTPMOD64 => return Some(TlsSlot::ModuleGot(offset)),
                _ => {}
            }
        }
    }
    if !is_main {
        return None;
    }
    // x86-64 (TLS variant II): the executable's block ends at the thread
    // pointer, rounded up to its alignment.
    let endian = file.endian();
    let tls = file.elf_program_headers().iter().find(|p| p.p_type(endian) == elf::PT_TLS)?;
    let (size, align) = (tls.p_memsz(endian), tls.p_align(endian).max(1));
    let block = size.div_ceil(align) * align;
    Some(TlsSlot::TpOff(sym.address() as i64 - block as i64))
}

/// Link-time address of the file's first loadable page (the load bias is the
/// mapping of file offset 0 minus this).
pub fn first_load(data: &[u8]) -> Option<u64> {
    let file = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| p.p_vaddr(endian) - p.p_offset(endian))
        .min()
}
