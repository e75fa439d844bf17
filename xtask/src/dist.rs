//! `cargo xtask dist`: `target/dist/osprey-<version>-x86_64-linux-gnu.tar.gz`,
//! holding `bin/osprey` (debug info stripped; it carries its agent libraries, see
//! `crates/osprey-cli/build.rs`), `include/osprey.h`, the README, the
//! changelog and `docs/`.
//!
//! Invariant: no file of the tarball needs a glibc newer than
//! [`GLIBC_FLOOR`], the oldest glibc the README names. The agent libraries
//! are built portable (`OSPREY_PORTABLE_AGENT=1`, see
//! `crates/osprey-preload/build.rs`); the staged binary, run alone, writes
//! the libraries it preloads, and `objdump -T -p` of it and of them is
//! checked (symbol versions, and GLIBC_ABI_DT_RELR: packed relocations,
//! glibc 2.36). The versions found are printed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest glibc the release binary runs on (README, docs/cli.md).
const GLIBC_FLOOR: (u32, u32) = (2, 34);

pub fn dist(root: &Path) -> bool {
    let portable = [("OSPREY_PORTABLE_AGENT", "1")];
    if !crate::run(root, "cargo", &["build", "--release", "-p", "osprey-cli"], &portable) {
        return false;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or(root.join("target"), PathBuf::from);
    let osprey = target.join("release/osprey");
    let name = format!("osprey-{}-x86_64-linux-gnu", env!("CARGO_PKG_VERSION"));
    let dist = target.join("dist");
    let stage = dist.join(&name);
    let _ = std::fs::remove_dir_all(&stage);
    let copy = |from: &Path, to: &str| -> std::io::Result<()> {
        let to = stage.join(to);
        std::fs::create_dir_all(to.parent().unwrap())?;
        std::fs::copy(from, &to).map(drop)
    };
    let mut files = vec![(osprey.clone(), "bin/osprey".to_string())];
    for f in ["include/osprey.h", "README.md", "CHANGELOG.md", "LICENSE"] {
        if root.join(f).exists() {
            files.push((root.join(f), f.to_string()));
        }
    }
    for e in walk(&root.join("docs")) {
        let rel = e.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        files.push((e, rel));
    }
    for (from, to) in &files {
        if let Err(e) = copy(from, to) {
            eprintln!("xtask: copying {} into {}: {e}", from.display(), stage.display());
            return false;
        }
    }
    // Debug info is most of the release binary (51 of 65 MB at 0.1.0); the
    // symbols stay, for backtraces.
    let bin = stage.join("bin/osprey");
    if !crate::run(root, "strip", &["--strip-debug", bin.to_str().unwrap()], &[]) {
        return false;
    }
    let scratch = dist.join(format!("{name}.check"));
    let checked = preloaded_by(&bin, &scratch).and_then(|libs| {
        for f in std::iter::once(&bin).chain(&libs) {
            let v = glibc_versions(f)?;
            let newest = v.iter().max().copied().unwrap_or((0, 0));
            eprintln!("xtask: {} needs {}", f.display(), newest_text(&v));
            if newest > GLIBC_FLOOR {
                let (a, b) = GLIBC_FLOOR;
                return Err(format!(
                    "{} needs glibc {}.{}, newer than the documented {a}.{b}",
                    f.display(),
                    newest.0,
                    newest.1
                ));
            }
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&scratch);
    if let Err(e) = checked {
        eprintln!("xtask: {e}");
        return false;
    }
    let tarball = dist.join(format!("{name}.tar.gz"));
    let (d, t) = (dist.to_str().unwrap(), tarball.to_str().unwrap());
    if !crate::run(root, "tar", &["-C", d, "--owner=0", "--group=0", "-czf", t, &name], &[]) {
        return false;
    }
    println!("{}", tarball.display());
    true
}

/// The libraries `osprey` (alone in its directory) preloads into a program:
/// the copies embedded in it, as it writes them to a cache under `scratch`.
fn preloaded_by(osprey: &Path, scratch: &Path) -> Result<Vec<PathBuf>, String> {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    // osprey names its cache by the path the links in `target/` lead to.
    let scratch = &std::fs::canonicalize(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let o = Command::new(osprey)
        .args(["exec", "-q", "--alloc", "--out"])
        .arg(scratch.join("profiles"))
        .args(["--", "/bin/sh", "-c", "echo \"$LD_PRELOAD\""])
        .env("XDG_CACHE_HOME", scratch.join("cache"))
        .env_remove("OSPREY_PRELOAD_LIB")
        .output()
        .map_err(|e| format!("{}: {e}", osprey.display()))?;
    let preload = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() {
        return Err(format!("{} exec failed: {}", osprey.display(), String::from_utf8_lossy(&o.stderr).trim()));
    }
    let libs: Vec<PathBuf> = preload.split([':', ' ']).filter(|l| !l.is_empty()).map(PathBuf::from).collect();
    if libs.len() != 2 || !libs.iter().all(|l| l.starts_with(scratch.join("cache"))) {
        return Err(format!("the staged osprey preloads {preload:?}, not two libraries from its cache"));
    }
    Ok(libs)
}

/// Every file under `dir`, sorted.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The glibc versions `file` asks for: its symbols' `GLIBC_x.y` and its
/// version references (`objdump -T -p`).
fn glibc_versions(file: &Path) -> Result<Vec<(u32, u32)>, String> {
    let o = Command::new("objdump")
        .args(["-T", "-p"])
        .arg(file)
        .output()
        .map_err(|e| format!("objdump -T -p {}: {e} (install binutils)", file.display()))?;
    if !o.status.success() {
        return Err(format!("objdump -T -p {} failed: {}", file.display(), String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(parse_glibc_versions(&String::from_utf8_lossy(&o.stdout)))
}

/// `GLIBC_x.y` words of `objdump` output, sorted and deduplicated;
/// `GLIBC_ABI_DT_RELR` (packed relative relocations) counts as 2.36, the
/// first glibc whose loader reads them.
fn parse_glibc_versions(text: &str) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|ver| {
            if ver == "ABI_DT_RELR" {
                return Some((2, 36));
            }
            let mut it = ver.split('.').map(|n| n.parse::<u32>());
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

fn newest_text(v: &[(u32, u32)]) -> String {
    let all: Vec<String> = v.iter().rev().take(4).map(|(a, b)| format!("GLIBC_{a}.{b}")).collect();
    format!("{} (newest first)", all.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_relocations_count_as_glibc_2_36() {
        let objdump = "Version References:\n  required from libc.so.6:\n    0x0 0x00 07 GLIBC_ABI_DT_RELR\n    \
                       0x0 0x00 05 GLIBC_2.34\nDYNAMIC SYMBOL TABLE:\n0 DF *UND* 0 (GLIBC_2.2.5) free\n";
        assert_eq!(parse_glibc_versions(objdump), vec![(2, 2), (2, 34), (2, 36)]);
    }

    /// The floor the dist check enforces is the one the README and
    /// docs/cli.md give users.
    #[test]
    fn the_docs_name_the_checked_glibc_floor() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let floor = format!("glibc {}.{}", GLIBC_FLOOR.0, GLIBC_FLOOR.1);
        for doc in ["README.md", "docs/cli.md"] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap().replace('\n', " ");
            assert!(text.contains(&floor), "{doc} names {floor}");
        }
    }
}
