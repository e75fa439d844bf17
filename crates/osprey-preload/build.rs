//! Compiles the exec-family shim (C, for the variadic `execl*`) into the
//! agent library and exports its symbols, which rustc's own version script
//! would otherwise hide.

fn main() {
    println!("cargo:rerun-if-changed=src/exec_shim.c");
    println!("cargo:rerun-if-changed=src/exec_shim.map");
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
}
