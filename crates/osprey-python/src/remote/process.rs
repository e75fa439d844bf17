//! Reading another process: memory (`process_vm_readv`, never stopping it),
//! `/proc/PID/maps`, and ELF symbols of its modules with their load bias.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

/// Memory of a process, read with `process_vm_readv`.
#[derive(Clone, Copy, Debug)]
pub struct Mem {
    /// Process id (in this process's PID namespace).
    pub pid: i32,
}

impl Mem {
    /// Memory of process `pid`.
    pub fn new(pid: i32) -> Self {
        Mem { pid }
    }

    /// Reads exactly `buf.len()` bytes at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if addr == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "read at NULL"));
        }
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: `local` describes `buf`, which we own mutably; the remote
        // iovec is only interpreted by the kernel in the other process.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short remote read"));
        }
        Ok(())
    }

    /// Reads exactly `len` bytes at `addr`.
    pub fn read_vec(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }

    /// A little-endian `u64` at `addr`.
    pub fn u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A little-endian `u32` at `addr`.
    pub fn u32(&self, addr: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A little-endian `i32` at `addr`.
    pub fn i32(&self, addr: u64) -> io::Result<i32> {
        Ok(self.u32(addr)? as i32)
    }

    /// A NUL-terminated string of at most `max` bytes.
    pub fn cstr(&self, addr: u64, max: usize) -> io::Result<String> {
        let mut out = Vec::new();
        let mut a = addr;
        while out.len() < max {
            // Read in small chunks that never cross a page boundary.
            let room = (4096 - (a % 4096)) as usize;
            let n = room.min(64).min(max - out.len());
            let chunk = self.read_vec(a, n)?;
            if let Some(z) = chunk.iter().position(|&c| c == 0) {
                out.extend_from_slice(&chunk[..z]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk);
            a += n as u64;
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

pub(crate) fn rd_u64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap())).unwrap_or(0)
}
pub(crate) fn rd_u32(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap())).unwrap_or(0)
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug)]
pub(crate) struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

pub(crate) fn read_maps(pid: i32) -> io::Result<Vec<MapEntry>> {
    Ok(parse_maps(&osprey_procfs::maps::read(pid)?))
}

/// The entries of a `/proc/PID/maps` text; a deleted file keeps the path it
/// was mapped from (without `" (deleted)"`), as the loader named it.
pub(crate) fn parse_maps(text: &[u8]) -> Vec<MapEntry> {
    osprey_procfs::maps::entries(text)
        .map(|e| MapEntry {
            start: e.start,
            end: e.end,
            offset: e.offset,
            path: String::from_utf8_lossy(e.path).into_owned(),
        })
        .collect()
}

/// Is `name` (a file name, not a path) a CPython shared library?
pub(crate) fn is_libpython_name(name: &str) -> bool {
    name.starts_with("libpython3") && name.contains(".so")
}

/// An ELF module mapped into the target, with the symbols osprey asked for.
#[derive(Debug, Clone)]
pub struct Module {
    /// Path of the file in the target's mount namespace.
    pub path: String,
    /// runtime address = file virtual address + bias
    pub bias: u64,
    /// Lowest runtime address of its mappings.
    pub start: u64,
    /// End (exclusive) of its highest mapping.
    pub end: u64,
    /// name -> (runtime address, size)
    pub symbols: HashMap<String, (u64, u64)>,
    /// Its `.dynstr` names a `libpython3` (an interpreter linked to libpython).
    pub dynstr_needs_libpython: bool,
}

impl Module {
    /// Runtime address of symbol `name`, if found.
    pub fn sym(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).map(|s| s.0)
    }
    /// Runtime address and size of symbol `name`, if found.
    pub fn sym_size(&self, name: &str) -> Option<(u64, u64)> {
        self.symbols.get(name).copied()
    }
    /// Is `addr` within `start..end`?
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end
    }
}

/// Path under which the target's file can be opened from here (handles
/// other mount namespaces through /proc/PID/root).
pub(crate) fn target_path(pid: i32, path: &str) -> PathBuf {
    let p = PathBuf::from(format!("/proc/{pid}/root{path}"));
    if p.exists() {
        p
    } else {
        PathBuf::from(path)
    }
}

/// Symbols of an ELF file: name -> (file vaddr, size) for the `wanted` names
/// (all names if `wanted` is empty), plus the first PT_LOAD vaddr.
pub(crate) struct ElfInfo {
    pub symbols: HashMap<String, (u64, u64)>,
    pub first_load_vaddr: u64,
    pub dynstr_needs_libpython: bool,
    pub defines_python: bool,
}

pub(crate) fn elf_info(path: &Path, wanted: &[&str]) -> io::Result<ElfInfo> {
    let file = fs::File::open(path)?;
    // `osprey exec` asks this of every program a tree runs: the headers and
    // the two symbol tables with their string tables are read with one
    // `pread` each (a compiler's `cc1` is 30 MB; reading it through
    // `object::ReadCache` cost one `read` and `lseek` per symbol name).
    if let Some(info) = elf64::info(&file, wanted)? {
        return Ok(info);
    }
    elf_info_object(path, file, wanted)
}

/// Python's entry points: a file that defines one is an interpreter.
fn is_python_entry(name: &[u8]) -> bool {
    matches!(name, b"Py_BytesMain" | b"Py_Initialize" | b"_PyRuntime" | b"PyEval_EvalCode")
}

/// [`elf_info`] through `object`, for what [`elf64`] does not read (32-bit
/// or big-endian files, extended section numbering).
fn elf_info_object(path: &Path, file: fs::File, wanted: &[&str]) -> io::Result<ElfInfo> {
    // Only the ranges parsed are read (headers, symbol and string tables).
    let data = object::ReadCache::new(file);
    let file = object::File::parse(&data)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
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
    let dynstr_needs_libpython = {
        use object::ObjectSection;
        file.section_by_name(".dynstr")
            .and_then(|s| s.data().ok())
            .map(|d| d.split(|&c| c == 0).any(|n| n.starts_with(b"libpython3")))
            .unwrap_or(false)
    };
    Ok(ElfInfo { symbols, first_load_vaddr, dynstr_needs_libpython, defines_python })
}

/// A reader of little-endian ELF64 files (x86-64, aarch64) that reads each
/// table it needs in one piece. It answers exactly as `object` does: the
/// defined symbols of `.dynsym` then `.symtab` (the first of a name wins; a
/// name that is not UTF-8 is skipped), the lowest `PT_LOAD` address, the
/// `.dynstr` section found by name.
mod elf64 {
    use super::{is_python_entry, rd_u32, rd_u64, ElfInfo};
    use std::collections::HashMap;
    use std::fs::File;
    use std::io;
    use std::os::unix::fs::FileExt;

    const SHT_SYMTAB: u32 = 2;
    const SHT_NOBITS: u32 = 8;
    const SHT_DYNSYM: u32 = 11;
    const PT_LOAD: u32 = 1;
    const SYM_SIZE: usize = 24;
    /// Larger tables than this are not read (no real symbol table is).
    const MAX_TABLE: u64 = 1 << 30;

    fn rd_u16(b: &[u8], off: usize) -> u16 {
        b.get(off..off + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).unwrap_or(0)
    }

    fn bad(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, what.to_string())
    }

    fn read_at(file: &File, off: u64, len: u64) -> io::Result<Vec<u8>> {
        if len > MAX_TABLE {
            return Err(bad("ELF table too large"));
        }
        let mut v = vec![0u8; len as usize];
        file.read_exact_at(&mut v, off)?;
        Ok(v)
    }

    struct Section {
        name: u32,
        kind: u32,
        offset: u64,
        size: u64,
        link: u32,
    }

    impl Section {
        fn data(&self, file: &File) -> io::Result<Vec<u8>> {
            if self.kind == SHT_NOBITS {
                return Ok(Vec::new());
            }
            read_at(file, self.offset, self.size)
        }
    }

    /// None when the file is ELF but not one this reader handles.
    pub(super) fn info(file: &File, wanted: &[&str]) -> io::Result<Option<ElfInfo>> {
        let mut eh = [0u8; 64];
        file.read_exact_at(&mut eh, 0).map_err(|_| bad("not an ELF file"))?;
        if &eh[..4] != b"\x7fELF" {
            return Err(bad("not an ELF file"));
        }
        if eh[4] != 2 || eh[5] != 1 {
            return Ok(None);
        }
        let (phoff, shoff) = (rd_u64(&eh, 32), rd_u64(&eh, 40));
        let (phentsize, phnum) = (rd_u16(&eh, 54) as u64, rd_u16(&eh, 56) as u64);
        let (shentsize, shnum, shstrndx) = (rd_u16(&eh, 58) as u64, rd_u16(&eh, 60) as u64, rd_u16(&eh, 62));
        // Extended numbering (more than 0xff00 sections or segments) is left to `object`.
        if phnum == 0xffff || (shoff != 0 && shnum == 0) || shstrndx == 0xffff {
            return Ok(None);
        }
        let mut first_load_vaddr = None::<u64>;
        if phoff != 0 && phnum != 0 {
            if phentsize < 56 {
                return Err(bad("bad program header size"));
            }
            let ph = read_at(file, phoff, phentsize * phnum)?;
            for i in 0..phnum as usize {
                let h = &ph[i * phentsize as usize..];
                if rd_u32(h, 0) == PT_LOAD {
                    let v = rd_u64(h, 16);
                    first_load_vaddr = Some(first_load_vaddr.map_or(v, |f| f.min(v)));
                }
            }
        }
        let mut sections = Vec::new();
        if shoff != 0 {
            if shentsize < 64 {
                return Err(bad("bad section header size"));
            }
            let sh = read_at(file, shoff, shentsize * shnum)?;
            for i in 0..shnum as usize {
                let h = &sh[i * shentsize as usize..];
                sections.push(Section {
                    name: rd_u32(h, 0),
                    kind: rd_u32(h, 4),
                    offset: rd_u64(h, 24),
                    size: rd_u64(h, 32),
                    link: rd_u32(h, 40),
                });
            }
        }
        let mut symbols = HashMap::new();
        let mut defines_python = false;
        let mut dynstr_seen: Option<(usize, Vec<u8>)> = None;
        for kind in [SHT_DYNSYM, SHT_SYMTAB] {
            // `object` takes the first table of each kind.
            let Some(table) = sections.iter().find(|s| s.kind == kind) else { continue };
            let Some(strtab) = sections.get(table.link as usize) else { return Err(bad("bad symbol string table")) };
            let (syms, strs) = (table.data(file)?, strtab.data(file)?);
            for sym in syms.chunks_exact(SYM_SIZE) {
                if rd_u16(sym, 6) == 0 {
                    continue; // SHN_UNDEF
                }
                let at = rd_u32(sym, 0) as usize;
                let Some(rest) = strs.get(at..) else { continue };
                let name = &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())];
                if rest.len() == name.len() {
                    continue; // unterminated: `object` fails on it
                }
                if is_python_entry(name) {
                    defines_python = true;
                }
                let Ok(name) = std::str::from_utf8(name) else { continue };
                if (wanted.is_empty() || wanted.contains(&name)) && !symbols.contains_key(name) {
                    symbols.insert(name.to_string(), (rd_u64(sym, 8), rd_u64(sym, 16)));
                }
            }
            if kind == SHT_DYNSYM {
                dynstr_seen = Some((table.link as usize, strs));
            }
        }
        // `.dynstr` by name, as `object` finds it; almost always `.dynsym`'s link.
        let names = match sections.get(shstrndx as usize) {
            Some(s) if shstrndx != 0 => s.data(file)?,
            _ => Vec::new(),
        };
        let name_of = |s: &Section| -> &[u8] {
            let rest = names.get(s.name as usize..).unwrap_or(&[]);
            &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
        };
        let needs = |d: &[u8]| d.split(|&c| c == 0).any(|n| n.starts_with(b"libpython3"));
        let dynstr = sections.iter().position(|s| name_of(s) == b".dynstr");
        let dynstr_needs_libpython = match (dynstr, &dynstr_seen) {
            (Some(i), Some((seen, d))) if i == *seen => needs(d),
            // Unreadable counts as absent, as with `object`.
            (Some(i), _) => sections[i].data(file).is_ok_and(|d| needs(&d)),
            (None, _) => false,
        };
        Ok(Some(ElfInfo {
            symbols,
            first_load_vaddr: first_load_vaddr.unwrap_or(0),
            dynstr_needs_libpython,
            defines_python,
        }))
    }
}

/// Loads module `path` as mapped in `maps`, with the `wanted` symbols.
pub(crate) fn load_module(pid: i32, maps: &[MapEntry], path: &str, wanted: &[&str]) -> io::Result<Module> {
    let entries: Vec<&MapEntry> = maps.iter().filter(|m| m.path == path).collect();
    let first = entries
        .iter()
        .filter(|m| m.offset == 0)
        .map(|m| m.start)
        .min()
        .or_else(|| entries.iter().map(|m| m.start - m.offset).min())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{path} not mapped")))?;
    let start = entries.iter().map(|m| m.start).min().unwrap_or(first);
    let end = entries.iter().map(|m| m.end).max().unwrap_or(first);
    let info = elf_info(&target_path(pid, path), wanted)?;
    let bias = first.wrapping_sub(info.first_load_vaddr & !0xfff);
    let symbols = info.symbols.into_iter().map(|(k, (a, s))| (k, (a.wrapping_add(bias), s))).collect();
    Ok(Module {
        path: path.to_string(),
        bias,
        start,
        end,
        symbols,
        dynstr_needs_libpython: info.dynstr_needs_libpython,
    })
}

/// Runtime address and size of section `name` of module `path` (mapped in
/// `maps`), None if the file has no such section.
pub(crate) fn section_in(pid: i32, maps: &[MapEntry], path: &str, name: &str) -> io::Result<Option<(u64, u64)>> {
    use object::ObjectSection;
    let m = load_module(pid, maps, path, &[name])?;
    let data = fs::read(target_path(pid, path))?;
    let file = object::File::parse(&*data).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    Ok(file.section_by_name(name).map(|s| (s.address().wrapping_add(m.bias), s.size())))
}

/// Executable path of the process.
pub(crate) fn exe_path(pid: i32) -> io::Result<String> {
    Ok(fs::read_link(format!("/proc/{pid}/exe"))?.to_string_lossy().into_owned())
}

/// Thread ids of the process.
pub fn list_tids(pid: i32) -> io::Result<Vec<i32>> {
    let mut v: Vec<i32> =
        fs::read_dir(format!("/proc/{pid}/task"))?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    v.sort_unstable();
    Ok(v)
}

/// Seconds since boot (`/proc/uptime`, the clock of `/proc`'s start times).
pub(crate) fn uptime() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()
}

/// Is process `pid` running (not exited, not a zombie)? Also true of a
/// thread id (its `/proc` entry is reachable though hidden).
pub(crate) fn process_alive(pid: i32) -> bool {
    let Ok(text) = osprey_procfs::stat::read(pid) else { return false };
    osprey_procfs::stat::Stat::parse(&text).is_some_and(|s| !matches!(s.state, b'Z' | b'X'))
}

/// Is `pid` a child of this process?
pub(crate) fn is_our_child(pid: i32) -> bool {
    let Ok(text) = osprey_procfs::stat::read(pid) else { return false };
    osprey_procfs::stat::Stat::parse(&text).and_then(|s| s.ppid()) == Some(std::process::id() as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parse() {
        let m = parse_maps(
            b"7f00-7f10 r-xp 00001000 08:01 123  /usr/lib/libpython3.12.so.1.0\n\
             7f20-7f30 rw-p 00000000 00:00 0 \n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].start, 0x7f00);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].path, "/usr/lib/libpython3.12.so.1.0");
        assert_eq!(m[1].path, "");
        assert!(is_libpython_name("libpython3.12.so.1.0"));
        assert!(!is_libpython_name("libpython2.7.so.1.0"));
    }

    /// The one-piece reader answers as `object` does, on files with and
    /// without `.symtab`, with and without a libpython dependency.
    #[test]
    fn elf64_reader_agrees_with_object() {
        let me = std::env::current_exe().unwrap();
        let mut files = vec![me.clone()];
        for p in ["/bin/true", "/bin/sh", "/usr/bin/python3", "/usr/lib/x86_64-linux-gnu/libc.so.6"] {
            if Path::new(p).exists() {
                files.push(Path::new(p).canonicalize().unwrap());
            }
        }
        for f in &files {
            for wanted in [&[][..], &["Py_BytesMain", "main", "malloc"][..]] {
                let ours = elf64::info(&fs::File::open(f).unwrap(), wanted).unwrap().expect("ELF64 LE");
                let theirs = elf_info_object(f, fs::File::open(f).unwrap(), wanted).unwrap();
                assert_eq!(ours.symbols, theirs.symbols, "{}", f.display());
                assert_eq!(ours.first_load_vaddr, theirs.first_load_vaddr, "{}", f.display());
                assert_eq!(ours.dynstr_needs_libpython, theirs.dynstr_needs_libpython, "{}", f.display());
                assert_eq!(ours.defines_python, theirs.defines_python, "{}", f.display());
            }
        }
        let e = elf_info(Path::new("/proc/self/status"), &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn read_self() {
        let x: u64 = 0x1122334455667788;
        let mem = Mem::new(std::process::id() as i32);
        assert_eq!(mem.u64(&x as *const u64 as u64).unwrap(), x);
        let s = b"hello\0world";
        assert_eq!(mem.cstr(s.as_ptr() as u64, 100).unwrap(), "hello");
    }
}
