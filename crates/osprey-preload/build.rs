//! Compiles the exec-family shim (C, for the variadic `execl*`) and the
//! OTEP 4947 TLS variable (C: stable Rust cannot define an exported TLS
//! symbol) into the agent library and exports their symbols, which rustc's
//! own version script would otherwise hide.

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
}
