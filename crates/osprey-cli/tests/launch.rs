//! End to end: programs started the way users start them. A pyenv shim, a
//! shebang script, a venv console script and `sh -c 'exec ..'` all end in the
//! same process running CPython, which gets Python frames without
//! `--children`; `--children` profiles every descendant (multiprocessing, a
//! prefork server, `make -j2`), each sample labelled with its pid and
//! process; the end-of-run messages say what happened.
//!
//! Needs the workspace built (`cargo build --workspace`) and pyenv (its
//! `python3` shim, 3.12); `cargo xtask test` and `.ci/run` provide them.

use osprey_pprof::pprof::Profile;
use osprey_testkit::profile::{function_names, label, profile_files};
use osprey_testkit::python::interpreter;
use osprey_testkit::run::serial;
use osprey_testkit::{osprey, tempdir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn py(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py").join(name)
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
}

/// pyenv's shims directory (a `python3` there is a bash script).
fn shims() -> PathBuf {
    let d = home().join(".pyenv/shims");
    let shim = std::fs::read(d.join("python3")).expect("pyenv's python3 shim (install pyenv)");
    assert!(shim.starts_with(b"#!"), "the python3 shim is a script");
    d
}

/// PATH with pyenv's shims first, as a pyenv user has it.
fn shim_path() -> String {
    format!("{}:{}", shims().display(), std::env::var("PATH").unwrap_or_default())
}

/// `osprey exec [flags] --out OUT -- cmd...` with the shims on PATH, in `cwd`.
fn exec(cwd: &Path, out: &Path, flags: &[&str], cmd: &[&str]) -> Output {
    Command::new(osprey())
        .current_dir(cwd)
        .env("PATH", shim_path())
        .arg("exec")
        .args(flags)
        .arg("--out")
        .arg(out)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run osprey")
}

fn profiles(dir: &Path) -> Vec<(PathBuf, Profile)> {
    if std::fs::read_dir(dir).is_err() {
        return vec![];
    }
    profile_files(dir).into_iter().map(|p| (p.clone(), osprey_pprof::read_profile(&p).unwrap())).collect()
}

/// CPU (ns) per (pid, function on the stack), and per pid in total.
struct Cpu {
    by_fn: HashMap<(i64, String), i64>,
    by_pid: HashMap<i64, i64>,
    process: HashMap<i64, String>,
}

fn cpu(profiles: &[(PathBuf, Profile)]) -> Cpu {
    let mut c = Cpu { by_fn: HashMap::new(), by_pid: HashMap::new(), process: HashMap::new() };
    for (_, p) in profiles {
        let cpu_idx = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").expect("cpu sample type");
        for s in &p.sample {
            let (_, pid) = label(p, s, "pid").expect("every sample has a pid label");
            let (name, _) = label(p, s, "process").expect("every sample has a process label");
            assert!(!name.is_empty());
            c.process.insert(pid, name.to_string());
            let v = s.value[cpu_idx];
            *c.by_pid.entry(pid).or_default() += v;
            let mut seen = std::collections::HashSet::new();
            for n in function_names(p, s) {
                if seen.insert(n) {
                    *c.by_fn.entry((pid, n.to_string())).or_default() += v;
                }
            }
        }
    }
    c
}

impl Cpu {
    fn of(&self, f: &str) -> i64 {
        self.by_fn.iter().filter(|((_, n), _)| n == f).map(|(_, v)| v).sum()
    }
}

/// The app's pid, from its first line.
fn printed_pid(o: &Output) -> i64 {
    let stdout = String::from_utf8_lossy(&o.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{stdout:?}"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The app ran as CPython in the command's own process: exit status and
/// stdout are its own, its `work` has most of the CPU of its pid, and the
/// last stderr line names exactly the files written.
fn assert_python_app(o: &Output, out: &Path) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(7), "exit status passes through; stderr: {err}");
    let pid = printed_pid(o);
    let ps = profiles(out);
    assert!(!ps.is_empty(), "no profile; stderr: {err}");
    let c = cpu(&ps);
    // The app's own pid is profiled as Python. A launcher's subshells forked
    // without exec (a pyenv shim's `$(...)`) keep the native agent, as any
    // forked child does, and may leave small profiles of their own.
    assert!(c.by_pid.contains_key(&pid), "no profile of the app's own pid {pid}: {:?}", c.by_pid.keys());
    let work = c.of("work") as f64 / c.by_pid[&pid] as f64;
    // The rest is the interpreter's start (imports, site): 79-95% measured.
    assert!(work > 0.7, "work has {:.0}% of the CPU: not sampled as Python? {err}", work * 100.0);
    let last = err.lines().last().unwrap_or_default();
    for (f, _) in &ps {
        assert!(last.contains(&f.display().to_string()), "last line {last:?} lacks {}", f.display());
    }
    assert!(last.starts_with("osprey: "), "{last:?}");
}

#[test]
fn pyenv_shim() {
    let _s = serial();
    let out = tempdir("shim");
    let o = exec(Path::new("."), &out, &[], &["python3", py("app.py").to_str().unwrap()]);
    assert_python_app(&o, &out);
}

#[test]
fn shebang_script() {
    let _s = serial();
    let dir = tempdir("shebang");
    let script = dir.join("app");
    std::fs::write(&script, format!("#!/usr/bin/env python3\nexec(open({:?}).read())\n", py("app.py"))).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.join("profiles");
    let o = exec(&dir, &out, &[], &["./app"]);
    assert_python_app(&o, &out);
}

#[test]
fn venv_console_script() {
    let _s = serial();
    let dir = tempdir("venv");
    let venv = dir.join("venv");
    let st = Command::new(interpreter("3.12").expect("pyenv python 3.12"))
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(st.success(), "python -m venv");
    // A tiny package and its console script, as pip writes them.
    let site = std::fs::read_dir(venv.join("lib")).unwrap().flatten().next().unwrap().path().join("site-packages");
    std::fs::create_dir_all(site.join("apptool")).unwrap();
    std::fs::write(site.join("apptool/__init__.py"), "").unwrap();
    std::fs::copy(py("app.py"), site.join("apptool/cli.py")).unwrap();
    let tool = venv.join("bin/apptool");
    std::fs::write(
        &tool,
        format!(
            "#!{}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom apptool.cli import main\n\
             if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n",
            venv.join("bin/python").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.join("profiles");
    let o = exec(&dir, &out, &[], &[tool.to_str().unwrap()]);
    assert_python_app(&o, &out);
}

#[test]
fn sh_c_exec_and_sh_c_child() {
    let _s = serial();
    let app = py("app.py");
    let out = tempdir("shc-exec");
    let o = exec(Path::new("."), &out, &[], &["sh", "-c", &format!("exec python3 {}", app.display())]);
    assert_python_app(&o, &out);

    // Not exec'd: a child of sh. Without --children it is not profiled, and
    // osprey says that the children did the work.
    let out = tempdir("shc-child");
    let cmd = format!("python3 {}; exit $?", app.display());
    let o = exec(Path::new("."), &out, &[], &["sh", "-c", &cmd]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(err.contains("its children did the work") && err.contains("--children"), "{err}");
    assert!(cpu(&profiles(&out)).of("work") == 0, "a child was profiled without --children");

    // With --children: the Python child, with Python frames.
    let out = tempdir("shc-children");
    let o = exec(Path::new("."), &out, &["--children"], &["sh", "-c", &cmd]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(7), "{err}");
    let c = cpu(&profiles(&out));
    let pid = printed_pid(&o);
    let share = c.by_fn.get(&(pid, "work".to_string())).copied().unwrap_or(0) as f64 / c.by_pid[&pid] as f64;
    assert!(share > 0.8, "work {share:.2} of the child's CPU; {err}");
    assert!(c.process[&pid].starts_with("python"), "{:?}", c.process);
}

/// A command that execs CPython late, once `osprey exec`'s scan has backed
/// off (to 1 s): the interpreter's agent wakes it, so the sampler attaches
/// at once and `work`'s 0.6 s of CPU is all in the profile (a scan on its
/// own schedule, at 0.64 s and 1.64 s, would attach 0.9 s late here).
#[test]
fn late_exec_into_python_is_sampled_from_its_start() {
    let _s = serial();
    let out = tempdir("late-exec");
    let cmd = format!("sleep 0.7; APP_SECS=0.6 exec python3 {}", py("app.py").display());
    let o = exec(Path::new("."), &out, &[], &["sh", "-c", &cmd]);
    assert_python_app(&o, &out);
    let work = cpu(&profiles(&out)).of("work");
    assert!(work >= 450_000_000, "work: {} ms of its 600 in the profile; {}", work / 1_000_000, stderr(&o));
}

/// Each worker's function gets its share of the workers' CPU within 5
/// points, in every start method.
#[test]
fn multiprocessing_pool() {
    let _s = serial();
    for method in ["fork", "forkserver", "spawn"] {
        let out = tempdir(&format!("pool-{method}"));
        let o = exec(Path::new("."), &out, &["--children"], &["python3", py("pool.py").to_str().unwrap(), method]);
        let err = stderr(&o);
        assert!(o.status.success(), "{method}: {err}");
        let c = cpu(&profiles(&out));
        let f: Vec<f64> = ["f0", "f1", "f2", "f3"].iter().map(|n| c.of(n) as f64).collect();
        let total: f64 = f.iter().sum();
        let shares: Vec<f64> = f.iter().map(|v| 100.0 * v / total).collect();
        let pids = c
            .by_fn
            .keys()
            .filter(|(_, n)| n.starts_with('f') && n.len() == 2)
            .map(|(p, _)| *p)
            .collect::<std::collections::HashSet<_>>();
        eprintln!("{method}: shares {shares:.1?} over {} worker pids", pids.len());
        for (s, want) in shares.iter().zip([40.0, 30.0, 20.0, 10.0]) {
            assert!((s - want).abs() <= 5.0, "{method}: shares {shares:.1?}, want 40/30/20/10; {err}");
        }
        assert!(pids.len() >= 2, "{method}: work seen in {} processes", pids.len());
        // `report` merges the processes' files and filters them by pid.
        let (pid, _) = c.by_fn.keys().find(|(_, n)| n == "f0").expect("f0 seen");
        let rep = Command::new(osprey())
            .arg("report")
            .arg(&out)
            .args(["--top", "1000", "--pid", &pid.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&rep.stdout);
        assert!(rep.status.success() && text.starts_with("Type: cpu"), "{text}");
        assert!(text.contains(" f0\n") && !text.contains(" f3\n"), "--pid {pid}: {text}");
        let rep =
            Command::new(osprey()).arg("report").arg(&out).args(["--process", "no-such-program"]).output().unwrap();
        assert!(!rep.status.success(), "no samples of that process: an error");
    }
}

/// CPython wakes the watcher at its start, and each process it forks (no
/// exec, no agent start in it) wakes it too: found at once, not at a scan.
#[test]
fn cpython_and_its_forks_wake_the_watcher() {
    let Some(python) = interpreter("3.12") else { return };
    let o = Command::new(&python)
        .arg(py("watcher.py"))
        .args([python.to_str().unwrap(), py("fork_worker.py").to_str().unwrap(), "0.05"])
        .env("WATCHER_PRELOAD", osprey_testkit::paths::preload_lib())
        .env_remove("OSPREY_ROOT_PID")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let pids: Vec<u32> = out.split_whitespace().map(|p| p.parse().unwrap()).collect();
    let (child, senders) = pids.split_first().expect("the child's pid");
    assert_eq!(senders.len(), 2, "the interpreter and its fork: {senders:?}");
    assert_eq!(senders[0], *child, "the interpreter first: {senders:?}");
    assert_ne!(senders[1], *child, "then its fork: {senders:?}");
}

#[test]
fn prefork_server() {
    let _s = serial();
    let out = tempdir("prefork");
    let o = exec(Path::new("."), &out, &["--children"], &["python3", py("prefork.py").to_str().unwrap()]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("reaped"), "the master reaps its own workers: {stdout}");
    let c = cpu(&profiles(&out));
    let workers: Vec<i64> =
        c.by_fn.iter().filter(|((_, n), v)| n == "handle" && **v > 0).map(|((p, _), _)| *p).collect();
    assert_eq!(workers.len(), 2, "handle in both forked workers: {workers:?}; {err}");
}

#[test]
fn make_j2() {
    let _s = serial();
    let dir = tempdir("make");
    for f in ["a", "b"] {
        // Enough code that cc1 runs for a few hundred ms.
        let body: String = (0..1500)
            .map(|i| format!("int {f}{i}(int x){{int s=0;for(int i=0;i<x;i++)s+=i*{i}%7;return s;}}\n"))
            .collect();
        std::fs::write(dir.join(format!("{f}.c")), body).unwrap();
    }
    std::fs::write(dir.join("Makefile"), "all: a.o b.o\n%.o: %.c\n\tcc -O2 -c $< -o $@\n").unwrap();
    let out = dir.join("profiles");
    let o = exec(&dir, &out, &[], &["make", "-j2"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("its children did the work") && err.contains("--children"), "{err}");
    // make's own profile (its few milliseconds, charged at exit) and nothing else.
    let own = cpu(&profiles(&out));
    assert!(own.process.values().all(|n| n == "make"), "only make without --children: {:?}", own.process);
    std::fs::remove_dir_all(&out).unwrap();
    for f in ["a.o", "b.o"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let o = exec(&dir, &out, &["--children"], &["make", "-j2"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let c = cpu(&profiles(&out));
    let compilers: Vec<&String> = c.process.values().filter(|n| n.starts_with("cc1")).collect();
    assert!(compilers.len() >= 2, "both compilers profiled: {:?}; {err}", c.process);
    assert!(!err.contains("children did the work"), "{err}");
}

/// A process shorter than one sample period still leaves the CPU it used:
/// charged at exit to its entry point, the root of its stacks.
#[test]
fn true_is_accounted_though_never_sampled() {
    let _s = serial();
    let dir = tempdir("true");
    let out = dir.join("profiles");
    let o = exec(&dir, &out, &[], &["true"]);
    let err = stderr(&o);
    assert!(o.status.success());
    assert!(o.stdout.is_empty());
    assert!(err.contains("1 profile written"), "{err}");
    let c = cpu(&profiles(&out));
    let program: i64 = c.by_fn.iter().filter(|((_, n), _)| n != "[osprey] agent").map(|(_, v)| v).sum();
    assert!(program > 0, "true's own CPU is in its profile: {:?}", c.by_fn);
    let o = exec(&dir, &out, &["--quiet"], &["true"]);
    assert!(o.stderr.is_empty(), "--quiet: {}", stderr(&o));
    let o = exec(&dir, &out, &["--quiet"], &["sh", "-c", "exit 42"]);
    assert_eq!(o.status.code(), Some(42));
}

/// A command killed by a signal makes osprey die of it too; a signal sent
/// to osprey reaches the command.
#[test]
fn signals_pass_through() {
    let _s = serial();
    let dir = tempdir("signals");
    let o = exec(&dir, &dir, &["-q"], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&o.status), Some(libc::SIGTERM));
    let mut child = Command::new(osprey())
        .args(["exec", "-q", "--out"])
        .arg(&dir)
        .args(["--", "sh", "-c", "trap 'exit 9' USR1; while :; do sleep 0.01; done"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    assert_eq!(child.wait().unwrap().code(), Some(9));
}
