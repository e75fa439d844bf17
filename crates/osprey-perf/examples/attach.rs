//! Samples a running process from outside for a while and prints its
//! hottest stacks: a manual check of [`ProcessSampler`] on real programs.
//!
//! `cargo run --release -p osprey-perf --example attach -- PID [SECONDS] [HZ]`

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use osprey_perf::{ProcessSampler, Stack, Unwinder};
use osprey_unwind::scan::file_of;
use osprey_unwind::symbols::{module_offset_name, Symbols};
use osprey_unwind::ModuleSet;

fn name(set: &ModuleSet, syms: &mut HashMap<PathBuf, Symbols>, pid: u32, pc: u64, ret: bool) -> String {
    let at = if ret { pc - 1 } else { pc };
    let Some(m) = set.module_for(at) else { return format!("{pc:#x}") };
    let s = syms.entry(m.path.clone()).or_insert_with(|| {
        let root = file_of(pid, std::path::Path::new(osprey_unwind::compile::DEBUG_ROOT));
        Symbols::load_with_debug(&file_of(pid, &m.path), Some(&root)).unwrap_or_default()
    });
    match s.lookup(at - m.bias) {
        Some((n, _)) => n.to_string(),
        None => module_offset_name(&m.path, at - m.bias),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pid: u32 = args.first().and_then(|a| a.parse().ok()).expect("usage: attach PID [SECONDS] [HZ]");
    let secs: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let hz: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(99);
    let mut sampler = match ProcessSampler::attach(pid, hz, 16 << 10) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("attach: {e}");
            std::process::exit(1);
        }
    };
    let mut unwinder = Unwinder::new(pid);
    let mut stacks: Vec<Stack> = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        sampler.wait(Duration::from_millis(100)).unwrap_or(false);
        sampler.drain(&mut |s| stacks.push(unwinder.unwind(s)));
        if sampler.refresh_threads().is_err() {
            break;
        }
    }
    sampler.drain(&mut |s| stacks.push(unwinder.unwind(s)));
    let set = unwinder.modules();
    let mut syms = HashMap::new();
    let mut counts: HashMap<Vec<String>, u64> = HashMap::new();
    let mut tids: HashMap<u32, u64> = HashMap::new();
    let complete = stacks.iter().filter(|s| !s.truncated).count();
    for s in &stacks {
        *tids.entry(s.tid).or_default() += 1;
        let names: Vec<String> =
            s.pcs.iter().enumerate().map(|(i, &pc)| name(set, &mut syms, pid, pc, i > 0)).collect();
        *counts.entry(names).or_default() += 1;
    }
    let d = sampler.totals();
    println!("{} samples ({} lost), {complete} complete; per thread {tids:?}", stacks.len(), d.lost);
    let mut top: Vec<_> = counts.into_iter().collect();
    top.sort_by_key(|t| std::cmp::Reverse(t.1));
    for (names, n) in top.iter().take(8) {
        println!("{n:5}  {}", names.join(" <- "));
    }
}
