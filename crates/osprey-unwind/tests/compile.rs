//! Tables compiled from real files built here and from the system.

use object::{Object, ObjectSection};
use osprey_testkit::unwind as fixture;
use osprey_unwind::compile::compile_file;
use osprey_unwind::{Kind, Rule};

fn section(path: &std::path::Path, name: &str) -> Option<(u64, u64)> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.section_by_name(name).map(|s| (s.address(), s.size()))
}

#[test]
fn lazy_plt_stubs_are_expanded_per_slot() {
    // Lazy binding (-z lazy) keeps the classic .plt with its CFA expression.
    let lib = fixture::build_c("libframeless-lazy.so", &["-shared", "-fPIC", "-Wl,-z,lazy"]);
    let (plt, size) = section(&lib, ".plt").expect(".plt");
    assert!(size >= 48, "PLT0 and at least two stubs");
    let t = compile_file(&lib, None).unwrap().table;
    let rsp = |o| Some(Rule::cfa(Kind::Rsp, o, None).unwrap());
    // PLT0 pushes one more word; each stub has pushed its index from +11 on.
    assert_eq!(t.lookup(plt), rsp(16));
    assert_eq!(t.lookup(plt + 6), rsp(24));
    for stub in (plt + 16..plt + size).step_by(16) {
        assert_eq!(t.lookup(stub), rsp(8), "stub at {stub:#x}");
        assert_eq!(t.lookup(stub + 10), rsp(8));
        assert_eq!(t.lookup(stub + 11), rsp(16));
        assert_eq!(t.lookup(stub + 15), rsp(16));
    }
}

#[test]
fn signal_trampoline_stops() {
    // glibc's __restore_rt is described with DWARF expressions: not expressible.
    let libc = std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let data = std::fs::read(libc).unwrap();
    let file = object::File::parse(&*data).unwrap();
    // libc has no .symtab here: find the trampoline by its code,
    // `mov $15, %eax; syscall` (rt_sigreturn).
    let text = file.section_by_name(".text").unwrap();
    let code = text.data().unwrap();
    let pat = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
    let at = code.windows(pat.len()).position(|w| w == pat).expect("__restore_rt");
    let t = compile_file(libc, None).unwrap().table;
    let pc = text.address() + at as u64;
    assert_eq!(t.lookup(pc).map(|r| r.kind()), Some(Kind::Stop), "{:?}", t.lookup(pc));
}

#[test]
fn page_index_lookup_matches_a_plain_search() {
    for lib in ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0"] {
        let t = compile_file(lib.as_ref(), None).unwrap().table;
        let entries: Vec<(u64, Rule)> = t.iter().collect();
        assert_eq!(entries.len(), t.len());
        assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "{lib}: starts not increasing");
        let (lo, hi) = (entries[0].0, entries[entries.len() - 1].0);
        let mut seed = 0x2545f4914f6cdd1du64;
        for i in 0..200_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Random addresses, and every entry's first and last byte.
            let a = match i % 3 {
                0 => lo.saturating_sub(64) + seed % (hi - lo + 128),
                1 => entries[(seed % entries.len() as u64) as usize].0,
                _ => entries[(seed % entries.len() as u64) as usize].0.saturating_sub(1),
            };
            let plain = entries.partition_point(|e| e.0 <= a).checked_sub(1).map(|i| entries[i].1);
            assert_eq!(t.lookup(a), plain, "{lib} at {a:#x}");
        }
    }
}

/// Builds the frameless library with `.debug_frame` only (no `.eh_frame`),
/// moves its debug sections to a separate file under a private
/// `.build-id` tree, and checks the table comes from that file.
#[test]
fn debug_frame_from_a_separate_debug_file_by_build_id() {
    let full = fixture::build_c(
        "libframeless-debugframe.so",
        &["-shared", "-fPIC", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-Wl,--build-id"],
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("debugroot");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let stripped = dir.join("libstripped.so");
    let debug = dir.join("tmp.debug");
    let run = |args: &[&std::ffi::OsStr]| {
        assert!(std::process::Command::new("objcopy").args(args).status().unwrap().success(), "objcopy {args:?}");
    };
    run(&["--only-keep-debug".as_ref(), full.as_os_str(), debug.as_os_str()]);
    run(&["--strip-debug".as_ref(), full.as_os_str(), stripped.as_os_str()]);

    let alone = compile_file(&stripped, None).unwrap();
    assert_eq!((alone.eh_fdes, alone.debug_fdes), (0, 0), "the stripped file has no CFI of its own");
    let id = alone.build_id.clone().expect("build id");
    let dest = osprey_unwind::compile::debug_file_path(&dir, &id).unwrap();
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::rename(&debug, &dest).unwrap();

    let c = compile_file(&stripped, Some(&dir)).unwrap();
    assert_eq!(c.debug_file.as_deref(), Some(dest.as_path()));
    assert!(c.debug_fdes >= 4, "{} FDEs from .debug_frame", c.debug_fdes);
    // fl_recurse's body: a CFA above RSP by more than the return address.
    let syms = osprey_unwind::symbols::Symbols::load(&full).unwrap();
    let data = std::fs::read(&full).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let (addr, size) = object::Object::symbols(&file)
        .find(|s| object::ObjectSymbol::name(s) == Ok("fl_recurse"))
        .map(|s| (object::ObjectSymbol::address(&s), object::ObjectSymbol::size(&s)))
        .unwrap();
    assert_eq!(syms.lookup(addr).map(|s| s.0), Some("fl_recurse"));
    let rules: Vec<Rule> = (addr..addr + size).filter_map(|a| c.table.lookup(a)).collect();
    assert!(rules.iter().all(|r| r.kind() == Kind::Rsp), "{rules:?}");
    assert!(rules.iter().any(|r| r.cfa_offset() > 8), "{rules:?}");
}

#[test]
fn vdso_has_a_table() {
    let shared = fixture::refresh();
    let vdso = shared
        .read(|s| s.modules().iter().find(|m| m.path.to_string_lossy().contains("vdso")).map(|m| m.table.len()))
        .unwrap();
    assert!(vdso.is_some_and(|n| n > 0), "vDSO: {vdso:?}");
}

/// libc here is stripped of `.symtab`; Debian's libc6-dbg installs its
/// debug file under /usr/lib/debug/.build-id (the CI installs it).
#[test]
fn symbols_from_the_separate_debug_file() {
    use osprey_unwind::compile::{debug_file_path, DEBUG_ROOT};
    use osprey_unwind::symbols::{module_offset_name, Symbols};
    let libc = std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let data = std::fs::read(libc).unwrap();
    let id = object::File::parse(&*data).unwrap().build_id().unwrap().unwrap().to_vec();
    let dpath = debug_file_path(DEBUG_ROOT.as_ref(), &id).unwrap();
    let ddata = std::fs::read(&dpath).unwrap_or_else(|e| panic!("{}: {e} (apt install libc6-dbg)", dpath.display()));
    let dfile = object::File::parse(&*ddata).unwrap();
    let (addr, size) = object::Object::symbols(&dfile)
        .find(|s| object::ObjectSymbol::name(s) == Ok("__libc_start_call_main"))
        .map(|s| (object::ObjectSymbol::address(&s), object::ObjectSymbol::size(&s)))
        .expect("__libc_start_call_main in the debug file");
    let plain = Symbols::load(libc).unwrap();
    assert_eq!(plain.lookup(addr + 1), None, "not in .dynsym");
    assert_eq!(module_offset_name(libc, addr + 1), format!("libc.so.6+{:#x}", addr + 1));
    let full = Symbols::load_with_debug(libc, Some(DEBUG_ROOT.as_ref())).unwrap();
    assert!(full.len() > plain.len());
    assert_eq!(full.lookup(addr + 1), Some(("__libc_start_call_main", 1)));
    // Past its end it is not named after it.
    assert_ne!(full.lookup(addr + size).map(|s| s.0), Some("__libc_start_call_main"));
}
