//! Naming addresses for the exporter (off the signal path).
//!
//! - Symbols come from `.symtab` (else `.dynsym`) of the module or of its
//!   separate debug file; an address is named after a symbol only if it lies
//!   in `[start, start + size)`: an address past the end of every symbol is
//!   never named after the nearest one before it.
//! - Otherwise the frame is named `module+0xoffset` (`libz.so.1+0x3a26`),
//!   the offset being the ELF virtual address (pc - load bias), which is what
//!   `addr2line`, `go tool pprof` and symbol servers take with the build id.

use crate::error::{Error, Result};
use crate::mapped::Mapped;
use object::read::elf::{ElfFile, FileHeader, Sym};
use object::{Object, ObjectSymbol, SymbolKind};
use std::path::Path;

/// Sized function symbols of one module, sorted by address.
#[derive(Debug, Default)]
pub struct Symbols {
    /// `(start, size, name)`, sorted by start.
    syms: Vec<(u64, u64, String)>,
}

impl Symbols {
    /// Reads the sized function symbols of an ELF file (`.symtab` and `.dynsym`).
    pub fn load(path: &Path) -> Result<Symbols> {
        Symbols::load_with_debug(path, None)
    }

    /// As [`Symbols::load`], adding the `.symtab` of the separate debug file
    /// found by build id under `debug_root` (normally
    /// [`crate::compile::DEBUG_ROOT`]) when it is installed: stripped
    /// libraries (libc) get their local functions back.
    pub fn load_with_debug(path: &Path, debug_root: Option<&Path>) -> Result<Symbols> {
        let data = Mapped::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let file = object::File::parse(data.bytes()).map_err(|source| Error::Elf { path: path.into(), source })?;
        let mut syms = Vec::new();
        collect(&file, &mut syms);
        let id = file.build_id().ok().flatten();
        if let Some(dpath) = debug_root.zip(id).and_then(|(root, id)| crate::compile::debug_file_path(root, id)) {
            if let Ok(ddata) = Mapped::open(&dpath) {
                let dfile = object::File::parse(ddata.bytes()).map_err(|source| Error::Elf { path: dpath, source })?;
                collect(&dfile, &mut syms);
            }
        }
        syms.sort_unstable();
        syms.dedup_by_key(|s| s.0);
        Ok(Symbols { syms })
    }

    /// The symbol containing ELF virtual address `svma`, with the offset into it.
    pub fn lookup(&self, svma: u64) -> Option<(&str, u64)> {
        let i = self.syms.partition_point(|s| s.0 <= svma).checked_sub(1)?;
        // Symbols may nest (aliases of different sizes): look back a few.
        self.syms[..=i]
            .iter()
            .rev()
            .take(4)
            .find(|s| svma < s.0.saturating_add(s.1))
            .map(|s| (s.2.as_str(), svma - s.0))
    }

    /// Address and size of the first symbol named `name`.
    pub fn find(&self, name: &str) -> Option<(u64, u64)> {
        self.syms.iter().find(|s| s.2 == name).map(|s| (s.0, s.1))
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// Whether there is no symbol.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
}

/// Names a few ELF virtual addresses of one module in one pass over its
/// symbols (and those of its separate debug file under `debug_root`), with
/// no table built: what naming one profile's leftover frames needs, at a
/// fraction of [`Symbols::load_with_debug`]'s cost (no sort, one string per
/// address named). The rules are [`Symbols::lookup`]'s: a containing sized
/// function symbol, the one that starts last. One entry per input address.
pub fn name_addresses(path: &Path, debug_root: Option<&Path>, svmas: &[u64]) -> Result<Vec<Option<String>>> {
    let data = Mapped::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
    let mut order: Vec<usize> = (0..svmas.len()).collect();
    order.sort_unstable_by_key(|&i| svmas[i]);
    let sorted: Vec<u64> = order.iter().map(|&i| svmas[i]).collect();
    // Per sorted address: (start, size, name) of the best symbol so far.
    let mut best: Vec<Option<(u64, u64, String)>> = vec![None; svmas.len()];
    let id = name_from(data.bytes(), &sorted, &mut best).map_err(|source| Error::Elf { path: path.into(), source })?;
    // The debug file only for what the module's own tables left unnamed:
    // an exported function of a stripped library is named by `.dynsym`.
    let debug = debug_root.zip(id).and_then(|(root, id)| crate::compile::debug_file_path(root, &id));
    if let Some(dpath) = debug.filter(|_| best.iter().any(Option::is_none)) {
        if let Ok(ddata) = Mapped::open(&dpath) {
            let _ = name_from(ddata.bytes(), &sorted, &mut best);
        }
    }
    let mut out = vec![None; svmas.len()];
    for (k, b) in best.into_iter().enumerate() {
        out[order[k]] = b.map(|b| b.2);
    }
    Ok(out)
}

/// One pass of [`name_addresses`] over the raw ELF symbols of `data`
/// (`.symtab`, then `.dynsym`); `sorted` ascending. Returns the file's GNU
/// build id.
fn name_from(data: &[u8], sorted: &[u64], best: &mut [Option<(u64, u64, String)>]) -> object::Result<Option<Vec<u8>>> {
    match object::FileKind::parse(data)? {
        object::FileKind::Elf64 => name_from_elf::<object::elf::FileHeader64<object::Endianness>>(data, sorted, best),
        object::FileKind::Elf32 => name_from_elf::<object::elf::FileHeader32<object::Endianness>>(data, sorted, best),
        // Not ELF: nothing to name by (and the parse error if it is no object at all).
        _ => object::File::parse(data).map(|_| None),
    }
}

/// [`name_from`] for one ELF class, straight over the symbol entries:
/// defined, sized `STT_FUNC`/`STT_GNU_IFUNC` symbols (what
/// [`Symbols::load`] keeps).
fn name_from_elf<Elf: FileHeader<Endian = object::Endianness>>(
    data: &[u8],
    sorted: &[u64],
    best: &mut [Option<(u64, u64, String)>],
) -> object::Result<Option<Vec<u8>>> {
    let elf = ElfFile::<Elf>::parse(data)?;
    let endian = elf.endian();
    for table in [elf.elf_symbol_table(), elf.elf_dynamic_symbol_table()] {
        for sym in table.symbols() {
            let (start, size) = (sym.st_value(endian).into(), sym.st_size(endian).into());
            let func = matches!(sym.st_type(), object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC);
            let shndx = sym.st_shndx(endian);
            let defined = shndx != object::elf::SHN_UNDEF
                && (shndx < object::elf::SHN_LORESERVE || shndx == object::elf::SHN_XINDEX);
            if size == 0 || !func || !defined {
                continue;
            }
            let first = sorted.partition_point(|&a| a < start);
            let end = start.saturating_add(size);
            for k in first..sorted.len() {
                if sorted[k] >= end {
                    break;
                }
                // Later start wins; at the same start the smaller symbol, then the first name.
                let better = match &best[k] {
                    None => true,
                    Some((s0, z0, _)) => (start, std::cmp::Reverse(size)) > (*s0, std::cmp::Reverse(*z0)),
                };
                if better {
                    if let Ok(name) = table.symbol_name(endian, sym) {
                        best[k] = Some((start, size, String::from_utf8_lossy(name).into_owned()));
                    }
                }
            }
        }
    }
    Ok(elf.build_id()?.map(<[u8]>::to_vec))
}

fn collect(file: &object::File, out: &mut Vec<(u64, u64, String)>) {
    let sized = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.is_definition());
    out.extend(sized.filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned()))));
}

/// `libz.so.1+0x3a26`: the module's file name and the ELF virtual address.
pub fn module_offset_name(module: &Path, svma: u64) -> String {
    let name = module.file_name().map_or_else(|| module.to_string_lossy(), |n| n.to_string_lossy());
    format!("{name}+{svma:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_respected() {
        let s = Symbols { syms: vec![(0x100, 0x10, "a".into()), (0x200, 0x8, "b".into())] };
        assert_eq!(s.lookup(0x100), Some(("a", 0)));
        assert_eq!(s.lookup(0x10f), Some(("a", 0xf)));
        assert_eq!(s.lookup(0x110), None, "past the end of `a` is not `a`");
        assert_eq!(s.lookup(0x1ff), None);
        assert_eq!(s.lookup(0x207), Some(("b", 7)));
        assert_eq!(s.lookup(0x208), None);
        assert_eq!(module_offset_name(Path::new("/lib/x86_64-linux-gnu/libz.so.1"), 0x3a26), "libz.so.1+0x3a26");
    }

    /// One pass over a real library names what the full table names.
    #[test]
    fn name_addresses_agrees_with_the_table() {
        let exe = std::env::current_exe().unwrap();
        let table = Symbols::load(&exe).unwrap();
        let mut svmas: Vec<u64> = table.syms.iter().step_by(97).flat_map(|s| [s.0, s.0 + s.1 / 2, s.0 + s.1]).collect();
        svmas.push(0);
        svmas.reverse();
        let named = name_addresses(&exe, None, &svmas).unwrap();
        let mut agree = 0;
        for (a, n) in svmas.iter().zip(&named) {
            let want = table.lookup(*a).map(|(name, _)| name);
            // The table keeps one symbol per start; aliases of the same code may differ in name.
            if want.is_some() == n.is_some() {
                agree += 1;
            }
            if let (Some(w), Some(n)) = (want, n) {
                // Another name is an alias of the same code: the table kept
                // one name per start, so it knows the other one at the same
                // start or not at all.
                let other = table.find(n).map(|f| f.0);
                assert!(other.is_none() || other == table.find(w).map(|f| f.0), "{a:#x}: {w} vs {n}");
            }
        }
        assert_eq!(agree, svmas.len(), "named the same addresses");
        assert!(named.iter().flatten().count() > 10);
    }
}
