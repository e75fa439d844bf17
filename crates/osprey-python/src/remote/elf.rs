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

use object::elf::{SHT_DYNSYM, SHT_GNU_HASH, SHT_STRTAB, SHT_SYMTAB, SHT_SYMTAB_SHNDX};
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::{Endianness, FileKind, Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef};

/// Larger tables than this are not read (no real symbol table is).
const MAX_TABLE: u64 = 1 << 30;

/// Symbols of an ELF file: name -> (file vaddr, size) for the `wanted` names
/// (all names if `wanted` is empty), plus the first PT_LOAD vaddr.
pub(crate) struct ElfInfo {
    pub symbols: HashMap<String, (u64, u64)>,
    pub first_load_vaddr: u64,
    pub dynstr_needs_libpython: bool,
}

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The [`ElfInfo`] of the file at `path`: the defined symbols of `.dynsym`
/// then `.symtab` (the first of a name wins; a name that is not UTF-8 is
/// skipped), the lowest `PT_LOAD` address, `.dynstr` found by name.
pub(crate) fn elf_info(path: &Path, wanted: &[&str]) -> io::Result<ElfInfo> {
    let file = File::open(path)?;
    let pieces = Pieces::of(&file, Tables::All).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    info_of(&pieces, wanted).map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// Whether the ELF file at `path` is a CPython interpreter: it defines one
/// of Python's entry points in its dynamic symbols, or needs a
/// `libpython3`. Reads the headers and the dynamic symbol and string tables
/// only (a compiler's full symbol table is megabytes): an interpreter
/// exports its API there, as the extension modules it loads link against it.
pub(crate) fn is_interpreter(path: &Path) -> io::Result<bool> {
    let file = File::open(path)?;
    let pieces = Pieces::of(&file, Tables::Dynamic).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    // `of_dynamic` took the file for ELF: one of the two classes.
    let found = match FileKind::parse(&pieces) {
        Ok(FileKind::Elf32) => dynamic_python::<object::elf::FileHeader32<Endianness>>(&pieces),
        _ => dynamic_python::<object::elf::FileHeader64<Endianness>>(&pieces),
    };
    found.map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// [`is_interpreter`] over the pieces read.
fn dynamic_python<Elf: FileHeader<Endian = Endianness>>(data: &Pieces) -> object::Result<bool> {
    let h = Elf::parse(data)?;
    let endian = h.endian()?;
    let sections = h.sections(endian, data)?;
    let symbols = sections.symbols(endian, data, SHT_DYNSYM)?;
    // The loader's own lookup, 4 names in the hash table, rather than a
    // pass over every symbol (`cc1` exports 29,000). Only defined symbols
    // are in a GNU hash table.
    let defines = match sections.gnu_hash(endian, data)? {
        Some((hash, _)) => {
            let versions = object::read::elf::VersionTable::default();
            PYTHON_ENTRIES
                .iter()
                .any(|n| hash.find(endian, n, object::elf::gnu_hash(n), None, &symbols, &versions).is_some())
        }
        None => symbols
            .iter()
            .any(|sym| !sym.is_undefined(endian) && sym.name(endian, symbols.strings()).is_ok_and(is_python_entry)),
    };
    let needs = sections
        .section(symbols.string_section())
        .and_then(|s| s.data(endian, data))
        .is_ok_and(|d: &[u8]| d.split(|&c| c == 0).any(|n| n.starts_with(b"libpython3")));
    Ok(defines || needs)
}

/// File address and size of section `name` of the ELF file at `path`.
pub(crate) fn section(path: &Path, name: &str) -> io::Result<Option<(u64, u64)>> {
    let file = File::open(path)?;
    let pieces = Pieces::of(&file, Tables::All).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let elf = object::File::parse(&pieces).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    Ok(elf.section_by_name(name).map(|s| (s.address(), s.size())))
}

/// Python's entry points: a file that defines one is an interpreter.
const PYTHON_ENTRIES: [&[u8]; 4] = [b"Py_BytesMain", b"Py_Initialize", b"_PyRuntime", b"PyEval_EvalCode"];

fn is_python_entry(name: &[u8]) -> bool {
    PYTHON_ENTRIES.contains(&name)
}

/// [`ElfInfo`] of the ELF file `data`.
fn info_of<'a, R: ReadRef<'a>>(data: R, wanted: &[&str]) -> object::Result<ElfInfo> {
    let file = object::File::parse(data)?;
    let mut symbols = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        let Ok(name) = sym.name() else { continue };
        if sym.is_undefined() {
            continue;
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
    Ok(ElfInfo { symbols, first_load_vaddr, dynstr_needs_libpython })
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

/// Which tables [`Pieces::of`] reads besides the headers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tables {
    /// Every symbol and string table (what `ElfFile::parse` and the symbol
    /// names need).
    All,
    /// The dynamic symbol table, its GNU hash table and their strings.
    Dynamic,
}

impl Pieces {
    /// The ELF headers, section headers, and the `tables` of `file`, which
    /// must be an ELF file.
    fn of(file: &File, tables: Tables) -> Result<Pieces, String> {
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let mut p = Pieces { len, parts: Vec::new() };
        p.load(file, 0, 64.min(len))?;
        match FileKind::parse(&p) {
            Ok(FileKind::Elf32) => p.read_tables::<object::elf::FileHeader32<Endianness>>(file, tables)?,
            Ok(FileKind::Elf64) => p.read_tables::<object::elf::FileHeader64<Endianness>>(file, tables)?,
            _ => return Err("not an ELF file".into()),
        }
        Ok(p)
    }

    /// Reads the headers, then `tables`, a class of ELF file at a time
    /// (`Elf`). Each step reads what the previous one found (section 0
    /// holds the counts past 0xff00).
    fn read_tables<Elf: FileHeader<Endian = Endianness>>(&mut self, file: &File, tables: Tables) -> Result<(), String> {
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
        let ranges: Vec<(u64, u64)> = {
            let h = Elf::parse(&*self).map_err(e)?;
            let sections = h.section_headers(endian, &*self).map_err(e)?;
            let kinds: &[u32] = match tables {
                Tables::All => &[SHT_SYMTAB, SHT_DYNSYM, SHT_STRTAB, SHT_SYMTAB_SHNDX],
                Tables::Dynamic => &[SHT_DYNSYM, SHT_GNU_HASH],
            };
            let wanted: Vec<_> = sections.iter().filter(|s| kinds.contains(&s.sh_type(endian))).collect();
            // The dynamic tables' strings: the section each links to.
            let links = wanted.iter().filter(|_| tables == Tables::Dynamic);
            let links = links.filter_map(|s| sections.get(s.sh_link(endian) as usize));
            wanted.iter().copied().chain(links).filter_map(|s| s.file_range(endian)).collect()
        };
        for (off, size) in ranges {
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
            let pieces = Pieces::of(&File::open(f).unwrap(), Tables::All).unwrap();
            assert!(pieces.parts.len() <= 12, "{}: {} reads", f.display(), pieces.parts.len());
            for wanted in [&[][..], &["Py_BytesMain", "main", "malloc"][..]] {
                let ours = info_of(&pieces, wanted).unwrap();
                let theirs = info_of(&whole[..], wanted).unwrap();
                assert_eq!(ours.symbols, theirs.symbols, "{}", f.display());
                assert_eq!(ours.first_load_vaddr, theirs.first_load_vaddr, "{}", f.display());
                assert_eq!(ours.dynstr_needs_libpython, theirs.dynstr_needs_libpython, "{}", f.display());
            }
        }
        let e = elf_info(Path::new("/proc/self/status"), &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let e = elf_info(Path::new("/etc/hostname"), &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    /// The dynamic tables alone tell an interpreter as all of the file's
    /// symbols do: pyenv's shared builds (a `libpython3` needed), Debian's
    /// static `python3.11` (its API exported), and programs that are not
    /// one (gcc's `cc1`, with its full symbol table, among them).
    #[test]
    fn an_interpreter_is_known_by_its_dynamic_tables() {
        let mut files: Vec<(std::path::PathBuf, Option<bool>)> = vec![(std::env::current_exe().unwrap(), Some(false))];
        for (p, is) in [("/bin/sh", Some(false)), ("/bin/true", Some(false)), ("/usr/bin/python3.11", Some(true))] {
            if Path::new(p).exists() {
                files.push((Path::new(p).canonicalize().unwrap(), is));
            }
        }
        let pyenv = std::env::var("PYENV_ROOT").map_or_else(|_| Path::new("/root/.pyenv").to_path_buf(), Into::into);
        for v in std::fs::read_dir(pyenv.join("versions")).into_iter().flatten().flatten() {
            let exe =
                std::fs::read_dir(v.path().join("bin")).into_iter().flatten().flatten().map(|e| e.path()).find(|p| {
                    let n = p.file_name().unwrap().to_string_lossy().into_owned();
                    n.starts_with("python3.") && n[8..].chars().all(|c| c.is_ascii_digit())
                });
            files.extend(exe.map(|e| (e, Some(true))));
        }
        let gcc = std::fs::read_dir("/usr/lib/gcc/x86_64-linux-gnu").into_iter().flatten().flatten();
        files.extend(gcc.map(|d| d.path().join("cc1")).filter(|p| p.exists()).map(|p| (p, Some(false))));
        assert!(files.iter().any(|(_, is)| *is == Some(true)), "no interpreter found to test with: {files:?}");
        for (f, expected) in &files {
            let whole = std::fs::read(f).unwrap();
            let elf = object::File::parse(&whole[..]).unwrap();
            let defines = elf
                .dynamic_symbols()
                .chain(elf.symbols())
                .any(|s| !s.is_undefined() && s.name().is_ok_and(|n| is_python_entry(n.as_bytes())));
            let all_tables = defines || info_of(&whole[..], &[]).unwrap().dynstr_needs_libpython;
            let ours = is_interpreter(f).unwrap();
            assert_eq!(ours, all_tables, "{}", f.display());
            if let Some(e) = expected {
                assert_eq!(ours, *e, "{}", f.display());
            }
        }
        assert_eq!(is_interpreter(Path::new("/etc/hostname")).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
