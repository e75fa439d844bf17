//! A CPython process as osprey sees it: where its interpreter code lives,
//! its version (read from the process), the structure layout, and the
//! decoded thread-local access paths.

pub(crate) mod contextvars;
pub(crate) mod pyobject;
pub mod thread_states;

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::layout::debug_offsets::{self, DebugOffsets};
use crate::layout::decode::{self, AddrRef, PthreadKeyLayout, TlsAccess, TlsDecode};
use crate::layout::{Layout, FRAME_OWNED_BY_CSTACK};
use crate::remote::namespace::{self, TidMap};
use crate::remote::process::{self, Mem, Module};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
/// A CPython version (`major.minor.micro`).
pub struct Version {
    /// Major version (3).
    pub major: u32,
    /// Minor version, e.g. 12 for 3.12.
    pub minor: u32,
    /// Micro (patch) version.
    pub micro: u32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

impl Version {
    pub(crate) fn from_hex(v: u64) -> Version {
        Version { major: ((v >> 24) & 0xff) as u32, minor: ((v >> 16) & 0xff) as u32, micro: ((v >> 8) & 0xff) as u32 }
    }
    /// Parses "3.10.13", "3.12.0rc1", "3.11.7+" (leading version only).
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s.splitn(3, '.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let rest = it.next()?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let tail = &rest[digits.len()..];
        if digits.is_empty() || !tail.chars().all(|c| c.is_ascii_alphanumeric() || c == '+') || tail.len() > 6 {
            return None;
        }
        Some(Version { major, minor, micro: digits.parse().ok()? })
    }
}

const WANTED: &[&str] = &[
    "_PyRuntime",
    "Py_Version",
    "Py_GetVersion",
    "_PyThreadState_GetCurrent",
    "PyCode_Type",
    "interp_head",
    "Py_BytesMain",
    "PyGILState_GetThisThreadState",
    "_Py_InitCleanup",
    "PyLong_Type",
    "PyUnicode_Type",
    "PyDict_Type",
    "PyContext_Type",
    "_Py_TrueStruct",
    "_Py_NoneStruct",
];

/// An attached CPython process: its libpython (or executable) module, version, structure layout and the addresses needed to find thread states.
pub struct Target {
    pub(crate) pid: i32,
    pub(crate) mem: Mem,
    /// The interpreter version.
    pub version: Version,
    /// Offsets of the CPython structures read (from `_Py_DebugOffsets` when available).
    pub layout: Layout,
    /// The module defining `_PyRuntime` (libpython or the executable).
    pub module: Module,
    /// Address of `_PyRuntime`.
    pub runtime: u64,
    pub(crate) code_type: Option<u64>,
    /// How to read `_Py_tss_tstate` (3.12+); None if unavailable (see `tls_error`).
    pub tls: Option<TlsAccess>,
    /// Why `tls` is None, if it is.
    pub tls_error: Option<String>,
    pub(crate) pthread: Option<PthreadKeyLayout>,
    pub(crate) pthread_error: Option<String>,
    /// 3.15+: the gilstate's thread state is a thread-local
    /// (`_Py_tss_gilstate`, read by `PyGILState_GetThisThreadState`), not a
    /// pthread key: set every thread's whole life, GIL or not.
    pub gilstate_tls: Option<TlsAccess>,
    /// The shim code object 3.13+ runs after a class's `__init__`
    /// (`_Py_InitCleanup`; exported from 3.14).
    pub init_cleanup: Option<u64>,
    /// `PyLong_Type` (asyncio task names may be ints).
    pub long_type: Option<u64>,
    /// `PyUnicode_Type` and `PyDict_Type`: what a `str` and a `dict` read
    /// for thread names must be instances of (unchecked where unknown).
    pub unicode_type: Option<u64>,
    /// See `unicode_type`.
    pub dict_type: Option<u64>,
    /// `PyContext_Type`: what a thread state's `context` must be an instance
    /// of for its variables to be read (unchecked where unknown).
    pub context_type: Option<u64>,
    /// `Py_True` (`_Py_TrueStruct`) and `Py_None` (`_Py_NoneStruct`), where known.
    pub true_obj: Option<u64>,
    /// See `true_obj`.
    pub none_obj: Option<u64>,
    /// The layout came from the interpreter's `_Py_DebugOffsets` (3.13+).
    pub debug_offsets: bool,
    /// Things the user should know, one line each (e.g. an interpreter
    /// newer than any osprey was tested with).
    pub notes: Vec<String>,
    /// The target is in another PID namespace (its thread ids differ).
    pub other_pid_ns: bool,
}

fn proc_err(pid: i32, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NoProcess(pid),
        Some(libc::EACCES) | Some(libc::EPERM) => {
            Error::Permission(format!("cannot read process {pid} ({e}): {}", namespace::permission_hint(pid)))
        }
        _ => Error::Io(e),
    }
}

/// The module holding the interpreter: a mapped libpython3.x, or the executable.
pub fn find_python_module(pid: i32) -> Result<Module, Error> {
    let maps = process::read_maps(pid).map_err(|e| proc_err(pid, e))?;
    let mut candidates: Vec<String> = Vec::new();
    for m in &maps {
        let name = m.path.rsplit('/').next().unwrap_or("");
        if process::is_libpython_name(name) && !candidates.contains(&m.path) {
            candidates.push(m.path.clone());
        }
    }
    if let Ok(exe) = process::exe_path(pid) {
        let exe = exe.trim_end_matches(" (deleted)").to_string();
        if maps.iter().any(|m| m.path == exe) && !candidates.contains(&exe) {
            candidates.push(exe);
        }
    } else if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(Error::NoProcess(pid));
    }
    let mut saw_old = false;
    for c in &candidates {
        let Ok(m) = process::load_module(pid, &maps, c, WANTED) else { continue };
        if m.sym("_PyRuntime").is_some() {
            return Ok(m);
        }
        if m.sym("interp_head").is_some() || m.sym("Py_BytesMain").is_some() {
            saw_old = true;
        }
    }
    if saw_old {
        return Err(Error::Unsupported("CPython without _PyRuntime (3.6 or older)".into()));
    }
    Err(Error::NotCpython(format!(
        "process {pid} has no CPython interpreter mapped (no libpython3 and no _PyRuntime in its executable)"
    )))
}

/// Reads the interpreter version from the process.
pub fn read_version(mem: &Mem, module: &Module) -> Result<Version, Error> {
    if let Some(a) = module.sym("Py_Version") {
        let v = mem.u64(a).map_err(|e| proc_err(mem.pid, e))?;
        let v = Version::from_hex(v & 0xffff_ffff);
        if v.major == 3 {
            return Ok(v);
        }
    }
    // < 3.11: Py_GetVersion formats PY_VERSION; find the rip-relative
    // strings it references and keep the one that is a version number.
    if let Some((a, size)) = module.sym_size("Py_GetVersion") {
        let size = if size == 0 { 128 } else { size.min(512) };
        let code = mem.read_vec(a, size as usize).map_err(|e| proc_err(mem.pid, e))?;
        for t in decode::rip_lea_targets(&code, a) {
            if let Ok(s) = mem.cstr(t, 32) {
                if let Some(v) = Version::parse(&s) {
                    return Ok(v);
                }
            }
        }
    }
    Err(Error::Unsupported(format!("cannot read the CPython version from {}", module.path)))
}

fn decode_tls(mem: &Mem, module: &Module, getter: &str) -> Result<TlsAccess, String> {
    let (mut addr, size) = module.sym_size(getter).ok_or_else(|| format!("no {getter} symbol"))?;
    let mut size = if size == 0 { 64 } else { size.min(256) };
    for _ in 0..3 {
        let code = mem.read_vec(addr, size as usize).map_err(|e| e.to_string())?;
        match decode::decode_tls_getter(&code, addr) {
            Some(TlsDecode::Found(a)) => return Ok(a),
            Some(TlsDecode::FollowCall(t)) => {
                addr = t;
                size = 96;
            }
            None => return Err(format!("unrecognized code in {getter} at {addr:#x}")),
        }
    }
    Err(format!("{getter}: call chain too deep"))
}

fn decode_pthread(pid: i32, mem: &Mem) -> Result<PthreadKeyLayout, String> {
    let maps = process::read_maps(pid).map_err(|e| e.to_string())?;
    let libc_path = maps
        .iter()
        .find(|m| {
            let n = m.path.rsplit('/').next().unwrap_or("");
            n.starts_with("libc.so") || (n.starts_with("libc-") && n.ends_with(".so"))
        })
        .map(|m| m.path.clone())
        .ok_or("no libc mapped")?;
    let names = ["pthread_getspecific", "__pthread_getspecific"];
    let libc = process::load_module(pid, &maps, &libc_path, &names).map_err(|e| e.to_string())?;
    let (a, size) = names.iter().find_map(|n| libc.sym_size(n)).ok_or("no pthread_getspecific in libc")?;
    let size = if size == 0 { 160 } else { size.min(512) };
    let code = mem.read_vec(a, size as usize).map_err(|e| e.to_string())?;
    decode::decode_pthread_getspecific(&code, a)
        .ok_or_else(|| format!("unrecognized pthread_getspecific in {libc_path}"))
}

/// The layout of the target: the table (3.8–3.12) or what the
/// interpreter publishes (3.13+), validated.
fn layout_of(
    mem: &Mem,
    module: &Module,
    runtime: u64,
    version: Version,
    notes: &mut Vec<String>,
) -> Result<(Layout, bool), Error> {
    let head = mem.read_vec(runtime, debug_offsets::max_len()).or_else(|_| mem.read_vec(runtime, 24));
    let head = head.map_err(|e| proc_err(mem.pid, e))?;
    let refuse = |why: String| Error::Unsupported(format!("CPython {version}: {why}; not profiling it"));
    let parsed = DebugOffsets::parse(&head).map_err(|e| refuse(e.0))?;
    if version.major != 3 || version.minor < 8 {
        return Err(Error::Unsupported(format!("CPython {version} (supported: 3.8 and later)")));
    }
    let Some(d) = parsed else {
        if let Some(l) = Layout::for_version(version.major, version.minor) {
            return Ok((l, false));
        }
        return Err(refuse(
            "no _Py_DebugOffsets (\"xdebugpy\") at the start of _PyRuntime to read its layout from".into(),
        ));
    };
    let claimed = Version::from_hex(d.version_hex());
    if (claimed.major, claimed.minor) != (version.major, version.minor) {
        return Err(refuse(format!("its debug offsets claim version {claimed}")));
    }
    d.validate().map_err(|e| refuse(format!("invalid _Py_DebugOffsets: {e}")))?;
    if !d.free_threaded() && abi_free_threaded(&module.path) {
        return Err(refuse(format!(
            "{} is named as a free-threaded build (ABI flag t) but its _Py_DebugOffsets say it is not",
            module.path
        )));
    }
    let autotsskey = decode_autotsskey(mem, module, runtime, d.get("runtime_state.size").unwrap_or(0)).unwrap_or(0);
    let layout = d.layout(version.minor, autotsskey).map_err(|e| refuse(e.0))?;
    if !d.known {
        notes.push(format!(
            "CPython {version} is newer than any osprey was tested with (3.8 to 3.{}); profiling it with the layout it publishes, which checks out",
            debug_offsets::NEWEST_KNOWN_MINOR
        ));
    }
    Ok((layout, true))
}

/// Does the file name of the interpreter's module carry the free-threaded
/// ABI flag (`python3.13t`, `libpython3.13t.so.1.0`)? Only an agreement
/// check: the `free_threaded` flag of `_Py_DebugOffsets` decides, since an
/// interpreter can be installed under any name.
pub fn abi_free_threaded(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or("");
    let Some(v) = name.strip_prefix("libpython3.").or_else(|| name.strip_prefix("python3.")) else { return false };
    let minor = v.chars().take_while(char::is_ascii_digit).count();
    minor > 0 && v[minor..].starts_with('t') && matches!(v[minor + 1..].chars().next(), None | Some('.') | Some('d'))
}

/// Offset of the gilstate `autoTSSkey` in `_PyRuntime`, from the code of
/// `PyGILState_GetThisThreadState` (it passes `&_PyRuntime.autoTSSkey` to
/// the TSS functions): the first address it refers to inside `_PyRuntime`.
fn decode_autotsskey(mem: &Mem, module: &Module, runtime: u64, runtime_size: u64) -> Option<u64> {
    let (a, size) = module.sym_size("PyGILState_GetThisThreadState")?;
    let size = if size == 0 { 96 } else { size.min(256) };
    let code = mem.read_vec(a, size as usize).ok()?;
    decode::addr_refs(&code, a).into_iter().find_map(|r| {
        let addr = match r {
            AddrRef::Abs(x) => x,
            AddrRef::GotPlus { got, add } => mem.u64(got).ok()?.wrapping_add(add as u64),
        };
        let off = addr.wrapping_sub(runtime);
        (addr >= runtime && off > 0 && off + 8 <= runtime_size).then_some(off)
    })
}

impl Target {
    /// Is the code object at `code` (named `name`, from `file`) one of the
    /// interpreter's own shims rather than Python code? `_Py_InitCleanup`,
    /// by address when exported, else by its name and file (both
    /// `__init__`, which no Python file is); the `<interpreter trampoline>`
    /// of entry frames (3.12+, file `<shim>`), met when an entry frame is
    /// read as it is being left.
    pub fn is_shim_code(&self, code: u64, name: &str, file: &str) -> bool {
        Some(code) == self.init_cleanup
            || (self.layout.minor >= 13 && name == "__init__" && file == "__init__")
            || (self.layout.minor >= 12 && file == "<shim>")
    }

    pub(crate) fn open(pid: i32) -> Result<Target, Error> {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Error::NoProcess(pid));
        }
        let module = find_python_module(pid)?;
        let mem = Mem::new(pid);
        let runtime = module.sym("_PyRuntime").unwrap();
        // Probe readability early for a clear message.
        mem.u64(runtime).map_err(|e| proc_err(pid, e))?;
        let version = read_version(&mem, &module)?;
        let mut notes = Vec::new();
        let (layout, debug_offsets) = layout_of(&mem, &module, runtime, version, &mut notes)?;
        let (tls, tls_error) = if version.minor >= 12 {
            match decode_tls(&mem, &module, "_PyThreadState_GetCurrent") {
                Ok(t) => (Some(t), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            (None, Some(format!("no thread-local tstate before 3.12 (this is {version})")))
        };
        // Only a direct thread-local read counts (older versions call the
        // pthread key functions from there).
        let gilstate_tls = match decode::decode_tls_getter(
            &module
                .sym_size("PyGILState_GetThisThreadState")
                .and_then(|(a, s)| mem.read_vec(a, if s == 0 { 64 } else { s.min(256) } as usize).ok())
                .unwrap_or_default(),
            module.sym("PyGILState_GetThisThreadState").unwrap_or(0),
        ) {
            Some(TlsDecode::Found(a)) if version.minor >= 12 => Some(a),
            _ => None,
        };
        let (pthread, pthread_error) = match decode_pthread(pid, &mem) {
            _ if gilstate_tls.is_some() => (None, None),
            Ok(_) if layout.runtime_autotsskey == 0 => {
                (None, Some("autoTSSkey not found in PyGILState_GetThisThreadState".to_string()))
            }
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        let code_type = module.sym("PyCode_Type");
        let init_cleanup = module.sym("_Py_InitCleanup");
        let long_type = module.sym("PyLong_Type");
        let (unicode_type, dict_type) = (module.sym("PyUnicode_Type"), module.sym("PyDict_Type"));
        let (context_type, true_obj) = (module.sym("PyContext_Type"), module.sym("_Py_TrueStruct"));
        let none_obj = module.sym("_Py_NoneStruct");
        let other_pid_ns = !namespace::same_pid_ns(pid);
        let t = Target {
            pid,
            mem,
            version,
            layout,
            module,
            runtime,
            code_type,
            tls,
            tls_error,
            pthread,
            pthread_error,
            gilstate_tls,
            init_cleanup,
            long_type,
            unicode_type,
            dict_type,
            context_type,
            true_obj,
            none_obj,
            debug_offsets,
            notes,
            other_pid_ns,
        };
        if t.debug_offsets {
            t.check_live()?;
        }
        Ok(t)
    }

    /// Checks the layout against the live process: every interpreter's GIL
    /// pointer, thread states that point back to their interpreter with
    /// thread ids of this process, and frames whose code objects are code
    /// objects. A chain changing under the read gets two more tries;
    /// `Unsupported` when the layout does not check out, which
    /// [`open_target`] retries while the runtime is starting.
    pub fn check_live(&self) -> Result<(), Error> {
        let mut why = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            match self.live_once() {
                Ok(()) => return Ok(()),
                Err(e) => why = e,
            }
        }
        Err(Error::Unsupported(format!(
            "CPython {}: the layout it publishes does not check out ({why}); not profiling it",
            self.version
        )))
    }

    fn live_once(&self) -> Result<(), String> {
        let l = &self.layout;
        let m = &self.mem;
        let rd = |a: u64| m.u64(a).map_err(|e| format!("read at {a:#x}: {e}"));
        let mut tids = TidMap::new(self.pid);
        let ns_tids: Vec<i32> = process::list_tids(self.pid)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter_map(|t| tids.ns_tid(self.pid, t).ok())
            .collect();
        let mut interp = rd(self.runtime + l.runtime_interpreters_head)?;
        if interp == 0 {
            return Err("no interpreter yet".into());
        }
        let (mut n_interp, mut n_tstates, mut n_code, mut n_not_code, mut own_gil) = (0, 0, 0, 0, false);
        let mut bad_tids = Vec::new();
        while interp != 0 {
            n_interp += 1;
            if n_interp > 256 {
                return Err("interpreter list does not end".into());
            }
            if let Some(off) = l.interp_gil_ptr {
                let gil = rd(interp + off)?;
                own_gil |= gil != 0 && gil.wrapping_sub(interp) < (1 << 24);
            }
            let mut ts = rd(interp + l.interp_tstate_head)?;
            let mut n = 0;
            while ts != 0 {
                n += 1;
                if n > 100_000 {
                    return Err("thread state list does not end".into());
                }
                if rd(ts + l.tstate_interp)? != interp {
                    return Err(format!("thread state {ts:#x} does not point back to interpreter {interp:#x}"));
                }
                if let Some(o) = l.tstate_native_thread_id {
                    let tid = m.u32(ts + o).map_err(|e| e.to_string())? as i32;
                    // A thread state being set up or torn down may have none yet.
                    if tid != 0 && !ns_tids.contains(&tid) {
                        bad_tids.push(tid);
                    }
                }
                let (good, bad) = self.check_frames(rd(ts + l.tstate_frame)?);
                (n_code, n_not_code) = (n_code + good, n_not_code + bad);
                ts = rd(ts + l.tstate_next)?;
            }
            n_tstates += n;
            interp = rd(interp + l.interp_next)?;
        }
        if n_tstates == 0 {
            return Err("no thread state yet".into());
        }
        if l.interp_gil_ptr.is_some() && !own_gil {
            return Err("no interpreter points to a GIL of its own".into());
        }
        // Threads come and go, frames change under the reads: a few misses
        // are a race, most of them a wrong layout.
        if 2 * bad_tids.len() > n_tstates {
            return Err(format!("thread states have thread ids {bad_tids:?}, not threads of the process"));
        }
        if self.code_type.is_some() && (n_code == 0 || 4 * n_not_code > n_code) {
            return Err(format!("{n_not_code} of {} frames do not run a code object", n_code + n_not_code));
        }
        Ok(())
    }

    /// Frames of one thread (up to 64): how many Python frames' executables
    /// are code objects, and how many are not (or could not be read).
    fn check_frames(&self, mut f: u64) -> (usize, usize) {
        let l = &self.layout;
        let Some(code_type) = self.code_type else { return (0, 0) };
        let (mut good, mut bad) = (0, 0);
        let mut depth = 0;
        while f != 0 && depth < 64 {
            depth += 1;
            let Ok(b) = self.mem.read_vec(f, l.frame_size_to_read) else { return (good, bad + 1) };
            let exe = process::rd_u64(&b, l.frame_code as usize) & !7;
            let owner = l.frame_owner.map(|o| b[o as usize]).unwrap_or(0);
            if owner < FRAME_OWNED_BY_CSTACK && exe != 0 {
                match self.mem.u64(exe + l.object_type) {
                    Ok(ty) if ty == code_type => good += 1,
                    _ => bad += 1,
                }
            }
            f = process::rd_u64(&b, l.frame_previous as usize);
        }
        (good, bad)
    }

    /// Address of the interpreter head, 0 while the runtime is not initialized.
    pub fn interp_head(&self) -> io::Result<u64> {
        self.mem.u64(self.runtime + self.layout.runtime_interpreters_head)
    }
}

/// Is `path` a CPython interpreter executable? Looks at the ELF file's
/// dynamic tables: a `libpython3` NEEDED entry, or CPython's own symbols
/// exported (static builds).
/// The answer is kept per file (device, inode, size, modification time):
/// `osprey exec --children` asks it of every process of a tree, most of
/// which run the same few programs.
pub fn is_cpython_executable(path: &Path) -> bool {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Mutex;
    type Key = (u64, u64, u64, i64, i64);
    static SEEN: Mutex<Option<HashMap<Key, bool>>> = Mutex::new(None);
    /// Bounds the memory of a process that sees many programs come and go.
    const MAX_SEEN: usize = 4096;
    let key = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()));
    if let Some(k) = key {
        if let Some(&known) = SEEN.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&k)) {
            return known;
        }
    }
    let cpython = crate::remote::elf::is_interpreter(path).unwrap_or(false);
    if let Some(k) = key {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        let map = seen.get_or_insert_with(HashMap::new);
        if map.len() >= MAX_SEEN {
            map.clear();
        }
        map.insert(k, cpython);
    }
    cpython
}

/// Does process `pid` run CPython (a libpython3 mapping, or an executable
/// that is a CPython interpreter)?
pub fn is_cpython_process(pid: i32) -> bool {
    maps_libpython(pid) || runs_cpython_executable(pid)
}

/// Does process `pid` map a libpython3 (the loader's, or one `dlopen`ed by
/// a program that embeds CPython)? Reads its `/proc/PID/maps`.
pub fn maps_libpython(pid: i32) -> bool {
    let Ok(maps) = process::read_maps(pid) else { return false };
    maps.iter().any(|m| process::is_libpython_name(m.path.rsplit('/').next().unwrap_or("")))
}

/// Is the executable process `pid` runs a CPython interpreter
/// ([`is_cpython_executable`], kept per file)?
pub fn runs_cpython_executable(pid: i32) -> bool {
    match process::exe_path(pid) {
        Ok(exe) => is_cpython_executable(&process::target_path(pid, exe.trim_end_matches(" (deleted)"))),
        Err(_) => false,
    }
}

/// Opens the target, waiting briefly for a process that was just started
/// (its loader may not have mapped libpython yet, or it may not have
/// exec'd the interpreter yet).
pub fn open_target(pid: i32) -> Result<Target, Error> {
    let start = Instant::now();
    let me = std::fs::read_link("/proc/self/exe").ok();
    loop {
        match Target::open(pid) {
            Ok(t) => return Ok(t),
            Err(e @ Error::NotCpython(_)) | Err(e @ Error::Unsupported(_)) => {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
                let young = exe.is_some() && (exe == me || is_cpython_process(pid));
                if !young || start.elapsed() > Duration::from_secs(3) {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn version_parse() {
        assert_eq!(Version::parse("3.10.13"), Some(Version { major: 3, minor: 10, micro: 13 }));
        assert_eq!(Version::parse("3.12.0rc1"), Some(Version { major: 3, minor: 12, micro: 0 }));
        assert_eq!(Version::parse("3.10.13 (main, Jan 1)"), None);
        assert_eq!(Version::parse("/tmp/x"), None);
        assert_eq!(Version::from_hex(0x030c01f0), Version { major: 3, minor: 12, micro: 1 });
    }
    #[test]
    fn abi_flag_in_names() {
        for n in ["/opt/bin/python3.13t", "/usr/lib/libpython3.13t.so.1.0", "python3.14td", "libpython3.13t.so"] {
            assert!(abi_free_threaded(n), "{n}");
        }
        for n in ["/usr/bin/python3.13", "libpython3.13.so.1.0", "python3.13-dbg", "python3", "python3.1test"] {
            assert!(!abi_free_threaded(n), "{n}");
        }
    }
}
