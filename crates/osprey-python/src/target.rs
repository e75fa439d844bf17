//! A CPython process as osprey sees it: where its interpreter code lives,
//! its version (read from the process), the structure layout, and the
//! decoded thread-local access paths.

use std::io;
use std::path::Path;

use crate::decode::{self, PthreadKeyLayout, TlsAccess, TlsDecode};
use crate::layout::Layout;
use crate::process::{self, Mem, Module};
use crate::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

impl Version {
    pub fn from_hex(v: u64) -> Version {
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
];

pub struct Target {
    pub pid: i32,
    pub mem: Mem,
    pub version: Version,
    pub layout: Layout,
    pub module: Module,
    pub runtime: u64,
    pub code_type: Option<u64>,
    pub tls: Option<TlsAccess>,
    pub tls_error: Option<String>,
    pub pthread: Option<PthreadKeyLayout>,
    pub pthread_error: Option<String>,
    pub debug_offsets: bool,
}

fn proc_err(pid: i32, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NoProcess(pid),
        Some(libc::EACCES) | Some(libc::EPERM) => Error::Permission(format!(
            "cannot read process {pid}: {e} (need CAP_SYS_PTRACE or same user and ptrace_scope 0)"
        )),
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

fn decode_tls(mem: &Mem, module: &Module) -> Result<TlsAccess, String> {
    let (mut addr, size) = module.sym_size("_PyThreadState_GetCurrent").ok_or("no _PyThreadState_GetCurrent symbol")?;
    let mut size = if size == 0 { 64 } else { size.min(256) };
    for _ in 0..3 {
        let code = mem.read_vec(addr, size as usize).map_err(|e| e.to_string())?;
        match decode::decode_tls_getter(&code, addr) {
            Some(TlsDecode::Found(a)) => return Ok(a),
            Some(TlsDecode::FollowCall(t)) => {
                addr = t;
                size = 96;
            }
            None => return Err(format!("unrecognized code in _PyThreadState_GetCurrent at {addr:#x}")),
        }
    }
    Err("_PyThreadState_GetCurrent: call chain too deep".into())
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

impl Target {
    pub fn open(pid: i32) -> Result<Target, Error> {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Error::NoProcess(pid));
        }
        let module = find_python_module(pid)?;
        let mem = Mem::new(pid);
        let runtime = module.sym("_PyRuntime").unwrap();
        // Probe readability early for a clear message.
        mem.u64(runtime).map_err(|e| proc_err(pid, e))?;
        let version = read_version(&mem, &module)?;
        let mut layout = Layout::for_version(version.major, version.minor)
            .ok_or_else(|| Error::Unsupported(format!("CPython {version} (supported: 3.8 to 3.13)")))?;
        let debug_offsets = version.minor >= 13 && layout.apply_debug_offsets(&mem, runtime);
        let (tls, tls_error) = if version.minor >= 12 {
            match decode_tls(&mem, &module) {
                Ok(t) => (Some(t), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            (None, Some(format!("no thread-local tstate before 3.12 (this is {version})")))
        };
        let (pthread, pthread_error) = match decode_pthread(pid, &mem) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        let code_type = module.sym("PyCode_Type");
        Ok(Target {
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
            debug_offsets,
        })
    }

    /// Address of the interpreter head, 0 while the runtime is not initialized.
    pub fn interp_head(&self) -> io::Result<u64> {
        self.mem.u64(self.runtime + self.layout.runtime_interpreters_head)
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
}
