//! `osprey exec --children` writes one profile file per period for the whole
//! process tree (the processes' parts merged by `osprey exec`, see
//! crates/osprey-cli/src/spool.rs), every sample labelled with its process,
//! so `osprey report --pid` still separates them. The kernel samples the
//! tree (crates/osprey-cli/src/native_tree.rs): a child killed by SIGKILL
//! loses nothing, each process's CPU is its own, exactly, a static program
//! is sampled too; with an agent in each process, the parts an `osprey
//! exec` killed by SIGKILL leaves are merged by the next one.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::{compile_source, Cc};
use osprey_testkit::profile::{function_names, label, location_lines, profile_files, read_profiles};
use osprey_testkit::{osprey, tempdir};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn exec(dir: &Path, out: &Path, flags: &[&str], cmd: &[&str]) -> Output {
    let mut args = vec!["exec", "--children", "--out", out.to_str().unwrap()];
    args.extend(flags);
    args.push("--");
    args.extend(cmd);
    Command::new(osprey()).current_dir(dir).args(args).output().expect("run osprey")
}

/// CPU nanoseconds per `pid` label, and the process names seen per pid.
fn cpu_by_pid(ps: &[Profile]) -> (BTreeMap<i64, i64>, BTreeMap<i64, String>) {
    let (mut cpu, mut names) = (BTreeMap::new(), BTreeMap::new());
    for p in ps {
        let i = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").expect("a cpu sample type");
        for s in &p.sample {
            let (_, pid) = label(p, s, "pid").expect("every sample has a pid label");
            *cpu.entry(pid).or_default() += s.value[i];
            if let Some((name, _)) = label(p, s, "process") {
                names.insert(pid, name.to_string());
            }
        }
    }
    (cpu, names)
}

/// The output directory holds exactly the profile files (no spool left).
fn only_profiles(out: &Path) -> usize {
    let all: Vec<String> =
        std::fs::read_dir(out).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(all.iter().all(|n| n.starts_with("osprey-") && n.ends_with(".pb.gz")), "{all:?}");
    all.len()
}

fn report(out: &Path, args: &[&str]) -> (bool, String) {
    let o = Command::new(osprey()).arg("report").arg(out).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// `n` `/bin/true`s started one at a time by `shell` under `exec
/// --children` from `dir`, profiles into `out`: the pids of the trues, then
/// the shell's, and osprey's stderr. Asserts that the run succeeded and
/// that every process has a profile in the tree's one file.
fn shell_loop(shell: &str, n: usize, dir: &Path, out: &Path) -> (Vec<i64>, BTreeMap<i64, String>, String) {
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true & echo $!; wait $!; i=$((i+1)); done; echo $$");
    let o = exec(dir, out, &["--period", "60"], &[shell, "-c", &script]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let pids: Vec<i64> = String::from_utf8_lossy(&o.stdout).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), n + 1);
    assert_eq!(only_profiles(out), 1, "one file for the tree: {err}");
    let (cpu, names) = cpu_by_pid(&read_profiles(out));
    let missing: Vec<&i64> = pids.iter().filter(|p| !cpu.contains_key(p)).collect();
    assert!(missing.is_empty(), "processes without a profile: {missing:?} of {}", pids.len());
    (pids, names, err)
}

/// 200 `/bin/true` from a shell loop: one file, with a profile of each of
/// the 201 processes in it, which `report --pid` tells apart.
#[test]
fn shell_loop_is_one_file_with_every_process() {
    let dir = tempdir("tree-loop");
    let out = dir.join("profiles");
    let (pids, names, err) = shell_loop("sh", 200, &dir, &out);
    assert!(err.lines().last().unwrap().starts_with("osprey: 1 profile written: "), "{err}");
    assert_eq!(names.get(&pids[0]).map(String::as_str), Some("true"));
    assert_eq!(names.get(&pids[200]).map(String::as_str), Some("sh"));
    // `report --pid` separates them: the shell's stacks have no `true` in
    // them, a true's has (and the forked shell it was before its exec).
    let (ok, text) = report(&out, &["--pid", &pids[7].to_string()]);
    assert!(ok && text.contains("true+") && text.contains("1 file"), "{text}");
    let (ok, text) = report(&out, &["--pid", &pids[200].to_string(), "--top", "500"]);
    assert!(ok && text.contains("dash") && !text.contains("true+"), "{text}");
    let (ok, text) = report(&out, &["--pid", "1"]);
    assert!(!ok, "no samples of pid 1: {text}");
}

/// Without `--children`, the processes bash forks without exec (a
/// subshell per `$(...)`, as a pyenv shim runs) keep bash's agent: they go
/// into the command's one file, labelled by pid, not a file each.
#[test]
fn forks_without_children_are_in_the_one_file() {
    let dir = tempdir("tree-forks");
    let out = dir.join("out");
    let script = "for i in 1 2 3 4 5 6 7 8; do x=$(echo $BASHPID); echo $x; done; echo $$";
    let o = Command::new(osprey())
        .current_dir(&dir)
        .args(["exec", "--period", "60", "--out", out.to_str().unwrap(), "--", "bash", "-c", script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let pids: Vec<i64> = String::from_utf8_lossy(&o.stdout).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(only_profiles(&out), 1, "one file for bash and its subshells: {err}");
    let (cpu, names) = cpu_by_pid(&read_profiles(&out));
    let missing: Vec<&i64> = pids.iter().filter(|p| !cpu.contains_key(p)).collect();
    assert!(missing.is_empty(), "processes without samples: {missing:?} of {pids:?}");
    assert!(names.values().all(|n| n == "bash"), "only bash is profiled: {names:?}");
}

/// bash as the root: its agent reads the tree's settings although bash
/// defines its own `setenv` and `getenv`, so bash and the children it forks
/// write into the tree's one file and nowhere else (not into a `profiles`
/// directory of the working directory, the default output).
#[test]
fn bash_root_and_its_forks_keep_the_tree_settings() {
    let dir = tempdir("tree-bash");
    let out = dir.join("out");
    let (pids, names, err) = shell_loop("bash", 10, &dir, &out);
    let cwd: Vec<String> =
        std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(cwd, ["out"], "files outside the output directory: {err}");
    assert_eq!(names.get(&pids[10]).map(String::as_str), Some("bash"));
}

/// 40 C files compiled by `make -j2` (make, and per file the compiler
/// driver, cc1 and as): one file, every process in it.
#[test]
fn make_j2_of_40_files_is_one_file() {
    let dir = tempdir("tree-make");
    for i in 0..40 {
        std::fs::write(dir.join(format!("f{i}.c")), format!("int f{i}(int x) {{ return x * {i} + 1; }}\n")).unwrap();
    }
    let objs: Vec<String> = (0..40).map(|i| format!("f{i}.o")).collect();
    std::fs::write(dir.join("Makefile"), format!("all: {}\n%.o: %.c\n\tgcc -O1 -c $< -o $@\n", objs.join(" ")))
        .unwrap();
    let out = dir.join("profiles");
    // cc1 runs a few ms a file: at 1000 Hz enough of its samples land in
    // functions its dynamic symbol table names (at 100 Hz, none on a fast machine).
    let o = exec(&dir, &out, &["--period", "60", "--hz", "1000"], &["make", "-j2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(objs.iter().all(|f| dir.join(f).is_file()), "every object built");
    assert_eq!(only_profiles(&out), 1, "{err}");
    let ps = read_profiles(&out);
    let (cpu, names) = cpu_by_pid(&ps);
    // The children's frames are named at the merge (their agents leave that
    // to it): cc1's C++ functions from its symbol table, and no mark left.
    let functions: Vec<&str> = ps.iter().flat_map(|p| p.function.iter().map(|f| p.string(f.name))).collect();
    assert!(functions.iter().any(|f| f.ends_with(')') && !f.contains('+')), "{functions:?}");
    let ids: Vec<&str> = ps.iter().flat_map(|p| p.mapping.iter().map(|m| p.string(m.build_id))).collect();
    assert!(ids.iter().all(|i| !i.starts_with("osprey-deferred")) && ids.iter().any(|i| i.len() == 40), "{ids:?}");
    // Each process walks with frame pointers until its tables come, through
    // code built without them: a word that is not a return address into
    // loaded code ends the walk rather than becoming a frame.
    let unmapped: Vec<u64> = ps
        .iter()
        .flat_map(|p| p.location.iter().filter(|l| l.address != 0 && l.mapping_id == 0))
        .map(|l| l.address)
        .collect();
    assert!(unmapped.is_empty(), "frames in no loaded module: {unmapped:x?}");
    let count = |n: &str| names.values().filter(|v| v.as_str() == n).count();
    assert_eq!(count("make"), 1, "{names:?}");
    assert_eq!(count("gcc"), 40, "{names:?}");
    assert_eq!(count("cc1"), 40, "{names:?}");
    assert_eq!(count("as"), 40, "{names:?}");
    assert!(cpu.values().all(|&v| v > 0));
    let cc1 = names.iter().find(|(_, n)| n.as_str() == "cc1").map(|(p, _)| *p).unwrap();
    let (ok, text) = report(&out, &["--pid", &cc1.to_string(), "--top", "200"]);
    // make's frames are `make+0x..` (its binary is stripped) or its own
    // functions; cc1 has functions named `make_..` of its own.
    let of_make = |l: &str| l.contains("make+0x") || l.ends_with(" reap_children") || l.ends_with(" update_goal_chain");
    assert!(ok && !text.lines().any(of_make), "{text}");
}

/// A busy child killed by SIGKILL keeps every period it had written; the
/// tree's files are one per period (plus the one the boundary makes).
#[test]
fn sigkilled_child_keeps_its_written_periods() {
    let dir = tempdir("tree-kill");
    let out = dir.join("profiles");
    // The child's CPU (utime + stime, in clock ticks) just before its SIGKILL.
    let script = "sh -c 'while :; do :; done' & p=$!; echo $p; sleep 2; \
                  cut -d' ' -f14,15 /proc/$p/stat; kill -9 $p; wait $p; exit 0";
    let started = Instant::now();
    let o = exec(&dir, &out, &["--period", "0.5", "--hz", "200"], &["sh", "-c", script]);
    let wall = started.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let mut lines = stdout.lines();
    let pid: i64 = lines.next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let tick = 1e9 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ran: f64 = lines.next().unwrap().split(' ').map(|t| t.parse::<f64>().unwrap() * tick).sum();
    let files = only_profiles(&out);
    let periods = wall / 0.5;
    assert!(files as f64 >= periods - 1.0 && files as f64 <= periods + 2.0, "{files} files in {wall:.2} s");
    let (cpu, _) = cpu_by_pid(&read_profiles(&out));
    let kept = *cpu.get(&pid).unwrap_or(&0) as f64;
    eprintln!("killed child: ran {:.0} ms, its profiles hold {:.0} ms", ran / 1e6, kept / 1e6);
    // Its samples were the kernel's as soon as taken, and its CPU after the
    // last one comes at its exit: nothing is lost (but the ticks of accounting
    // the `stat` figures are rounded to, and the moment before the kill).
    assert!(kept >= ran - 2.0 * tick - 0.02e9, "kept {kept} ns of {ran} ns");
    assert!(kept <= ran * 1.1 + 0.05e9, "kept {kept} ns of {ran} ns");
}

/// The tree's processes end their periods together: a file spans one
/// period, though a second busy child starts in the middle of one (on their
/// own clocks, the two children's parts would land in the same merge 0.6
/// periods apart, and every file would span 1.6).
#[test]
fn a_file_spans_one_period_of_every_process() {
    let dir = tempdir("tree-grid");
    let out = dir.join("profiles");
    let busy = "sh -c 'while :; do :; done'";
    let script = format!("{busy} & a=$!; sleep 0.6; {busy} & b=$!; sleep 2.6; kill $a $b; wait; exit 0");
    let o = exec(&dir, &out, &["--period", "1", "--hz", "100"], &["sh", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let profiles = read_profiles(&out);
    let spans: Vec<f64> = profiles.iter().filter(|p| p.time_nanos > 0).map(|p| p.duration_nanos as f64 / 1e9).collect();
    eprintln!("file spans (s): {spans:?}");
    assert!(spans.len() >= 3, "{} files: {spans:?}", profiles.len());
    // A part ends when its writer flushes, a little after the period's end.
    // The last file holds the tail, with the period before it when the tree
    // ended before that period's merge.
    let (last, full) = spans.split_last().unwrap();
    assert!(full.iter().all(|&s| s <= 1.3) && *last <= 2.3, "file spans (s): {spans:?}");
}

/// `osprey exec` killed by SIGKILL: the parts of the tree it had not merged
/// stay in its spool, and the next `osprey exec --children` with the same
/// output directory merges them.
#[test]
fn parts_left_by_a_killed_osprey_are_merged_next_time() {
    use std::io::{BufRead, BufReader};
    let dir = tempdir("tree-crash");
    let out = dir.join("profiles");
    let script = "echo $$; i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done; echo done";
    // The agent in each process (not the kernel's events, which end with
    // `osprey exec`): the command goes on writing parts after the kill.
    let mut child = Command::new(osprey())
        .env("OSPREY_TREE_SAMPLER", "agent")
        .args(["exec", "--children", "--hz", "200", "--period", "0.3", "--out"])
        .arg(&out)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid: i64 = lines.next().unwrap().unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    child.kill().unwrap();
    child.wait().unwrap();
    // Its private status directory is left too, until the next `osprey exec` ends.
    let status_prefix = format!("osprey-status-{}-", child.id());
    let status_dirs = || -> Vec<_> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&status_prefix))
            .collect()
    };
    assert_eq!(status_dirs().len(), 1, "the killed osprey's status directory");
    // The command goes on without osprey and writes its last part at exit.
    assert_eq!(lines.next().unwrap().unwrap(), "done");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let spools: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".osprey-spool-"))
        .collect();
    assert_eq!(spools.len(), 1, "the killed osprey's spool is left");
    let parts = std::fs::read_dir(spools[0].path()).unwrap().count();
    assert!(parts >= 1, "its last part at least");
    // What writers killed mid-write leave: osprey's merge, an agent's part.
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    std::fs::write(spools[0].path().join(".merge.tmp"), b"\x1f\x8b torn").unwrap();
    std::fs::write(spools[0].path().join(format!(".osprey-{}-0.tmp", gone.id())), b"torn").unwrap();
    let before = profile_files(&out).len();

    let o = exec(&dir, &out, &["--hz", "200"], &["true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("osprey: merged the profiles an interrupted run left: "), "{err}");
    assert!(status_dirs().is_empty(), "the killed osprey's status directory is removed");
    // No spool nor temporary file left.
    assert_eq!(only_profiles(&out), before + 2, "the recovered file and this run's: {err}");
    let ps = read_profiles(&out);
    let (cpu, _) = cpu_by_pid(&ps);
    assert!(cpu.get(&pid).is_some_and(|&v| v > 0), "{cpu:?}");
    // The shell loop's last part is in: its exit is charged to its entry point.
    let stacks: BTreeSet<&str> = ps
        .iter()
        .flat_map(|p| {
            p.sample
                .iter()
                .filter(|s| label(p, s, "pid").is_some_and(|(_, v)| v == pid))
                .flat_map(move |s| function_names(p, s))
        })
        .collect();
    assert!(!stacks.is_empty());
}

/// CPU of the reaped children of this process so far, in ns.
fn children_cpu_ns() -> f64 {
    // SAFETY: a zeroed rusage is valid to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let ns = |t: libc::timeval| t.tv_sec as f64 * 1e9 + t.tv_usec as f64 * 1e3;
    ns(u.ru_utime) + ns(u.ru_stime)
}

/// The profile holds what the tree used, process by process, though most
/// of its processes are shorter than a sampling period: the same script
/// alone used about as much CPU as the profile shows (the kernel reports
/// each thread's count at its exit; nothing runs in the processes).
#[test]
fn every_process_is_charged_its_cpu() {
    let dir = tempdir("tree-exact");
    let out = dir.join("profiles");
    let script = "for i in $(seq 150); do /bin/true; done; i=0; while [ $i -lt 60000 ]; do i=$((i+1)); done";
    let (mut alone, mut profiled) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let before = children_cpu_ns();
        assert!(Command::new("sh").args(["-c", script]).status().unwrap().success());
        alone.push(children_cpu_ns() - before);
        let out = out.join(round.to_string());
        let o = exec(&dir, &out, &["--period", "60"], &["sh", "-c", script]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (cpu, names) = cpu_by_pid(&read_profiles(&out));
        assert_eq!(names.values().filter(|n| n.as_str() == "true").count(), 150, "{names:?}");
        assert!(cpu.values().all(|&v| v > 0), "{cpu:?}");
        profiled.push(cpu.values().sum::<i64>() as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, p) = (median(&mut alone), median(&mut profiled));
    eprintln!("script alone {:.1} ms, its profile {:.1} ms (x{:.3})", a / 1e6, p / 1e6, p / a);
    assert!((0.8..=1.25).contains(&(p / a)), "profile {p} ns, alone {a} ns");
}

/// A statically linked program in the tree is sampled (nothing needs to be
/// preloaded into it), its frames named.
#[test]
fn a_static_program_in_the_tree_is_sampled() {
    let dir = tempdir("tree-static");
    let src = dir.join("spin.c");
    std::fs::write(
        &src,
        "volatile unsigned long sink;\n\
         __attribute__((noinline)) void spin_static(long n) { for (long i = 0; i < n; i++) sink += i * 7; }\n\
         int main(void) { spin_static(300000000L); return 0; }\n",
    )
    .unwrap();
    let exe = Cc::new("cc").flags(["-O1", "-static"]).build(&src, &dir.join("spin"));
    let out = dir.join("profiles");
    let script = format!("{}; true", exe.display());
    let o = exec(&dir, &out, &["--hz", "200"], &["sh", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ok, text) = report(&out, &["--process", "spin"]);
    assert!(ok && text.lines().any(|l| l.ends_with(" spin_static") && l.contains('%')), "{text}");
}

/// Threads that come and go: each one's CPU is charged to it at its exit,
/// named as it named itself, and the program's total is what it used.
#[test]
fn short_threads_are_each_charged_and_named() {
    let dir = tempdir("tree-threads");
    let exe = compile_source(
        &dir,
        "churn",
        r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
static volatile unsigned long sink;
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void *work(void *a) {
    pthread_setname_np(pthread_self(), "churner");
    for (long i = 0; i < 3000000; i++) sink += i;
    return a;
}
int main(void) {
    for (int i = 0; i < 60; i++) {
        pthread_t t;
        pthread_create(&t, 0, work, 0);
        pthread_join(t, 0);
    }
    printf("%.0f\n", cpu() * 1e9);
    return 0;
}
"#,
    );
    let out = dir.join("profiles");
    let script = format!("{}; true", exe.display());
    let o = exec(&dir, &out, &["--hz", "100"], &["sh", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let used: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let ps = read_profiles(&out);
    let (mut total, mut threads, mut named) = (0i64, BTreeSet::new(), 0i64);
    for p in &ps {
        let cpu = p.sample_type.iter().position(|t| p.string(t.r#type) == "cpu").unwrap();
        for s in p.sample.iter().filter(|s| label(p, s, "process").is_some_and(|(n, _)| n == "churn")) {
            total += s.value[cpu];
            threads.insert(label(p, s, "thread id").map(|(_, v)| v));
            if label(p, s, "thread name").is_some_and(|(n, _)| n == "churner") {
                named += s.value[cpu];
            }
        }
    }
    eprintln!(
        "churn used {:.1} ms; its profile {:.1} ms over {} threads",
        used / 1e6,
        total as f64 / 1e6,
        threads.len()
    );
    assert!(threads.len() >= 55, "{} threads", threads.len());
    assert!((total as f64 - used).abs() <= 0.1 * used, "profile {total} ns, used {used} ns");
    assert!(named as f64 >= 0.8 * used, "named {named} of {used} ns");
}

/// `--lines` keeps the tree kernel-sampled (nothing preloaded) and names
/// its frames with files, lines and inlined functions, read at the merge.
#[test]
fn a_tree_with_lines_gets_files_lines_and_inlined_functions() {
    let dir = tempdir("tree-lines");
    let exe = compile_source(
        &dir,
        "lined",
        r#"
static volatile unsigned long sink;
static inline __attribute__((always_inline)) void inlined_step(long i) { sink += i * 7; }
__attribute__((noinline)) void lined_outer(long n) { for (long i = 0; i < n; i++) inlined_step(i); }
int main(void) { lined_outer(300000000L); return 0; }
"#,
    );
    let out = dir.join("profiles");
    let script = format!("{}; env | grep -c osprey_preload || true", exe.display());
    let o = exec(&dir, &out, &["--hz", "200", "--lines"], &["sh", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0", "nothing preloaded into the tree");
    let ps = read_profiles(&out);
    let (mut inlined, mut with_line) = (0, 0);
    for p in &ps {
        for l in &p.location {
            let names = location_lines(p, l);
            if names.iter().any(|&(n, file, line)| n == "lined_outer" && file.ends_with("lined.c") && line > 0) {
                with_line += 1;
                inlined += names
                    .first()
                    .is_some_and(|&(n, file, line)| n == "inlined_step" && file.ends_with("lined.c") && line > 0)
                    as usize;
            }
        }
    }
    assert!(
        with_line > 0 && inlined > 0,
        "lined_outer at a line: {with_line} locations, {inlined} inside inlined_step"
    );
}
