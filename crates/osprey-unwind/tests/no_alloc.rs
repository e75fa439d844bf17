//! The handler's path (enter the module set, unwind, leave) never allocates:
//! a counting global allocator sees no allocation during walks over real
//! stacks, garbage and truncation.

use osprey_testkit::unwind as fixture;
use osprey_unwind::{unwind, CopiedStack, Regs};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, SeqCst);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, SeqCst);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn walks_do_not_allocate() {
    fixture::lib();
    let shared = fixture::refresh();
    let pcs: Vec<u64> = shared.read(|s| s.modules().iter().map(|m| (m.start + m.end) / 2).collect()).unwrap();
    let mut bytes = vec![0u8; 8192];
    for (i, w) in bytes.chunks_mut(8).enumerate() {
        w.copy_from_slice(&pcs[i % pcs.len()].to_le_bytes());
    }
    let stack = CopiedStack { base: 0x10000, bytes: &bytes };
    let mut frames = [0u64; 64];
    let mut lens = 0usize;
    let before = ALLOCS.load(SeqCst);
    for (i, &pc) in pcs.iter().cycle().take(10_000).enumerate() {
        let regs = Regs { pc, sp: 0x10000 + (i as u64 % 1000) * 8, fp: 0x10000 + (i as u64 % 500) * 16 };
        lens += shared.read(|s| unwind(s, regs, |a| stack.read(a), &mut frames).len).unwrap_or(0);
    }
    assert_eq!(ALLOCS.load(SeqCst) - before, 0, "the unwind path allocated");
    assert!(lens > 10_000, "walks went past the leaf: {lens}");
    // The counter works: an allocation is seen.
    std::hint::black_box(vec![1u8; 16]);
    assert!(ALLOCS.load(SeqCst) > before);
}
