//! A real frameless C program sampled from outside: unwound stacks, the CPU
//! split, every thread (including one started after attach), a thread that
//! blocks, and a process that does not exist.

mod common;
use common::*;

use osprey_perf::{Error, ProcessSampler, ThreadSampler};

/// High enough for ~1000 samples in 3 s on a busy machine: the split's
/// standard error is then ~1.6 points at 50%.
const HZ: u32 = 999;

fn share(n: usize, of: usize) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

#[test]
fn stacks_split_and_threads_of_a_frameless_program() {
    let t = Target::start(&["run", "3"]);
    let pid = t.pid();
    let run = sample_until_exit(t, HZ);
    assert_eq!(run.code, Some(3));
    assert_eq!(run.output, "ready\ndone\n");

    let set = run.unwinder.modules();
    let mut namer = Namer::default();
    let (mut complete, mut leaves, mut by_entry) = (0, [0usize; 3], [0usize; 3]);
    let mut tids = std::collections::BTreeMap::<u32, usize>::new();
    let mut bad = Vec::new();
    for s in &run.stacks {
        let names = namer.names(set, &s.pcs);
        *tids.entry(s.tid).or_default() += 1;
        let entries = ["main", "worker_main", "late_main"];
        let entry = entries.iter().position(|e| names.iter().any(|n| n == e));
        if let Some(e) = entry.filter(|_| !s.truncated) {
            complete += 1;
            by_entry[e] += 1;
        } else if bad.len() < 5 {
            bad.push((s.truncated, names.clone()));
        }
        match names.first().map(String::as_str) {
            Some("burn_a") => leaves[0] += 1,
            Some("burn_b") => leaves[1] += 1,
            Some("burn_c") => leaves[2] += 1,
            _ => {}
        }
    }
    let n = run.stacks.len();
    // Each sample stands for its period of CPU time: together, the target's.
    let weighed: u64 = run.stacks.iter().map(|s| s.period).sum();
    let cpu_share = 100.0 * weighed as f64 / run.cpu_ns as f64;
    let burned: usize = leaves.iter().sum();
    let split = leaves.map(|l| share(l, burned));
    eprintln!(
        "{n} stacks ({cpu_share:.1}% of the target's CPU time), {} lost, complete to their thread's entry: {complete} ({:.1}%), by entry main/worker/late {by_entry:?}, \
         split a/b/c {split:.1?} of {burned}, per tid {tids:?}",
        run.lost,
        share(complete, n)
    );
    assert!(n >= 150, "{n} stacks");
    assert!((85.0..=105.0).contains(&cpu_share), "samples x period = {cpu_share:.1}% of the CPU time");
    assert!(share(complete, n) >= 95.0, "{complete}/{n} complete; e.g. {bad:#?}");
    for (got, want) in split.iter().zip([50.0, 30.0, 20.0]) {
        assert!((got - want).abs() <= 5.0, "split {split:?}");
    }
    // Main and the worker each ran the whole time; the late thread two thirds.
    assert!(share(by_entry[0], n) >= 15.0 && share(by_entry[1], n) >= 15.0, "{by_entry:?}");
    assert!(share(by_entry[2], n) >= 10.0, "late thread not followed: {by_entry:?}");
    assert!(tids.contains_key(&pid) && tids.len() == 3, "{tids:?}");
    assert!(run.tids.len() >= 3, "{:?}", run.tids);
}

#[test]
fn a_blocked_thread_gives_no_samples() {
    let t = Target::start(&["block", "1.5"]);
    let blocked: u32 = t.lines.iter().find_map(|l| l.strip_prefix("blocked ")).unwrap().parse().unwrap();
    let run = sample_until_exit(t, HZ);
    assert_eq!(run.code, Some(3));
    assert!(run.output.ends_with("ready\ndone\n"), "{}", run.output);
    assert!(run.tids.contains(&blocked), "blocked thread {blocked} had no event: {:?}", run.tids);
    let from_blocked = run.stacks.iter().filter(|s| s.tid == blocked).count();
    assert_eq!(from_blocked, 0, "a thread blocked in read() uses no CPU");
    assert!(run.stacks.len() >= 50, "{} stacks", run.stacks.len());
}

#[test]
fn a_missing_process_or_thread_is_a_clear_error() {
    let pid = 0x3fff_fff0;
    let e = ProcessSampler::attach(pid, HZ, 16 << 10).unwrap_err();
    assert!(matches!(e, Error::NoSuchProcess { pid: p } if p == pid), "{e:?}");
    assert!(e.to_string().contains(&pid.to_string()), "{e}");
    let e = ThreadSampler::open(pid, HZ, 16 << 10).unwrap_err();
    assert!(matches!(e, Error::NoSuchThread { tid } if tid == pid), "{e:?}");
    assert!(matches!(ThreadSampler::open(std::process::id(), HZ, 12), Err(Error::Config(_))));
    // The largest stack copy is accepted by the kernel.
    ThreadSampler::open(std::process::id(), HZ, osprey_perf::Config::MAX_STACK).unwrap();
}

#[test]
fn a_library_loaded_after_attach_is_unwound() {
    let t = Target::start(&["dlopen", "1.5"]);
    let run = sample_until_exit(t, HZ);
    assert_eq!(run.code, Some(3));
    let set = run.unwinder.modules();
    let in_libz = |pc: u64| set.module_for(pc).is_some_and(|m| m.path.to_string_lossy().contains("libz.so"));
    let mut namer = Namer::default();
    let (mut libz, mut through) = (0, 0);
    for s in run.stacks.iter().filter(|s| s.pcs.first().is_some_and(|&pc| in_libz(pc))) {
        libz += 1;
        let names = namer.names(set, &s.pcs);
        if !s.truncated && names.iter().any(|n| n == "zlib_loop") && names.iter().any(|n| n == "main") {
            through += 1;
        }
    }
    eprintln!(
        "{} stacks, {libz} with the leaf in libz, {through} of them complete through zlib_loop and main",
        run.stacks.len()
    );
    assert!(libz >= 100, "{libz} samples in libz");
    assert!(share(through, libz) >= 95.0, "{through}/{libz}");
}
