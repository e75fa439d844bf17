//! Allocation profiles of a Rust program through `osprey::alloc::Sampling`:
//! what a function keeps is its in-use space, what it frees is not.

use std::alloc::System;
use std::hint::black_box;

#[global_allocator]
static A: osprey::alloc::Sampling<System> = osprey::alloc::Sampling::new(System);

const BLOCK: usize = 4096;
const KEPT: usize = 16 << 10; // blocks: 64 MiB

#[inline(never)]
fn keep_rust(out: &mut Vec<Vec<u8>>) {
    for _ in 0..KEPT {
        out.push(black_box(vec![1u8; BLOCK]));
        if out.len() % 2048 == 0 {
            // About 125 samples per 8 MiB: within a ring between two drains.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[inline(never)]
fn churn_rust() {
    for i in 0..(256 << 20) / BLOCK {
        drop(black_box(vec![1u8; BLOCK]));
        if i % 2048 == 2047 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// 64 MiB kept in 4 KiB blocks at a 64 KiB mean: about 990 samples, a
/// relative standard deviation of 3.1%; the bound is 5 of those.
#[test]
fn inuse_space_of_a_rust_program() {
    let dir = std::env::temp_dir().join(format!("osprey-alloc-global-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).alloc(true).alloc_interval(64 << 10).start().unwrap();
    // The collector compiles the unwind tables first.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut kept = Vec::with_capacity(KEPT);
    keep_rust(&mut kept);
    churn_rust();
    let file = p.flush().unwrap().expect("a profile");
    drop(p);
    let prof = osprey_pprof::read_profile(&file).unwrap();
    let cum = |ty: &str, name: &str| -> f64 {
        let s = osprey_pprof::summarize(std::slice::from_ref(&prof), Some(ty)).unwrap();
        s.functions.iter().filter(|f| f.name.ends_with(name)).map(|f| f.cum as f64).sum()
    };
    let want = (KEPT * BLOCK) as f64;
    let (inuse, churn_inuse, churn) =
        (cum("inuse-space", "keep_rust"), cum("inuse-space", "churn_rust"), cum("alloc-space", "churn_rust"));
    eprintln!(
        "keep_rust in use {:.1} MiB, churn_rust in use {churn_inuse} allocated {:.1} MiB",
        inuse / 1048576.0,
        churn / 1048576.0
    );
    let a = &osprey::internals::alloc::ALLOC;
    let r = std::sync::atomic::Ordering::Relaxed;
    eprintln!(
        "sampled {} lost: unregistered {} re-entered {} live set full {}",
        a.sampled.load(r),
        a.lost_unrecorded.load(r),
        a.lost_reentered.load(r),
        osprey::internals::alloc::LIVE.full.load(r)
    );
    let p = 1.0 - f64::exp(-(BLOCK as f64) / 65536.0);
    let sd = ((1.0 - p) / (KEPT as f64 * p)).sqrt();
    assert!((inuse / want - 1.0).abs() <= 5.0 * sd, "keep_rust in use {inuse} vs {want}");
    assert_eq!(churn_inuse, 0.0, "churn_rust keeps nothing");
    assert!((churn / (256u64 << 20) as f64 - 1.0).abs() < 0.1, "churn_rust allocated {churn}");
    drop(kept);
}
