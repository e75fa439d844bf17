//! Native address -> function/file/line, with `blazesym`, off the signal path.
//!
//! One [`Symbolizer`] lives for one call of [`symbolize`] and is dropped at its
//! end: its caches (mapped ELF/DWARF data, parsed line tables) go with it, so
//! the agent's resident memory returns to its baseline between flushes.
//! The freed heap pages stay resident in the caller's malloc arena until
//! [`release_free_heap`], which the caller runs where it is safe (see there).

use blazesym::symbolize::source::{Elf, Process, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer};
use blazesym::Pid;

/// One (possibly inlined) function at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymLine {
    /// Demangled name.
    pub name: String,
    /// Source file; empty when unknown.
    pub file: String,
    /// Line in `file`; 0 when unknown.
    pub line: i64,
}

/// Symbolization of one address. `lines` is innermost first, the physical
/// (non-inlined) function last, as pprof's `Location.line` wants; it is empty
/// when the address could not be symbolized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Functions at the address, innermost first; empty if unsymbolized.
    pub lines: Vec<SymLine>,
    /// Source locations (DWARF) were available, hence also inlining information.
    pub debug_info: bool,
}

/// Symbolizes `(addr, return_address)` pairs in `pid`'s address space (`pid <= 0`:
/// this process). A return address is looked up at `addr - 1` so that it
/// lands inside the call instruction. The result has one entry per input.
/// `lines`: use DWARF (file, line, inlined frames) besides ELF symbols.
pub fn symbolize(pid: i32, addrs: &[(u64, bool)], lines: bool) -> Vec<Resolved> {
    symbolize_in(pid, addrs, lines, None)
}

/// [`symbolize`], with the text of `/proc/<pid>/maps` when the caller read
/// it already (it is read here otherwise).
pub fn symbolize_in(pid: i32, addrs: &[(u64, bool)], lines: bool, maps: Option<&[u8]>) -> Vec<Resolved> {
    let lookup: Vec<u64> = addrs.iter().map(|&(a, ret)| if ret { a.saturating_sub(1) } else { a }).collect();
    let pid = if pid <= 0 || pid as u32 == std::process::id() { Pid::Slf } else { Pid::from(pid as u32) };
    let mut out = vec![Resolved::default(); lookup.len()];
    // Without DWARF, one pass over each module's symbol tables names a
    // profile's few hundred addresses for a fraction of what indexing every
    // symbol costs (it matters for short processes, whose only profile is
    // written at exit).
    // Addresses whose module's tables were read and hold no symbol for them:
    // blazesym, without DWARF, reads the same tables and would not name them
    // either (it costs another read of the map and of each module).
    let mut settled = vec![false; out.len()];
    if !lines {
        from_elf_symbols(pid, &lookup, &mut out, maps, &mut settled);
    }
    let unknown: Vec<usize> = (0..out.len()).filter(|&i| out[i].lines.is_empty() && !settled[i]).collect();
    if !unknown.is_empty() {
        let symbolizer =
            Symbolizer::builder().enable_inlined_fns(lines).enable_code_info(lines).enable_demangling(true).build();
        let retry: Vec<u64> = unknown.iter().map(|&i| lookup[i]).collect();
        // Paths named in /proc/<pid>/maps first: opening /proc/<pid>/map_files/*
        // needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE), even for oneself.
        let mut found = run(&symbolizer, pid, false, lines, &retry);
        // Then map_files for what is left (deleted files, other mount namespaces).
        let left: Vec<usize> = (0..found.len()).filter(|&k| found[k].lines.is_empty()).collect();
        if !left.is_empty() {
            let again: Vec<u64> = left.iter().map(|&k| retry[k]).collect();
            for (k, r) in left.into_iter().zip(run(&symbolizer, pid, true, lines, &again)) {
                found[k] = r;
            }
        }
        for (i, r) in unknown.into_iter().zip(found) {
            out[i] = r;
        }
        drop(symbolizer);
        if lines {
            from_elf_symbols(pid, &lookup, &mut out, maps, &mut settled);
        }
    }
    out
}

/// Names the unnamed addresses from the sized function symbols of their
/// module and of its separate debug file under `/usr/lib/debug/.build-id/`
/// (stripped libraries such as libc get their local functions, e.g.
/// `start_thread`), one pass over each module's tables. An address past the
/// end of every symbol stays unnamed.
/// `settled[i]` is set for each address of a module whose tables were read.
fn from_elf_symbols(pid: Pid, lookup: &[u64], out: &mut [Resolved], maps: Option<&[u8]>, settled: &mut [bool]) {
    use std::collections::HashMap;
    let unknown: Vec<usize> = (0..out.len()).filter(|&i| out[i].lines.is_empty()).collect();
    if unknown.is_empty() {
        return;
    }
    let pid = match pid {
        Pid::Pid(p) => p.get(),
        _ => std::process::id(),
    };
    let modules = match maps {
        Some(text) => osprey_unwind::scan::loaded_from_bytes(pid, &holding(text, &unknown, lookup)),
        None => match osprey_unwind::scan::loaded_in(pid) {
            Ok(m) => m,
            Err(_) => return,
        },
    };
    let root = std::path::Path::new(osprey_unwind::compile::DEBUG_ROOT);
    let mut by_module: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in unknown {
        if let Some(m) = modules.iter().position(|m| m.start <= lookup[i] && lookup[i] < m.end) {
            by_module.entry(m).or_default().push(i);
        }
    }
    for (m, idx) in by_module {
        let module = &modules[m];
        let svmas: Vec<u64> = idx.iter().map(|&i| lookup[i].wrapping_sub(module.bias)).collect();
        let file = osprey_unwind::scan::file_of(pid, &module.path);
        let Ok(names) = osprey_unwind::symbols::name_addresses(&file, Some(root), &svmas) else { continue };
        for (i, name) in idx.into_iter().zip(names) {
            settled[i] = true;
            if let Some(name) = name {
                let name = demangle(&name);
                out[i] = Resolved { lines: vec![SymLine { name, file: String::new(), line: 0 }], debug_info: false };
            }
        }
    }
}

/// The lines of the maps `text` that belong to a file with an executable
/// mapping holding one of the `unknown` addresses: only those modules' ELF
/// headers are read (a short process's one stack touches two or three of
/// the modules it maps).
fn holding(text: &[u8], unknown: &[usize], lookup: &[u64]) -> Vec<u8> {
    use osprey_procfs::maps::Entry;
    let mut paths = std::collections::HashSet::new();
    for e in osprey_procfs::maps::entries(text) {
        if e.perms.exec && e.is_file() && unknown.iter().any(|&i| e.contains(lookup[i])) {
            paths.insert(e.path);
        }
    }
    let mut out = Vec::new();
    for line in text.split(|&c| c == b'\n') {
        if Entry::parse(line).is_some_and(|e| paths.contains(e.path)) {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    out
}

/// A symbol's name as blazesym shows it: Rust demangled without its hash,
/// else C++ demangled, else as it is.
pub(crate) fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    cpp_demangle::Symbol::new(name).ok().and_then(|s| s.demangle().ok()).unwrap_or_else(|| name.to_string())
}

/// Returns free malloc memory to the kernel (glibc's `malloc_trim`; elsewhere
/// a no-op): a symbolization's freed caches, which the caller's arena would
/// otherwise keep resident.
///
/// It locks every arena of the process in turn, so it must not run while a
/// thread may be stopped holding one: in a profiled program, never while a
/// termination handler, `abort` or `_exit` (which glibc calls from inside
/// `malloc` on a corrupt heap) waits for the last profile, or it waits on
/// that thread until the handler gives up.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and trims the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// DWARF lines (files, lines, inlined functions) at `offsets` of the ELF
/// file `path` (file offsets of the addresses looked up), one entry per
/// offset; empty where the file has no debug information for it (its
/// separate debug file found as the loader's debug link or build id says).
pub fn file_lines(path: &std::path::Path, offsets: &[u64]) -> Vec<Resolved> {
    let symbolizer =
        Symbolizer::builder().enable_inlined_fns(true).enable_code_info(true).enable_demangling(true).build();
    let found = match symbolizer.symbolize(&Source::Elf(Elf::new(path)), Input::FileOffset(offsets)) {
        Ok(syms) => syms.iter().map(resolve).collect(),
        Err(_) => vec![Resolved::default(); offsets.len()],
    };
    found.into_iter().map(|r| if r.debug_info { r } else { Resolved::default() }).collect()
}

/// One blazesym pass; all unknown if it fails as a whole.
fn run(symbolizer: &Symbolizer, pid: Pid, map_files: bool, lines: bool, addrs: &[u64]) -> Vec<Resolved> {
    let mut process = Process::new(pid);
    process.map_files = map_files;
    process.debug_syms = lines;
    match symbolizer.symbolize(&Source::Process(process), Input::AbsAddr(addrs)) {
        Ok(syms) => syms.iter().map(resolve).collect(),
        Err(_) => vec![Resolved::default(); addrs.len()],
    }
}

fn resolve(s: &Symbolized<'_>) -> Resolved {
    let Some(sym) = s.as_sym() else {
        return Resolved::default();
    };
    if past_end(sym.offset, sym.size) {
        return Resolved::default();
    }
    // blazesym lists inlined functions outermost first, each with the location
    // inside that function; `sym.code_info` is the location inside `sym`.
    let mut lines: Vec<SymLine> = sym.inlined.iter().rev().map(|f| line(&f.name, f.code_info.as_ref())).collect();
    lines.push(line(&sym.name, sym.code_info.as_deref()));
    Resolved { lines, debug_info: sym.code_info.is_some() }
}

/// Whether an address `offset` bytes into a symbol of `size` bytes lies
/// past its end: then it is not that symbol's (code after the last symbol of
/// a stripped library would otherwise be named `_init` or
/// `__do_global_dtors_aux`). A symbol without a size only owns its first byte.
fn past_end(offset: usize, size: Option<usize>) -> bool {
    offset > 0 && offset >= size.unwrap_or(0)
}

fn line(name: &str, info: Option<&CodeInfo<'_>>) -> SymLine {
    SymLine {
        name: name.to_string(),
        file: info.map(|c| c.to_path().to_string_lossy().into_owned()).unwrap_or_default(),
        line: info.and_then(|c| c.line).map_or(0, i64::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_fn() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn symbolizes_own_function() {
        let a = marker_fn as fn() -> u64 as usize as u64;
        let r = symbolize(0, &[(a, false), (a + 1, true), (8, false)], true);
        assert_eq!(r.len(), 3);
        assert!(r[0].lines.last().unwrap().name.contains("marker_fn"), "{:?}", r[0]);
        assert!(r[1].lines.last().unwrap().name.contains("marker_fn"), "{:?}", r[1]);
        assert!(r[2].lines.is_empty());
    }

    /// Names from the one-pass reading of symbol tables are blazesym's names.
    #[test]
    fn symbol_tables_name_as_blazesym_does() {
        let addrs: Vec<u64> = vec![
            marker_fn as fn() -> u64 as usize as u64,
            symbolize as fn(i32, &[(u64, bool)], bool) -> Vec<Resolved> as usize as u64 + 3,
            demangle as fn(&str) -> String as usize as u64 + 1,
            libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64,
            libc::malloc as unsafe extern "C" fn(usize) -> *mut libc::c_void as usize as u64 + 2,
        ];
        let mut ours = vec![Resolved::default(); addrs.len()];
        from_elf_symbols(Pid::Slf, &addrs, &mut ours, None, &mut vec![false; addrs.len()]);
        let symbolizer = Symbolizer::builder().enable_demangling(true).build();
        let theirs = run(&symbolizer, Pid::Slf, false, false, &addrs);
        for ((a, o), t) in addrs.iter().zip(&ours).zip(&theirs) {
            assert!(!o.lines.is_empty(), "{a:#x} unnamed");
            if !t.lines.is_empty() {
                assert_eq!(o.lines[0].name, t.lines[0].name, "{a:#x}");
            }
        }
        assert!(ours[0].lines[0].name.ends_with("marker_fn"), "{:?}", ours[0]);
    }

    /// Only the modules holding an address are kept, and they name it
    /// as the whole map does.
    #[test]
    fn reads_only_the_modules_holding_addresses() {
        let text = osprey_procfs::maps::read(0).unwrap();
        let addrs = vec![marker_fn as fn() -> u64 as usize as u64];
        let kept = holding(&text, &[0], &addrs);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let lines: Vec<_> = osprey_procfs::maps::entries(&kept).collect();
        assert!(!lines.is_empty() && lines.iter().all(|e| std::path::Path::new(e.path_os()) == exe), "{lines:?}");
        let (mut whole, mut part) = (vec![Resolved::default()], vec![Resolved::default()]);
        from_elf_symbols(Pid::Slf, &addrs, &mut whole, None, &mut [false]);
        let mut settled = [false];
        from_elf_symbols(Pid::Slf, &addrs, &mut part, Some(&text), &mut settled);
        assert_eq!(whole, part);
        assert!(settled[0] && part[0].lines[0].name.ends_with("marker_fn"), "{part:?}");
    }

    #[test]
    fn sizes_are_respected() {
        assert!(!past_end(0, Some(16)) && !past_end(15, Some(16)) && !past_end(0, None));
        assert!(past_end(16, Some(16)) && past_end(1, Some(0)) && past_end(0x40, None));
    }
}
