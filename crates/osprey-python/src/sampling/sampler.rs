//! One sampling pass over all threads of the target.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use osprey_pprof::Frame;

use super::otel_context::Changed;
use super::thread_state::{classify, State};
use crate::error::Error;
use crate::remote::kernel_thread::{ProcFiles, Sys};
use crate::remote::process::{is_our_child, process_alive, uptime};
use crate::remote::thread_cpu::{RunTime, TaskClock};
use crate::sampling::otel_context::SpanIds;
use crate::target::thread_states::{Method, ThreadStateMap};
use crate::target::Target;
use crate::walk::{read_copied, read_stack, End, Stack, Walks};

/// One thread's sample.
#[derive(Clone, Debug)]
pub struct ThreadSample {
    pub tid: i32,
    /// The Python thread name where one is known, else the OS thread name.
    pub name: String,
    pub state: State,
    /// CPU (ns) charged to this sample before the aggregator scales it to
    /// the thread's (or the process's) CPU clock: the wall time since the
    /// previous pass, times the part of the stack read the thread spent on a
    /// CPU (see docs/design/python-walk.md, "CPU charges").
    pub cpu_ns: i64,
    /// Address of the thread's `PyThreadState` (shown by `Debug`).
    #[allow(dead_code)]
    pub tstate: u64,
    pub frames: Vec<Frame>,
    /// Why the stack ends in a `[truncated]` frame, if it does.
    pub truncated: Option<End>,
    /// The thread's CPU time (ns, its [`RunTime`], counted from when the
    /// sampler first saw it, or from its start for a young thread), read
    /// after the stack.
    pub thread_cpu: Option<u64>,
    /// Nanoseconds of GIL wait this sample accounts for (see [`crate::sampling::gilwait`]).
    pub gil_wait_ns: i64,
    /// The asyncio task the thread runs (3.14+, see [`crate::sampling::asyncio`]).
    pub task: Option<String>,
    /// The OpenTelemetry span the thread is in (see [`crate::sampling::otel_context`]).
    pub span: Option<crate::sampling::otel_context::SpanIds>,
}

#[derive(Default, Clone, Debug)]
pub struct Stats {
    pub passes: u64,
    pub samples: u64,
    /// Samples kept with a `[truncated]` frame (any reason), and those of
    /// them whose frame chain looped.
    pub torn: u64,
    pub cycles: u64,
    pub retries: u64,
    pub threads_seen: HashSet<i32>,
}

pub struct Sampler {
    pub target: Target,
    pub disc: ThreadStateMap,
    pub walks: Walks,
    procs: ProcFiles,
    pub method: Option<Method>,
    tids: Vec<i32>,
    tids_at: Option<Instant>,
    pub stats: Stats,
    /// Per-thread CPU clocks; None where they could not be opened.
    clocks: HashMap<i32, Option<Clocks>>,
    /// Threads that started before this (seconds since boot) are charged
    /// only the CPU they use from their first sample on (`osprey attach`
    /// profiles from the moment it attaches); `None`: any young thread is
    /// charged from its start (a process started to be profiled).
    pub since: Option<f64>,
    /// Why the last per-thread clock could not be opened (then `on_cpu`
    /// falls back to the kernel's run state, which counts preempted threads).
    pub clock_error: Option<String>,
    /// When the previous pass started.
    last_pass: Option<Instant>,
    /// The process CPU clock (ns) read at the start of the latest pass that
    /// could read it.
    pub cpu_clock: Option<i64>,
    /// Nominal sampling interval (set by the caller; default 10 ms).
    pub interval_ns: i64,
    gil_waits: crate::sampling::gilwait::GilWaits,
    tasks: crate::sampling::asyncio::Tasks,
    /// Python thread names (`threading`), refreshed about once a second.
    pub names: crate::sampling::thread_names::ThreadNames,
    /// OpenTelemetry spans, read with each stack.
    pub spans: crate::sampling::otel_context::Spans,
    /// Mixed native and Python stacks (`--native`), when enabled.
    pub native: Option<crate::sampling::native::Native>,
    /// Running threads' frames copied at the sampling interrupt (the
    /// default where the program loads; not with `--native` or `--blocking`).
    pub interrupt: Option<crate::sampling::interrupt::Interrupt>,
    /// Stop each running thread for the moment of its read (`--blocking`;
    /// see [`crate::remote::ptrace`]).
    pub blocking: bool,
    /// Threads that could not be stopped, and the last reason.
    pub stop_failed: u64,
    pub last_stop_error: Option<String>,
}

/// CPU time of the whole process (ns), from its process CPU clock
/// (`clock_gettime` on MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)).
pub fn process_cpu_ns(pid: i32) -> Option<i64> {
    let clock = ((!(pid as libc::clockid_t)) << 3) | 2;
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes into `ts`.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| ts.tv_sec * 1_000_000_000 + ts.tv_nsec)
}

/// Stack reads per thread and sample, at most, while its span changes
/// during them: a task switch every few milliseconds crosses one read in
/// ten to twenty (reads take 0.1-1 ms), two in a row one in a hundred.
const SPAN_READS: u32 = 3;
/// `--native`: samples taken per running thread and pass before it is
/// stopped instead, the Python stack having moved on around each (on
/// calls of a microsecond, a third of the samples move; 2-3% of the reads
/// then stop).
const SHOT_TRIES: u32 = 3;
/// `--native`: the most time from a one-shot sample to the Python read
/// after it, or the sample is taken again. A sampler preempted in between
/// left the thread time to leave the sample's calls and come back to the
/// read's (the median is 60-100 µs in a debug build, 99% under 0.4 ms on
/// a quiet machine; under load a tenth took 2-10 ms).
const SHOT_GAP_NS: u64 = 500_000;

/// A thread's Python stack, the asyncio task it runs, the span it runs in.
type ThreadRead = (std::io::Result<Stack>, u64, Option<SpanIds>);
/// Threads younger than this when first seen are charged, at their first
/// sample, the CPU they used since they started.
const YOUNG: Duration = Duration::from_secs(1);

/// Whether a thread that started at `start_ticks` (clock ticks since boot)
/// did so less than [`YOUNG`] ago and not before `since` (seconds since boot).
fn is_young(start_ticks: Option<u64>, since: Option<f64>) -> bool {
    let (Some(start_ticks), Some(uptime)) = (start_ticks, uptime()) else { return false };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let started = start_ticks as f64 / hz;
    uptime - started <= YOUNG.as_secs_f64() && !since.is_some_and(|s| started < s)
}

/// A thread's two CPU clocks (see [`crate::remote::thread_cpu`]): the
/// task-clock tells whether it ran during a read, the run time, counted
/// from `base`, is what it is charged.
struct Clocks {
    task: TaskClock,
    run: RunTime,
    /// The run time when the thread was first seen; 0 for a young thread,
    /// charged from its start.
    base: u64,
}

impl Clocks {
    /// `young`: the thread is charged from its start (see [`is_young`]).
    fn open(pid: i32, tid: i32, young: bool) -> Result<Clocks, String> {
        let task = TaskClock::open(tid).map_err(|e| format!("perf_event_open: {e}"))?;
        let run = RunTime::open(pid, tid).map_err(|e| format!("/proc/{pid}/task/{tid}/schedstat: {e}"))?;
        let base = if young { 0 } else { run.read().map_err(|e| format!("schedstat: {e}"))? };
        Ok(Clocks { task, run, base })
    }

    /// The CPU the thread is charged so far (ns).
    fn charged(&self) -> Option<u64> {
        self.run.read().ok().map(|r| r.saturating_sub(self.base))
    }
}

/// The process is gone (exited, or became a zombie).
pub struct Gone;

impl Sampler {
    pub fn new(target: Target, method: Option<Method>) -> Result<Sampler, Error> {
        if let Some(m) = method {
            let ok = match m {
                Method::Tls => target.tls.is_some(),
                Method::Tss => target.pthread.is_some() || target.gilstate_tls.is_some(),
                Method::Lists | Method::Cache => true,
            };
            if !ok {
                let why = match m {
                    Method::Tls => target.tls_error.clone(),
                    _ => target.pthread_error.clone(),
                };
                return Err(Error::Unsupported(format!(
                    "method {m:?} on CPython {}: {}",
                    target.version,
                    why.unwrap_or_default()
                )));
            }
        }
        let mut disc = ThreadStateMap::default();
        if is_our_child(target.pid) {
            disc.child = Some(target.pid);
            disc.no_ptrace = method.is_none() && target.layout.tstate_native_thread_id.is_some();
        }
        Ok(Sampler {
            target,
            disc,
            walks: Walks::default(),
            procs: ProcFiles::default(),
            method,
            tids: Vec::new(),
            tids_at: None,
            stats: Stats::default(),
            clocks: HashMap::new(),
            since: None,
            clock_error: None,
            last_pass: None,
            cpu_clock: None,
            interval_ns: 10_000_000,
            gil_waits: Default::default(),
            tasks: Default::default(),
            names: Default::default(),
            spans: Default::default(),
            native: None,
            interrupt: None,
            blocking: false,
            stop_failed: 0,
            last_stop_error: None,
        })
    }

    /// Waits (up to `timeout`) until the interpreter has a thread state.
    pub fn wait_initialized(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if let Ok(list) = crate::target::thread_states::list_tstates(&self.target) {
                if !list.is_empty() {
                    return true;
                }
            }
            if start.elapsed() > timeout || !process_alive(self.target.pid) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn refresh_tids(&mut self) -> Result<(), Gone> {
        if self.tids_at.is_some_and(|t| t.elapsed() < Duration::from_millis(50)) {
            return Ok(());
        }
        let pid = self.target.pid;
        if !process_alive(pid) {
            return Err(Gone);
        }
        let tids = crate::remote::process::list_tids(pid).map_err(|_| Gone)?;
        if tids.is_empty() {
            return Err(Gone);
        }
        self.disc.retain_threads(&tids);
        self.procs.retain(&tids);
        self.clocks.retain(|t, _| tids.contains(t));
        self.gil_waits.retain(&tids);
        if let Some(n) = &mut self.native {
            n.retain_threads(&tids);
        }
        if let Some(i) = &mut self.interrupt {
            i.retain_threads(&tids);
        }
        self.tids = tids;
        self.tids_at = Some(Instant::now());
        Ok(())
    }

    /// GILs: (address range of the GIL struct, locked, last holder).
    pub fn gils(&self) -> Vec<((u64, u64), bool, u64)> {
        let t = &self.target;
        let l = &t.layout;
        let mut addrs = Vec::new();
        if let Some(off) = l.runtime_gil {
            addrs.push(t.runtime + off);
        } else if let Some(off) = l.interp_gil_ptr {
            let mut interp = t.interp_head().unwrap_or(0);
            let mut n = 0;
            while interp != 0 && n < 64 {
                n += 1;
                if let Ok(g) = t.mem.u64(interp + off) {
                    if g != 0 && !addrs.contains(&g) {
                        addrs.push(g);
                    }
                }
                interp = t.mem.u64(interp + l.interp_next).unwrap_or(0);
            }
        }
        addrs
            .into_iter()
            .filter_map(|g| {
                let b = t.mem.read_vec(g, (l.gil_locked.max(l.gil_last_holder) + 8) as usize).ok()?;
                let locked = crate::remote::process::rd_u32(&b, l.gil_locked as usize) as i32 > 0;
                let holder = crate::remote::process::rd_u64(&b, l.gil_last_holder as usize);
                Some(((g, g + l.gil_size), locked, holder))
            })
            .collect()
    }

    /// Stops thread `tid` for the moment of its read, if it can be.
    fn stop(&mut self, tid: i32) -> Option<crate::remote::ptrace::Stopped> {
        crate::remote::ptrace::Stopped::new(tid, self.disc.child == Some(tid))
            .map_err(|e| {
                self.stop_failed += 1;
                self.last_stop_error = Some(format!("thread {tid}: {e}"));
            })
            .ok()
    }

    /// Reads a thread's Python stack, with the asyncio task it runs and
    /// the span it runs in (`still`: the thread is stopped; `at_interrupt`:
    /// running thread `tid`'s frames are taken from its latest copy made at
    /// its sampling interrupt, see [`crate::sampling::interrupt`]).
    ///
    /// From a copy, the running task and the span are the ones copied with
    /// its frames; where spans are read and the copy has none known, the
    /// thread is read from outside. Read from outside, the task is read next
    /// to the stack on both sides: a task that switched during the read is
    /// the one that ran when the innermost frames were read (first), or, if
    /// none ran then, the one that started during the read. The span is the
    /// one before and after the stack; if they differ (a task switch, a span
    /// begun or ended meanwhile), the stack is read again, at most
    /// `SPAN_READS` times in all.
    fn read_thread(&mut self, tstate: u64, still: bool, at_interrupt: Option<i32>) -> ThreadRead {
        if let Some(tid) = at_interrupt {
            let task_at = self.tasks.running_at(&self.target, tstate);
            let found = self.spans.found();
            let copied = self.interrupt.as_mut().and_then(|i| i.copy(&self.target, tid, tstate, task_at));
            if let Some(c) = copied {
                let span = if found {
                    self.spans.from_copy(c.span)
                } else {
                    // Looks for the variable now and then; a span read now
                    // is not the copy's.
                    let mark = self.spans.mark(&self.target, tstate, false);
                    let _ = self.spans.read(&self.target, tstate, mark);
                    Ok(None)
                };
                match span {
                    Ok(span) => return (read_copied(&self.target, &mut self.walks, c.top, c.frames), c.mark, span),
                    Err(_) => {
                        if let Some(i) = self.interrupt.as_mut() {
                            i.set_aside();
                        }
                    }
                }
            }
        }
        let mut reads = 0;
        loop {
            reads += 1;
            let span_mark = self.spans.mark(&self.target, tstate, still);
            let before = self.tasks.running(&self.target, tstate);
            let read = read_stack(&self.target, &mut self.walks, tstate, &mut self.stats.retries, still);
            let task = if before != 0 { before } else { self.tasks.running(&self.target, tstate) };
            match self.spans.read(&self.target, tstate, span_mark) {
                Err(Changed) if reads < SPAN_READS => continue,
                span => break (read, task, span.unwrap_or(None)),
            }
        }
    }

    /// `--native` without a stop: running thread `tid`'s native stack,
    /// sampled between two reads of its Python stack (the second within
    /// [`SHOT_GAP_NS`] of the sample), with one of them. A
    /// sample in a C extension or a library is kept only when the reads show
    /// the same calls (so the sample ran them too); one in Python code with a
    /// read that has as many calls of the evaluation function. Tried
    /// [`SHOT_TRIES`] times; None where no sample can be taken, none came in
    /// time (the thread waited for a CPU) or the calls kept changing: the
    /// caller stops the thread instead.
    fn shoot(&mut self, tid: i32, tstate: u64) -> Option<(ThreadRead, (Vec<u64>, bool))> {
        if !self.native.as_mut()?.can_arm(tid) {
            return None;
        }
        for _ in 0..SHOT_TRIES {
            let before = self.read_thread(tstate, false, None);
            let n = self.native.as_mut()?;
            if !n.arm(tid) {
                return None;
            }
            let taken = n.take(tid)?;
            // The after read must follow the sample closely: a thread that
            // ran a whole round of its calls in between would show the same
            // calls as before the sample, which ran others.
            if osprey_perf::now_ns().saturating_sub(taken) > SHOT_GAP_NS {
                n.stats.moved += 1;
                continue;
            }
            let after = self.read_thread(tstate, false, None);
            let n = self.native.as_mut()?;
            let native = n.unwind_taken()?;
            match n.in_python(&native.0) {
                // Python code ran: either read places it as a read without
                // `--native` would, if it has the sample's calls of the
                // evaluation function.
                Some(evals) => {
                    let fits = |r: &ThreadRead| r.0.as_ref().is_ok_and(|s| s.evals.len() == evals);
                    if fits(&after) {
                        return Some((after, native));
                    }
                    if fits(&before) {
                        return Some((before, native));
                    }
                }
                None => {
                    if matches!((&before.0, &after.0), (Ok(b), Ok(a)) if b.same_calls(a)) {
                        return Some((after, native));
                    }
                }
            }
            n.stats.moved += 1;
        }
        self.native.as_mut()?.stats.missed += 1;
        None
    }

    /// Samples every thread once. `Err(Gone)` when the process has exited.
    pub fn sample(&mut self) -> Result<Vec<ThreadSample>, Gone> {
        self.refresh_tids()?;
        crate::remote::ptrace::settle();
        self.stats.passes += 1;
        let now = Instant::now();
        // The wall time each sample of this pass stands for (capped at twice
        // the nominal interval, so that a pass delayed by a busy machine does
        // not put the whole gap on one stack).
        let wall = self
            .last_pass
            .map_or(self.interval_ns, |p| (now.duration_since(p).as_nanos() as i64).min(2 * self.interval_ns));
        let cpu_now = process_cpu_ns(self.target.pid);
        let gils = self.gils();
        let collecting = crate::sampling::gc::collecting(&self.target);
        let ranges: Vec<(u64, u64)> = gils.iter().map(|g| g.0).collect();
        let pid = self.target.pid;
        self.names.update(&self.target, &self.tids);
        // What the span reads verified so far, for the copies at the interrupt.
        if let Some(i) = self.interrupt.as_mut().filter(|_| self.spans.found()) {
            i.publish(&self.spans.recipe(&self.target));
        }
        let mut out = Vec::with_capacity(self.tids.len());
        let tids = self.tids.clone();
        for tid in tids {
            let tstate = match self.disc.find(&self.target, tid, self.method) {
                Ok(ts) => ts,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(Gone),
                Err(_) => 0,
            };
            if tstate == 0 {
                continue;
            }
            let k = match self.procs.kernel(pid, tid) {
                Ok(k) => k,
                Err(_) => {
                    self.disc.forget_thread(tid);
                    continue;
                }
            };
            let (start_ticks, since) = (k.start_ticks, self.since);
            let clock = self.clocks.entry(tid).or_insert_with(|| {
                Clocks::open(pid, tid, is_young(start_ticks, since)).map_err(|e| self.clock_error = Some(e)).ok()
            });
            let running = k.state == 'R';
            let t0 = Instant::now();
            // Reading a running thread's clock interrupts its CPU: just
            // before a stop, that tied the stop to the interrupt, and a
            // thread about to be stopped is charged in full anyway.
            let to_stop = running && self.blocking;
            let before = clock.as_ref().filter(|_| !to_stop).and_then(|c| c.task.read().ok());
            let t1 = Instant::now();
            // `--native`: a running thread's native stack is sampled between
            // two reads of its Python stack, unless `--blocking` stops it (a
            // waiting one does not change).
            if let Some(n) = self.native.as_mut().filter(|_| running) {
                n.prepare();
            }
            let shot = if running && !self.blocking { self.shoot(tid, tstate) } else { None };
            let mut stopped = None;
            let (read, task, span, native) = match shot {
                Some((read, native)) => (read.0, read.1, read.2, Some(native)),
                None => {
                    if running && (self.blocking || self.native.is_some()) {
                        stopped = self.stop(tid);
                    }
                    let native = match (&mut self.native, &stopped) {
                        (Some(n), Some(s)) => n.unwind(s),
                        _ => None,
                    };
                    let at_interrupt = (running && stopped.is_none() && self.native.is_none()).then_some(tid);
                    let (read, task, span) = self.read_thread(tstate, stopped.is_some(), at_interrupt);
                    (read, task, span, native)
                }
            };
            let was_stopped = stopped.is_some();
            drop(stopped);
            let t2 = Instant::now();
            let clock = self.clocks.get(&tid).and_then(Option::as_ref);
            let after = clock.and_then(|c| c.task.read().ok());
            let thread_cpu = clock.and_then(Clocks::charged);
            // From the middle of one clock read to the middle of the other.
            let window = ((t2 - t0) + (Instant::now() - t1)).as_nanos() as f64 / 2.0;
            let (mut frames, truncated) = match read {
                Ok(stack) => {
                    if let Some(why) = stack.truncated {
                        self.stats.torn += 1;
                        self.stats.cycles += (why == End::Cycle) as u64;
                    }
                    let frames = match (&mut self.native, native) {
                        (Some(n), Some((nf, complete))) => n.merge(&nf, complete, &stack),
                        _ => stack.frames,
                    };
                    (frames, stack.truncated)
                }
                Err(_) => {
                    if !process_alive(pid) {
                        return Err(Gone);
                    }
                    continue;
                }
            };
            let holds = gils.iter().any(|g| g.1 && g.2 == tstate);
            // Collecting when the pass began. A collection holds the Python
            // stack still; a read that tore means it ended meanwhile, so
            // that case is checked again rather than shown as `[gc]` over
            // frames it did not run under.
            let in_gc = |c: &Option<Vec<u64>>| {
                c.as_ref().is_some_and(|c| crate::sampling::gc::in_collection(&self.target, tstate, c))
            };
            if holds
                && in_gc(&collecting)
                && (truncated.is_none() || in_gc(&crate::sampling::gc::collecting(&self.target)))
            {
                frames.insert(0, Frame::Synthetic(crate::sampling::gc::GC_FRAME.into()));
            }
            let sys = if holds { Sys::Unknown } else { self.procs.syscall(pid, tid) };
            let mut state = classify(holds, k.state, sys, &ranges);
            // Without a GIL, a thread on a CPU runs (Python or C alike).
            if self.target.layout.free_threaded && state == State::Native {
                state = State::Running;
            }
            let gil_wait_ns = self.gil_waits.observe(tid, state == State::WaitingForGil, now);
            let task = self.tasks.name(&self.target, task);
            // On a CPU during the stack read: its exact clock moved. Without
            // one, runnable (which also counts preempted threads).
            let on_cpu = match (before, after) {
                // Stopped for the read, so its clock may not have moved.
                _ if was_stopped => true,
                (Some(a), Some(b)) => b > a,
                _ if holds => k.state == 'R',
                _ => sys == Sys::Running || (sys == Sys::Unknown && k.state == 'R'),
            };
            // With an exact clock: the wall time times 1 if runnable before
            // and after the read (preempted too), else the share of the read
            // spent on a CPU; 0 in a sleeping call. Without one: the wall
            // time if on a CPU, from the second pass on.
            let cpu_ns = if let Some(b) = after {
                let share = match before {
                    _ if state == State::Sleeping => 0.0,
                    _ if was_stopped => 1.0,
                    _ if k.state == 'R' && self.procs.kernel(pid, tid).is_ok_and(|k| k.state == 'R') => 1.0,
                    Some(a) => (b.saturating_sub(a) as f64 / window.max(1.0)).min(1.0),
                    None => 0.0,
                };
                (wall as f64 * share).round() as i64
            } else if on_cpu && self.last_pass.is_some() {
                wall
            } else {
                0
            };
            self.stats.samples += 1;
            self.stats.threads_seen.insert(tid);
            out.push(ThreadSample {
                tid,
                name: self.names.name(tstate).map_or(k.name, str::to_string),
                state,
                cpu_ns,
                tstate,
                frames,
                truncated,
                thread_cpu,
                gil_wait_ns,
                task,
                span,
            });
        }
        self.last_pass = Some(now);
        if cpu_now.is_some() {
            self.cpu_clock = cpu_now;
        }
        Ok(out)
    }
}
