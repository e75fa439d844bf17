//! Compiles the exec-family shim (C, for the variadic `execl*`) and the
//! OTEP 4947 TLS variable (C: stable Rust cannot define an exported TLS
//! symbol) into the agent library and exports their symbols, which rustc's
//! own version script would otherwise hide. Also sets how the
//! library is linked: it is loaded into every process of a profiled tree, so
//! what the dynamic loader does for it is paid by each of them (see
//! docs/design/agent-start.md).

fn main() {
    println!("cargo:rerun-if-changed=src/exec_shim.c");
    println!("cargo:rerun-if-changed=src/exec_shim.map");
    println!("cargo:rerun-if-changed=src/otel_tls.c");
    let mut tls = cc::Build::new();
    tls.file("src/otel_tls.c").cargo_metadata(false);
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        // TLSDESC, which OTEP readers resolve from the GOT (AArch64's default).
        tls.flag("-mtls-dialect=gnu2");
    }
    tls.compile("osprey_otel_tls");
    println!("cargo:rustc-link-lib=static:+whole-archive=osprey_otel_tls");
    cc::Build::new()
        .file("src/exec_shim.c")
        .flag("-fno-omit-frame-pointer")
        .cargo_metadata(false)
        .compile("osprey_exec_shim");
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    println!("cargo:rustc-link-search=native={out}");
    println!("cargo:rustc-link-lib=static:+whole-archive=osprey_exec_shim");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/src/exec_shim.map");
    // `OSPREY_PORTABLE_AGENT=1` (set by `cargo xtask dist`): a library for
    // any glibc the release names, not only the build machine's, so neither
    // of the two choices below that tie it to the build machine's glibc.
    println!("cargo:rerun-if-env-changed=OSPREY_PORTABLE_AGENT");
    let portable = std::env::var_os("OSPREY_PORTABLE_AGENT").is_some_and(|v| v != "0" && !v.is_empty());
    // Relative relocations packed (DT_RELR, glibc 2.36): a few KiB to read
    // at load instead of 24 bytes for each of ~8000 pointers. An older
    // loader refuses the library (GLIBC_ABI_DT_RELR not found).
    if !portable && linker_packs_relocs() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,pack-relative-relocs");
    }
    // The unwinder from libgcc_eh.a, linked in (its symbols stay local, see
    // the version scripts): libgcc_s.so.1 is then no longer needed (rustc
    // links with --as-needed), one library less to map and relocate, and
    // its constructor's `cpuid`s (a VM exit each) no longer run. Not when
    // portable: libgcc built for glibc 2.35+ calls `_dl_find_object`
    // (GLIBC_2.35), while the system's libgcc_s matches the system's glibc.
    if !portable {
        if let Some(dir) = gcc_file_dir("libgcc_eh.a") {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
        }
    }
}

/// The directory of a file of the C compiler's runtime (`cc -print-file-name`).
fn gcc_file_dir(name: &str) -> Option<String> {
    let cc = cc::Build::new().get_compiler();
    let out = cc.to_command().arg(format!("-print-file-name={name}")).output().ok()?;
    let path = std::path::PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    // Not found, the compiler echoes the bare name back.
    path.is_absolute().then(|| path.parent().map(|d| d.display().to_string())).flatten()
}

/// Whether the linker accepts `-z pack-relative-relocs` (binutils 2.38, lld
/// 15) and the C library the build runs on reads DT_RELR (glibc 2.36): the
/// library is built for the machine it runs on.
fn linker_packs_relocs() -> bool {
    let cc = cc::Build::new().get_compiler();
    let probe = std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("relr-probe.so");
    let linked = cc
        .to_command()
        .args(["-shared", "-x", "c", "/dev/null", "-Wl,-z,pack-relative-relocs", "-Wl,--fatal-warnings", "-o"])
        .arg(&probe)
        .status()
        .is_ok_and(|s| s.success());
    // glibc marks its support with the GLIBC_ABI_DT_RELR version.
    let glibc = std::process::Command::new("ldd").arg("--version").output().ok().and_then(|o| {
        let v = String::from_utf8_lossy(&o.stdout).lines().next()?.rsplit(' ').next()?.to_string();
        let (major, minor) = v.split_once('.')?;
        Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?))
    });
    linked && glibc.is_some_and(|v| v >= (2, 36))
}
