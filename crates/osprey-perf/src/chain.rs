//! A linked chain of user memory copied at each sampling interrupt: the
//! thread is the one the CPU was running, so nothing it writes moves during
//! the copy, and it is not stopped for it.
//!
//! A BPF program (assembled in `bpf.rs`), attached to each watched thread's
//! periodic event ([`crate::ThreadSampler::attach`]), runs at every overflow
//! on the thread's CPU. For a thread given a slot by [`Chain::watch`] it
//! reads the pointer at the slot's start address, follows
//! [`ChainSpec::derefs`], then copies up to [`ChainSpec::max_nodes`] nodes of
//! [`ChainSpec::node_bytes`], each linked to the next by the pointer at
//! [`ChainSpec::next`] (a CPython thread state's frame pointer and its
//! frames, for instance), into the slot's entry of an array mapped into
//! this process. [`Chain::latest`] reads the last complete copy. A thread
//! may also name a mark, one word read in the same run (a CPython thread
//! state's running asyncio task, for instance): the copy's frames and mark
//! are of one instant. The caller's own code ([`Extra`]) may copy more in
//! the same run, into an area of the entry it is given.
//!
//! Invariant: an entry's `seq` is odd while the program writes it and even
//! after; one thread's runs never overlap (one CPU at a time, and the
//! kernel runs one program per CPU at once). A reader that finds `seq`
//! even and unchanged around its copy has a copy of one run (x86-64 keeps
//! stores in order, and the reader's loads in order too).

use std::io;

use crate::bpf::{helper, Asm, Cond, Reg, SharedArray, Size, R0, R1, R10, R2, R3, R6, R7, R8, R9};

/// What to copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainSpec {
    /// Offsets of the pointers followed after the first: `p = *start`,
    /// then `p = *(p + off)` for each (stopping at a null pointer).
    pub derefs: Vec<u32>,
    /// Bytes copied per node (a multiple of 8, at most [`ChainSpec::MAX_NODE`]).
    pub node_bytes: u32,
    /// Where in a node the pointer to the next one is.
    pub next: u32,
    /// Nodes copied at most (at most [`ChainSpec::MAX_NODES`]).
    pub max_nodes: u32,
}

impl ChainSpec {
    /// The largest [`ChainSpec::node_bytes`].
    pub const MAX_NODE: u32 = 512;
    /// The largest [`ChainSpec::max_nodes`].
    pub const MAX_NODES: u32 = 512;
    /// The most [`ChainSpec::derefs`].
    pub const MAX_DEREFS: usize = 4;
}

/// A thread's entry in the config map: `slot: u32, pad: u32, start: u64,
/// mark: u64` (0: none).
const CONFIG: usize = 24;
/// A copy's header: `seq: u32, tid: u32, n: u32, end: u32, time: u64, top:
/// u64, mark: u64, count: u64`.
const HEAD: usize = 48;

/// Code of the caller's run in the program, after the mark and before the
/// chain, to copy more of the thread's memory in the same run.
pub trait Extra {
    /// Bytes of the entry it writes (a multiple of 8, at most
    /// [`Extra::MAX_BYTES`]); the first word is zeroed before it runs.
    fn bytes(&self) -> u32;
    /// Emits the code. It must fall through at its end (every jump to a
    /// label it places), leave [`Site::config`] and [`Site::entry`] as they
    /// were, write the entry only in its area, and use the stack only in
    /// `[Site::stack_low, Site::stack_high)`; it may clobber R0-R6 and R9.
    fn emit(&self, a: &mut Asm, site: Site);
}

impl dyn Extra {
    /// The largest [`Extra::bytes`].
    pub const MAX_BYTES: u32 = 1024;
}

/// Where [`Extra::emit`]'s code runs.
#[derive(Clone, Copy, Debug)]
pub struct Site {
    /// The thread's config entry: the chain's start address at +8, the
    /// mark's at +16.
    pub config: Reg,
    /// The copy's entry.
    pub entry: Reg,
    /// Where in the entry the extra area is.
    pub area: i16,
    /// The lowest stack offset (from R10) the code may use.
    pub stack_low: i16,
    /// The stack offset (from R10) above what the code may use.
    pub stack_high: i16,
}

/// How a copy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainEnd {
    /// At a null pointer: the whole chain.
    Whole,
    /// After [`ChainSpec::max_nodes`].
    Full,
    /// A pointer or node could not be read (not mapped, or not resident:
    /// the program cannot fault pages in).
    Fault,
}

/// One copy.
#[derive(Debug)]
pub struct Copied {
    /// The run's number in its slot (increasing).
    pub seq: u32,
    /// When the program ran (`CLOCK_MONOTONIC`, ns).
    pub time_ns: u64,
    /// The event's count then ([`crate::Counts::cpu_ns`] of the thread's
    /// [`crate::ThreadSampler`]: its CPU time); 0 if it could not be read.
    pub count: u64,
    /// The first node's address (0: the chain was empty).
    pub top: u64,
    /// The word at the thread's mark address in the same run (0 if it has
    /// none or it could not be read).
    pub mark: u64,
    /// Each node copied, first to last: its address and bytes.
    pub nodes: Vec<(u64, Vec<u8>)>,
    /// What [`Extra`]'s code wrote in the same run (empty without one).
    pub extra: Vec<u8>,
    /// Why the copy ended there.
    pub end: ChainEnd,
}

/// The program, the threads it watches, and their copies.
pub struct Chain {
    spec: ChainSpec,
    extra: usize,
    config: crate::bpf::HashMap,
    out: SharedArray,
    slots: u32,
    prog: std::os::fd::OwnedFd,
}

impl Chain {
    /// Loads the program for `spec`, `extra`'s code in it, with room for
    /// `slots` threads at once. Needs CAP_BPF and CAP_PERFMON (or root); an
    /// error says why the kernel refused.
    pub fn load(spec: &ChainSpec, slots: u32, extra: Option<&dyn Extra>) -> io::Result<Chain> {
        let extra_bytes = extra.map_or(0, |e| e.bytes());
        if spec.node_bytes == 0
            || spec.node_bytes % 8 != 0
            || spec.node_bytes > ChainSpec::MAX_NODE
            || spec.next + 8 > spec.node_bytes
            || spec.max_nodes == 0
            || spec.max_nodes > ChainSpec::MAX_NODES
            || spec.derefs.len() > ChainSpec::MAX_DEREFS
            || spec.derefs.iter().any(|&d| d > i32::MAX as u32)
            || slots == 0
            || extra_bytes % 8 != 0
            || extra_bytes > <dyn Extra>::MAX_BYTES
            || (extra.is_some() && extra_bytes == 0)
        {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid chain: {spec:?}")));
        }
        let config = crate::bpf::HashMap::create("osprey_watch", CONFIG as u32, slots)?;
        let entry = HEAD + extra_bytes as usize + spec.max_nodes as usize * (8 + spec.node_bytes as usize);
        let out = SharedArray::create("osprey_chain", entry, slots)?;
        let prog = crate::bpf::load("osprey_chain", &program(spec, extra, config.fd(), out.fd()).finish())?;
        Ok(Chain { spec: spec.clone(), extra: extra_bytes as usize, config, out, slots, prog })
    }

    /// The program's descriptor, for [`crate::ThreadSampler::attach`].
    pub(crate) fn prog_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.prog.as_raw_fd()
    }

    /// From now on, each run on thread `tid` copies the chain whose first
    /// pointer is at `start` into `slot` (below the `slots` loaded), and
    /// the word at `mark` (0: none) with it. Called again for a watched
    /// thread, it changes what is copied from its next run on.
    pub fn watch(&self, tid: u32, slot: u32, start: u64, mark: u64) -> io::Result<()> {
        if slot >= self.slots {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "chain slot out of range"));
        }
        let mut b = [0u8; CONFIG];
        b[0..4].copy_from_slice(&slot.to_ne_bytes());
        b[8..16].copy_from_slice(&start.to_ne_bytes());
        b[16..24].copy_from_slice(&mark.to_ne_bytes());
        self.config.set(tid, &b)
    }

    /// Runs on thread `tid` copy nothing any more.
    pub fn unwatch(&self, tid: u32) {
        self.config.remove(tid);
    }

    /// The last complete copy in `slot` made on thread `tid`, if any.
    pub fn latest(&self, slot: u32, tid: u32) -> Option<Copied> {
        let slot = slot as usize;
        if slot >= self.slots as usize {
            return None;
        }
        let stride = 8 + self.spec.node_bytes as usize;
        for _ in 0..4 {
            let w0 = self.out.word(slot, 0);
            let seq = w0 as u32;
            if seq == 0 || seq % 2 == 1 || (w0 >> 32) as u32 != tid {
                if seq % 2 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                return None;
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let w1 = self.out.word(slot, 8);
            let n = ((w1 as u32) as usize).min(self.spec.max_nodes as usize);
            let end = match (w1 >> 32) as u32 {
                1 => ChainEnd::Whole,
                2 => ChainEnd::Full,
                _ => ChainEnd::Fault,
            };
            let [time_ns, top, mark, count] = [16, 24, 32, 40].map(|at| self.out.word(slot, at));
            let mut extra = vec![0u8; self.extra];
            self.out.copy(slot, HEAD, &mut extra);
            let mut raw = vec![0u8; n * stride];
            self.out.copy(slot, HEAD + self.extra, &mut raw);
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            if self.out.word(slot, 0) as u32 != seq {
                continue;
            }
            let nodes = raw
                .chunks_exact(stride)
                .map(|c| (u64::from_ne_bytes(c[..8].try_into().unwrap_or_default()), c[8..].to_vec()))
                .collect();
            return Some(Copied { seq, time_ns, count, top, mark, nodes, extra, end });
        }
        None
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("spec", &self.spec).field("slots", &self.slots).finish()
    }
}

/// Stack bytes [`Extra`]'s code may use.
const EXTRA_STACK: i16 = 256;

/// The program. Registers: r6 the thread id, then the nodes copied; r7
/// the thread's config, then where the next node goes; r8 its entry; r9
/// the pointer followed. Stack: the map keys at r10-4 and r10-8, a pointer
/// read at r10-16; 16 bytes in all, and [`EXTRA_STACK`] below for `extra`
/// (whose top 24 bytes hold the event's value until the entry is found).
///
/// Each node's offset in the entry is a constant per loop iteration (the
/// verifier walks the bounded loop iteration by iteration), so every write
/// is proved inside the value; the loop runs at most `max_nodes` times.
fn program(spec: &ChainSpec, extra: Option<&dyn Extra>, config_fd: i32, out_fd: i32) -> Asm {
    let mut a = Asm::default();
    let (quit, fault, done, full, next, close) = (a.label(), a.label(), a.label(), a.label(), a.label(), a.label());
    // While r1 is the context: the event's count, the thread's CPU time.
    const VALUE: i16 = -40;
    a.mov(R2, R10);
    a.add_imm(R2, VALUE as i32);
    a.mov_imm(R3, 24);
    a.call(helper::PERF_PROG_READ_VALUE);
    a.call(helper::GET_CURRENT_PID_TGID);
    a.mov32(R6, R0);
    a.store(Size::W, R10, -4, R6);
    a.lookup(config_fd, -4, quit);
    a.mov(R7, R0);
    a.load(Size::W, R1, R7, 0);
    a.store(Size::W, R10, -8, R1);
    a.lookup(out_fd, -8, quit);
    a.mov(R8, R0);
    // seq odd: being written.
    a.load(Size::W, R1, R8, 0);
    a.add_imm(R1, 1);
    a.store(Size::W, R8, 0, R1);
    a.store(Size::W, R8, 4, R6);
    a.mov_imm(R6, 0);
    a.store(Size::Dw, R8, 24, R6);
    a.call(helper::KTIME_GET_NS);
    a.store(Size::Dw, R8, 16, R0);
    a.load(Size::Dw, R1, R10, VALUE);
    a.store(Size::Dw, R8, 40, R1);
    // The mark: zero where there is none or it cannot be read (the helper
    // zeroes its destination on a fault).
    let no_mark = a.label();
    a.store_imm(Size::Dw, R8, 32, 0);
    a.load(Size::Dw, R3, R7, 16);
    a.jump_if(Cond::Eq, R3, 0, no_mark);
    a.mov(R1, R8);
    a.add_imm(R1, 32);
    a.mov_imm(R2, 8);
    a.call(helper::PROBE_READ_USER);
    a.place(no_mark);
    if let Some(e) = extra {
        a.store_imm(Size::Dw, R8, HEAD as i16, 0);
        let site = Site { config: R7, entry: R8, area: HEAD as i16, stack_low: -16 - EXTRA_STACK, stack_high: -16 };
        e.emit(&mut a, site);
        a.mov_imm(R6, 0);
    }
    let nodes_at = HEAD as i32 + extra.map_or(0, |e| e.bytes() as i32);
    a.load(Size::Dw, R9, R7, 8);
    // The first pointer, then the derefs.
    let read_ptr = |a: &mut Asm, off: i32| {
        a.read_user(R10, -16, 8, R9, off, fault);
        a.load(Size::Dw, R9, R10, -16);
    };
    read_ptr(&mut a, 0);
    for &d in &spec.derefs {
        a.jump_if(Cond::Eq, R9, 0, done);
        read_ptr(&mut a, d as i32);
    }
    a.store(Size::Dw, R8, 24, R9);
    a.mov(R7, R8);
    a.add_imm(R7, nodes_at);
    let stride = 8 + spec.node_bytes as i32;
    a.place(next);
    a.jump_if(Cond::Eq, R9, 0, done);
    a.jump_if(Cond::Ge, R6, spec.max_nodes as i32, full);
    a.store(Size::Dw, R7, 0, R9);
    a.read_user(R7, 8, spec.node_bytes as i32, R9, 0, fault);
    a.load(Size::Dw, R9, R7, 8 + spec.next as i16);
    a.add_imm(R6, 1);
    a.add_imm(R7, stride);
    a.jump(next);
    a.place(full);
    a.store_imm(Size::W, R8, 12, 2);
    a.jump(close);
    a.place(done);
    a.store_imm(Size::W, R8, 12, 1);
    a.jump(close);
    a.place(fault);
    a.store_imm(Size::W, R8, 12, 3);
    // n, then seq even: written.
    a.place(close);
    a.store(Size::W, R8, 8, R6);
    a.load(Size::W, R1, R8, 0);
    a.add_imm(R1, 1);
    a.store(Size::W, R8, 0, R1);
    // Zero: the event writes no sample of its own.
    a.place(quit);
    a.mov_imm(R0, 0);
    a.exit();
    a
}
