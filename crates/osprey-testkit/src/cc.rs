//! C and C++ fixtures compiled at test time.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The flags of the end-to-end fixtures: frame pointers kept (osprey's
/// native walk follows them), debug information, threads.
pub const FRAME_POINTERS: [&str; 4] = ["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"];

/// Optimized, without frame pointers: walks need the CFI tables
/// (`osprey attach`/`top` to native programs).
pub const FRAMELESS: [&str; 3] = ["-O2", "-fomit-frame-pointer", "-pthread"];

/// One compiler invocation: `COMPILER FLAGS -I include -I c SRC AFTER -o
/// OUT`, `include` being the workspace's public C headers and `c` the
/// fixtures' shared ones (this crate's `c/`).
#[derive(Clone, Debug)]
pub struct Cc {
    compiler: String,
    flags: Vec<OsString>,
    after: Vec<OsString>,
}

impl Cc {
    /// An invocation of `compiler` (`cc`, `c++`, `gcc`) with no flags yet.
    pub fn new(compiler: &str) -> Cc {
        Cc { compiler: compiler.into(), flags: Vec::new(), after: Vec::new() }
    }

    /// Adds options before the source (code generation, defines).
    pub fn flags<S: AsRef<OsStr>>(mut self, flags: impl IntoIterator<Item = S>) -> Cc {
        self.flags.extend(flags.into_iter().map(|f| f.as_ref().to_owned()));
        self
    }

    /// Adds arguments after the source (libraries, linker options): the
    /// linker resolves a library only for what comes before it.
    pub fn after<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Cc {
        self.after.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Compiles `src` into `out` and returns `out`; fails the test if the
    /// compiler is missing or fails.
    pub fn build(&self, src: &Path, out: &Path) -> PathBuf {
        let st = Command::new(&self.compiler)
            .args(&self.flags)
            .arg("-I")
            .arg(crate::paths::workspace_root().join("include"))
            .arg("-I")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("c"))
            .arg(src)
            .args(&self.after)
            .arg("-o")
            .arg(out)
            .status()
            .unwrap_or_else(|e| panic!("{} (install gcc/g++): {e}", self.compiler));
        assert!(
            st.success(),
            "compiling {} with {} {:?} ... {:?}",
            src.display(),
            self.compiler,
            self.flags,
            self.after
        );
        out.to_path_buf()
    }
}

/// `cc` with [`FRAME_POINTERS`]: compiles `src` into `out`, `extra` after
/// the source (e.g. `-ldl`).
pub fn compile_c(src: &Path, out: &Path, extra: &[&str]) -> PathBuf {
    Cc::new("cc").flags(FRAME_POINTERS).after(extra).build(src, out)
}

/// `cc` with [`FRAMELESS`]: compiles `src_dir/NAME.c` into `out_dir/NAME`.
pub fn compile_frameless(src_dir: impl AsRef<Path>, name: &str, out_dir: &Path) -> PathBuf {
    Cc::new("cc").flags(FRAMELESS).build(&src_dir.as_ref().join(format!("{name}.c")), &out_dir.join(name))
}

/// Compiles `src_dir/NAME.c` into `out_dir/NAME` as [`compile_c`] does.
pub fn compile_named(src_dir: impl AsRef<Path>, name: &str, out_dir: &Path) -> PathBuf {
    compile_c(&src_dir.as_ref().join(format!("{name}.c")), &out_dir.join(name), &[])
}

/// Writes C `source` to `dir/NAME.c` and compiles it into `dir/NAME` as
/// [`compile_c`] does.
pub fn compile_source(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    compile_c(&src, &dir.join(name), &[])
}
