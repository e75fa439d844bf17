//! [`TreeSampler`]: a child and everything it starts, sampled through
//! inherited per-CPU events: each process's exec, mappings, exit and CPU
//! time at exit come through the rings, and this process is never sampled.

mod common;
use common::*;

use osprey_perf::{Config, Images, Record, TreeSampler};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

/// What the records said of one process.
#[derive(Default, Debug)]
struct Seen {
    execs: Vec<String>,
    files: BTreeSet<String>,
    exits: u32,
    cpu_ns: u64,
    samples: u64,
    forked_by: Option<u32>,
}

fn run_and_collect(script: &str) -> (BTreeMap<u32, Seen>, u32, f64) {
    let mut tree = TreeSampler::open(&Config::new(1000, 8 << 10)).expect("perf_event_open");
    let before = cpu_of_children();
    let mut child = Command::new("sh").args(["-c", script]).spawn().expect("sh");
    let root = child.id();
    let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
    let mut collect = |r: Record<'_>| match r {
        Record::Sample(s) => seen.entry(s.pid).or_default().samples += 1,
        Record::Comm(c) if c.exec => {
            seen.entry(c.pid).or_default().execs.push(String::from_utf8_lossy(c.name).into_owned())
        }
        Record::Mmap(m) => {
            seen.entry(m.pid).or_default().files.insert(String::from_utf8_lossy(m.path).into_owned());
        }
        Record::Task(t) if t.exit && t.pid == t.tid => seen.entry(t.pid).or_default().exits += 1,
        Record::Task(t) if !t.exit && t.pid != t.ppid => seen.entry(t.pid).or_default().forked_by = Some(t.ppid),
        Record::Read(r) => seen.entry(r.pid).or_default().cpu_ns += r.value,
        _ => {}
    };
    loop {
        let _ = tree.wait(Duration::from_millis(20));
        tree.drain(false, &mut collect);
        if child.try_wait().unwrap().is_some() {
            break;
        }
    }
    tree.drain(true, &mut collect);
    let cpu = cpu_of_children() - before;
    assert_eq!(tree.counts().lost, 0, "records lost");
    (seen, root, cpu)
}

/// User + system CPU of the reaped children, in seconds.
fn cpu_of_children() -> f64 {
    // SAFETY: `u` is a valid rusage to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(u.ru_utime) + s(u.ru_stime)
}

#[test]
fn a_shell_loop_of_short_processes_is_seen_whole() {
    let (seen, root, cpu) = run_and_collect("for i in $(seq 50); do /bin/true; done");
    assert!(!seen.contains_key(&std::process::id()), "this process was sampled: {:?}", seen[&std::process::id()]);
    let trues: Vec<&Seen> = seen.values().filter(|s| s.execs.iter().any(|e| e == "true")).collect();
    assert_eq!(trues.len(), 50, "{seen:#?}");
    for t in &trues {
        assert_eq!(t.exits, 1, "{t:?}");
        assert!(t.files.iter().any(|f| f.ends_with("/true")), "the executable's mapping: {t:?}");
        assert!(t.files.iter().any(|f| f.contains("libc.so")), "libc's mapping: {t:?}");
        assert!(t.cpu_ns > 0, "CPU at exit: {t:?}");
    }
    let sh = &seen[&root];
    assert_eq!(sh.execs, ["sh"], "{sh:?}");
    assert!(trues.iter().all(|t| t.forked_by == Some(root)), "forked by the shell");
    // Every process's CPU comes at its exit: the counts add up to what
    // the kernel charged the reaped tree.
    let counted = seen.values().map(|s| s.cpu_ns).sum::<u64>() as f64 / 1e9;
    assert!((counted - cpu).abs() <= 0.2 * cpu + 0.005, "counted {counted:.4} s, rusage {cpu:.4} s");
}

#[test]
fn a_busy_child_is_sampled_at_its_rate() {
    let (seen, root, _) = run_and_collect("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done");
    let sh = &seen[&root];
    let ms = sh.cpu_ns / 1_000_000;
    // 1000 Hz of its CPU: a sample a millisecond, never more; a timer that
    // fires late skips the periods it missed (a few in a hundred in a VM).
    assert!(ms >= 50, "the loop ran {ms} ms");
    assert!(sh.samples <= ms && sh.samples * 100 >= ms * 90, "{} samples for {ms} ms", sh.samples);
}

/// A frameless program's threads, unwound from the side-band records alone
/// (no `/proc` read of the target): stacks complete to each thread's entry,
/// the 50/30/20 split, the threads' names.
#[test]
fn stacks_of_a_frameless_program_from_the_records() {
    let mut tree = TreeSampler::open(&Config::new(999, 16 << 10)).expect("perf_event_open");
    let t = Target::start(&["run", "2"]);
    let pid = t.pid();
    let mut images = Images::default();
    let mut stacks = Vec::new();
    drain_until_exit(&mut tree, &t, &mut |r| match r {
        Record::Sample(s) if s.pid == pid => stacks.push(images.unwind(&s)),
        Record::Mmap(m) => images.mmap(&m),
        Record::Comm(c) => images.comm(&c),
        Record::Task(t) => images.task(&t),
        _ => {}
    });
    let (code, _, _) = t.finish();
    assert_eq!(code, Some(3));
    assert!(images.process_name(pid).starts_with("split-"), "{}", images.process_name(pid));
    let set = images.modules(pid);
    let mut namer = Namer::default();
    let (mut complete, mut leaves, mut bad) = (0, [0usize; 3], Vec::new());
    for s in &stacks {
        let names = namer.names(&set, &s.pcs);
        if !s.truncated && ["main", "worker_main", "late_main"].iter().any(|e| names.iter().any(|n| n == e)) {
            complete += 1;
        } else if bad.len() < 5 {
            bad.push(names.clone());
        }
        match names.first().map(String::as_str) {
            Some("burn_a") => leaves[0] += 1,
            Some("burn_b") => leaves[1] += 1,
            Some("burn_c") => leaves[2] += 1,
            _ => {}
        }
    }
    let n = stacks.len();
    assert!(n >= 150, "{n} stacks");
    assert!(complete * 100 >= n * 95, "{complete}/{n} complete; e.g. {bad:#?}");
    let burned: usize = leaves.iter().sum();
    for (got, want) in leaves.iter().zip([50.0, 30.0, 20.0]) {
        let got = 100.0 * *got as f64 / burned as f64;
        assert!((got - want).abs() <= 5.0, "split {leaves:?}");
    }
}

/// Mapping records lost (a ring that overflowed drops them with the
/// samples): the process's map, read from `/proc` while it lives, stands
/// in for them.
#[test]
fn lost_mapping_records_are_filled_from_proc() {
    let mut tree = TreeSampler::open(&Config::new(999, 16 << 10)).expect("perf_event_open");
    let t = Target::start(&["run", "1"]);
    let pid = t.pid();
    let mut images = Images::default();
    let mut samples = 0;
    let mut complete = 0;
    let mut filled = false;
    drain_until_exit(&mut tree, &t, &mut |r| match r {
        Record::Comm(c) => images.comm(&c),
        Record::Task(t) => images.task(&t),
        Record::Sample(s) if s.pid == pid => {
            if !filled {
                filled = images.fill_from_proc(pid);
            }
            let st = images.unwind(&s);
            samples += 1;
            complete += usize::from(!st.truncated);
        }
        // Every mapping record dropped.
        _ => {}
    });
    let _ = t.finish();
    assert!(filled, "the map read from /proc");
    assert!(samples >= 50, "{samples} samples");
    assert!(complete * 100 >= samples * 90, "{complete} of {samples} complete");
}

/// Passes `tree`'s records to `f` until `t` has exited, then the rest.
fn drain_until_exit(tree: &mut TreeSampler, t: &Target, f: &mut dyn FnMut(Record<'_>)) {
    while !t.exited() {
        let _ = tree.wait(Duration::from_millis(50));
        tree.drain(false, f);
    }
    tree.drain(true, f);
}
