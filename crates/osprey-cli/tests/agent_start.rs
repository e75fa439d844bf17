//! What the agent costs a process at start, as structure rather than time
//! (timings are in `bench/start_cost.py`): a profiled process gets one
//! thread of osprey's, the collector, which also serves the last profile
//! on SIGINT/SIGTERM/SIGHUP; the agent's copy of stderr stays inside the
//! descriptor table every process starts with (a higher one makes the
//! kernel grow the table, and every `fork` copy it); the agent library
//! brings no other library into the process than libc and the loader.
//!
//! Needs the workspace built (`cargo build --workspace`).

use osprey_testkit::cc::compile_source;
use osprey_testkit::paths::preload_lib;
use osprey_testkit::profile::profile_files;
use osprey_testkit::{osprey, tempdir};
use std::process::Command;

/// Lists its threads (names) and its open descriptors after 300 ms, then
/// waits for SIGTERM if asked (`argv[1]`), else exits.
const PROBE: &str = r#"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void list(const char *dir, int names) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[256], comm[64] = "";
        if (names) {
            snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
            FILE *f = fopen(path, "r");
            if (f) { if (!fgets(comm, sizeof comm, f)) comm[0] = 0; fclose(f); }
            comm[strcspn(comm, "\n")] = 0;
        }
        printf("%s %s\n", names ? "thread" : "fd", names ? comm : e->d_name);
    }
    closedir(d);
}
int main(int argc, char **argv) {
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < 50000000UL; i++) x += i;
    usleep(300000);
    list("/proc/self/task", 1);
    list("/proc/self/fd", 0);
    printf("ready\n");
    fflush(stdout);
    if (argc > 1) pause();
    return 0;
}
"#;

fn lines<'a>(out: &'a str, kind: &str) -> Vec<&'a str> {
    out.lines().filter_map(|l| l.strip_prefix(kind)).map(str::trim).collect()
}

/// Each library the agent needs is opened, mapped and relocated in every
/// process of a tree: libgcc_s is linked in statically, libm replaced by
/// Rust code. (A portable build for older glibc loads libgcc_s.)
#[test]
fn agent_library_needs_only_libc_and_the_loader() {
    if std::env::var_os("OSPREY_PORTABLE_AGENT").is_some() {
        return;
    }
    let o = Command::new("readelf").arg("-dW").arg(preload_lib()).output().expect("readelf (binutils)");
    let dynamic = String::from_utf8_lossy(&o.stdout);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(!needed.is_empty(), "no NEEDED entry read from {}:\n{dynamic}", preload_lib().display());
    let extra: Vec<&&str> = needed.iter().filter(|n| !matches!(**n, "libc.so.6" | "ld-linux-x86-64.so.2")).collect();
    assert!(extra.is_empty(), "the agent library needs {extra:?} besides libc and the loader");
}

/// The program's main thread and the collector: no other thread of
/// osprey's; no descriptor of osprey's above the 64 every process has.
#[test]
fn one_agent_thread_and_no_high_descriptor() {
    let dir = tempdir("agent-start");
    let probe = compile_source(&dir, "probe", PROBE);
    let out_dir = dir.join("out");
    let o = Command::new(osprey()).args(["exec", "--out"]).arg(&out_dir).arg("--").arg(&probe).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let threads = lines(&stdout, "thread ");
    assert_eq!(threads, ["probe", "osprey-collect"], "{stdout}");
    // The agent's descriptors: those the probe does not have alone (the
    // test harness may pass some down).
    let alone = Command::new(&probe).output().unwrap();
    let alone = String::from_utf8_lossy(&alone.stdout);
    let ours: Vec<&str> = lines(&stdout, "fd ").into_iter().filter(|f| !lines(&alone, "fd ").contains(f)).collect();
    assert!(ours.iter().all(|f| f.parse::<i32>().unwrap() < 64), "a descriptor at 64 or above: {ours:?}");
    assert_eq!(profile_files(&out_dir).len(), 1, "{stdout}");
}

/// SIGTERM with the default disposition: the collector writes the profile
/// so far, then the program dies of the signal.
#[test]
fn sigterm_profile_is_written_by_the_collector() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let dir = tempdir("agent-start-term");
    let probe = compile_source(&dir, "probe", PROBE);
    let out_dir = dir.join("out");
    // The agent preloaded directly: `osprey exec` would forward the signal.
    let mut child = Command::new(&probe)
        .arg("wait")
        .env("LD_PRELOAD", osprey_testkit::paths::preload_lib())
        .env("OSPREY_OUT", &out_dir)
        .env_remove("OSPREY_ROOT_PID")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.ends_with("ready\n") {
        assert!(stdout.read_line(&mut seen).unwrap() > 0, "the probe ended early: {seen}");
    }
    assert_eq!(lines(&seen, "thread "), ["probe", "osprey-collect"], "{seen}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}");
    assert_eq!(profile_files(&out_dir).len(), 1, "no profile after SIGTERM");
}

/// Prints `arenas N ms T`: how many malloc arenas other than the main one
/// the process has (anonymous 64 MiB reservations at a 64 MiB boundary,
/// glibc's per-thread heaps) T ms after `main` began, 10 ms in.
const ARENAS: &str = r#"
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static double ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
int main(void) {
    double t0 = ms();
    usleep(10000);
    const unsigned long heap = 64UL << 20;
    unsigned long lo, hi, start = 0, end = 0, offset, inode;
    char perms[8], dev[16], line[512];
    int arenas = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    while (fgets(line, sizeof line, f)) {
        int named = sscanf(line, "%lx-%lx %7s %lx %15s %lu %*s", &lo, &hi, perms, &offset, dev, &inode) == 6 && inode != 0;
        char *path = line; while (*path && *path != '/' && *path != '[') path++;
        if (named || *path) { start = end = 0; continue; }
        if (lo == end && start) end = hi; else { start = lo; end = hi; }
        if (start % heap == 0 && end - start == heap) { arenas++; start = end = 0; }
    }
    fclose(f);
    printf("arenas %d ms %.0f\n", arenas, ms() - t0);
    return 0;
}
"#;

/// In a process the command starts (`--children`: most are short), the
/// collector's start allocates nothing: glibc makes a thread its own malloc
/// arena at its first `malloc` or `free`, and a process shorter than the
/// collector's first deadline would pay for one it never uses. (The
/// command's own collector compiles unwind tables at once, in an arena.)
#[test]
fn the_collector_makes_no_malloc_arena_at_start() {
    let dir = tempdir("agent-start-arena");
    let probe = compile_source(&dir, "arenas", ARENAS);
    let alone = Command::new(&probe).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&alone.stdout).split_whitespace().nth(1), Some("0"), "alone: {alone:?}");
    // A machine so loaded that the check comes after the collector's
    // first deadline (100 ms) would see the collector's own work: retried.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let out_dir = dir.join("out");
        // `; true`: the shell forks the probe rather than exec it in its own pid.
        let script = format!("{}; true", probe.display());
        let o = Command::new(osprey())
            .env("OSPREY_TREE_SAMPLER", "agent")
            .args(["exec", "--children", "--out"])
            .arg(&out_dir)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
        let words: Vec<&str> = stdout.split_whitespace().collect();
        let (arenas, ms) = (words[1].parse::<u32>().unwrap(), words[3].parse::<f64>().unwrap());
        if ms < 50.0 {
            assert_eq!(arenas, 0, "the agent made {arenas} malloc arena(s) in a process of one thread: {stdout}");
            return;
        }
        seen.push(stdout);
    }
    panic!("the probe never checked within 50 ms: {seen:?}");
}
