//! `cargo xtask dist`: `target/dist/osprey-<version>-x86_64-linux-gnu.tar.gz`,
//! holding `bin/osprey` (which carries its agent libraries, see
//! `crates/osprey-cli/build.rs`), `include/osprey.h`, the README, the
//! changelog and `docs/`.
//!
//! Invariant: no file of the tarball needs a glibc symbol version newer
//! than [`GLIBC_FLOOR`], the oldest glibc the README names; `objdump -T`
//! of the binary and of the libraries embedded in it is checked, and the
//! versions found are printed.

use std::path::Path;
use std::process::Command;

/// The oldest glibc the release binary runs on (README, docs/cli.md).
const GLIBC_FLOOR: (u32, u32) = (2, 34);

pub fn dist(root: &Path) -> bool {
    if !crate::run(root, "cargo", &["build", "--release", "-p", "osprey-cli"], &[]) {
        return false;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or(root.join("target"), std::path::PathBuf::from);
    let osprey = target.join("release/osprey");
    let embedded = ["libosprey_preload.so", "libosprey_alloc.so"].map(|l| target.join("osprey-agent/release").join(l));
    for f in std::iter::once(&osprey).chain(&embedded) {
        match glibc_versions(f) {
            Ok(v) => {
                let newest = v.iter().max().copied().unwrap_or((0, 0));
                eprintln!("xtask: {} needs glibc {}", f.display(), newest_text(&v));
                if newest > GLIBC_FLOOR {
                    eprintln!(
                        "xtask: {} needs GLIBC_{}.{}, newer than the documented floor {}.{}",
                        f.display(),
                        newest.0,
                        newest.1,
                        GLIBC_FLOOR.0,
                        GLIBC_FLOOR.1
                    );
                    return false;
                }
            }
            Err(e) => {
                eprintln!("xtask: {e}");
                return false;
            }
        }
    }
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
    let tarball = dist.join(format!("{name}.tar.gz"));
    let (d, t) = (dist.to_str().unwrap(), tarball.to_str().unwrap());
    if !crate::run(root, "tar", &["-C", d, "--owner=0", "--group=0", "-czf", t, &name], &[]) {
        return false;
    }
    println!("{}", tarball.display());
    true
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

/// The `GLIBC_x.y` versions `file`'s dynamic symbols ask for.
fn glibc_versions(file: &Path) -> Result<Vec<(u32, u32)>, String> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .map_err(|e| format!("objdump -T {}: {e} (install binutils)", file.display()))?;
    if !o.status.success() {
        return Err(format!("objdump -T {} failed: {}", file.display(), String::from_utf8_lossy(&o.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut v: Vec<(u32, u32)> = text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|ver| {
            let mut it = ver.split('.').map(|n| n.parse::<u32>());
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

fn newest_text(v: &[(u32, u32)]) -> String {
    let all: Vec<String> = v.iter().rev().take(4).map(|(a, b)| format!("GLIBC_{a}.{b}")).collect();
    format!("{} (newest first)", all.join(", "))
}
