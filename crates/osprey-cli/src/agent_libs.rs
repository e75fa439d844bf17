//! Where `osprey exec` finds the agent libraries it preloads.
//!
//! In order: `$OSPREY_PRELOAD_LIB` (the allocators beside it); the
//! libraries next to this executable or in `../lib` beside it (a development
//! build, `cargo build --workspace`); else the copies embedded in this binary
//! (see `build.rs`), written once per build to a private cache directory:
//! `$XDG_CACHE_HOME/osprey`, `~/.cache/osprey`, or `/tmp/osprey-<uid>` without
//! a writable home, in a subdirectory named after the libraries' content hash.
//!
//! Invariant: a library handed to the loader is never at a path another user
//! can change. Every directory from `/` to it is owned by us or root and not
//! writable by group or others (sticky directories such as `/tmp` excepted),
//! and a cached file is owned by us, not group/other-writable, and
//! byte-for-byte the embedded copy; a cached file that is not is rewritten
//! (with one line), a directory that is not is refused.

use crate::Failure;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const AGENT_LIB: &str = "libosprey_preload.so";
/// The interposed allocators, preloaded with the agent for `--alloc` only.
const ALLOC_LIB: &str = "libosprey_alloc.so";

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/agent_libs.rs"));
}

/// The two libraries `exec` preloads.
pub struct AgentLibs {
    /// `libosprey_preload.so`.
    pub agent: PathBuf,
    /// `libosprey_alloc.so`; `None` when `$OSPREY_PRELOAD_LIB` names an agent
    /// without one beside it.
    pub alloc: Option<PathBuf>,
}

/// Finds the libraries (see the module documentation); `say` prints the one
/// line about a cached file rewritten.
pub fn locate(say: &dyn Fn(&str)) -> Result<AgentLibs, Failure> {
    if let Some(p) = std::env::var_os("OSPREY_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(Failure::from(format!("OSPREY_PRELOAD_LIB={} does not exist", p.display())));
        }
        let agent = std::fs::canonicalize(&p).unwrap_or(p);
        let alloc = Some(agent.with_file_name(ALLOC_LIB)).filter(|a| a.is_file());
        return Ok(AgentLibs { agent, alloc });
    }
    let exe = std::env::current_exe().map_err(|e| Failure::from(format!("cannot locate osprey itself: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    for d in [dir.to_path_buf(), dir.join("../lib")] {
        let (agent, alloc) = (d.join(AGENT_LIB), d.join(ALLOC_LIB));
        if agent.is_file() && alloc.is_file() {
            let agent = std::fs::canonicalize(&agent).unwrap_or(agent);
            let alloc = agent.with_file_name(ALLOC_LIB);
            match private_path(&agent).and_then(|()| private_path(&alloc)) {
                Ok(()) => return Ok(AgentLibs { agent, alloc: Some(alloc) }),
                Err(why) => say(&format!("osprey: not using the agent beside osprey: {why}; using the embedded one")),
            }
        }
    }
    let dir = cache_dir()?.join(format!("agent-{}", embedded::VERSION_KEY));
    private_dir(&dir)?;
    let agent = cached(&dir, AGENT_LIB, embedded::PRELOAD, say)?;
    let alloc = cached(&dir, ALLOC_LIB, embedded::ALLOC, say)?;
    Ok(AgentLibs { agent, alloc: Some(alloc) })
}

/// `$XDG_CACHE_HOME/osprey`, `$HOME/.cache/osprey`, or `/tmp/osprey-<uid>`
/// (no home, or one where `.cache/osprey` cannot be created: a container
/// user whose home is `/`); created private (0700) if missing, refused if
/// another user can write it or any directory above it.
pub fn cache_dir() -> Result<PathBuf, Failure> {
    let absolute = |v: &str| std::env::var_os(v).map(PathBuf::from).filter(|p| p.is_absolute());
    // SAFETY: a plain id query.
    let tmp = || std::env::temp_dir().join(format!("osprey-{}", unsafe { libc::geteuid() }));
    let dir = if let Some(x) = absolute("XDG_CACHE_HOME") {
        x.join("osprey")
    } else if let Some(home) = absolute("HOME").filter(|h| h.is_dir()) {
        let dir = home.join(".cache/osprey");
        match create(&dir) {
            Ok(()) => dir,
            Err(_) => tmp(),
        }
    } else {
        tmp()
    };
    // Checked, and handed to the loader, as the path it resolves to: a link
    // on the way (`~/.cache` on another disk) is no directory of its own.
    let dir = create(&dir).and_then(|()| std::fs::canonicalize(&dir)).map_err(|e| {
        let hint = if std::env::var_os("XDG_CACHE_HOME").is_some() { "" } else { " (set XDG_CACHE_HOME)" };
        Failure::from(format!("cannot create the agent cache {}: {e}{hint}", dir.display()))
    })?;
    private_path(&dir).map_err(|why| Failure::from(format!("refusing the agent cache: {why}")))?;
    Ok(dir)
}

/// Creates `dir` (0700) and its missing parents (`~/.cache`: the usual
/// 0755); an existing `dir` is left as it is, for the caller to check.
fn create(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

fn cache_error(dir: &Path, e: std::io::Error) -> Failure {
    Failure::from(format!("cannot create the agent cache {}: {e}", dir.display()))
}

/// Creates `dir` (0700) unless it exists, then checks it and its parents.
fn private_dir(dir: &Path) -> Result<(), Failure> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(cache_error(dir, e)),
    }
    private_path(dir).map_err(|why| Failure::from(format!("refusing the agent cache: {why}")))
}

/// Ok when no other user can replace `path`: it and every directory above
/// it are owned by us or root and not writable by group or others (a sticky
/// directory owned by root, such as `/tmp`, protects its entries). Symbolic
/// links are refused: the loader would follow them.
fn private_path(path: &Path) -> Result<(), String> {
    // SAFETY: a plain id query.
    let me = unsafe { libc::geteuid() };
    let mut first = true;
    for p in path.ancestors().filter(|p| !p.as_os_str().is_empty()) {
        let m = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if first && m.file_type().is_symlink() {
            return Err(format!("{} is a symbolic link", p.display()));
        }
        // A root-owned sticky directory above (`/tmp`) lets no one else rename our entry.
        let sticky_above = !first && m.is_dir() && m.uid() == 0 && m.mode() & libc::S_ISVTX != 0;
        if m.uid() != me && m.uid() != 0 {
            return Err(format!("{} is owned by uid {}, not {me}", p.display(), m.uid()));
        }
        if m.mode() & 0o022 != 0 && !sticky_above {
            return Err(format!("{} is writable by group or others (mode {:o})", p.display(), m.mode() & 0o7777));
        }
        first = false;
    }
    Ok(())
}

/// `dir/name` holding `bytes`: kept if it is ours, private and identical,
/// else (re)written through a temporary file and a rename (atomic, so
/// concurrent runs and a loader opening it meanwhile see a whole library).
/// A file replaced is reported in one line once it is; a file that cannot
/// be replaced is an error, in one line with the reason it had to be.
fn cached(dir: &Path, name: &str, bytes: &[u8], say: &dyn Fn(&str)) -> Result<PathBuf, Failure> {
    let path = dir.join(name);
    let why = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(e.to_string()),
        Ok(_) => match private_path(&path) {
            Err(why) => Some(why),
            Ok(()) if std::fs::read(&path).is_ok_and(|b| b == bytes) => return Ok(path),
            Ok(()) => Some("its content is not this osprey's agent".to_string()),
        },
    };
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failure::from(match why {
            Some(why) => format!("cannot replace the agent library {} ({why}): {e}", path.display()),
            None => format!("cannot write the agent library {}: {e}", path.display()),
        }));
    }
    if let Some(why) = why {
        say(&format!("osprey: replaced {}: {why}", path.display()));
    }
    Ok(path)
}
