//! The end-of-run lines of `osprey exec` tell the truth: what each
//! destination received, never "no samples" when samples were taken, and
//! osprey's own threads are never reported as the program's.

use osprey_testkit::backends::{ok, Receiver};
use osprey_testkit::{osprey, tempdir};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A dash loop of about half a second of CPU; dash ends with `_exit`, the
/// path on which the last profile used to miss the backends.
fn busy_script(dir: &Path) -> PathBuf {
    let s = dir.join("busy.sh");
    std::fs::write(&s, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done\n").unwrap();
    s
}

/// Runs `osprey exec ARGS -- sh SCRIPT` in `dir`; returns its stderr.
fn exec(dir: &Path, args: &[&str]) -> String {
    let script = busy_script(dir);
    let out = std::process::Command::new(osprey())
        .current_dir(dir)
        .args(["exec", "--hz", "200"])
        .args(args)
        .arg("--")
        .arg("/bin/sh")
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_no_false_alarm(err: &str) {
    assert!(!err.contains("no samples"), "samples were taken:\n{err}");
    assert!(!err.contains("osprey-upload"), "osprey's upload thread reported as the program's:\n{err}");
}

#[test]
fn backend_up_counts_what_it_accepted() {
    let dir = tempdir("msg-up");
    let r = Receiver::start(|_, _| ok());
    let err = exec(&dir, &["--otlp", &r.url]);
    assert_no_false_alarm(&err);
    let line = err.lines().find(|l| l.starts_with("osprey: otlp: ")).unwrap_or_else(|| panic!("no otlp line:\n{err}"));
    assert!(line.contains("1 profile delivered to"), "{err}");
    assert!(!line.contains("not delivered"), "{err}");
    assert_eq!(r.wait_for(1, Duration::from_secs(5)).len(), 1, "{err}");
    assert!(!dir.join("profiles").exists(), "a backend alone writes no files");
}

#[test]
fn backend_down_says_what_was_lost_and_why() {
    let dir = tempdir("msg-down");
    // A port nothing listens on: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let err = exec(&dir, &["--otlp", &url, "--exit-wait", "1"]);
    assert_no_false_alarm(&err);
    let line = err.lines().find(|l| l.starts_with("osprey: otlp: ")).unwrap_or_else(|| panic!("no otlp line:\n{err}"));
    assert!(line.contains("0 profiles delivered"), "{err}");
    assert!(line.contains("1 not delivered by exit"), "{err}");
    assert!(line.contains("last error"), "{err}");
}

#[test]
fn files_alone_are_named() {
    let dir = tempdir("msg-files");
    let err = exec(&dir, &["--out", "p"]);
    assert_no_false_alarm(&err);
    let line = err.lines().last().unwrap_or_default();
    assert!(line.starts_with("osprey: 1 profile written: "), "{err}");
    assert!(!err.contains("delivered"), "{err}");
}

/// With `--children` the tree's processes are merged into one file per
/// period while each process still goes to the backend on its own: the
/// lines count the merged files written and the profiles delivered.
#[test]
fn children_count_merged_files_and_delivered_profiles() {
    let dir = tempdir("msg-tree");
    let r = Receiver::start(|_, _| ok());
    let script = busy_script(&dir);
    let out = std::process::Command::new(osprey())
        .current_dir(&dir)
        .args(["exec", "--hz", "200", "--children", "--out", "p", "--otlp", &r.url, "--"])
        .arg("/bin/sh")
        .arg("-c")
        .arg(format!("/bin/sh {}; /bin/sh {}", script.display(), script.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_no_false_alarm(&err);
    let files = err.lines().find(|l| l.starts_with("osprey: 1 profile written: p/"));
    assert!(files.is_some(), "one merged file for the tree:\n{err}");
    assert_eq!(std::fs::read_dir(dir.join("p")).unwrap().count(), 1, "{err}");
    // The root shell and its two children, each its own profile.
    let line = err.lines().find(|l| l.starts_with("osprey: otlp: ")).unwrap_or_else(|| panic!("no otlp line:\n{err}"));
    assert!(line.contains("3 profiles delivered to"), "{err}");
    let requests = r.wait_for(3, Duration::from_secs(5));
    assert_eq!(requests.len(), 3, "{err}");
    // Each as its own process: three runtime ids (the resource's
    // `osprey.runtime_id`), whatever samples the tree.
    let ids: std::collections::BTreeSet<String> = requests.iter().filter_map(|q| runtime_id(&q.body)).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
}

/// The value of the `osprey.runtime_id` attribute in a gzipped OTLP
/// request: the first UUID-shaped text after the key.
fn runtime_id(gzipped: &[u8]) -> Option<String> {
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gzipped), &mut body).ok()?;
    let key = b"osprey.runtime_id";
    let at = body.windows(key.len()).position(|w| w == key)? + key.len();
    let uuid = |w: &[u8]| {
        w.len() == 36
            && w.iter()
                .enumerate()
                .all(|(i, &c)| if [8, 13, 18, 23].contains(&i) { c == b'-' } else { c.is_ascii_hexdigit() })
    };
    let rest = body.get(at..at + 64)?;
    rest.windows(36).find(|w| uuid(w)).map(|w| String::from_utf8_lossy(w).into_owned())
}
