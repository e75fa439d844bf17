//! Reading another process: memory (`process_vm_readv`, never stopping it),
//! `/proc/PID/maps`, and ELF symbols of its modules with their load bias
//! ([`super::elf`]).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::PathBuf;

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
    let info = super::elf::elf_info(&target_path(pid, path), wanted)?;
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
    let m = load_module(pid, maps, path, &[name])?;
    let found = super::elf::section(&target_path(pid, path), name)?;
    Ok(found.map(|(addr, size)| (addr.wrapping_add(m.bias), size)))
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

    #[test]
    fn read_self() {
        let x: u64 = 0x1122334455667788;
        let mem = Mem::new(std::process::id() as i32);
        assert_eq!(mem.u64(&x as *const u64 as u64).unwrap(), x);
        let s = b"hello\0world";
        assert_eq!(mem.cstr(s.as_ptr() as u64, 100).unwrap(), "hello");
    }
}
