//! `code-provenance.json` (Datadog): which code the profiled frames come from.
//!
//! `{"v1":[{"kind","name","version","paths"}]}`:
//! - native programs: the main binary (`kind` `executable`) and each shared
//!   library (`library`) mapped executable in `/proc/PID/maps`, with its path;
//! - CPython: the installed distributions (`library`: name and version from
//!   each `*.dist-info/METADATA`, paths = the top-level packages and modules
//!   its `RECORD` lists, under their site-packages directory), the standard
//!   library (`standard library`) and the program's own code (`executable`:
//!   the script's directory). Site-packages directories are found from the
//!   interpreter's prefix (`<prefix>/lib/pythonX.Y/{site,dist}-packages`,
//!   Debian's `/usr/lib/python3/dist-packages`, a venv's `pyvenv.cfg`),
//!   from mapped extension modules and from the target's `PYTHONPATH`.

use crate::Language;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `code-provenance.json` for process `pid`.
pub fn code_provenance(pid: i32, language: Language) -> String {
    let entries = match language {
        Language::Native => native(pid),
        Language::Python => python(pid),
    };
    json!({ "v1": entries }).to_string()
}

fn entry(kind: &str, name: &str, version: &str, paths: Vec<String>) -> Value {
    json!({ "kind": kind, "name": name, "version": version, "paths": paths })
}

/// (path, executable) of the file-backed mappings of `pid`, in address order.
fn mapped_files(pid: i32) -> Vec<(String, bool)> {
    let maps = osprey_procfs::maps::read(pid).unwrap_or_default();
    osprey_procfs::maps::entries(&maps)
        .filter(|e| e.is_file())
        .map(|e| (String::from_utf8_lossy(e.path).into_owned(), e.perms.exec))
        .collect()
}

fn exe(pid: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.display().to_string().trim_end_matches(" (deleted)").to_string())
}

fn base(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Entries of a native program: its executable and shared libraries.
pub fn native(pid: i32) -> Vec<Value> {
    let mut out = Vec::new();
    let main = exe(pid);
    if let Some(m) = &main {
        out.push(entry("executable", base(m), "", vec![m.clone()]));
    }
    let mut seen = BTreeSet::new();
    for (path, x) in mapped_files(pid) {
        if !x || Some(&path) == main.as_ref() || !seen.insert(path.clone()) {
            continue;
        }
        // libfoo.so.1.2.3 -> version 1.2.3
        let name = base(&path).to_string();
        let version = name.split_once(".so.").map(|(_, v)| v.to_string()).unwrap_or_default();
        out.push(entry("library", &name, &version, vec![path]));
    }
    out
}

fn environ(pid: i32, key: &str) -> Option<String> {
    let env = osprey_procfs::read_file(std::path::Path::new(&format!("/proc/{pid}/environ"))).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{key}=")).map(str::to_string)
    })
}

/// Paths as the target sees them (through its root, for containers).
fn in_target(pid: i32, p: &Path) -> PathBuf {
    if pid as u32 == std::process::id() {
        return p.to_path_buf();
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let through = root.join(p.strip_prefix("/").unwrap_or(p));
    if through.exists() {
        through
    } else {
        p.to_path_buf()
    }
}

/// `pythonX.Y` and the interpreter's prefix, from libpython or the executable.
fn python_prefix(pid: i32) -> Option<(String, PathBuf)> {
    let files = mapped_files(pid);
    let exe = exe(pid)?;
    // lib-dynload and libpython name the version; the prefix is above lib/ or bin/.
    for (p, _) in &files {
        if let Some(i) = p.find("/lib/python3.") {
            let rest = &p[i + 5..];
            let ver: String = rest.chars().take_while(|c| *c != '/').collect();
            return Some((ver, PathBuf::from(&p[..i])));
        }
    }
    let name = files
        .iter()
        .map(|(p, _)| base(p).to_string())
        .find(|b| b.starts_with("libpython3."))
        .or_else(|| Some(base(&exe).to_string()))?;
    let ver: String =
        name.trim_start_matches("lib").chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.').collect();
    let ver = ver.trim_end_matches(".so").trim_end_matches('.').to_string();
    let prefix = Path::new(&exe).parent()?.parent()?.to_path_buf();
    ver.starts_with("python3.").then_some((ver, prefix))
}

/// Entries of a CPython process: distributions, standard library, the program.
pub fn python(pid: i32) -> Vec<Value> {
    let mut out = Vec::new();
    let exe_path = exe(pid).unwrap_or_default();
    let Some((ver, prefix)) = python_prefix(pid) else {
        return native(pid);
    };
    let stdlib = prefix.join("lib").join(&ver);
    out.push(entry("standard library", "stdlib", ver.trim_start_matches("python"), vec![stdlib.display().to_string()]));
    // Site directories, in sys.path order as far as it can be told from outside.
    let mut sites: Vec<PathBuf> = Vec::new();
    if let Some(pp) = environ(pid, "PYTHONPATH") {
        sites.extend(pp.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    // A venv: <venv>/bin/python with <venv>/pyvenv.cfg.
    if let Some(venv) = Path::new(&exe_path).parent().and_then(Path::parent) {
        if in_target(pid, &venv.join("pyvenv.cfg")).exists() {
            sites.push(venv.join("lib").join(&ver).join("site-packages"));
        }
    }
    if let Some(home) = environ(pid, "HOME") {
        sites.push(PathBuf::from(home).join(".local/lib").join(&ver).join("site-packages"));
    }
    for p in [&prefix, Path::new("/usr/local"), Path::new("/usr")] {
        sites.push(p.join("lib").join(&ver).join("site-packages"));
        sites.push(p.join("lib").join(&ver).join("dist-packages"));
    }
    sites.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    for (p, _) in mapped_files(pid) {
        for marker in ["/site-packages/", "/dist-packages/"] {
            if let Some(i) = p.find(marker) {
                sites.push(PathBuf::from(&p[..i + marker.len() - 1]));
            }
        }
    }
    let mut seen = BTreeSet::new();
    sites.retain(|s| seen.insert(s.clone()));
    let mut dists: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for site in &sites {
        let Ok(rd) = std::fs::read_dir(in_target(pid, site)) else { continue };
        for e in rd.flatten() {
            let fname = e.file_name().to_string_lossy().to_string();
            if !fname.ends_with(".dist-info") {
                continue;
            }
            let meta = std::fs::read_to_string(e.path().join("METADATA")).unwrap_or_default();
            let field = |k: &str| {
                meta.lines().take_while(|l| !l.is_empty()).find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            };
            let Some(name) = field("Name:") else { continue };
            let version = field("Version:").unwrap_or_default();
            let record = std::fs::read_to_string(e.path().join("RECORD")).unwrap_or_default();
            let mut tops = BTreeSet::new();
            for line in record.lines() {
                let file = line.split(',').next().unwrap_or("").trim_matches('"');
                if file.is_empty() || file.starts_with("..") || file.starts_with('/') {
                    continue;
                }
                let top = file.split('/').next().unwrap_or(file);
                if top.ends_with(".dist-info")
                    || top.ends_with(".data")
                    || top == "__pycache__"
                    || top.ends_with(".pth")
                {
                    continue;
                }
                if !(file.contains('/') || top.ends_with(".py") || top.ends_with(".so")) {
                    continue;
                }
                tops.insert(site.join(top).display().to_string());
            }
            // The first site directory holding a distribution wins (as on sys.path).
            dists.entry(name.to_lowercase().replace('_', "-")).or_insert((version, tops.into_iter().collect()));
        }
    }
    for (name, (version, paths)) in dists {
        out.push(entry("library", &name, &version, paths));
    }
    // The program: the script's directory (argv after the interpreter's options).
    let cmdline = osprey_procfs::read_file(std::path::Path::new(&format!("/proc/{pid}/cmdline"))).unwrap_or_default();
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let script = args.iter().skip(1).find(|a| !a.starts_with('-') && !a.is_empty());
    let modflag = args.iter().skip(1).any(|a| a == "-m" || a == "-c");
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
    let program_dir = match script {
        Some(s) if !modflag => {
            let p = cwd.join(s);
            p.parent().map(Path::to_path_buf).unwrap_or(cwd)
        }
        _ => cwd,
    };
    let program = script.filter(|_| !modflag).map(|s| base(s).to_string()).unwrap_or_else(|| "__main__".into());
    out.push(entry("executable", &program, "", vec![program_dir.display().to_string()]));
    out
}
