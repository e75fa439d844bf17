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

    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
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
}
