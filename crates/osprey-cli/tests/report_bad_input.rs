//! Bad input to `osprey report` and `osprey diff`: an empty file, a
//! truncated one, a file that is not pprof, profiles of different sample
//! types. Each is one line naming the file and why, exit status 2, and no
//! output file written.

use osprey_pprof::{write_profile, ProfileData};
use osprey_testkit::cli::osprey_output;
use osprey_testkit::profile::folded;
use osprey_testkit::tempdir;
use std::path::{Path, PathBuf};

/// `osprey ARGS` must fail with status 2 and one line on stderr naming
/// `file` and containing `why`; nothing on stdout, no file in `outputs`.
fn refused(args: &[&Path], file: &Path, why: &str, outputs: &[&Path]) {
    let o = osprey_output(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(&*file.to_string_lossy()) && err.contains(why), "{args:?}: want {file:?} and {why:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?} printed {:?}", String::from_utf8_lossy(&o.stdout));
    for out in outputs {
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
}

fn good(dir: &Path) -> PathBuf {
    write_profile(dir, &folded(&[("main;f", 3), ("main;g", 1)])).unwrap()
}

#[test]
fn empty_truncated_and_foreign_files_are_refused_with_their_name() {
    let dir = tempdir("bad-input");
    let ok = good(&dir);
    let bytes = std::fs::read(&ok).unwrap();
    let raw = osprey_testkit::profile::gunzip(&bytes);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.pb.gz", vec![], "empty file"),
        ("truncated.pb.gz", bytes[..bytes.len() / 2].to_vec(), "truncated or corrupt gzip"),
        ("truncated.pb", raw[..raw.len() * 2 / 3].to_vec(), "not a pprof profile"),
        ("notes.txt", b"these are my notes, not a profile\n".to_vec(), "not a pprof profile"),
    ];
    let (out, svg, html) = (dir.join("out"), dir.join("f.svg"), dir.join("t.html"));
    for (name, content, why) in cases {
        let bad = dir.join("bad").join(name);
        std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
        std::fs::write(&bad, content).unwrap();
        for format in ["top", "collapsed", "speedscope", "pprof"] {
            let args: [&Path; 11] = [
                "report".as_ref(),
                &ok,
                &bad,
                "--format".as_ref(),
                format.as_ref(),
                "-o".as_ref(),
                &out,
                "--flamegraph".as_ref(),
                &svg,
                "--timeline".as_ref(),
                &html,
            ];
            refused(&args, &bad, why, &[&out, &svg, &html]);
        }
        refused(&["diff".as_ref(), &ok, &bad, "--flamegraph".as_ref(), &svg], &bad, why, &[&svg]);
        refused(&["diff".as_ref(), &bad, &ok], &bad, why, &[]);
        std::fs::remove_file(&bad).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profiles_of_different_sample_types_do_not_compare() {
    let dir = tempdir("bad-types");
    let cpu = good(&dir);
    let heap = ProfileData {
        sample_types: vec![("alloc-space".into(), "bytes".into())],
        period: ("alloc-space".into(), "bytes".into(), 524288),
        ..folded(&[("main;malloc", 1)])
    };
    let mut heap = heap;
    for s in &mut heap.samples {
        s.values.truncate(1);
    }
    let other = dir.join("other");
    let heap = write_profile(&other, &heap).unwrap();
    let svg = dir.join("d.svg");
    refused(&["diff".as_ref(), &cpu, &heap, "--flamegraph".as_ref(), &svg], &heap, "lack cpu/nanoseconds", &[&svg]);
    refused(&["diff".as_ref(), &heap, &cpu], &cpu, "lack alloc-space/bytes", &[]);
    refused(&["report".as_ref(), &cpu, &heap], &heap, "lack cpu/nanoseconds", &[]);
    refused(
        &["report".as_ref(), &cpu, "--sample-index".as_ref(), "wall".as_ref()],
        &cpu,
        "no sample type \"wall\"",
        &[],
    );
    refused(&["report".as_ref(), &cpu, "--span".as_ref(), "zz".as_ref()], Path::new("--span zz"), "not an id", &[]);
    std::fs::remove_dir_all(&dir).unwrap();
}
