//! Finding loaded modules (`dl_iterate_phdr`) and keeping the published
//! [`ModuleSet`] current, on the agent thread (never in a handler: this
//! takes the loader's lock, reads files and allocates).

use crate::cache::Cache;
use crate::compile::{compile_elf, compile_file};
use crate::error::Error;
use crate::modules::{Module, ModuleSet};
use crate::publish::Shared;
use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The loader's counters of objects ever added and removed: a change means a
/// `dlopen` or `dlclose` happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation {
    pub adds: u64,
    pub subs: u64,
}

/// One loaded object as the loader reports it.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// File name as loaded (`""` for the main program, resolved to
    /// `/proc/self/exe`'s target).
    pub path: PathBuf,
    pub bias: u64,
    /// Executable address range (union of the `PF_X` `PT_LOAD` segments).
    pub start: u64,
    pub end: u64,
    /// The whole image `[lo, hi)` in memory when it is mapped from file offset
    /// 0 (used for the vDSO, which has no file).
    pub image: Option<(u64, u64)>,
}

struct Scan {
    generation: Option<Generation>,
    objects: Vec<Loaded>,
    only_generation: bool,
}

unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, size: usize, data: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `data` is the `&mut Scan` passed to dl_iterate_phdr below, and
    // `info` is valid for the callback's duration (loader's contract).
    let (scan, info) = unsafe { (&mut *(data as *mut Scan), &*info) };
    if scan.generation.is_none() && size >= std::mem::size_of::<libc::dl_phdr_info>() {
        scan.generation = Some(Generation { adds: info.dlpi_adds, subs: info.dlpi_subs });
    }
    if scan.only_generation {
        return 1;
    }
    let name = if info.dlpi_name.is_null() {
        PathBuf::new()
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        PathBuf::from(unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy().into_owned())
    };
    let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
        &[]
    } else {
        // SAFETY: the loader gives `dlpi_phnum` program headers at `dlpi_phdr`.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    let (mut start, mut end, mut image) = (u64::MAX, 0, None::<(u64, u64)>);
    for ph in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
        let lo = info.dlpi_addr.wrapping_add(ph.p_vaddr);
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
        scan.objects.push(Loaded { path: name, bias: info.dlpi_addr, start, end, image });
    }
    0
}

fn iterate(only_generation: bool) -> Scan {
    let mut scan = Scan { generation: None, objects: Vec::new(), only_generation };
    // SAFETY: `each` matches the callback contract; `scan` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut scan as *mut Scan as *mut libc::c_void) };
    scan
}

/// The loader's generation counters (cheap: stops at the first object).
pub fn generation() -> Option<Generation> {
    iterate(true).generation
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

/// What one [`Tracker::refresh`] did.
#[derive(Debug, Default)]
pub struct Refresh {
    /// A new module set was published.
    pub published: bool,
    /// Modules whose tables were compiled this time.
    pub compiled: usize,
    /// Modules that could not be compiled (they are still in the set, with
    /// an empty table, so their frames end the walk as truncated).
    pub errors: Vec<Error>,
}

/// Keeps the published [`ModuleSet`] in step with the loaded objects. Owned
/// by the agent thread; handlers only see [`Tracker::shared`].
pub struct Tracker {
    shared: Arc<Shared<ModuleSet>>,
    cache: HashMap<(PathBuf, u64), Module>,
    generation: Option<Generation>,
    debug_root: Option<PathBuf>,
    disk: Option<Cache>,
}

impl Tracker {
    /// `debug_root`: where separate debug files are found by build id
    /// (normally `Some(compile::DEBUG_ROOT)`).
    pub fn new(debug_root: Option<PathBuf>) -> Tracker {
        Tracker {
            shared: Arc::new(Shared::new(ModuleSet::default())),
            cache: HashMap::new(),
            generation: None,
            debug_root,
            disk: None,
        }
    }

    /// Compiles through `disk` (see [`crate::cache`]).
    pub fn with_cache(mut self, disk: Option<Cache>) -> Tracker {
        self.disk = disk;
        self
    }

    /// What handlers read.
    pub fn shared(&self) -> &Arc<Shared<ModuleSet>> {
        &self.shared
    }

    /// Rescans if the loader's generation moved (or on the first call),
    /// compiles new modules and publishes the new set; waits for handlers
    /// still reading the previous set before freeing it.
    pub fn refresh(&mut self) -> Refresh {
        let mut out = Refresh::default();
        let generation = generation();
        if generation.is_some() && generation == self.generation {
            return out;
        }
        let (generation, objects) = loaded();
        let mut modules = Vec::with_capacity(objects.len());
        let mut cache = HashMap::with_capacity(objects.len());
        for o in objects {
            let key = (o.path.clone(), o.bias);
            let m = match self.cache.remove(&key) {
                Some(m) => m,
                None => {
                    out.compiled += 1;
                    let compiled = match o.image.filter(|_| !o.path.is_file()) {
                        // SAFETY (of the read inside): the vDSO image is mapped
                        // for the process's lifetime, as the loader reports.
                        Some((lo, hi)) => compile_image(&o.path, lo, hi, self.debug_root.as_deref()),
                        None => match &self.disk {
                            Some(d) => d.compile_file(&o.path, self.debug_root.as_deref()),
                            None => compile_file(&o.path, self.debug_root.as_deref()),
                        },
                    };
                    let (table, build_id) = match compiled {
                        Ok(c) => (c.table, c.build_id),
                        Err(e) => {
                            out.errors.push(e);
                            Default::default()
                        }
                    };
                    Module {
                        path: o.path.clone(),
                        start: o.start,
                        end: o.end,
                        bias: o.bias,
                        build_id: build_id.map(Into::into),
                        table,
                    }
                }
            };
            modules.push(m.clone());
            cache.insert(key, m);
        }
        self.cache = cache;
        self.generation = generation;
        self.shared.publish(ModuleSet::new(modules));
        out.published = true;
        out
    }
}

/// Compiles an object that has no file (the vDSO) from its mapped image.
/// Its section headers lie past the segment's file size but inside the last
/// mapped page (the kernel maps the whole image): read up to their end.
fn compile_image(
    path: &Path,
    lo: u64,
    hi: u64,
    debug_root: Option<&Path>,
) -> crate::error::Result<crate::compile::Compiled> {
    const PAGE: u64 = 4096;
    let seg = hi.saturating_sub(lo);
    let mapped = seg.div_ceil(PAGE) * PAGE;
    let mut len = seg;
    if seg >= 64 {
        // SAFETY: the first 64 bytes (the ELF header) lie in the segment,
        // mapped for the process's lifetime (vDSO).
        let hdr = unsafe { std::slice::from_raw_parts(lo as *const u8, 64) };
        let u = |at: usize, n: usize| {
            hdr.get(at..at + n).map_or(0, |b| b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)))
        };
        let end = u(0x28, 8).saturating_add(u(0x3a, 2).saturating_mul(u(0x3c, 2)));
        if end <= mapped {
            len = len.max(end);
        }
    }
    let len = usize::try_from(len).unwrap_or(0);
    // SAFETY: `[lo, lo + len)` lies within the whole pages of the object's
    // first PT_LOAD segment from file offset 0, mapped by the kernel and never
    // unmapped (vDSO).
    let bytes = unsafe { std::slice::from_raw_parts(lo as *const u8, len) };
    compile_elf(path, bytes, debug_root)
}

/// Where a file that process `pid` maps as `path` can be opened from here:
/// through `/proc/<pid>/root` (another mount namespace or a chroot: a
/// container), else as named.
pub fn file_of(pid: u32, path: &Path) -> PathBuf {
    let under = Path::new("/proc").join(pid.to_string()).join("root").join(path.strip_prefix("/").unwrap_or(path));
    if under.exists() {
        under
    } else {
        path.to_path_buf()
    }
}

/// `(p_offset, p_filesz, p_vaddr)` of an executable `PT_LOAD`.
type ExecSegment = (u64, u64, u64);

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
    Ok(loaded_from(pid, &std::fs::read_to_string(format!("/proc/{pid}/maps"))?))
}

/// [`loaded_in`] from the text of `/proc/<pid>/maps` already read.
pub fn loaded_from(pid: u32, maps: &str) -> Vec<Loaded> {
    let mut out: Vec<Loaded> = Vec::new();
    let mut files: HashMap<PathBuf, Option<Vec<ExecSegment>>> = HashMap::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(off), _, _, Some(path)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        let Some((Some(start), Some(end))) = range.split_once('-').map(|(a, b)| (hex(a), hex(b))) else {
            continue;
        };
        let Some(off) = hex(off) else { continue };
        let path = PathBuf::from(path);
        // (p_offset, p_filesz, p_vaddr) of each executable PT_LOAD, read once per file.
        let segs = files.entry(path.clone()).or_insert_with(|| {
            let head = read_head(&file_of(pid, &path)).ok()?;
            exec_segments(&head).or_else(|| {
                // Program headers past the first page: rare, map the file.
                let data = crate::mapped::Mapped::open(&file_of(pid, &path)).ok()?;
                exec_segments(data.bytes())
            })
        });
        let Some(segs) = segs else { continue };
        // The mapping starts at the segment's offset rounded down to a page.
        let page = |o: u64| o & !0xfff;
        let Some(&(p_off, _, p_vaddr)) = segs.iter().find(|s| page(s.0) <= off && off < s.0 + s.1) else {
            continue;
        };
        // File offset `off` is mapped at `start`; it is vaddr p_vaddr - p_off + off.
        let bias = start.wrapping_sub(p_vaddr.wrapping_sub(p_off).wrapping_add(off));
        match out.last_mut() {
            Some(l) if l.path == path && l.bias == bias => l.end = l.end.max(end),
            _ => out.push(Loaded { path, bias, start, end, image: None }),
        }
    }
    out
}
