//! What a process has loaded: this process's objects as the loader reports
//! them (`dl_iterate_phdr`, with its generation counters), and another
//! process's executable file mappings from its `/proc/<pid>/maps` with their
//! load bias. Off the signal path (takes the loader's lock, reads files,
//! allocates).

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};

/// The loader's counters of objects ever added and removed: a change means a
/// `dlopen` or `dlclose` happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation {
    /// Objects ever loaded (`dlpi_adds`).
    pub adds: u64,
    /// Objects ever unloaded (`dlpi_subs`).
    pub subs: u64,
}

/// One loaded object as the loader reports it.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// File name as loaded (`""` for the main program, resolved to
    /// `/proc/self/exe`'s target).
    pub path: PathBuf,
    /// Load bias: address in memory minus ELF virtual address.
    pub bias: u64,
    /// Executable address range (union of the `PF_X` `PT_LOAD` segments).
    pub start: u64,
    /// End of the executable address range, exclusive.
    pub end: u64,
    /// The whole image `[lo, hi)` in memory when it is mapped from file offset
    /// 0 (used for the vDSO, which has no file).
    pub image: Option<(u64, u64)>,
}

/// One object as the loader reports it, borrowed for the duration of
/// [`each_object`]'s callback.
pub struct Object<'a> {
    /// File name as loaded (empty for the main program).
    pub name: &'a CStr,
    /// Load bias: address in memory minus ELF virtual address.
    pub bias: u64,
    /// The object's program headers, in memory.
    pub phdrs: &'a [libc::Elf64_Phdr],
    /// The loader's counters (absent from an old loader's shorter record).
    pub generation: Option<Generation>,
}

impl Object<'_> {
    /// The object's note segments, in memory.
    pub fn notes(&self) -> impl Iterator<Item = &[u8]> {
        self.phdrs.iter().filter(|p| p.p_type == libc::PT_NOTE).map(|p| {
            let at = self.bias.wrapping_add(p.p_vaddr) as *const u8;
            // SAFETY: a PT_NOTE segment lies in a PT_LOAD one, mapped and
            // readable while the object is loaded, which it is during the
            // callback (the loader's lock is held).
            unsafe { std::slice::from_raw_parts(at, p.p_memsz as usize) }
        })
    }
}

/// Calls `f` with each loaded object, in the loader's order, until it
/// returns false. Takes the loader's lock: `f` must not `dlopen`. Calls `f`
/// for none in a forked child whose loader lock came held (see
/// [`crate::loader_lock`]).
pub fn each_object(mut f: impl FnMut(&Object<'_>) -> bool) {
    let Some(_call) = crate::loader_lock::Call::enter() else { return };
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, size: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `data` is the `&mut dyn FnMut` passed to dl_iterate_phdr
        // below, and `info` is valid for the callback's duration (loader's
        // contract).
        let (f, info) = unsafe { (&mut *(data as *mut &mut dyn FnMut(&Object<'_>) -> bool), &*info) };
        let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
            &[]
        } else {
            // SAFETY: the loader gives `dlpi_phnum` program headers at `dlpi_phdr`.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        let name = if info.dlpi_name.is_null() {
            c""
        } else {
            // SAFETY: a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }
        };
        // The counters are read only where the loader's record has them.
        let generation = if size >= std::mem::size_of::<libc::dl_phdr_info>() {
            Some(Generation { adds: info.dlpi_adds, subs: info.dlpi_subs })
        } else {
            None
        };
        let object = Object { name, bias: info.dlpi_addr, phdrs, generation };
        libc::c_int::from(!f(&object))
    }
    let mut f: &mut dyn FnMut(&Object<'_>) -> bool = &mut f;
    // SAFETY: `each` matches the callback contract; `f` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut f as *mut _ as *mut libc::c_void) };
}

struct Scan {
    generation: Option<Generation>,
    objects: Vec<Loaded>,
}

fn iterate(only_generation: bool) -> Scan {
    let mut scan = Scan { generation: None, objects: Vec::new() };
    each_object(|o| {
        if scan.generation.is_none() {
            scan.generation = o.generation;
        }
        if only_generation {
            return false;
        }
        let (mut start, mut end, mut image) = (u64::MAX, 0, None::<(u64, u64)>);
        for ph in o.phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
            let lo = o.bias.wrapping_add(ph.p_vaddr);
            let hi = lo.wrapping_add(ph.p_memsz);
            if ph.p_flags & libc::PF_X != 0 {
                start = start.min(lo);
                end = end.max(hi);
            }
            if ph.p_offset == 0 && image.is_none() {
                image = Some((lo, lo.wrapping_add(ph.p_filesz)));
            }
        }
        if start < end {
            let path = PathBuf::from(o.name.to_string_lossy().into_owned());
            scan.objects.push(Loaded { path, bias: o.bias, start, end, image });
        }
        true
    });
    scan
}

/// The loader's generation counters (cheap: stops at the first object).
pub fn generation() -> Option<Generation> {
    iterate(true).generation
}

/// The executable ranges `[start, end)` of every loaded object, in the
/// loader's order: no file is read (not even the executable's link).
pub fn code_ranges() -> (Option<Generation>, Vec<(u64, u64)>) {
    let scan = iterate(false);
    (scan.generation, scan.objects.iter().map(|o| (o.start, o.end)).collect())
}

/// Every loaded object with executable segments.
pub fn loaded() -> (Option<Generation>, Vec<Loaded>) {
    let mut scan = iterate(false);
    for o in &mut scan.objects {
        if o.path.as_os_str().is_empty() {
            o.path = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        }
    }
    (scan.generation, scan.objects)
}

/// Where a file that process `pid` maps as `path` can be opened from here:
/// through `/proc/<pid>/root` (another mount namespace or a chroot: a
/// container), else as named.
pub fn file_of(pid: u32, path: &Path) -> PathBuf {
    // This process's own root is ours: no walk through `/proc` needed.
    if pid == std::process::id() {
        return path.to_path_buf();
    }
    let under = Path::new("/proc").join(pid.to_string()).join("root").join(path.strip_prefix("/").unwrap_or(path));
    if under.exists() {
        under
    } else {
        path.to_path_buf()
    }
}

/// `(p_offset, p_filesz, p_vaddr)` of an executable `PT_LOAD`.
type ExecSegment = (u64, u64, u64);

/// The ELF virtual address of each file offset of `path` (an offset in no
/// executable `PT_LOAD` gives `None`); `None` if `path` is no readable ELF
/// file. What a module's addresses are looked up by, from offsets alone.
pub fn svmas_of_offsets(path: &Path, offsets: &[u64]) -> Option<Vec<Option<u64>>> {
    let head = read_head(path).ok()?;
    let segs = exec_segments(&head).or_else(|| exec_segments(crate::mapped::Mapped::open(path).ok()?.bytes()))?;
    let svma = |off: u64| segs.iter().find(|s| s.0 <= off && off < s.0 + s.1).map(|s| off - s.0 + s.2);
    Some(offsets.iter().map(|&o| svma(o)).collect())
}

/// An ELF file's executable `PT_LOAD` segments, `(p_offset, p_filesz,
/// p_vaddr)` each: what gives a mapping of the file its load bias.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecSegments(Vec<ExecSegment>);

impl ExecSegments {
    /// Reads them from the file's program headers: its first page, the
    /// whole file only when they lie further.
    pub fn read(path: &Path) -> Option<ExecSegments> {
        let head = read_head(path).ok()?;
        exec_segments(&head)
            .or_else(|| exec_segments(crate::mapped::Mapped::open(path).ok()?.bytes()))
            .map(ExecSegments)
    }

    /// The load bias of the file mapped at `start` from file offset `off`
    /// (a mapping starts at its segment's offset rounded down to a page);
    /// None if no executable segment holds `off`.
    pub fn bias(&self, start: u64, off: u64) -> Option<u64> {
        let page = |o: u64| o & !0xfff;
        let &(p_off, _, p_vaddr) = self.0.iter().find(|s| page(s.0) <= off && off < s.0 + s.1)?;
        // File offset `off` is mapped at `start`; it is vaddr p_vaddr - p_off + off.
        Some(start.wrapping_sub(p_vaddr.wrapping_sub(p_off).wrapping_add(off)))
    }
}

/// The first page of a file: where an ELF image keeps its program headers.
/// Read, not mapped: a mapping's `munmap` costs every thread of the process
/// a TLB flush.
fn read_head(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)?.take(4096).read_to_end(&mut head)?;
    Ok(head)
}

/// The executable `PT_LOAD` segments of an ELF image, from its program
/// headers alone (no section or symbol table is parsed).
fn exec_segments(data: &[u8]) -> Option<Vec<ExecSegment>> {
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf64 => exec_segments_of::<object::elf::FileHeader64<object::Endianness>>(data),
        object::FileKind::Elf32 => exec_segments_of::<object::elf::FileHeader32<object::Endianness>>(data),
        _ => None,
    }
}

fn exec_segments_of<Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
    data: &[u8],
) -> Option<Vec<ExecSegment>> {
    use object::read::elf::ProgramHeader;
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let exec = |p: &&Elf::ProgramHeader| {
        p.p_type(endian) == object::elf::PT_LOAD && p.p_flags(endian) & object::elf::PF_X != 0
    };
    let phdrs = header.program_headers(endian, data).ok()?;
    Some(
        phdrs
            .iter()
            .filter(exec)
            .map(|p| (p.p_offset(endian).into(), p.p_filesz(endian).into(), p.p_vaddr(endian).into()))
            .collect(),
    )
}

/// The executable file mappings of process `pid` from `/proc/<pid>/maps`,
/// with their load bias from the file's program headers: what an
/// out-of-process sampler (Python's `--native` mode, on a copied stack)
/// builds its [`ModuleSet`] from, with [`compile_file`] for the tables.
/// Paths are as the process sees them (open them with [`file_of`]).
/// Mappings whose file cannot be read are left out.
pub fn loaded_in(pid: u32) -> std::io::Result<Vec<Loaded>> {
    Ok(loaded_from_bytes(pid, &osprey_procfs::maps::read(pid as i32)?))
}

/// [`loaded_in`] from the text of `/proc/<pid>/maps` already read.
pub fn loaded_from(pid: u32, maps: &str) -> Vec<Loaded> {
    loaded_from_bytes(pid, maps.as_bytes())
}

/// [`loaded_in`] from the bytes of `/proc/<pid>/maps` already read.
pub fn loaded_from_bytes(pid: u32, maps: &[u8]) -> Vec<Loaded> {
    let mut out: Vec<Loaded> = Vec::new();
    let mut files: HashMap<PathBuf, Option<ExecSegments>> = HashMap::new();
    for e in osprey_procfs::maps::entries(maps) {
        // A deleted file is opened by its old path, as the process named it.
        if !e.perms.exec || !e.is_file() {
            continue;
        }
        let (start, end, off) = (e.start, e.end, e.offset);
        let path = PathBuf::from(e.path_os());
        let segs = files.entry(path.clone()).or_insert_with(|| ExecSegments::read(&file_of(pid, &path)));
        let Some(bias) = segs.as_ref().and_then(|s| s.bias(start, off)) else { continue };
        match out.last_mut() {
            Some(l) if l.path == path && l.bias == bias => l.end = l.end.max(end),
            _ => out.push(Loaded { path, bias, start, end, image: None }),
        }
    }
    out
}
