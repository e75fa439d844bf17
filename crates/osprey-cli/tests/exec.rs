//! End to end: `osprey exec` on real programs, profiles read back by
//! osprey's reader and by the reference `go tool pprof`.
//!
//! Needs the workspace built (`cargo build --workspace`: the agent library
//! and the demo sit next to the `osprey` binary); `cargo xtask test` does it.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::compile_c;
use osprey_testkit::paths::{demo, osprey, workspace_root};
use osprey_testkit::profile::{profile_files, read_profiles};
use osprey_testkit::tempdir;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(osprey()).args(args).output().expect("run osprey")
}

/// Cumulative share of each name among `names`, by `osprey_pprof::summarize`.
fn shares(profiles: &[Profile], names: &[&str]) -> Vec<f64> {
    let s = osprey_pprof::summarize(profiles, Some("cpu")).unwrap();
    let cum: Vec<f64> =
        names.iter().map(|n| s.functions.iter().filter(|f| f.name.ends_with(n)).map(|f| f.cum as f64).sum()).collect();
    let total: f64 = cum.iter().sum();
    assert!(total > 0.0, "none of {names:?} in the profile");
    cum.iter().map(|c| c / total * 100.0).collect()
}

fn label_keys(p: &Profile) -> Vec<String> {
    let mut keys: Vec<String> =
        p.sample.iter().flat_map(|s| s.label.iter().map(|l| p.string_table[l.key as usize].clone())).collect();
    keys.sort();
    keys.dedup();
    keys
}

#[test]
fn cpu_split_50_30_20_read_by_osprey_and_go_pprof() {
    let out = tempdir("split");
    let o = run(&[
        "exec",
        "--hz",
        "1000",
        "--out",
        out.to_str().unwrap(),
        "--",
        demo().to_str().unwrap(),
        "--threads",
        "2",
        "--seconds",
        "3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files = profile_files(&out);
    assert_eq!(files.len(), 1, "one profile at exit: {files:?}");
    let ps = read_profiles(&out);
    let p = &ps[0];
    let types: Vec<(String, String)> = p
        .sample_type
        .iter()
        .map(|t| (p.string_table[t.r#type as usize].clone(), p.string_table[t.unit as usize].clone()))
        .collect();
    assert_eq!(types, [("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())]);
    assert!(p.time_nanos > 0 && p.duration_nanos > 0 && p.period == 1_000_000);
    assert!(!p.mapping.is_empty() && !p.location.is_empty() && !p.function.is_empty());
    let keys = label_keys(p);
    assert!(keys.contains(&"thread id".to_string()) && keys.contains(&"thread name".to_string()), "{keys:?}");
    let s = shares(&ps, &["::work_a", "::work_b", "::work_c"]);
    eprintln!("osprey reader: {s:.1?}");
    for (got, want) in s.iter().zip([50.0, 30.0, 20.0]) {
        assert!((got - want).abs() <= 3.0, "shares {s:?} not within 3 points of 50/30/20");
    }

    // The reference reader.
    let go = Command::new("go")
        .args(["tool", "pprof", "-top", "-cum", "-nodecount=200", "-symbolize=none"])
        .arg(&files[0])
        .env("PPROF_TMPDIR", &out)
        .env("HOME", &out)
        .output()
        .expect("`go` not found: install golang-go (CI does)");
    assert!(go.status.success(), "go tool pprof: {}", String::from_utf8_lossy(&go.stderr));
    let text = String::from_utf8_lossy(&go.stdout);
    let cum_of = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.trim_end().ends_with(name))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                parse_duration(f[3])
            })
            .sum()
    };
    let go_cum: Vec<f64> = ["::work_a", "::work_b", "::work_c"].iter().map(|n| cum_of(n)).collect();
    let total: f64 = go_cum.iter().sum();
    assert!(total > 0.0, "go tool pprof shows none of work_a/b/c:\n{text}");
    for (got, want) in go_cum.iter().map(|c| c / total * 100.0).zip([50.0, 30.0, 20.0]) {
        assert!((got - want).abs() <= 3.0, "go tool pprof shares {go_cum:?} not within 3 points:\n{text}");
    }
}

/// "1.23s", "450ms", "12us", "0" as seconds.
fn parse_duration(s: &str) -> f64 {
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1e-9)
    };
    num.parse::<f64>().unwrap_or(0.0) * mul
}

#[test]
fn bad_input_fails_before_anything_runs() {
    let out = tempdir("bad");
    let o = run(&["exec", "--out", out.to_str().unwrap(), "--", "no-such-command-osprey"]);
    assert_eq!(o.status.code(), Some(127));
    assert_eq!(String::from_utf8_lossy(&o.stderr).trim(), "osprey: no-such-command-osprey: command not found");
    let o = run(&["exec", "--out", "/proc/osprey-cannot-write", "--", "true"]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("osprey: ") && err.contains("--out") && err.lines().count() == 1, "{err}");
    // Each range error names the flag that caused it, in one line.
    for (flag, value) in [("--hz", "0"), ("--hz", "20000"), ("--period", "0.01"), ("--period", "-1e9")] {
        let o = run(&["exec", &format!("{flag}={value}"), "--out", out.to_str().unwrap(), "--", "true"]);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.starts_with(&format!("osprey: {flag}: ")) && err.lines().count() == 1, "{err}");
    }
    // A static binary cannot take the preloaded agent: said up front.
    let dir = tempdir("static");
    let bin = dir.join("static_true");
    std::fs::write(dir.join("t.c"), "int main(void) { return 0; }").unwrap();
    let st = Command::new("cc").args(["-static", "-o"]).arg(&bin).arg(dir.join("t.c")).status().unwrap();
    assert!(st.success(), "cc -static failed (needs libc6-dev's libc.a)");
    let o = run(&["exec", "--out", out.to_str().unwrap(), "--", bin.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("statically linked"));
    assert!(profile_files(&out).is_empty());
}

#[test]
fn status_streams_and_signals_pass_through() {
    let out = tempdir("pass");
    let o = Command::new(osprey())
        .args([
            "exec",
            "--out",
            out.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "read x; echo \"out:$x\"; echo err >&2; exit 7",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b"hello\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out:hello\n");
    // The program's stderr first, untouched; then osprey's own lines.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.starts_with("err\n"), "{stderr:?}");
    assert!(stderr.lines().skip(1).all(|l| l.starts_with("osprey: ")), "{stderr:?}");
    let o = run(&["exec", "-q", "--out", out.to_str().unwrap(), "--", "sh", "-c", "echo err >&2"]);
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err\n", "--quiet: the program's stderr only");
    use std::os::unix::process::ExitStatusExt;
    let o = run(&["exec", "--out", out.to_str().unwrap(), "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "killed by its own SIGTERM, like without osprey");
    // Programs the target runs are not profiled unless asked.
    let o = run(&["exec", "--out", out.to_str().unwrap(), "--", "sh", "-c", "env | grep -c LD_PRELOAD || true"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    // With --children the kernel samples the tree: nothing is preloaded;
    // the agent in each process, when asked for, passes itself on.
    let children = ["exec", "--children", "--out", out.to_str().unwrap(), "--", "sh", "-c"];
    let preloads = [&children[..], &["env | grep -c osprey_preload || true"]].concat();
    let o = run(&preloads);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    let o = Command::new(osprey()).env("OSPREY_TREE_SAMPLER", "agent").args(&preloads).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1");
}

#[test]
fn program_with_its_own_sigprof_keeps_working() {
    let dir = tempdir("sigprof");
    let bin = dir.join("own_sigprof");
    compile_c(&workspace_root().join("crates/osprey-cli/tests/c/own_sigprof.c"), &bin, &[]);
    let out = dir.join("profiles");
    let o = run(&["exec", "--hz", "1000", "--out", out.to_str().unwrap(), "--", bin.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout} {}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.starts_with("ticks "));
    // Its pthread_create threads registered at start: nothing lost as unregistered.
    let ps = read_profiles(&out);
    let s = osprey_pprof::summarize(&ps, Some("samples")).unwrap();
    assert!(s.functions.iter().any(|f| f.name == "burn_in_thread"), "C function not symbolized");
    assert!(!s.functions.iter().any(|f| f.name.contains("not registered")), "samples dropped");
}

#[test]
fn c_program_span_ids_reach_the_profile() {
    let dir = tempdir("ctx");
    let bin = dir.join("context_dlsym");
    compile_c(&workspace_root().join("crates/osprey/tests/c/context_dlsym.c"), &bin, &["-ldl"]);
    let out = dir.join("profiles");
    let o = run(&["exec", "--hz", "1000", "--out", out.to_str().unwrap(), "--", bin.to_str().unwrap(), "2", "10"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("osprey: present"));
    let ps = read_profiles(&out);
    let (mut labelled, mut spans) = (0, std::collections::BTreeSet::new());
    for p in &ps {
        for s in &p.sample {
            let get = |k: &str| s.label.iter().find(|l| p.string_table[l.key as usize] == k).map(|l| l.num);
            if let (Some(span), Some(root)) = (get("span id"), get("local root span id")) {
                assert_eq!(root, 42, "local root span id");
                assert!((1000..1010).contains(&span), "span id {span}");
                spans.insert(span);
                labelled += s.value[0];
            }
        }
    }
    assert!(labelled > 100 && spans.len() >= 5, "{labelled} labelled samples over spans {spans:?}");
}

#[test]
fn lines_flag_adds_files_and_lines() {
    let out = tempdir("lines");
    let o = run(&[
        "exec",
        "--lines",
        "--hz",
        "500",
        "--out",
        out.to_str().unwrap(),
        "--",
        demo().to_str().unwrap(),
        "--threads",
        "1",
        "--seconds",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = &read_profiles(&out)[0];
    let with_line = p
        .function
        .iter()
        .filter(|f| p.string_table[f.name as usize].ends_with("::work_a"))
        .any(|f| p.string_table[f.filename as usize].ends_with("osprey-demo/src/lib.rs"));
    assert!(with_line, "work_a has no source file with --lines");
    assert!(p.location.iter().any(|l| l.line.iter().any(|x| x.line > 0)));
}
