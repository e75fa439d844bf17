//! What the sampler needs of an ELF file: some symbols, the first load
//! address, whether it is a Python interpreter or needs `libpython`.
//!
//! `osprey exec` asks this of every program a tree runs (a compiler's `cc1`
//! is 30 MB), so the file is never read whole, nor piece by piece as it is
//! parsed: [`Pieces`] reads, with one `pread` each, the headers and the
//! tables `object` will parse (symbol and string tables), then `object`
//! parses them as if they were the file.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::elf::{SHT_DYNSYM, SHT_STRTAB, SHT_SYMTAB, SHT_SYMTAB_SHNDX};
use object::read::elf::{FileHeader, SectionHeader};
use object::{Endianness, FileKind, Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef};

/// Larger tables than this are not read (no real symbol table is).
const MAX_TABLE: u64 = 1 << 30;

/// Symbols of an ELF file: name -> (file vaddr, size) for the `wanted` names
/// (all names if `wanted` is empty), plus the first PT_LOAD vaddr.
pub(crate) struct ElfInfo {
    pub symbols: HashMap<String, (u64, u64)>,
    pub first_load_vaddr: u64,
    pub dynstr_needs_libpython: bool,
    pub defines_python: bool,
}

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The [`ElfInfo`] of the file at `path`: the defined symbols of `.dynsym`
/// then `.symtab` (the first of a name wins; a name that is not UTF-8 is
/// skipped), the lowest `PT_LOAD` address, `.dynstr` found by name.
pub(crate) fn elf_info(path: &Path, wanted: &[&str]) -> io::Result<ElfInfo> {
    let file = File::open(path)?;
    let pieces = Pieces::of(&file).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    info_of(&pieces, wanted).map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// File address and size of section `name` of the ELF file at `path`.
pub(crate) fn section(path: &Path, name: &str) -> io::Result<Option<(u64, u64)>> {
    let file = File::open(path)?;
    let pieces = Pieces::of(&file).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let elf = object::File::parse(&pieces).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    Ok(elf.section_by_name(name).map(|s| (s.address(), s.size())))
}

/// Python's entry points: a file that defines one is an interpreter.
fn is_python_entry(name: &[u8]) -> bool {
    matches!(name, b"Py_BytesMain" | b"Py_Initialize" | b"_PyRuntime" | b"PyEval_EvalCode")
}

/// [`ElfInfo`] of the ELF file `data`.
fn info_of<'a, R: ReadRef<'a>>(data: R, wanted: &[&str]) -> object::Result<ElfInfo> {
    let file = object::File::parse(data)?;
    let mut symbols = HashMap::new();
    let mut defines_python = false;
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        let Ok(name) = sym.name() else { continue };
        if sym.is_undefined() {
            continue;
        }
        if is_python_entry(name.as_bytes()) {
            defines_python = true;
        }
        if (wanted.is_empty() || wanted.contains(&name)) && !symbols.contains_key(name) {
            symbols.insert(name.to_string(), (sym.address(), sym.size()));
        }
    }
    let first_load_vaddr = file.segments().map(|s| s.address()).min().unwrap_or(0);
    let dynstr_needs_libpython = file
        .section_by_name(".dynstr")
        .and_then(|s| s.data().ok())
        .is_some_and(|d| d.split(|&c| c == 0).any(|n| n.starts_with(b"libpython3")));
    Ok(ElfInfo { symbols, first_load_vaddr, dynstr_needs_libpython, defines_python })
}

/// Parts of a file, each read whole: `object` reads them as the file (a
/// read outside them fails, as one past the end of a file would).
///
/// Invariant: every part starts at an 8-aligned file offset and is held in
/// 8-aligned memory, so `object`'s aligned reads of ELF structures hold.
struct Pieces {
    len: u64,
    /// (file offset, length in bytes, the bytes in words).
    parts: Vec<(u64, u64, Vec<u64>)>,
}

impl Pieces {
    /// The ELF headers, section headers, and the symbol and string tables
    /// of `file`, which must be an ELF file.
    fn of(file: &File) -> Result<Pieces, String> {
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let mut p = Pieces { len, parts: Vec::new() };
        p.load(file, 0, 64.min(len))?;
        match FileKind::parse(&p) {
            Ok(FileKind::Elf32) => p.read_tables::<object::elf::FileHeader32<Endianness>>(file)?,
            Ok(FileKind::Elf64) => p.read_tables::<object::elf::FileHeader64<Endianness>>(file)?,
            _ => return Err("not an ELF file".into()),
        }
        Ok(p)
    }

    /// Reads what `ElfFile::parse` and the symbol names need, a class of
    /// ELF file at a time (`Elf`). Each step reads what the previous one
    /// found (section 0 holds the counts past 0xff00).
    fn read_tables<Elf: FileHeader<Endian = Endianness>>(&mut self, file: &File) -> Result<(), String> {
        let e = |e: object::Error| e.to_string();
        let (endian, shoff, shentsize) = {
            let h = Elf::parse(&*self).map_err(e)?;
            let endian = h.endian().map_err(e)?;
            (endian, h.e_shoff(endian).into(), h.e_shentsize(endian) as u64)
        };
        if shoff != 0 {
            self.load(file, shoff, shentsize)?;
        }
        let (phoff, phsize, shsize) = {
            let h = Elf::parse(&*self).map_err(e)?;
            let phnum = h.phnum(endian, &*self).map_err(e)? as u64;
            let shnum = h.shnum(endian, &*self).map_err(e)? as u64;
            (h.e_phoff(endian).into(), phnum * h.e_phentsize(endian) as u64, shnum * shentsize)
        };
        self.load(file, phoff, phsize)?;
        self.load(file, shoff, shsize)?;
        let tables: Vec<(u64, u64)> = {
            let h = Elf::parse(&*self).map_err(e)?;
            let sections = h.section_headers(endian, &*self).map_err(e)?;
            let kinds = [SHT_SYMTAB, SHT_DYNSYM, SHT_STRTAB, SHT_SYMTAB_SHNDX];
            sections
                .iter()
                .filter(|s| kinds.contains(&s.sh_type(endian)))
                .filter_map(|s| s.file_range(endian))
                .collect()
        };
        for (off, size) in tables {
            self.load(file, off, size)?;
        }
        Ok(())
    }

    /// Reads `len` bytes at `off` as one part, unless a part holds them.
    fn load(&mut self, file: &File, off: u64, len: u64) -> Result<(), String> {
        if len == 0 || self.find(off, len).is_some() {
            return Ok(());
        }
        if len > MAX_TABLE || off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(format!("table of {len} bytes at {off} past the file's end"));
        }
        let start = off & !7;
        let n = off + len - start;
        let mut words = vec![0u64; n.div_ceil(8) as usize];
        let bytes = &mut object::pod::bytes_of_slice_mut(&mut words)[..n as usize];
        file.read_exact_at(bytes, start).map_err(|e| e.to_string())?;
        self.parts.push((start, n, words));
        Ok(())
    }

    /// Of the parts holding `off`, the one reaching furthest, from `off` to
    /// its end (parts may overlap: a table read again whole after a piece).
    fn from(&self, off: u64) -> Option<&[u8]> {
        let (s, n, w) = self.parts.iter().filter(|(s, n, _)| off >= *s && off < s + n).max_by_key(|(s, n, _)| s + n)?;
        Some(&object::pod::bytes_of_slice(w)[(off - s) as usize..*n as usize])
    }

    /// Bytes `off..off + len`, if one part holds them.
    fn find(&self, off: u64, len: u64) -> Option<&[u8]> {
        self.from(off).and_then(|b| b.get(..usize::try_from(len).ok()?))
    }
}

impl<'a> ReadRef<'a> for &'a Pieces {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        self.find(offset, size).ok_or(())
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let b = self.from(range.start).ok_or(())?;
        let b = &b[..b.len().min(range.end.saturating_sub(range.start) as usize)];
        b.iter().position(|&c| c == delimiter).map(|i| &b[..i]).ok_or(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parsing the parts read answers as parsing the whole file, on files
    /// with and without `.symtab`, with and without a libpython dependency.
    #[test]
    fn the_parts_read_answer_as_the_whole_file() {
        let mut files = vec![std::env::current_exe().unwrap()];
        for p in ["/bin/true", "/bin/sh", "/usr/bin/python3", "/usr/lib/x86_64-linux-gnu/libc.so.6"] {
            if Path::new(p).exists() {
                files.push(Path::new(p).canonicalize().unwrap());
            }
        }
        // gcc's `cc1` (30 MB, large symbol tables), when gcc is installed.
        let gcc = std::fs::read_dir("/usr/lib/gcc/x86_64-linux-gnu").into_iter().flatten().flatten();
        files.extend(gcc.map(|d| d.path().join("cc1")).filter(|p| p.exists()));
        for f in &files {
            let whole = std::fs::read(f).unwrap();
            let pieces = Pieces::of(&File::open(f).unwrap()).unwrap();
            assert!(pieces.parts.len() <= 12, "{}: {} reads", f.display(), pieces.parts.len());
            for wanted in [&[][..], &["Py_BytesMain", "main", "malloc"][..]] {
                let ours = info_of(&pieces, wanted).unwrap();
                let theirs = info_of(&whole[..], wanted).unwrap();
                assert_eq!(ours.symbols, theirs.symbols, "{}", f.display());
                assert_eq!(ours.first_load_vaddr, theirs.first_load_vaddr, "{}", f.display());
                assert_eq!(ours.dynstr_needs_libpython, theirs.dynstr_needs_libpython, "{}", f.display());
                assert_eq!(ours.defines_python, theirs.defines_python, "{}", f.display());
            }
        }
        let e = elf_info(Path::new("/proc/self/status"), &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let e = elf_info(Path::new("/etc/hostname"), &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
