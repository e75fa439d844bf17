//! The thread-start path: a thread registers itself (interposed
//! `pthread_create`, `register_current_thread`, or its first trace-context
//! write), learns its stack bounds and arms its CPU clock, all with signals
//! blocked; and the helpers about threads that discovery shares.

use crate::cpu_clock::{self, thread_cpu_ns};
use crate::record::{Origin, Record, SampleRecord};
use crate::registry::{Registry, RegistryConfig};
use crate::signal::{sys, InFlight, STATE};
use osprey_procfs::stat::Stat;
use std::sync::atomic::{AtomicI32, Ordering::*};

/// Thread-start path: registers the calling thread, learns its stack and arms
/// its CPU clock, all with signals blocked. Idempotent.
pub fn register_current() -> Option<(usize, &'static Record)> {
    let reg = Registry::get()?;
    let _blocked = SignalBlock::all();
    // Outside any handler the pool may grow on the spot: a burst of new
    // threads can outrun the collector's recycling of exited ones.
    let (me, now) = (sys::gettid(), sys::monotonic_ns());
    let claim = || reg.claim(me, Origin::ThreadStart, now);
    // Other threads may take the records a growth made before this one gets
    // one: grow and claim again while the pool can still grow.
    let mut claimed = claim();
    for _ in 0..crate::registry::MAX_SEGMENTS {
        if claimed.is_some() || !reg.grow_now() {
            break;
        }
        claimed = claim();
    }
    let (idx, rec) = claimed?;
    crate::signal::charge_from_now(rec);
    if rec.stack_hi.load(Acquire) == 0 {
        if let Some((lo, hi)) = current_stack_bounds() {
            rec.stack_lo.store(lo, Relaxed);
            rec.stack_hi.store(hi, Release);
        }
    }
    // A thread that blocks the sampling signal (e.g. started with every
    // signal blocked by its creator) gets no clock: signals would only pile up.
    if _blocked.was_blocked(STATE.sample_signal.load(Relaxed)) {
        rec.blocked.store(1, Relaxed);
    } else {
        let _ = cpu_clock::arm(rec);
    }
    Some((idx, rec))
}

/// Like [`register_current`], remembering `routine` as the stack to charge
/// for CPU time used before the thread's first sample.
pub fn register_current_with_start(routine: usize) -> Option<(usize, &'static Record)> {
    let r = register_current()?;
    r.1.start_routine.store(routine as u64, Relaxed);
    Some(r)
}

/// Thread-exit path: charges the CPU time the thread used since its last
/// sample (a thread shorter than one period would otherwise show none) to
/// its last stack, or to its start routine when it was never sampled; then
/// disarms and retires the record.
pub fn unregister_current() {
    let Some(reg) = Registry::get() else { return };
    let blocked = SignalBlock::all();
    let me = sys::gettid();
    if let Some((slot, rec)) = reg.lookup(me) {
        cpu_clock::disarm(rec);
        // For samples drained after it is gone: renames included.
        leave_name(rec, me);
        charge_remainder(reg, slot, rec, me);
        reg.retire(me);
        // A sample raised before the disarm would be dropped as unregistered
        // after the unblock, and its CPU is in the remainder just charged.
        blocked.discard_pending();
    }
}

/// Process-exit path (`exit`, `_exit`, the last profile): charges the CPU
/// time the calling thread used since its last sample, as a thread exit
/// does, and leaves it registered. A process shorter than the clock's
/// resolution (POSIX timers tick at the scheduler's rate) would otherwise
/// show none of the CPU it used.
pub fn charge_current_remainder() {
    let Some(reg) = Registry::get() else { return };
    let _blocked = SignalBlock::all();
    let me = sys::gettid();
    if let Some((slot, rec)) = reg.lookup(me) {
        // A thread the collector has not named yet (a short process's
        // only one) is named from here, before the sample that shows it:
        // one system call, no `/proc` read.
        leave_name(rec, me);
        charge_remainder(reg, slot, rec, me);
    }
}

/// Leaves the calling thread's name (`me`) in its record, as the collector
/// reads it (`Record::exit_name`).
fn leave_name(rec: &Record, me: i32) {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0 {
        let word = |i: usize| u64::from_ne_bytes(name[i..i + 8].try_into().unwrap_or([0; 8]));
        rec.exit_tid.store(me, Relaxed);
        rec.exit_name[0].store(word(0), Relaxed);
        rec.exit_name[1].store(word(8), Release);
    }
}

/// osprey's own threads in this process (0: free slot): never primed,
/// sampled or accounted.
static INTERNAL: [AtomicI32; 8] = [const { AtomicI32::new(0) }; 8];

/// osprey's own threads that exist now.
pub fn internal_tids() -> impl Iterator<Item = i32> {
    INTERNAL.iter().map(|t| t.load(Relaxed)).filter(|&t| t > 0)
}

/// Whether `tid` is one of osprey's own threads.
pub fn is_internal(tid: i32) -> bool {
    tid > 0 && INTERNAL.iter().any(|t| t.load(Relaxed) == tid)
}

/// In a forked child: only the forking thread exists, so none of the
/// parent's internal threads does. Clearing their slots here keeps
/// [`forget_current`] from looking them up in `/proc` (and allocating) when
/// the child's collector starts.
pub(crate) fn forget_internal_after_fork() {
    for slot in &INTERNAL {
        slot.store(0, Relaxed);
    }
}

/// Takes the calling thread out of profiling for good, without charging
/// anything: for osprey's own threads (the collector, upload threads),
/// which an interposed `pthread_create` registered like any other.
pub fn forget_current() {
    let me = sys::gettid();
    if !is_internal(me) {
        // Slots of threads that are gone (e.g. a collector before a fork) are reused.
        let gone = |t: i32| t == 0 || !std::path::Path::new(&format!("/proc/self/task/{t}")).exists();
        if let Some(slot) = INTERNAL.iter().find(|s| gone(s.load(Relaxed))) {
            slot.store(me, Relaxed);
        }
    }
    let Some(reg) = Registry::get() else { return };
    let _blocked = SignalBlock::all();
    if let Some((_, rec)) = reg.lookup(me) {
        cpu_clock::disarm(rec);
        reg.retire(me);
    }
}

/// See [`unregister_current`]. Runs on the exiting thread with every signal
/// blocked, so its frame buffer is its own.
fn charge_remainder(reg: &Registry, slot: usize, rec: &Record, tid: i32) {
    if rec.blocked.load(Relaxed) != 0 {
        return; // accounted by discovery from its CPU clock
    }
    let Some(_in_flight) = InFlight::enter(rec) else { return };
    // SAFETY: published before `enabled`, never freed (see `signal::STATE`).
    let Some(storage) = (unsafe { STATE.storage.load(Acquire).as_ref() }) else { return };
    let Some(cpu) = thread_cpu_ns(tid) else { return };
    // What is owed (CPU without a working clock) is part of the rest.
    rec.owed_ns.store(0, Relaxed);
    let rest = cpu.saturating_sub(rec.charged_ns.load(Relaxed));
    if rest == 0 {
        return;
    }
    // SAFETY: only this thread touches its frame buffer, and its handler cannot run (signals blocked).
    let frames = unsafe { &*rec.frames.get() };
    // A main thread never sampled (a process shorter than a period) is
    // charged to the program's entry point, `_start`, the root of its stacks.
    let start = [match rec.start_routine.load(Relaxed) {
        // SAFETY: getauxval reads the auxiliary vector saved at start.
        0 if tid == sys::getpid() => unsafe { libc::getauxval(libc::AT_ENTRY) },
        routine => routine,
    }];
    let stack = match rec.last_depth.load(Relaxed) as usize {
        0 if start[0] != 0 => &start[..],
        0 => return,
        n => frames.get(..n).unwrap_or(&[]),
    };
    rec.charged_ns.fetch_add(rest, Relaxed);
    STATE.charged_ns.fetch_add(rest, Relaxed);
    let ctx = rec.context.read().unwrap_or_default();
    storage.put(slot, stack, false, 0, rest, |trace_id| {
        let sample = SampleRecord {
            trace_id,
            timestamp_ns: sys::monotonic_ns(),
            span_id: ctx.span_id,
            local_root_span_id: ctx.local_root_span_id,
            w3c_trace_id: [(ctx.trace_id >> 64) as u64, ctx.trace_id as u64],
            count: 0,
            tid,
            tags: ctx.tags,
            value: rest,
            ..Default::default()
        };
        reg.push_sample(slot, rec, &sample);
    });
}

/// The calling thread's record, after the full thread-start setup (record,
/// stack bounds, CPU clock; see [`register_current`], idempotent):
/// a record claimed by the priming handler gets its setup now rather than at
/// the next scan. Not signal-safe: for application-side writers (context
/// setters cache the result) and thread hooks.
pub fn current_or_register() -> Option<&'static Record> {
    Registry::get_or_init(RegistryConfig::default()).ok()?;
    register_current().map(|(_, r)| r)
}

/// Starts one of osprey's own threads (upload threads), and returns once the
/// thread has made itself internal: no scan after this counts it as one of
/// the program's. See [`spawn_own`].
pub(crate) fn spawn_internal<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    let (known, internal) = std::sync::mpsc::sync_channel(1);
    let h = spawn_own(name, move || {
        let _ = known.send(());
        f()
    })?;
    let _ = internal.recv();
    Ok(h)
}

/// One of osprey's own threads started by `pthread_create` itself rather
/// than `std::thread`: its start neither allocates nor frees. glibc gives a
/// thread its own malloc arena (a 64 MiB reservation, its first pages
/// touched) at its first `malloc` or `free`, and `std::thread` frees its
/// start data on the new thread; a collector that sleeps through a short
/// process would pay for an arena it never uses.
pub(crate) trait Bare: Sync + 'static {
    /// The thread's name (at most 15 bytes).
    const NAME: &'static core::ffi::CStr;
    /// The thread's work. A panic ends the thread, not the process.
    fn run(&'static self);
}

/// A thread started by [`spawn_bare`].
pub(crate) struct BareThread(libc::pthread_t);

impl BareThread {
    /// Waits for the thread to end.
    pub(crate) fn join(self) {
        // SAFETY: a thread this handle created, joined once (self is consumed).
        unsafe { libc::pthread_join(self.0, core::ptr::null_mut()) };
    }
}

/// Starts `body.run()` on one of osprey's own threads (see [`spawn_own`] for
/// its signal mask and registry invariant), without waiting for it to make
/// itself internal. Every scan for the program's threads (discovery, the
/// wall sampler, the final check of a stop, which waits for the
/// collector's end) runs on that thread, after it did: a wait here would
/// only hold the program's thread up for a thread switch.
pub(crate) fn spawn_bare<B: Bare>(body: &'static B) -> std::io::Result<BareThread> {
    extern "C" fn start<B: Bare>(p: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `p` is the `&'static B` given to `pthread_create` below.
        let body: &'static B = unsafe { &*(p as *const B) };
        // SAFETY: PR_SET_NAME reads a NUL-terminated string.
        unsafe { libc::prctl(libc::PR_SET_NAME, B::NAME.as_ptr()) };
        forget_current();
        // An unwinding panic must not leave an `extern "C"` function.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.run()));
        core::ptr::null_mut()
    }
    own_mask(|| {
        // SAFETY: attributes on a stack value, destroyed after use; `start`
        // takes a `&'static B`, which outlives the thread.
        unsafe {
            let mut attr: libc::pthread_attr_t = core::mem::zeroed();
            libc::pthread_attr_init(&mut attr);
            // As `std::thread`'s default: the collector's deepest work (CFI
            // compilation, encoding) is sized for it.
            libc::pthread_attr_setstacksize(&mut attr, 2 << 20);
            let mut t: libc::pthread_t = 0;
            let rc = libc::pthread_create(&mut t, &attr, start::<B>, body as *const B as *mut libc::c_void);
            libc::pthread_attr_destroy(&mut attr);
            if rc == 0 {
                Ok(BareThread(t))
            } else {
                Err(std::io::Error::from_raw_os_error(rc))
            }
        }
    })
}

/// Starts one of osprey's own threads. Invariant: it runs
/// with every asynchronous signal blocked from its first instruction (the mask is inherited from the creator, set around the spawn)
/// and is forgotten by the registry before `f` runs. So a process-directed
/// signal (`kill(pid, SIGUSR1)`, a terminal's SIGINT) always reaches a thread
/// of the program: a handler that runs on an osprey thread can lose it (dash
/// drops a trap signal that lands while its main thread waits in `vfork`),
/// and the termination handler never runs on a thread it waits for.
/// Synchronous fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
/// SIGSYS) stay unblocked: blocking them would not stop a fault, only skip
/// the program's own handler.
fn spawn_own<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    own_mask(|| {
        std::thread::Builder::new().name(name.into()).spawn(move || {
            forget_current();
            f()
        })
    })
}

/// Runs `create` (which starts a thread) with the signal mask of
/// [`spawn_own`], the calling thread marked as the [`SPAWNER`].
fn own_mask<R>(create: impl FnOnce() -> R) -> R {
    let blocked = SignalBlock::all();
    // SAFETY: sigset manipulation on stack values; unblocks faults only.
    unsafe {
        let mut faults: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut faults);
        for s in FAULT_SIGNALS {
            libc::sigaddset(&mut faults, s);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &faults, core::ptr::null_mut());
    }
    SPAWNER.store(sys::gettid(), SeqCst);
    let r = create();
    SPAWNER.store(0, SeqCst);
    drop(blocked);
    r
}

/// The thread inside [`spawn_own`] (0: none).
static SPAWNER: AtomicI32 = AtomicI32::new(0);

/// Whether the calling thread is creating one of osprey's own threads: an
/// interposed `pthread_create` asks, and has the new thread call
/// [`forget_current`] instead of registering, so no scan ever sees an osprey
/// thread as the program's.
pub fn spawning_internal() -> bool {
    SPAWNER.load(SeqCst) == sys::gettid()
}

/// Signals raised by a faulting instruction, never left blocked.
const FAULT_SIGNALS: [i32; 6] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS];

/// Blocks every signal on the calling thread until dropped.
pub struct SignalBlock(libc::sigset_t);

impl SignalBlock {
    /// Blocks every signal; the old mask comes back on drop.
    pub fn all() -> Self {
        // SAFETY: plain sigset manipulation on stack values.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalBlock(old)
        }
    }

    /// Accepts (and discards) every instance of osprey's sampling and
    /// priming signals pending on the calling thread or the process: signals
    /// a clock raised before it was stopped, which would otherwise reach the
    /// thread once the block ends (a thread whose record is retired, a new
    /// program image).
    pub fn discard_pending(&self) {
        let sigs = [STATE.sample_signal.load(Relaxed), STATE.prime_signal.load(Relaxed)];
        // SAFETY: sigset manipulation on a stack value, and sigtimedwait with a
        // zero timeout on signals this block holds: it returns at once.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in sigs.into_iter().filter(|&s| s > 0) {
                libc::sigaddset(&mut set, s);
            }
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // Real-time signals queue: one call takes one instance. Bounded in
            // case the kernel keeps one coming (it cannot: the clock is stopped).
            for _ in 0..4096 {
                if libc::sigtimedwait(&set, core::ptr::null_mut(), &zero) < 0 {
                    break;
                }
            }
        }
    }

    /// Whether `signal` was blocked before this block.
    pub fn was_blocked(&self, signal: i32) -> bool {
        // SAFETY: membership test on a valid set.
        signal > 0 && unsafe { libc::sigismember(&self.0, signal) } == 1
    }
}

impl Drop for SignalBlock {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `all`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
}

/// Tids of the threads in this process, sorted, from `/proc/self/task`.
///
/// Read with `getdents64` on a descriptor held for microseconds and closed
/// without a check: the program may close every descriptor at any time
/// (`close_range`, daemonizing), and `std::fs::read_dir` would panic on the
/// resulting `EBADF` at `closedir`.
pub fn list_threads() -> std::io::Result<Vec<i32>> {
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(c"/proc/self/task".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut tids = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        // SAFETY: buffer of the stated length, our own descriptor.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name[].
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = &buf[off + 19..(off + reclen).min(n as usize)];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(tid) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()) {
                tids.push(tid);
            }
            off += reclen;
        }
    }
    // SAFETY: closing the descriptor opened above; an error (the program
    // closed it meanwhile) is ignored, never fatal.
    unsafe { libc::close(fd) };
    tids.sort_unstable();
    Ok(tids)
}

/// Threads in this process (`num_threads` of `/proc/self/stat`): one small
/// read, the discovery scan's cheap test for change. Descriptor held as in
/// [`list_threads`].
pub fn thread_count() -> Option<u64> {
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(c"/proc/self/stat".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 1024];
    // SAFETY: buffer of the stated length, our own descriptor.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the descriptor opened above, error ignored.
    unsafe { libc::close(fd) };
    Stat::parse(buf.get(..usize::try_from(n).ok()?)?)?.num_threads()
}

/// When process `pid` (> 0) started (field 22 of its `stat`, clock ticks
/// since boot): with the pid, it names one process even once the pid is reused.
pub fn start_ticks(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    Stat::parse(&osprey_procfs::stat::read(pid).ok()?)?.starttime()
}

/// Whether thread `tid` has `signal` blocked (`SigBlk` in its `status`).
/// `None` when its status is unreadable (the thread is exiting or gone).
pub fn signal_blocked(tid: i32, signal: i32) -> Option<bool> {
    status_mask_has(tid, "SigBlk:", signal)
}

/// Whether `signal` is pending for thread `tid` (`SigPnd` in its `status`).
/// `None` when its status is unreadable.
pub fn signal_pending(tid: i32, signal: i32) -> Option<bool> {
    status_mask_has(tid, "SigPnd:", signal)
}

fn status_mask_has(tid: i32, field: &str, signal: i32) -> Option<bool> {
    if signal <= 0 {
        return Some(false);
    }
    let s = osprey_procfs::read_file(std::path::Path::new(&format!("/proc/self/task/{tid}/status"))).ok()?;
    let s = String::from_utf8_lossy(&s);
    let mask = s.lines().find_map(|l| l.strip_prefix(field))?;
    let mask = u64::from_str_radix(mask.trim(), 16).ok()?;
    Some(mask & (1 << (signal - 1)) != 0)
}

/// Whether thread `tid` is running or runnable (`R` in its `stat`).
pub fn thread_running(tid: i32) -> bool {
    let Ok(s) = osprey_procfs::stat::read_task(0, tid) else { return false };
    Stat::parse(&s).is_some_and(|s| s.state == b'R')
}

/// The thread's name from `/proc/self/task/TID/comm` (empty if gone).
pub fn thread_name(tid: i32) -> String {
    let comm = osprey_procfs::read_file(std::path::Path::new(&format!("/proc/self/task/{tid}/comm")));
    comm.map(|s| String::from_utf8_lossy(&s).trim_end().to_string()).unwrap_or_default()
}

/// Stack mapping `[lo, hi)` of the calling thread (pthread_getattr_np; the
/// main thread's lower bound comes from RLIMIT_STACK). Not signal-safe.
pub fn current_stack_bounds() -> Option<(usize, usize)> {
    if let Some(b) = main_stack_bounds() {
        return Some(b);
    }
    // SAFETY: attr initialised by pthread_getattr_np and destroyed after use.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok.then(|| (addr as usize, addr as usize + size))
    }
}

/// The main thread's stack without reading `/proc/self/maps` (which
/// `pthread_getattr_np` does for it, at every process start): its top is
/// the end of the page holding the end of the `AT_EXECFN` string, the
/// first thing the kernel copies below the top at `execve`; its bottom is
/// the rlimit below that, as for `[stack]` in [`stack_bounds_of`]. `None`
/// (ask libc) off the main thread, when the calling frame is not inside
/// those bounds (a thread that forked: its child's only thread runs on a
/// thread stack), or without a stack limit.
pub fn main_stack_bounds() -> Option<(usize, usize)> {
    if sys::gettid() != sys::getpid() {
        return None;
    }
    // SAFETY: getauxval reads the auxiliary vector; 0 when absent.
    let execfn = unsafe { libc::getauxval(libc::AT_EXECFN) } as usize;
    if execfn == 0 {
        return None;
    }
    // SAFETY: AT_EXECFN points at a NUL-terminated string the kernel wrote.
    let len = unsafe { libc::strlen(execfn as *const libc::c_char) };
    let page = 4096;
    let hi = (execfn + len + 1).next_multiple_of(page);
    let limit = stack_rlimit();
    if limit >= 1 << 30 {
        return None;
    }
    let lo = hi.saturating_sub(limit);
    let here = &execfn as *const usize as usize;
    (lo <= here && here < hi).then_some((lo, hi))
}

/// The mapping of `/proc/self/maps` (its contents `maps`) that contains
/// `sp`. For the main thread's growable `[stack]` the lower bound is
/// extended to the stack rlimit.
pub fn stack_bounds_of(sp: usize, maps: &[u8]) -> Option<(usize, usize)> {
    let e = osprey_procfs::maps::entries(maps).find(|e| e.contains(sp as u64))?;
    let (lo, hi) = (usize::try_from(e.start).ok()?, usize::try_from(e.end).ok()?);
    if e.path == b"[stack]" {
        return Some((hi.saturating_sub(stack_rlimit()), hi));
    }
    Some((lo, hi))
}

fn stack_rlimit() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut r) };
    if r.rlim_cur == libc::RLIM_INFINITY || r.rlim_cur == 0 {
        1 << 30
    } else {
        r.rlim_cur as usize
    }
}
