//! The chain copied at the interrupt: a thread that pushes and pops a
//! linked stack as fast as it can (each push one pointer store after its
//! node is written, as an interpreter's frames are) is copied whole and
//! consistent at every sample, where copies from outside see it torn; its
//! depth word, written right after each push or pop, is read in the same run,
//! and so are the head and depth copied by code of the test's own
//! ([`Extra`]).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use osprey_perf::bpf::{Asm, R10, R6};
use osprey_perf::chain::{Chain, ChainEnd, ChainSpec, Extra, Site};
use osprey_perf::{Config, ThreadSampler};

/// A node: its tag (the push that wrote it), its depth, the one below.
#[repr(C)]
struct Node {
    tag: u64,
    depth: u64,
    next: u64,
}

const SLOTS: usize = 40;

/// The stack's nodes live in `slots` (node of depth d in slot d), its top
/// at `head`: a push writes the node, then `head`, then `depth`; a pop
/// writes `head`, then `depth`.
#[repr(C)]
struct Stack {
    head: u64,
    depth: u64,
    slots: [Node; SLOTS],
}

/// Whether a copy (top first: address, tag, depth, next) is one the stack
/// was in: depths n..1, each node below the one above it, tags falling.
fn consistent(stack: &Stack, nodes: &[(u64, u64, u64, u64)]) -> bool {
    let slot = |d: u64| &stack.slots[d as usize] as *const Node as u64;
    nodes.first().is_none_or(|n| n.2 == nodes.len() as u64)
        && nodes.iter().all(|&(a, _, d, _)| d >= 1 && (d as usize) < SLOTS && a == slot(d))
        && nodes.windows(2).all(|w| w[0].3 == w[1].0 && w[0].1 > w[1].1 && w[0].2 == w[1].2 + 1)
}

/// Copies the stack's head and depth words (16 bytes at the chain's start)
/// into its area, through the stack.
struct HeadAndDepth;

impl Extra for HeadAndDepth {
    fn bytes(&self) -> u32 {
        24
    }
    fn emit(&self, a: &mut Asm, s: Site) {
        let done = a.label();
        a.load(osprey_perf::bpf::Size::Dw, R6, s.config, 8);
        a.read_user(R10, s.stack_low as i32, 16, R6, 0, done);
        for w in 0..2 {
            a.load(osprey_perf::bpf::Size::Dw, R6, R10, s.stack_low + 8 * w);
            a.store(osprey_perf::bpf::Size::Dw, s.entry, s.area + 8 + 8 * w, R6);
        }
        a.store_imm(osprey_perf::bpf::Size::Dw, s.entry, s.area, 1);
        a.place(done);
    }
}

#[test]
fn a_chain_copied_at_the_interrupt_is_never_torn() {
    // SAFETY: Stack is plain integers and arrays of them: all zeros is a valid value.
    let stack: &'static mut Stack = Box::leak(Box::new(unsafe { std::mem::zeroed::<Stack>() }));
    let addr = stack as *mut Stack as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicU32::new(0));
    let writer = {
        let (stop, tid) = (stop.clone(), tid.clone());
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid.store(unsafe { libc::gettid() } as u32, Ordering::SeqCst);
            let s = addr as *mut Stack;
            let (mut depth, mut tag, mut rng) = (0u64, 0u64, 0x9e37_79b9_7f4a_7c15u64);
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let up = depth == 0 || (depth + 1 < SLOTS as u64 && rng & 1 == 0);
                // SAFETY: `s` is the leaked stack, written by this thread only;
                // volatile keeps each store where the program order puts it.
                unsafe {
                    if up {
                        tag += 1;
                        let below = (*s).head;
                        let n = &raw mut (*s).slots[depth as usize + 1];
                        (&raw mut (*n).tag).write_volatile(tag);
                        (&raw mut (*n).depth).write_volatile(depth + 1);
                        (&raw mut (*n).next).write_volatile(below);
                        std::sync::atomic::compiler_fence(Ordering::SeqCst);
                        (&raw mut (*s).head).write_volatile(n as u64);
                        depth += 1;
                        (&raw mut (*s).depth).write_volatile(depth);
                    } else {
                        let top = (*s).head as *const Node;
                        (&raw mut (*s).head).write_volatile((&raw const (*top).next).read_volatile());
                        depth -= 1;
                        (&raw mut (*s).depth).write_volatile(depth);
                    }
                }
            }
        })
    };
    while tid.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    let tid = tid.load(Ordering::SeqCst);
    let spec = ChainSpec { derefs: vec![], node_bytes: 24, next: 16, max_nodes: 64 };
    let chain = Chain::load(&spec, 4, Some(&HeadAndDepth)).expect("the chain program loads (run as root)");
    let depth_at = &raw const stack.depth as u64;
    chain.watch(tid, 2, addr as u64, depth_at).expect("watch");
    let config = Config { ring_pages: Some(1), ..Config::new(5000, 8) };
    let events = ThreadSampler::open_paused(tid, &config).expect("perf event");
    events.attach(&chain).expect("attach");
    events.resume().expect("resume");
    let rd = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
    let (mut copies, mut torn, mut deep, mut last, mut marked) = (0, 0, 0, 0, 0);
    let (mut last_count, mut max_behind) = (0, 0);
    let started = std::time::Instant::now();
    while copies < 1000 && started.elapsed() < Duration::from_secs(20) {
        let Some(c) = chain.latest(2, tid) else { continue };
        if c.seq == last {
            continue;
        }
        last = c.seq;
        assert_eq!(c.end, ChainEnd::Whole);
        // The event's count at the run: the thread's CPU time, which only
        // grows, and is the event's own count of a moment ago.
        let now = events.counts().expect("the event's count").cpu_ns;
        assert!(c.count > last_count && c.count <= now, "count {} after {last_count}, event at {now}", c.count);
        (last_count, max_behind) = (c.count, max_behind.max(now - c.count));
        let nodes: Vec<_> = c.nodes.iter().map(|(a, b)| (*a, rd(b, 0), rd(b, 8), rd(b, 16))).collect();
        assert_eq!(c.top, nodes.first().map_or(0, |n| n.0));
        copies += 1;
        torn += !consistent(stack, &nodes) as u32;
        // One store behind the head at most: the interrupt may fall between the two.
        assert!(c.mark.abs_diff(nodes.len() as u64) <= 1, "depth word {} with {} nodes", c.mark, nodes.len());
        marked += (c.mark == nodes.len() as u64 && c.mark > 3) as u32;
        // The test's code ran in the same run: the same head and depth.
        let extra = (rd(&c.extra, 0), rd(&c.extra, 8), rd(&c.extra, 16));
        assert_eq!(extra, (1, c.top, c.mark), "head and depth copied by the extra code");
        deep += (nodes.len() > 3) as u32;
    }
    assert!(chain.latest(1, tid).is_none() && chain.latest(2, tid + 1).is_none(), "other slots and threads are empty");
    // The same stack copied from outside: its head, then its nodes.
    let mut outside_torn = 0;
    for _ in 0..2000 {
        let mut nodes = Vec::new();
        let mut at = read_remote(addr as u64);
        while at != 0 && nodes.len() < SLOTS {
            nodes.push((at, read_remote(at), read_remote(at + 8), read_remote(at + 16)));
            at = read_remote(at + 16);
        }
        outside_torn += !consistent(stack, &nodes) as u32;
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    eprintln!(
        "{copies} copies at the interrupt, {torn} torn, {deep} deeper than 3 ({marked} with their depth word), at most {max_behind} ns of CPU behind; {outside_torn} of 2000 torn from outside"
    );
    // One period of CPU time between runs, the thread always running.
    let period = config.period_ns();
    assert!(max_behind < 10 * period, "a copy {max_behind} ns of CPU behind the event, period {period} ns");
    assert!(marked > copies / 5, "the depth word was read with the copies: {marked} of {copies}");
    assert!(copies >= 1000, "{copies} copies in 20 s");
    assert_eq!(torn, 0);
    assert!(deep > copies / 4, "the stack was copied at many depths: {deep} of {copies}");
    assert!(outside_torn > 0, "the check sees tears from outside");
}

/// One word of this process read as another process would.
fn read_remote(at: u64) -> u64 {
    let mut v = 0u64;
    let local = libc::iovec { iov_base: (&raw mut v).cast(), iov_len: 8 };
    let remote = libc::iovec { iov_base: at as usize as *mut libc::c_void, iov_len: 8 };
    // SAFETY: writes 8 bytes into `v`.
    unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    v
}
