//! The program is unchanged by osprey: programs it execs are never killed by
//! an osprey signal, children made every way (raw clone, fork, vfork,
//! daemon) neither hang nor crash and the parent's profile is complete.
//!
//! Needs the workspace built (`cargo build --workspace`); `cargo xtask test` does it.

use osprey_testkit::cc::{compile_c, compile_named};
use osprey_testkit::python::interpreter;
use osprey_testkit::run::output_within;
use osprey_testkit::{osprey, tempdir};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The C programs of these tests.
const C_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c");

/// `osprey` with SIGINT, SIGQUIT, SIGTERM and SIGHUP at their default
/// dispositions, whatever this test inherited (a test run started in the
/// background of a shell without job control ignores SIGINT and SIGQUIT,
/// and the programs would inherit that).
fn osprey_cmd() -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(osprey());
    // SAFETY: only `signal`, async-signal-safe, between fork and exec.
    unsafe {
        c.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    c
}

/// Runs `osprey exec ARGS`, killing it after `limit`; returns status, stdout, stderr and its pid.
fn run_limited(args: &[&str], limit: Duration) -> (ExitStatus, String, String, u32) {
    // The agent in every process, `--children` too: what these tests hold to the host's promises.
    let child = osprey_cmd()
        .env("OSPREY_TREE_SAMPLER", "agent")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run osprey");
    let pid = child.id();
    let out = output_within(child, limit, &format!("osprey exec {args:?} hung"));
    (out.status, String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into(), pid)
}

/// `key N` in `text`.
fn figure(text: &str, key: &str) -> u64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    let i = words.iter().position(|w| *w == key).unwrap_or_else(|| panic!("no `{key}` in {text:?}"));
    words[i + 1].parse().unwrap()
}

fn ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true")
}

/// A process with 200 MB resident and two busy threads re-execs itself
/// (every function of the exec family in turn) while sampled at 10 kHz, with
/// `--children` so each new program is sampled too. Without the exec
/// interposition every exec'd program died of the sampling signal.
#[test]
fn exec_while_sampling_never_kills_the_new_program() {
    let dir = tempdir("exec");
    let prog = compile_named(C_DIR, "reexec", &dir);
    let total = if ci() { "200" } else { "1000" };
    let out = dir.join("profiles");
    let (st, stdout, stderr, _) = run_limited(
        &[
            "exec",
            "--children",
            "--hz",
            "10000",
            "--out",
            out.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            "drive",
            total,
            "10",
            "200",
        ],
        Duration::from_secs(if ci() { 300 } else { 1200 }),
    );
    assert!(st.success(), "{st:?}\n{stderr}");
    let (execs, deaths, failures) = (figure(&stdout, "execs"), figure(&stdout, "deaths"), figure(&stdout, "failures"));
    eprintln!("exec at 10 kHz from a 200 MB parent: {execs} execs, {deaths} deaths");
    assert!(execs >= total.parse().unwrap());
    assert_eq!((deaths, failures), (0, 0), "{stderr}");
}

/// Children forked while the agent works (samples to drain, its collector
/// asking the loader on every pass) and a program thread walks the loaded
/// objects without end, each exiting at once, all end: a lock held at the
/// fork by a thread that does not exist in the child (the loader's, or one
/// of the agent's) is never waited on there. With and without `--children`.
#[test]
fn children_forked_while_the_collector_works_all_exit() {
    let dir = tempdir("fork-exit");
    let prog = compile_c(&Path::new(C_DIR).join("fork_exit.c"), &dir.join("fork_exit"), &["-lpthread"]);
    let n = if ci() { "1500" } else { "3000" };
    for flags in [&["--children"][..], &[]] {
        let out = dir.join(format!("profiles{}", flags.len()));
        let mut args = vec!["exec", "--hz", "1000", "--out", out.to_str().unwrap()];
        args.extend(flags);
        args.extend(["--", prog.to_str().unwrap(), n]);
        let (st, stdout, stderr, _) = run_limited(&args, Duration::from_secs(600));
        assert!(st.success(), "{flags:?}: {st:?}\n{stdout}\n{stderr}");
        assert_eq!(figure(&stdout, "forked"), n.parse::<u64>().unwrap(), "{flags:?}: {stdout}");
        assert_eq!((figure(&stdout, "hung"), figure(&stdout, "bad")), (0, 0), "{flags:?}: {stdout}\n{stderr}");
    }
}

/// posix_spawn, system and popen children are new tasks without osprey's
/// clocks: none of them receives an osprey signal.
#[test]
fn spawned_children_never_receive_an_osprey_signal() {
    let dir = tempdir("spawn");
    let prog = compile_named(C_DIR, "spawners", &dir);
    let out = dir.join("profiles");
    let n = if ci() { "150" } else { "600" };
    let (st, stdout, stderr, _) = run_limited(
        &["exec", "--hz", "10000", "--out", out.to_str().unwrap(), "--", prog.to_str().unwrap(), n],
        Duration::from_secs(300),
    );
    assert!(st.success(), "{st:?}\n{stderr}");
    assert_eq!(figure(&stdout, "spawned"), n.parse::<u64>().unwrap());
    assert_eq!((figure(&stdout, "deaths"), figure(&stdout, "failures")), (0, 0), "{stderr}");
}

/// Raw clone(SIGCHLD), fork, vfork (+_exit, +exec) and daemon children that
/// end with exit(): no hang, no crash, every child exits 0, and the parent's
/// last profile is written with its own frames.
#[test]
fn clone_fork_vfork_daemon_children_exiting() {
    let dir = tempdir("clone");
    let prog = compile_named(C_DIR, "clones", &dir);
    let out = dir.join("profiles");
    let (st, stdout, stderr, pid) = run_limited(
        &["exec", "--hz", "1000", "--out", out.to_str().unwrap(), "--", prog.to_str().unwrap(), "5"],
        Duration::from_secs(60),
    );
    assert!(st.success() && st.signal().is_none(), "{st:?}\n{stderr}");
    assert_eq!(figure(&stdout, "bad"), 0, "{stderr}");
    let _ = pid; // osprey's own pid: the program runs as its child
    let mine = program_files(&out);
    assert!(!mine.is_empty(), "the parent wrote no profile; stderr:\n{stderr}");
    let profiles: Vec<_> = mine.iter().map(|p| osprey_pprof::read_profile(p).unwrap()).collect();
    let s = osprey_pprof::summarize(&profiles, Some("cpu")).unwrap();
    let parent = s.functions.iter().find(|f| f.name.ends_with("parent_work")).map_or(0, |f| f.cum);
    // parent_work burns 5 x 20 ms of the parent's thread CPU time: at least
    // half of it must be in the parent's profile (children write their own).
    assert!(parent >= 50_000_000, "parent_work: {parent} ns of the 100 ms it burned");
}

/// CPython runs as osprey's child: SIGUSR1 sent to osprey reaches the
/// program's own handler, SIGTERM kills the program, and osprey exits with
/// 128 + 15 after writing the last profile.
#[test]
fn python_child_gets_the_signals_sent_to_osprey() {
    use std::io::{BufRead, BufReader};
    let Some(py) = interpreter("3.12") else { return };
    let dir = tempdir("pysig");
    let script = "import signal, sys\n\
        signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n\
        print('ready', flush=True)\n\
        def spin():\n    x = 0\n    while True:\n        x += 1\n\
        spin()\n";
    let mut child = osprey_cmd()
        .args(["exec", "--hz", "100", "--out", dir.to_str().unwrap(), "--", py.to_str().unwrap(), "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling the osprey process we started.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    assert_eq!(lines.next().unwrap().unwrap(), "usr1");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "osprey did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    // osprey ends as the program did: killed by the same signal (a shell
    // shows 128 + n), or exiting with 128 + n.
    assert!(st.signal() == Some(libc::SIGTERM) || st.code() == Some(128 + libc::SIGTERM), "{st:?}");
    let written = std::fs::read_dir(&dir).unwrap().flatten().any(|e| e.path().to_string_lossy().ends_with(".pb.gz"));
    assert!(written, "no profile written");
}

/// A setuid program (of another user) runs with LD_PRELOAD ignored by the
/// loader: osprey says so in one line instead of silently not profiling it.
#[test]
fn setuid_program_is_refused_with_one_line() {
    let dir = tempdir("setuid");
    let prog = dir.join("suid-true");
    std::fs::copy("/bin/true", &prog).unwrap();
    // SAFETY: plain id query.
    let target = if unsafe { libc::geteuid() } == 0 {
        // Owned by nobody (65534), setuid: exec would change the effective user.
        let c = std::ffi::CString::new(prog.to_str().unwrap()).unwrap();
        // SAFETY: chown/chmod of our own temporary file.
        unsafe {
            assert_eq!(libc::chown(c.as_ptr(), 65534, 65534), 0);
            assert_eq!(libc::chmod(c.as_ptr(), 0o4755), 0);
        }
        prog
    } else {
        PathBuf::from("/usr/bin/passwd")
    };
    let out = osprey_cmd().args(["exec", "--", target.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("setuid") && err.trim().lines().count() == 1, "{err}");
}

/// Profiles written by the program (the first process osprey started: the
/// lowest pid among the files, its children came later) in `dir`, and the
/// CPU nanoseconds their samples give to `function`.
fn cpu_of(dir: &Path, pid: u32, function: &str) -> (usize, i64) {
    let _ = pid; // osprey's own pid: the program runs as its child
    let mine = program_files(dir);
    if mine.is_empty() {
        return (0, 0);
    }
    let profiles: Vec<_> = mine.iter().map(|p| osprey_pprof::read_profile(p).unwrap()).collect();
    let s = osprey_pprof::summarize(&profiles, Some("cpu")).unwrap();
    (mine.len(), s.functions.iter().find(|f| f.name.ends_with(function)).map_or(0, |f| f.cum))
}

/// Starts `ending MODE` under `osprey exec` (60 s period: only the last
/// profile can be written), waits for "ready" and ~300 ms of its CPU time.
fn start_ending(
    prog: &Path,
    dir: &Path,
    mode: &str,
) -> (std::process::Child, std::io::Lines<std::io::BufReader<std::process::ChildStdout>>) {
    use std::io::BufRead;
    let mut child = osprey_cmd()
        .args([
            "exec",
            "--hz",
            "1000",
            "--period",
            "60",
            "--out",
            dir.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            mode,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    // The program is osprey's child: its main thread's CPU time.
    let cli = child.id();
    let program = || {
        std::fs::read_to_string(format!("/proc/{cli}/task/{cli}/children"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
    };
    let cpu = || program().map_or(0, |pid| osprey_testkit::run::schedstat(pid).0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cpu() < 300_000_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, lines)
}

fn wait_limited(child: &mut std::process::Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "the program did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGINT, SIGTERM, SIGHUP with the default disposition: the program dies of
/// the same signal (status unchanged) and its last profile holds the CPU it
/// burned (>= half of the ~300 ms measured before the signal).
#[test]
fn termination_signal_writes_the_profile_then_kills() {
    let dir = tempdir("term");
    let prog = compile_named(C_DIR, "ending", &dir);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let out = dir.join(format!("sig{sig}"));
        let (mut child, _lines) = start_ending(&prog, &out, "spin");
        // SAFETY: signalling the program we started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = wait_limited(&mut child, Duration::from_secs(30));
        assert_eq!(st.signal(), Some(sig), "signal {sig}: {st:?}");
        let (files, ns) = cpu_of(&out, child.id(), "spin_work");
        assert_eq!(files, 1, "signal {sig}: one last profile");
        assert!(ns >= 150_000_000, "signal {sig}: spin_work has {ns} ns of ~300 ms");
    }
}

/// A program with its own SIGTERM handler keeps it: the handler runs, the
/// program exits 0, and the last profile is written at exit.
#[test]
fn own_termination_handler_is_kept() {
    let dir = tempdir("ownterm");
    let prog = compile_named(C_DIR, "ending", &dir);
    let out = dir.join("p");
    let (mut child, mut lines) = start_ending(&prog, &out, "own");
    // SAFETY: signalling the program we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_limited(&mut child, Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert_eq!(lines.next().unwrap().unwrap(), format!("handled {}", libc::SIGTERM));
    let (files, ns) = cpu_of(&out, child.id(), "spin_work");
    assert_eq!(files, 1);
    assert!(ns >= 150_000_000, "spin_work has {ns} ns");
}

/// `abort()`, `_exit()` and a SIGIO the program raises at `SIG_DFL` (osprey
/// takes SIGIO only for the kernel's fallback) write the profile so far;
/// status unchanged.
#[test]
fn abort_exit_and_raised_sigio_write_the_profile() {
    let dir = tempdir("abort");
    let prog = compile_named(C_DIR, "ending", &dir);
    for (mode, check) in
        [("abort", (None, Some(libc::SIGABRT))), ("_exit", (Some(3), None)), ("sigio", (None, Some(libc::SIGIO)))]
    {
        let out = dir.join(mode);
        let (st, _, stderr, pid) = run_limited(
            &[
                "exec",
                "--hz",
                "1000",
                "--period",
                "60",
                "--out",
                out.to_str().unwrap(),
                "--",
                prog.to_str().unwrap(),
                mode,
            ],
            Duration::from_secs(60),
        );
        assert_eq!((st.code(), st.signal()), check, "{mode}: {stderr}");
        let (files, ns) = cpu_of(&out, pid, "spin_work");
        assert_eq!(files, 1, "{mode}: {stderr}");
        assert!(ns >= 150_000_000, "{mode}: spin_work has {ns} ns of 300 ms");
    }
}

/// A program that installs its own handler for osprey's sampling signal
/// while sampled at 1 kHz gets it: osprey steps aside with one line on
/// stderr, and the program's handler receives only the program's own signal
/// (never one from osprey's CPU clock), through `sigaction` and `signal`.
#[test]
fn program_taking_osprey_signal_gets_it() {
    let dir = tempdir("rtsig");
    let prog = compile_named(C_DIR, "rtsig", &dir);
    for extra in [&[][..], &["signal"][..]] {
        let out = dir.join(format!("p{}", extra.len()));
        let mut args = vec!["exec", "--hz", "1000", "--out", out.to_str().unwrap(), "--", prog.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (st, stdout, stderr, _) = run_limited(&args, Duration::from_secs(60));
        assert!(st.success(), "{st:?}\n{stderr}");
        assert_eq!((figure(&stdout, "foreign"), figure(&stdout, "own")), (0, 1), "{stdout}\n{stderr}");
        // One line about the signal (besides the closing line naming the files).
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("osprey:") && !l.contains("written")).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].contains("its own handler for signal"), "{stderr}");
    }
}

/// The program sees its dispositions unchanged: SIGINT, SIGTERM and SIGHUP
/// read `SIG_DFL` through `sigaction` and `signal` while osprey's
/// termination handler stands in for the default.
#[test]
fn termination_handler_is_invisible_to_the_program() {
    let dir = tempdir("query");
    let prog = compile_named(C_DIR, "ending", &dir);
    let out = dir.join("p");
    let (st, stdout, stderr, _) = run_limited(
        &["exec", "--out", out.to_str().unwrap(), "--", prog.to_str().unwrap(), "query"],
        Duration::from_secs(60),
    );
    assert!(st.success(), "{st:?}\n{stderr}");
    assert_eq!((figure(&stdout, "sigaction"), figure(&stdout, "signal")), (3, 3), "{stdout}");
}

/// The profiles in `dir` of the process with the lowest pid: the program
/// `osprey exec` started (its forked children have higher pids).
fn program_files(dir: &Path) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<PathBuf>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p: &PathBuf| p.to_string_lossy().ends_with(".pb.gz"))
        .collect();
    let pid_of = |p: &PathBuf| -> Option<u32> {
        p.file_name()?.to_str()?.strip_prefix("osprey-")?.split('-').next()?.parse().ok()
    };
    let Some(root) = files.iter().filter_map(pid_of).min() else { return vec![] };
    files.into_iter().filter(|p| pid_of(p) == Some(root)).collect()
}
