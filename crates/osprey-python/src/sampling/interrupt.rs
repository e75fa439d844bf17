//! Running threads' frames copied at their sampling interrupts.
//!
//! Read from outside, a running thread's stack moves while it is copied:
//! calls shorter than the copy (a microsecond or so) are charged to their
//! callers or neighbours. Stopping the thread (`--blocking`) costs it a
//! stop per sample. Instead, each running thread gets a perf event that
//! fires every half sampling interval of its CPU time, and a BPF program
//! ([`osprey_perf::chain`]) run at that interrupt, on the thread's CPU
//! while it is interrupted, copies its frame pointer and frame chain: the
//! stack of that instant, as a stopped reader sees it. A pass uses the
//! thread's latest copy.
//!
//! The events run freely: arming one per sample (an IPI to the thread's
//! CPU, then a sample 10 µs of its CPU later) put 10-20 points more of a
//! call-heavy loop in the loop itself and less in allocation, whatever the
//! interpreter (docs/design/python-reader.md).
//!
//! Needs root (CAP_BPF and CAP_PERFMON). Where the program cannot be
//! loaded, a thread's event opened, or its latest copy is older than
//! [`MAX_AGE`] intervals (it waited for a CPU: its Python stack did not
//! move meanwhile), the stack is read from outside. So it is in a process
//! whose spans are read (the sampler decides): spans are read at the pass,
//! and a copy from before could pair a stack with a span it did not run
//! in, unless the span was copied in the same run too
//! ([`crate::sampling::span_copy`]). A thread's running asyncio task is a
//! single word of its thread state: it is copied in the same run as the
//! frames (the chain's mark), so a copy's stack and task are of one instant.

use std::collections::HashMap;

use osprey_perf::chain::{Chain, ChainEnd, ChainSpec, Copied};
use osprey_perf::{Config, ThreadSampler};

use crate::layout::Layout;
use crate::sampling::span_copy::{CopiedSpan, Recipe, SpanCode};
use crate::target::Target;

/// Frames copied at most per sample; a deeper stack's outer frames are
/// read from outside, after the copy.
const MAX_FRAMES: u32 = 256;
/// Threads watched at once, at most (the others are read from outside).
const SLOTS: u32 = 256;
/// Copies per sampling interval of a thread's CPU time.
const COPIES_PER_INTERVAL: u32 = 2;
/// A copy older than this many sampling intervals of the thread's CPU time
/// is not used (of wall time where that cannot be read). A thread waiting
/// for a CPU does not move: its copy stays exact however long it waits.
const MAX_AGE: u64 = 2;

/// What the copies did.
#[derive(Clone, Copy, Debug, Default)]
pub struct InterruptStats {
    /// Stacks read from a copy made at the interrupt.
    pub copied: u64,
    /// Running threads read from outside: no copy recent enough.
    pub missed: u64,
    /// Copies cut short by memory the program could not read (the rest
    /// read from outside).
    pub faults: u64,
}

/// A copy (see [`Interrupt::copy`]).
pub struct Frames {
    /// The innermost frame's address.
    pub top: u64,
    /// The frames (address, bytes) from it outwards.
    pub frames: Vec<(u64, Vec<u8>)>,
    /// The mark word read with them.
    pub mark: u64,
    /// The OpenTelemetry span the thread was in then.
    pub span: CopiedSpan,
}

/// One watched thread.
struct Watched {
    /// None where it could not be opened: read from outside.
    events: Option<ThreadSampler>,
    slot: u32,
    tstate: u64,
    /// The address whose word is copied with the frames (0: none).
    mark: u64,
    /// Copies from before this (a new thread state) are not used.
    since_ns: u64,
}

/// The program and each running thread's event.
pub struct Interrupt {
    chain: Chain,
    /// The span code in the program (None: it could not be loaded).
    spans: Option<SpanCode>,
    /// Why the span code is not in the program.
    pub spans_error: Option<String>,
    /// Where the frame pointer is in a thread state.
    tstate_frame: u64,
    threads: HashMap<i32, Watched>,
    free: Vec<u32>,
    /// The sampling interval (ns).
    interval_ns: u64,
    /// What the copies did so far.
    pub stats: InterruptStats,
    /// Why the last thread's event could not be opened or attached.
    pub error: Option<String>,
}

impl Interrupt {
    /// Loads the program for the interpreter's frame layout, for samples
    /// every `interval_ns`.
    pub fn new(l: &Layout, interval_ns: u64) -> Result<Interrupt, String> {
        let spec = ChainSpec {
            derefs: l.cframe_current_frame.map(|o| o as u32).into_iter().collect(),
            node_bytes: u32::try_from(l.frame_size_to_read.div_ceil(8) * 8).unwrap_or(u32::MAX),
            next: l.frame_previous as u32,
            max_nodes: MAX_FRAMES,
        };
        let with_spans = SpanCode::new(l).map_err(|e| format!("bpf map: {e}")).and_then(|code| {
            let chain = Chain::load(&spec, SLOTS, Some(&code)).map_err(|e| format!("bpf (with spans): {e}"))?;
            Ok((chain, code))
        });
        let (chain, spans, spans_error) = match with_spans {
            Ok((chain, code)) => (chain, Some(code), None),
            Err(e) => (Chain::load(&spec, SLOTS, None).map_err(|e| format!("bpf: {e}"))?, None, Some(e)),
        };
        Ok(Interrupt {
            chain,
            spans,
            spans_error,
            tstate_frame: l.tstate_frame,
            threads: HashMap::new(),
            free: (0..SLOTS).rev().collect(),
            interval_ns: interval_ns.max(1),
            stats: Default::default(),
            error: None,
        })
    }

    /// What the span code compares with from the next interrupts on.
    pub fn publish(&mut self, r: &Recipe) {
        if let Some(code) = self.spans.as_mut() {
            if let Err(e) = code.publish(r) {
                self.spans_error = Some(format!("bpf map: {e}"));
                self.spans = None;
            }
        }
    }

    /// The last copy [`Interrupt::copy`] gave was not used (its span was
    /// not known): the thread was read from outside.
    pub fn set_aside(&mut self) {
        self.stats.copied = self.stats.copied.saturating_sub(1);
        self.stats.missed += 1;
    }

    /// Stops watching threads not in `tids`.
    pub fn retain_threads(&mut self, tids: &[i32]) {
        let gone: Vec<i32> = self.threads.keys().filter(|t| !tids.contains(t)).copied().collect();
        for tid in gone {
            self.forget(tid);
        }
    }

    fn forget(&mut self, tid: i32) {
        if let Some(w) = self.threads.remove(&tid) {
            self.chain.unwatch(tid as u32);
            self.free.push(w.slot);
        }
    }

    /// Starts watching thread `tid` (its state at `tstate`), the word at
    /// `mark` copied with its frames.
    fn watch(&mut self, tid: i32, tstate: u64, mark: u64) -> Option<&mut Watched> {
        let slot = self.free.pop()?;
        let start = tstate + self.tstate_frame;
        let hz = (1_000_000_000 / self.interval_ns).clamp(1, 10_000) as u32 * COPIES_PER_INTERVAL;
        // In the kernel too (a system call, a page fault): the Python stack
        // is as consistent there, and the copies then cover all of the
        // thread's CPU time, as a stopped reader's samples do.
        let config = Config { ring_pages: Some(1), include_kernel: true, ..Config::new(hz, 8) };
        let open = |c: &Config| ThreadSampler::open_paused(tid as u32, c);
        let opened = self
            .chain
            .watch(tid as u32, slot, start, mark)
            .map_err(|e| format!("bpf map: {e}"))
            .and_then(|()| {
                open(&config).or_else(|_| open(&Config { include_kernel: false, ..config })).map_err(|e| e.to_string())
            })
            .and_then(|s| s.attach(&self.chain).and_then(|()| s.resume()).map(|()| s).map_err(|e| e.to_string()));
        let events = opened.map_err(|e| self.error = Some(e)).ok();
        let w = Watched { events, slot, tstate, mark, since_ns: osprey_perf::now_ns() };
        Some(self.threads.entry(tid).insert_entry(w).into_mut())
    }

    /// Running thread `tid`'s frames (its state at `tstate`) as copied at
    /// its latest interrupt, with the word at `mark` (0: none) read in the
    /// same run, and its span; None if there is no recent copy. A new `mark`
    /// is copied from the next interrupt on: until then there is no copy.
    pub fn copy(&mut self, t: &Target, tid: i32, tstate: u64, mark: u64) -> Option<Frames> {
        if self.threads.get(&tid).is_some_and(|w| w.tstate != tstate) {
            self.forget(tid);
        }
        if !self.threads.contains_key(&tid) {
            self.watch(tid, tstate, mark)?;
        }
        let w = self.threads.get_mut(&tid)?;
        if w.mark != mark {
            let start = tstate + self.tstate_frame;
            self.chain.watch(tid as u32, w.slot, start, mark).ok()?;
            (w.mark, w.since_ns) = (mark, osprey_perf::now_ns());
        }
        let events = w.events.as_ref()?;
        let (slot, since, max_age) = (w.slot, w.since_ns, MAX_AGE * self.interval_ns);
        let wall_fresh = osprey_perf::now_ns().saturating_sub(max_age);
        // A thread's CPU time grows no faster than the wall clock: a copy
        // young by the wall clock is young by CPU time too, and only an
        // older one costs a read of the event's count (the thread's CPU
        // time now, on the clock the copy noted its own on).
        let fresh = |c: &Copied| {
            c.time_ns >= since
                && (c.time_ns >= wall_fresh
                    || c.count != 0 && events.counts().is_ok_and(|now| now.cpu_ns.saturating_sub(c.count) <= max_age))
        };
        let Some(c) = self.chain.latest(slot, tid as u32).filter(fresh) else {
            self.stats.missed += 1;
            return None;
        };
        self.stats.faults += (c.end == ChainEnd::Fault) as u64;
        if c.top == 0 && c.end == ChainEnd::Fault {
            // Not even the frame pointer could be read.
            return None;
        }
        self.stats.copied += 1;
        let span = self.spans.as_ref().map_or(CopiedSpan::Unknown, |code| code.decode(t, &c.extra));
        Some(Frames { top: c.top, frames: c.nodes, mark: c.mark, span })
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        // The events go before the program and maps they run.
        self.threads.clear();
    }
}
