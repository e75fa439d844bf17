//! `osprey attach --pid` to a native program (perf_event_open sampling from
//! outside): stacks through code without frame pointers, the CPU split of
//! the work, the target untouched; refusals of what cannot be attached to.
//!
//! Needs the osprey binary built (`cargo build -p osprey-cli`) and a C
//! compiler; perf_event_open allowed (root, or kernel.perf_event_paranoid <= 1).

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::compile_frameless;
use osprey_testkit::cli::attach_into;
use osprey_testkit::profile::function_names;
use osprey_testkit::{osprey, tempdir};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `tests/c/NAME.c` built without frame pointers into `dir`.
fn build_c(dir: &Path, name: &str) -> PathBuf {
    compile_frameless(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"), name, dir)
}

/// Each sample's function names (leaf first) and CPU nanoseconds.
fn stacks(p: &Profile) -> Vec<(Vec<String>, i64)> {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let cpu = p.sample_type.iter().position(|t| s(t.r#type) == "cpu").expect("cpu sample type");
    p.sample
        .iter()
        .map(|smp| (function_names(p, smp).into_iter().map(String::from).collect(), smp.value[cpu]))
        .collect()
}

#[test]
fn attach_reaches_main_keeps_the_split_and_leaves_the_target_unchanged() {
    let dir = tempdir("split");
    let bin = build_c(&dir, "attach_split");
    let cycles = "600";
    let alone = Command::new(&bin).arg(cycles).output().unwrap();
    assert!(alone.status.success());

    let target = Command::new(&bin).arg(cycles).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.join("out");
    let o = attach_into(&out, target.id(), &["--duration", "2", "--hz", "1000"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("profile(s) written"), "{stderr}");
    let mut target = target;
    let mut stdout = String::new();
    target.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let status = target.wait().unwrap();
    assert_eq!(status.code(), alone.status.code(), "exit status changed under attach");
    assert_eq!(stdout, String::from_utf8_lossy(&alone.stdout), "output changed under attach");

    let mut all = Vec::new();
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        all.extend(stacks(&osprey_pprof::read_profile(&e.path()).unwrap()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let total: i64 = all.iter().map(|s| s.1).sum();
    // At least 250 samples of 1 ms (1000 Hz): the split's sampling noise is then about a point.
    assert!(total >= 250_000_000, "{total} ns sampled");
    let has = |s: &(Vec<String>, i64), f: &str| s.0.iter().any(|n| n == f);
    let rooted: i64 = all.iter().filter(|s| has(s, "main") || has(s, "start_thread")).map(|s| s.1).sum();
    let reach = rooted as f64 * 100.0 / total as f64;
    let work: Vec<i64> =
        ["fifty", "thirty", "twenty"].iter().map(|f| all.iter().filter(|s| has(s, f)).map(|s| s.1).sum()).collect();
    let sum: i64 = work.iter().sum();
    let split: Vec<f64> = work.iter().map(|w| *w as f64 * 100.0 / sum as f64).collect();
    eprintln!("reach main/start_thread {reach:.1}%, split {split:.1?}");
    assert!(reach >= 95.0, "{reach:.1}% of the CPU reaches main or start_thread");
    for (got, want) in split.iter().zip([50.0, 30.0, 20.0]) {
        assert!((got - want).abs() <= 5.0, "split {split:.1?}, want 50/30/20 within 5 points");
    }
}

/// The commands that take `--pid`, each cut short.
const PID_COMMANDS: [&[&str]; 3] = [&["attach", "--duration", "1"], &["dump"], &["top", "--duration", "1"]];

/// Runs each of [`PID_COMMANDS`] with `--pid=PID`: (status, stderr) of
/// the first, after checking that the others end the same way.
fn attach(pid: &str) -> (i32, String) {
    let mut first: Option<(i32, String)> = None;
    for args in PID_COMMANDS {
        let o = Command::new(osprey()).args(&args[..1]).arg(format!("--pid={pid}")).args(&args[1..]).output().unwrap();
        let r = (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned());
        assert!(o.stdout.is_empty(), "{args:?} {pid}: {}", String::from_utf8_lossy(&o.stdout));
        match &first {
            None => first = Some(r),
            Some(f) => assert_eq!((f.0, f.1.lines().count()), (r.0, r.1.lines().count()), "{args:?} {pid}: {r:?}"),
        }
    }
    first.unwrap()
}

fn one_line(stderr: &str) {
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
}

/// attach, dump and top alike.
#[test]
fn what_cannot_be_attached_to_is_refused_in_one_line() {
    // Pids stay below pid_max: that one never exists.
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().to_string();
    let (code, err) = attach(&pid_max);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no process with pid"), "{err}");
    one_line(&err);

    for bad in ["0", "-5"] {
        let (code, err) = attach(bad);
        assert_eq!(code, 2, "{bad}: {err}");
        one_line(&err);
    }

    // A child that has exited and is not yet waited for.
    let mut zombie = Command::new("true").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (code, err) = attach(&zombie.id().to_string());
    zombie.wait().unwrap();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("zombie"), "{err}");
    one_line(&err);

    // A kernel thread, when this PID namespace shows one.
    let kthread = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let flags: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(6)?.parse().ok()?;
        (flags & 0x0020_0000 != 0).then_some(pid)
    });
    if let Some(k) = kthread {
        let (code, err) = attach(&k.to_string());
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("kernel thread"), "{err}");
        one_line(&err);
    }
}

/// Two attaches at once to one process: perf events are per attach, so both
/// sample it, and the target ends as it would have.
#[test]
fn two_attaches_at_once_both_work() {
    let dir = tempdir("twice");
    let bin = build_c(&dir, "attach_split");
    let alone = Command::new(&bin).arg("300").output().unwrap();
    let mut target = Command::new(&bin).arg("300").stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = target.id().to_string();
    let runs: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| {
            Command::new(osprey())
                .args(["attach", "--pid", &pid, "--duration", "1.5", "--out"])
                .arg(dir.join(n))
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, n) in runs.into_iter().zip(["a", "b"]) {
        let o = r.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{n}: {err}");
        let p = osprey_pprof::read_profile(&std::fs::read_dir(dir.join(n)).unwrap().next().unwrap().unwrap().path());
        let all = stacks(&p.unwrap());
        assert!(all.iter().any(|s| s.0.iter().any(|f| f == "fifty")), "{n}: {all:?}");
    }
    let mut stdout = String::new();
    target.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert_eq!(target.wait().unwrap().code(), alone.status.code());
    assert_eq!(stdout, String::from_utf8_lossy(&alone.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}
