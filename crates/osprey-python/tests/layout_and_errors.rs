//! The offset tables against the interpreters' own headers (compiled with
//! the C compiler at test time), and the bad-input paths.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use osprey_python::layout::Layout;
use osprey_python::{attach_with_sink, is_cpython_executable, is_cpython_process, open_target, Error, Options};

fn offsets_from_headers(include: &Path, py: &common::Py, tag: &str) -> Vec<(String, u64)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/offsets.c");
    compile_and_run(&src, include, py, tag)
}

/// Compiles `src` against `include` (and, for a chroot's interpreter, the
/// chroot's multiarch headers after the host's), runs it, parses "KEY VALUE" lines.
fn compile_and_run(src: &Path, include: &Path, py: &common::Py, tag: &str) -> Vec<(String, u64)> {
    let exe = std::env::temp_dir().join(format!("osprey-py-offsets-{}-{tag}", std::process::id()));
    let mut cc = Command::new("cc");
    cc.arg("-w").arg("-I").arg(include);
    if let Some(root) = &py.root {
        cc.arg("-idirafter").arg(root.join("usr/include"));
    }
    let st = cc.arg("-o").arg(&exe).arg(src).status().expect("a C compiler (cc) is needed for this test");
    assert!(st.success(), "compiling {} against {}", src.display(), include.display());
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The interpreter's headers: its prefix's (`python3.13t` for a
/// free-threaded one), Debian's in /usr/include, or the chroot's.
fn include_dir(py: &common::Py, minor: u32) -> PathBuf {
    if let Some(root) = &py.root {
        return root.join(format!("usr/include/python3.{minor}"));
    }
    let prefix = py.host_exe.parent().unwrap().parent().unwrap();
    let abi = if osprey_python::abi_free_threaded(&py.host_exe.to_string_lossy()) { "t" } else { "" };
    let include = prefix.join(format!("include/python3.{minor}{abi}"));
    if include.exists() {
        include
    } else {
        PathBuf::from(format!("/usr/include/python3.{minor}"))
    }
}

/// Checks layout `l` against the headers of interpreter `name`.
fn check_layout(name: &str, minor: u32) {
    let Some(py) = common::python(name) else { return };
    let include = include_dir(&py, minor);
    // 3.8-3.12: the table; 3.13+: what the running interpreter publishes.
    let (l, _w) = match Layout::for_version(3, minor) {
        Some(l) => (l, None),
        None => {
            let w = py.start(&["states"]);
            let t = open_target(w.pid()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(t.debug_offsets, "{name}: layout not from _Py_DebugOffsets");
            (t.layout.clone(), Some(w))
        }
    };
    let mut seen = 0;
    for (k, v) in offsets_from_headers(&include, &py, name) {
        // A free-threaded layout does not read the (disabled) GIL.
        if l.free_threaded && (k.starts_with("gil.") || k == "interp.gil_ptr") {
            continue;
        }
        seen += 1;
        let ours = match k.as_str() {
            "runtime.interpreters_head" => l.runtime_interpreters_head,
            "runtime.autotsskey" => l.runtime_autotsskey,
            "runtime.gil" => l.runtime_gil.unwrap(),
            "interp.gil_ptr" => l.interp_gil_ptr.unwrap(),
            "gil.last_holder" => l.gil_last_holder,
            "gil.locked" => l.gil_locked,
            "gil.size" => l.gil_size,
            "interp.next" => l.interp_next,
            "interp.tstate_head" => l.interp_tstate_head,
            "tstate.next" => l.tstate_next,
            "tstate.interp" => l.tstate_interp,
            "tstate.thread_id" => l.tstate_thread_id,
            "tstate.native_thread_id" => l.tstate_native_thread_id.unwrap(),
            "tstate.frame" => l.tstate_frame,
            "cframe.current_frame" => l.cframe_current_frame.unwrap(),
            "frame.code" => l.frame_code,
            "frame.previous" => l.frame_previous,
            "frame.instr" => l.frame_instr,
            "frame.owner" => l.frame_owner.unwrap(),
            "code.filename" => l.code_filename,
            "code.name" => l.code_name,
            "code.qualname" => l.code_qualname.unwrap(),
            "code.code_adaptive" => l.code_code_adaptive.unwrap(),
            "code.firstlineno" => l.code_firstlineno,
            "code.linetable" => l.code_linetable,
            "bytes.sval" => l.bytes_sval,
            "unicode.ascii_size" => l.unicode_ascii_size,
            "unicode.compact_size" => l.unicode_compact_size,
            "unicode.length" => l.unicode_length,
            "unicode.kind_bit" => l.unicode_kind_bit as u64,
            "frame.tlbc_index" => l.frame_tlbc_index.unwrap(),
            "code.tlbc" => l.code_tlbc.unwrap(),
            "bytes.size" => l.bytes_size,
            "object.type" => l.object_type,
            "interp.gc_collecting" => l.interp_gc_collecting.unwrap(),
            "runtime.gc_collecting" => l.runtime_gc_collecting.unwrap(),
            "tstate.holds_gil" => l.tstate_holds_gil.unwrap(),
            "objects.interp_modules" => l.objects.interp_modules,
            "objects.interp_sysdict" => l.objects.interp_sysdict,
            "objects.dict_keys" => l.objects.dict_keys,
            "objects.dict_values" => l.objects.dict_values,
            "objects.type_flags" => l.objects.type_flags,
            "objects.type_basicsize" => l.objects.type_basicsize,
            "objects.type_dictoffset" => l.objects.type_dictoffset,
            "objects.heap_type_cached_keys" => l.objects.heap_type_cached_keys,
            "objects.long_size" => l.objects.long_size,
            "objects.long_digits" => l.objects.long_digits,
            "objects.values_array" => l.objects.values_array,
            "objects.module_dict" => l.objects.module_dict,
            "objects.managed_dict" => l.objects.managed_dict,
            "objects.dict_used" => l.objects.dict_used,
            "objects.tstate_context" => l.objects.tstate_context,
            "objects.context_vars" => l.objects.context_vars,
            "objects.hamt_root" => l.objects.hamt_root,
            "objects.hamt_count" => l.objects.hamt_count,
            "objects.contextvar_name" => l.objects.contextvar_name,
            "objects.contextvar_hash" => l.objects.contextvar_hash,
            "objects.tuple_size" => l.objects.tuple_size,
            "objects.tuple_items" => l.objects.tuple_items,
            "objects.type_name" => l.objects.type_name,
            other => panic!("unknown key {other}"),
        };
        assert_eq!(ours, v, "{name}: {k}");
    }
    assert!(seen > 25, "{name}: only {seen} offsets from the headers");
}

#[test]
fn layouts_match_headers() {
    for (name, minor) in [("3.8", 8), ("3.9", 9), ("3.10", 10), ("3.11", 11), ("3.12", 12), ("debian-3.11", 11)] {
        check_layout(name, minor);
    }
}

/// 3.13+: the layout read from the running interpreter's `_Py_DebugOffsets`
/// (and the `autoTSSkey` offset decoded from machine code) equals what the
/// compiler computes from its headers.
#[test]
fn debug_offset_layouts_match_headers() {
    for (name, minor) in
        [("3.13", 13), ("forky-3.13", 13), ("forky-3.14", 14), ("forky-3.15", 15), ("3.13t", 13), ("3.14t", 14)]
    {
        check_layout(name, minor);
    }
}

/// osprey's field order of `_Py_DebugOffsets` per version equals the
/// struct in the interpreter's headers (`offsetof` of every field).
#[test]
fn debug_offsets_schemas_match_headers() {
    for (name, minor) in [("forky-3.13", 13), ("forky-3.14", 14), ("forky-3.15", 15), ("3.13t", 13), ("3.14t", 14)] {
        let Some(py) = common::python(name) else { return };
        let (schema, known) = osprey_python::debug_offsets::schema(minor).unwrap();
        assert!(known);
        let mut c = String::from(
            "#define Py_BUILD_CORE 1\n#include <Python.h>\n#include <stddef.h>\n#include <stdio.h>\n#include \"internal/pycore_runtime.h\"\nint main(void) {\n",
        );
        for f in schema {
            c += &format!("    printf(\"%s %zu\\n\", \"{f}\", offsetof(_Py_DebugOffsets, {f}));\n");
        }
        c += "    printf(\"sizeof %zu\\n\", sizeof(_Py_DebugOffsets));\n    return 0;\n}\n";
        let src = std::env::temp_dir().join(format!("osprey-py-schema-{}-{minor}.c", std::process::id()));
        std::fs::write(&src, c).unwrap();
        let got = compile_and_run(&src, &include_dir(&py, minor), &py, &format!("schema{minor}"));
        let _ = std::fs::remove_file(&src);
        for (i, f) in schema.iter().enumerate() {
            let v = got.iter().find(|(k, _)| k == f).map(|(_, v)| *v);
            assert_eq!(v, Some(8 * i as u64), "{name}: offset of {f}");
        }
        let size = got.iter().find(|(k, _)| k == "sizeof").unwrap().1;
        assert_eq!(size, 8 * schema.len() as u64, "{name}: the struct has fields osprey does not know");
    }
}

/// A layout that does not match the live process is refused, with the reason.
#[test]
fn live_check_refuses_a_wrong_layout() {
    let Some(py) = common::python("forky-3.14") else { return };
    let w = py.start(&["states"]);
    let mut t = open_target(w.pid()).unwrap();
    t.check_live().unwrap();
    for (what, edit) in [
        ("interp", Box::new(|l: &mut Layout| l.tstate_interp = l.tstate_next) as Box<dyn Fn(&mut Layout)>),
        ("native id", Box::new(|l: &mut Layout| l.tstate_native_thread_id = Some(l.tstate_thread_id + 4))),
        ("frame", Box::new(|l: &mut Layout| l.frame_code = l.frame_previous)),
    ] {
        let good = t.layout.clone();
        edit(&mut t.layout);
        match t.check_live() {
            Err(e @ Error::Unsupported(_)) => eprintln!("{what}: {e}"),
            other => panic!("{what}: a wrong layout was accepted: {other:?}"),
        }
        t.layout = good;
    }
}

#[test]
fn detection() {
    let Some(py) = common::interpreter("3.12") else { return };
    assert!(is_cpython_executable(&py.canonicalize().unwrap()));
    if let Some(deb) = common::interpreter("debian-3.11") {
        assert!(is_cpython_executable(&deb));
    }
    assert!(!is_cpython_executable(Path::new("/bin/sleep")));
    // A copy of /bin/sleep named python3 is not CPython.
    let fake = std::env::temp_dir().join(format!("osprey-fake-{}/python3", std::process::id()));
    std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
    std::fs::copy("/bin/sleep", &fake).unwrap();
    assert!(!is_cpython_executable(&fake));
    let mut c = Command::new(&fake).arg("5").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(!is_cpython_process(c.id() as i32));
    match open_target(c.id() as i32) {
        Err(e @ Error::NotCpython(_)) => eprintln!("{e}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a fake python3 was accepted"),
    }
    let _ = c.kill();
    let _ = c.wait();
    let _ = std::fs::remove_dir_all(fake.parent().unwrap());
    let w = common::start(&py, &["states"]);
    assert!(is_cpython_process(w.pid()));
}

#[test]
fn no_process() {
    let stop = AtomicBool::new(false);
    let r = attach_with_sink(999_999_999, &Options::default(), &stop, &mut |_| Ok(None));
    match r {
        Err(e @ Error::NoProcess(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("999999999"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_version() {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let Some(old) = std::fs::read_dir(Path::new(&home).join(".pyenv/versions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/python3"))
        .find(|p| p.to_string_lossy().contains("/3.7.") && p.exists())
    else {
        eprintln!("no python 3.7 here; skipping");
        return;
    };
    let mut c = Command::new(&old).args(["-c", "import time; time.sleep(5)"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    match open_target(c.id() as i32) {
        Err(e @ Error::Unsupported(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("3.7"), "{msg}");
            eprintln!("{msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("3.7 accepted"),
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// The process exits while being sampled: attach ends normally and flushes.
#[test]
fn process_exits_mid_sampling() {
    let Some(py) = common::interpreter("3.12") else { return };
    let mut w = common::start(&py, &["short", "1.0"]);
    let pid = w.pid();
    let waiter = std::thread::spawn(move || {
        let _ = w.child.wait();
        drop(w);
    });
    let opts = Options {
        hz: 200,
        period: Duration::from_secs(60),
        duration: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let mut flushed = Vec::new();
    let t0 = std::time::Instant::now();
    let s = attach_with_sink(pid, &opts, &stop, &mut |d| {
        flushed.push(d.samples.len());
        Ok(None)
    })
    .unwrap();
    waiter.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10), "attach did not notice the exit");
    assert!(s.samples > 20, "{s:?}");
    assert_eq!(flushed.len(), 1, "one final flush");
    assert!(flushed[0] > 0);
}

/// Overwrites the 8-byte word at `addr` in the target's memory (through
/// /proc/PID/mem, which also writes read-only pages for a tracer).
fn poke(pid: i32, addr: u64, value: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(format!("/proc/{pid}/mem")).unwrap();
    f.seek(SeekFrom::Start(addr)).unwrap();
    f.write_all(&value.to_le_bytes()).unwrap();
}

/// What a running 3.15 interpreter publishes, edited in its memory: a newer
/// version is profiled after one line saying so; garbage offsets and a
/// free-threaded flag are refused with one line each.
#[test]
fn edited_debug_offsets() {
    let Some(py) = common::python("forky-3.15") else { return };
    let (schema, _) = osprey_python::debug_offsets::schema(15).unwrap();
    let field = |name: &str| 8 * schema.iter().position(|f| *f == name).unwrap() as u64;
    let cases: &[(&str, &str, u64, Option<&str>)] = &[
        ("newer", "version", 0x031000f0, None),
        ("garbage", "thread_state.next", 1 << 40, Some("invalid _Py_DebugOffsets: thread_state.next")),
        ("too small", "interpreter_frame.size", 8, Some("invalid _Py_DebugOffsets: sizeof interpreter_frame")),
        ("free-threaded", "free_threaded", 1, Some("free_threaded flag (1) disagrees with sizeof PyObject = 16")),
        ("wrong version", "version", 0x030e00f0, Some("claim version 3.14.0")),
    ];
    for &(what, name, value, refusal) in cases {
        let w = py.start(&["states"]);
        let t = open_target(w.pid()).unwrap();
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        poke(w.pid(), t.runtime + field(name), value);
        if what == "newer" {
            // Py_Version too (read-only data), so both say 3.16.
            poke(w.pid(), t.module.sym("Py_Version").unwrap(), 0x031000f0);
        }
        match (open_target(w.pid()), refusal) {
            (Ok(t), None) => {
                assert_eq!(t.version.minor, 16);
                assert_eq!(t.notes.len(), 1, "{:?}", t.notes);
                assert!(
                    t.notes[0].contains("CPython 3.16.0 is newer than any osprey was tested with"),
                    "{:?}",
                    t.notes
                );
                let (profiles, s) = sample(w.pid());
                assert!(s.samples > 10 && !profiles.is_empty(), "{what}: {s:?}");
            }
            (Err(e @ Error::Unsupported(_)), Some(why)) => {
                let msg = e.to_string();
                eprintln!("{what}: {msg}");
                assert!(msg.contains(why), "{what}: {msg}");
                assert_eq!(msg.lines().count(), 1);
            }
            (Ok(_), Some(_)) => panic!("{what}: accepted"),
            (Err(e), _) => panic!("{what}: {e}"),
        }
    }
}

fn sample(pid: i32) -> (Vec<osprey_pprof::ProfileData>, osprey_python::Summary) {
    let opts = Options {
        hz: 100,
        period: Duration::from_secs(60),
        duration: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let mut out = Vec::new();
    let s = attach_with_sink(pid, &opts, &stop, &mut |d| {
        out.push(d.clone());
        Ok(None)
    })
    .unwrap();
    (out, s)
}
