//! Compiles the C side of the context ABI: `include/osprey.h` as C and C++,
//! and `tests/c/context_dlsym.c`, which must run unchanged without osprey.
//! Set `OSPREY_PRELOAD=/path/libosprey_preload.so` to also run it under the
//! agent. Skipped (with a message) when no C compiler is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn header_compiles_as_c_and_cxx() {
    let (inc, src) = (root().join("include"), root().join("crates/osprey/tests/c/osprey_h_compiles.c"));
    if !have("cc") {
        eprintln!("SKIPPED: no cc");
        return;
    }
    run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only", "-I"])
        .arg(&inc)
        .arg(&src));
    if have("c++") {
        run(Command::new("c++")
            .args(["-std=c++11", "-Wall", "-Werror", "-fsyntax-only", "-x", "c++", "-I"])
            .arg(&inc)
            .arg(&src));
    }
}

#[test]
fn dlsym_program_runs_without_osprey() {
    if !have("cc") {
        eprintln!("SKIPPED: no cc");
        return;
    }
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("context_dlsym");
    run(Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-fno-omit-frame-pointer", "-I"])
        .arg(root().join("include"))
        .arg(root().join("crates/osprey/tests/c/context_dlsym.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl"));
    let out = run(Command::new(&exe).args(["0.05", "2"]));
    assert!(out.starts_with("osprey: absent\n"), "{out}");
    assert!(out.contains("unit 1 span 1001"), "{out}");
    if let Some(so) = std::env::var_os("OSPREY_PRELOAD") {
        let out = run(Command::new(&exe).args(["0.05", "2"]).env("LD_PRELOAD", so));
        assert!(out.starts_with("osprey: present\n"), "{out}");
    }
}
