//! Building a module's [`Table`] from its CFI, off the signal path.
//!
//! Sources, in order of preference for any address range:
//! 1. `.eh_frame`, enumerated through the sorted FDE index of `.eh_frame_hdr`
//!    when present (else walked sequentially);
//! 2. `.debug_frame` of the file itself, then of its separate debug file
//!    `/usr/lib/debug/.build-id/xx/rest.debug` (found by GNU build id), for
//!    ranges `.eh_frame` does not cover.
//!
//! Every CFI row becomes one [`Rule`]: CFA = RSP/RBP + offset, RBP unchanged
//! or saved at CFA - 8n, return address at CFA - 8. The lazy-binding PLT's
//! CFA expression (a function of `rip & 15`) is expanded into plain rows per
//! 16-byte stub. Other rows outside that form (DWARF expressions as in the
//! signal trampoline `__restore_rt`, registers saved in registers) become
//! `Stop`; rows whose return address is undefined (`_start`, `clone`)
//! become `End`.

use crate::error::{Error, Result};
use crate::mapped::Mapped;
use crate::table::{Kind, Rule, Table};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, UnwindTableRow, X86_64,
};
use object::{Object, ObjectSection};
use std::path::{Path, PathBuf};

type Slice<'a> = gimli::EndianSlice<'a, LittleEndian>;

/// Where separate debug files are looked up by build id.
pub const DEBUG_ROOT: &str = "/usr/lib/debug/.build-id";

/// A compiled module table and what it was built from.
#[derive(Debug, Default)]
pub struct Compiled {
    /// The compiled rules.
    pub table: Table,
    /// The module's GNU build id, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// Size of `.eh_frame` in the file (for the memory-per-MiB figure).
    pub eh_frame_bytes: usize,
    /// Size of the `.debug_frame` sections read (the module's and its debug file's).
    pub debug_frame_bytes: usize,
    /// FDEs read from `.eh_frame`.
    pub eh_fdes: usize,
    /// FDEs read from `.debug_frame`.
    pub debug_fdes: usize,
    /// The separate debug file used, if any.
    pub debug_file: Option<PathBuf>,
    /// `[start, end)` (ELF virtual addresses) of the longest `.eh_frame`
    /// FDE: the module's biggest function, found without symbols (an
    /// interpreter's evaluation loop, in a stripped CPython).
    pub largest_fde: Option<(u64, u64)>,
}

/// Reads and compiles the ELF file at `path`; `debug_root` is where to look
/// for separate debug files by build id (normally [`DEBUG_ROOT`]).
pub fn compile_file(path: &Path, debug_root: Option<&Path>) -> Result<Compiled> {
    let data = Mapped::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
    compile_elf(path, data.bytes(), debug_root)
}

/// Compiles an ELF image held in memory (`path` names it in errors).
pub fn compile_elf(path: &Path, data: &[u8], debug_root: Option<&Path>) -> Result<Compiled> {
    let elf = |source| Error::Elf { path: path.into(), source };
    let file = object::File::parse(data).map_err(elf)?;
    let mut out = Compiled { build_id: file.build_id().map_err(elf)?.map(<[u8]>::to_vec), ..Compiled::default() };
    let mut rows = Vec::new();
    let mut covered = Vec::new();

    if let Some(eh) = file.section_by_name(".eh_frame") {
        let bytes = eh.data().map_err(elf)?;
        out.eh_frame_bytes = bytes.len();
        let hdr = file.section_by_name(".eh_frame_hdr");
        out.eh_fdes = eh_frame_rows(&file, eh.address(), bytes, hdr.as_ref(), &mut rows, &mut covered);
    }
    out.largest_fde = covered.iter().copied().max_by_key(|&(a, b)| b.saturating_sub(a));
    covered.sort_unstable();
    let mut debug = |f: &object::File| -> Result<()> {
        if let Some(s) = f.section_by_name(".debug_frame") {
            let bytes = s.uncompressed_data().map_err(elf)?;
            out.debug_frame_bytes += bytes.len();
            out.debug_fdes += debug_frame_rows(&bytes, &covered, &mut rows);
        }
        Ok(())
    };
    debug(&file)?;
    if let (Some(root), Some(id)) = (debug_root, out.build_id.as_deref()) {
        if let Some(dpath) = debug_file_path(root, id).filter(|p| p.is_file()) {
            let ddata = Mapped::open(&dpath).map_err(|source| Error::Io { path: dpath.clone(), source })?;
            let dfile =
                object::File::parse(ddata.bytes()).map_err(|source| Error::Elf { path: dpath.clone(), source })?;
            debug(&dfile)?;
            out.debug_file = Some(dpath);
        }
    }
    out.table = Table::from_rows(rows).ok_or_else(|| Error::TooLarge { path: path.into() })?;
    Ok(out)
}

/// `/usr/lib/debug/.build-id/ab/cdef….debug` for build id `abcdef…`.
pub fn debug_file_path(root: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(root.join(format!("{first:02x}")).join(format!("{hex}.debug")))
}

fn section_address(file: &object::File, name: &str) -> Option<u64> {
    file.section_by_name(name).map(|s| s.address())
}

/// Appends the rows of every `.eh_frame` FDE; records FDE ranges in `covered`.
fn eh_frame_rows(
    file: &object::File,
    eh_address: u64,
    bytes: &[u8],
    hdr: Option<&object::Section>,
    rows: &mut Vec<(u64, u64, Rule)>,
    covered: &mut Vec<(u64, u64)>,
) -> usize {
    let mut eh = EhFrame::new(bytes, LittleEndian);
    eh.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(eh_address);
    if let Some(a) = section_address(file, ".text") {
        bases = bases.set_text(a);
    }
    if let Some(a) = section_address(file, ".got") {
        bases = bases.set_got(a);
    }
    let mut ctx = UnwindContext::new();
    let mut n = 0;
    let mut one = |fde: gimli::FrameDescriptionEntry<Slice>| {
        covered.push((fde.initial_address(), fde.end_address()));
        fde_rows(&eh, &bases, &fde, &mut ctx, rows);
        n += 1;
    };
    // The sorted index the runtime's own unwinder uses, when there is one.
    if let Some(hdr) = hdr {
        let hdr_bases = bases.clone().set_eh_frame_hdr(hdr.address());
        let parsed = hdr.data().ok().and_then(|d| EhFrameHdr::new(d, LittleEndian).parse(&hdr_bases, 8).ok());
        if let Some(table) = parsed.as_ref().and_then(|p| p.table()) {
            let mut it = table.iter(&hdr_bases);
            while let Ok(Some((_, ptr))) = it.next() {
                let fde = table
                    .pointer_to_offset(ptr)
                    .and_then(|off| eh.fde_from_offset(&hdr_bases, off, EhFrame::cie_from_offset));
                if let Ok(fde) = fde {
                    one(fde);
                }
            }
            return n;
        }
    }
    let mut entries = eh.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
                one(fde);
            }
        }
    }
    n
}

/// Appends the rows of every `.debug_frame` FDE not overlapping a range in
/// `covered` (sorted).
fn debug_frame_rows(bytes: &[u8], covered: &[(u64, u64)], rows: &mut Vec<(u64, u64, Rule)>) -> usize {
    let mut df = DebugFrame::new(bytes, LittleEndian);
    df.set_address_size(8);
    let bases = BaseAddresses::default();
    let mut ctx = UnwindContext::new();
    let mut entries = df.entries(&bases);
    let mut n = 0;
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(DebugFrame::cie_from_offset) else {
            continue;
        };
        let (lo, hi) = (fde.initial_address(), fde.end_address());
        let i = covered.partition_point(|c| c.1 <= lo);
        if covered.get(i).is_some_and(|c| c.0 < hi) {
            continue;
        }
        fde_rows(&df, &bases, &fde, &mut ctx, rows);
        n += 1;
    }
    n
}

fn fde_rows<'d, S: UnwindSection<Slice<'d>>>(
    section: &S,
    bases: &BaseAddresses,
    fde: &gimli::FrameDescriptionEntry<Slice<'d>>,
    ctx: &mut UnwindContext<usize>,
    rows: &mut Vec<(u64, u64, Rule)>,
) {
    let Ok(mut table) = fde.rows(section, bases, ctx) else {
        rows.push((fde.initial_address(), fde.end_address(), Rule::STOP));
        return;
    };
    loop {
        match table.next_row() {
            Ok(Some(row)) => {
                let rule = rule_of(row);
                if rule == Rule::STOP {
                    if let Some(expanded) = periodic_rows(section, fde.cie().encoding(), row) {
                        rows.extend(expanded);
                        continue;
                    }
                }
                rows.push((row.start_address(), row.end_address(), rule));
            }
            Ok(None) => return,
            Err(_) => {
                // Keep the rows before the malformed instruction; stop after.
                rows.push((fde.initial_address(), fde.end_address(), Rule::STOP));
                return;
            }
        }
    }
}

/// Lazy-binding PLT stubs describe their CFA with one DWARF expression over
/// the whole `.plt`: RSP + 8, or RSP + 16 once the stub has pushed its index,
/// chosen by `rip & 15`. When a row's CFA is an expression of RSP and RIP only
/// that repeats every 16 bytes (checked on the first and last 16-byte slot),
/// expand it into plain RSP rows per slot. Other expressions stay `Stop`.
fn periodic_rows<'d, S: UnwindSection<Slice<'d>>>(
    section: &S,
    encoding: gimli::Encoding,
    row: &UnwindTableRow<usize>,
) -> Option<Vec<(u64, u64, Rule)>> {
    const SLOT: u64 = 16;
    let CfaRule::Expression(expr) = row.cfa() else {
        return None;
    };
    if row.register(X86_64::RA) != Some(RegisterRule::Offset(-8)) {
        return None;
    }
    if !matches!(row.register(X86_64::RBP), None | Some(RegisterRule::SameValue)) {
        return None;
    }
    let (start, end) = (row.start_address(), row.end_address());
    if start % SLOT != 0 || (end - start) % SLOT != 0 || end - start > 1 << 20 || end <= start {
        return None;
    }
    let expr = expr.get(section).ok()?;
    let offset_at = |rip: u64| cfa_minus_rsp(expr, encoding, rip);
    let offsets: Vec<u64> = (0..SLOT).map(|k| offset_at(start + k)).collect::<Option<_>>()?;
    let last: Vec<u64> = (0..SLOT).map(|k| offset_at(end - SLOT + k)).collect::<Option<_>>()?;
    if offsets != last || offsets.iter().any(|&o| o < 8) {
        return None;
    }
    let mut rows = Vec::new();
    for slot in (start..end).step_by(SLOT as usize) {
        for (k, &o) in offsets.iter().enumerate() {
            rows.push((slot + k as u64, slot + k as u64 + 1, Rule::cfa(Kind::Rsp, o, None)?));
        }
    }
    Some(rows)
}

/// Evaluates a CFA expression with RSP = a fixed base and RIP = `rip`;
/// returns CFA - RSP, or `None` if it needs anything else.
fn cfa_minus_rsp(expr: gimli::Expression<Slice>, encoding: gimli::Encoding, rip: u64) -> Option<u64> {
    use gimli::{EvaluationResult, Location, Value};
    const RSP: u64 = 1 << 40;
    let mut eval = expr.evaluation(encoding);
    let mut step = eval.evaluate().ok()?;
    loop {
        match step {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = match register {
                    X86_64::RSP => RSP,
                    X86_64::RA => rip,
                    _ => return None,
                };
                step = eval.resume_with_register(Value::Generic(v)).ok()?;
            }
            _ => return None,
        }
    }
    match eval.as_result() {
        [gimli::Piece { location: Location::Address { address }, .. }] => address.checked_sub(RSP),
        _ => None,
    }
}

/// The compact rule for one CFI row (see the module docs).
pub(crate) fn rule_of(row: &UnwindTableRow<usize>) -> Rule {
    match row.register(X86_64::RA) {
        Some(RegisterRule::Undefined) => return Rule::END,
        Some(RegisterRule::Offset(-8)) => {}
        _ => return Rule::STOP,
    }
    let (kind, offset) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => (Kind::Rsp, offset),
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => (Kind::Rbp, offset),
        _ => return Rule::STOP,
    };
    // The return address sits at CFA - 8, above the register the CFA is based on.
    let Ok(offset @ 8..) = u64::try_from(offset) else {
        return Rule::STOP;
    };
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => None,
        Some(RegisterRule::Offset(o)) if o < 0 && o % 8 == 0 => Some(o.unsigned_abs() / 8),
        Some(_) => return Rule::STOP,
    };
    Rule::cfa(kind, offset, rbp).unwrap_or(Rule::STOP)
}
