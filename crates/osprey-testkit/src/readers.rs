//! The real tools that read osprey's report outputs: `go tool pprof`,
//! speedscope's JSON schema (npm package `speedscope`, checked with
//! Python's `jsonschema`), and a headless Chromium for HTML pages. CI
//! installs them all (.ci/run).

use crate::run::output_within;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `go tool pprof ARGS FILE`'s standard output; fails the test if pprof
/// fails. `PPROF_TMPDIR` points into `dir`, so pprof writes nothing
/// elsewhere; `HOME` stays, as go keeps its built tools in `$HOME/.cache`
/// (a new HOME rebuilds pprof: minutes).
pub fn go_pprof(dir: &Path, args: &[&str], file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("PPROF_TMPDIR", dir)
        .output()
        .expect("`go` not found: install golang-go (CI does)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "go tool pprof {args:?}: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    text
}

/// speedscope's own file-format schema: `OSPREY_SPEEDSCOPE_SCHEMA`, else
/// the npm package installed under `target/speedscope` (.ci/run does).
pub fn speedscope_schema() -> PathBuf {
    let p = std::env::var_os("OSPREY_SPEEDSCOPE_SCHEMA").map(PathBuf::from).unwrap_or_else(|| {
        crate::paths::target_dir().join("speedscope/node_modules/speedscope/dist/release/file-format-schema.json")
    });
    assert!(p.is_file(), "{} missing: npm install --prefix target/speedscope speedscope (CI does)", p.display());
    p
}

/// Checks the JSON file `doc` against the JSON schema file `schema` with
/// Python's `jsonschema`: Err with the validator's message if invalid.
pub fn validate_json(schema: &Path, doc: &Path) -> Result<(), String> {
    const CHECK: &str = "import json, sys, jsonschema\n\
        jsonschema.validate(json.load(open(sys.argv[2])), json.load(open(sys.argv[1])))";
    let out = Command::new("python3").args(["-c", CHECK]).arg(schema).arg(doc).output().expect("python3 not found");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("No module named 'jsonschema'"), "pip install jsonschema (CI does)");
    if out.status.success() {
        Ok(())
    } else {
        Err(err.lines().rev().take(12).collect::<Vec<_>>().join("\n"))
    }
}

/// The Chromium binary, if one is installed (`chromium` on Debian).
fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"].into_iter().find(|c| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

/// The DOM of the page `html` after `script` ran in it (appended at the
/// end of its body), as headless Chromium dumps it; None, with one line
/// on stderr, when Chromium cannot run here.
pub fn chromium_dom(html: &Path, script: &str) -> Option<String> {
    let Some(browser) = chromium() else {
        eprintln!("SKIPPED: no chromium (apt-get install chromium)");
        return None;
    };
    let page = std::fs::read_to_string(html).unwrap();
    let at = page.rfind("</body>").expect("a page with a body");
    let driven = html.with_extension("driven.html");
    std::fs::write(&driven, format!("{}<script>{script}</script>{}", &page[..at], &page[at..])).unwrap();
    let profile = html.with_extension("chromium");
    let child = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", driven.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = output_within(child, Duration::from_secs(120), "chromium --dump-dom");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !dom.contains("<body") {
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("SKIPPED: chromium cannot run here: {}", err.lines().last().unwrap_or("no output"));
        return None;
    }
    Some(dom)
}

/// py-spy (`pip install py-spy==0.4.3`; CI does) recording `pid` in its
/// default mode (the process stopped for each read) for `secs` at `hz`:
/// each leaf function's share (%) of its non-idle samples, by its bare name
/// (`Class.method` as `method`), and the samples.
///
/// py-spy runs on the CPU the process is on, the process held there
/// meanwhile: stopped from another CPU, a thread's stops were not spread
/// as its CPU time is (a microsecond-call loop's own share 2-3 points
/// above an in-process SIGPROF sampler's; on the same CPU within 1).
pub fn py_spy_flat(pid: i32, secs: u32, hz: u32) -> (std::collections::HashMap<String, f64>, u64) {
    let dir = crate::tmp::tempdir("py-spy");
    let raw = dir.join("raw.txt");
    let held = Pinned::to_current_cpu(pid);
    let mut cmd = Command::new("py-spy");
    cmd.args(["record", "--pid", &pid.to_string(), "--duration", &secs.to_string(), "--rate", &hz.to_string()])
        .args(["--format", "raw", "-o"])
        .arg(&raw)
        .stdout(Stdio::null());
    if let Some(cpu) = held.as_ref().map(|p| p.cpu) {
        use std::os::unix::process::CommandExt;
        // SAFETY: sched_setaffinity is async-signal-safe; the set is a local.
        unsafe { cmd.pre_exec(move || set_affinity(0, &one_cpu(cpu)).map_err(std::io::Error::from_raw_os_error)) };
    }
    let out = cmd.output().expect("`py-spy` not found: pip install py-spy==0.4.3 (CI does)");
    assert!(out.status.success(), "py-spy record: {}", String::from_utf8_lossy(&out.stderr));
    let mut counts = std::collections::HashMap::<String, u64>::new();
    for line in std::fs::read_to_string(&raw).unwrap_or_default().lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else { continue };
        let leaf = stack.rsplit(';').next().unwrap_or("");
        let name = bare_name(leaf.split(" (").next().unwrap_or(""));
        *counts.entry(name.to_string()).or_default() += n.parse::<u64>().unwrap_or(0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let total = counts.values().sum::<u64>();
    let shares = counts.into_iter().map(|(k, v)| (k, 100.0 * v as f64 / total.max(1) as f64)).collect();
    (shares, total)
}

/// A process's threads held on one CPU, their masks put back on drop.
struct Pinned {
    cpu: usize,
    masks: Vec<(i32, libc::cpu_set_t)>,
}

impl Pinned {
    /// `pid`'s threads held on the CPU its main thread last ran on; None
    /// with a single CPU or when the process cannot be read.
    fn to_current_cpu(pid: i32) -> Option<Pinned> {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return None;
        }
        let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        let cpu = osprey_procfs::stat::Stat::parse(&stat)?.processor()? as usize;
        let mut masks = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            // SAFETY: a zeroed cpu_set_t is an empty set.
            let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `old` is a whole cpu_set_t of the size given.
            let got = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut old) };
            if got == 0 && set_affinity(tid, &one_cpu(cpu)).is_ok() {
                masks.push((tid, old));
            }
        }
        Some(Pinned { cpu, masks })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for (tid, old) in &self.masks {
            let _ = set_affinity(*tid, old);
        }
    }
}

fn one_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET indexes the set checked (a CPU beyond it panics).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// sched_setaffinity(tid, set); Err(errno).
fn set_affinity(tid: i32, set: &libc::cpu_set_t) -> Result<(), i32> {
    // SAFETY: `set` is a whole cpu_set_t of the size given.
    match unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)),
    }
}

/// A Python function's name as py-spy shows it: `Class.method` as `method`;
/// `<module>`, `<genexpr>` and the like whole.
pub fn bare_name(qualified: &str) -> &str {
    if qualified.starts_with('<') {
        qualified
    } else {
        qualified.rsplit('.').next().unwrap_or(qualified)
    }
}
