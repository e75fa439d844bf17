//! `osprey dump --pid PID [--json]`: every thread's stack now.
//!
//! Per thread: its state and system call from `/proc` (read before it is
//! stopped, which would change them), then a stop as short as can be
//! (`osprey_python::ptrace::Stopped`: `PTRACE_SEIZE` + `PTRACE_INTERRUPT`,
//! signals arriving meanwhile handed back) for `PTRACE_GETREGS` and a
//! `process_vm_readv` of at most [`STACK_COPY`] bytes above sp; the thread is
//! detached before anything else runs (the guard's drop, on every path).
//! The copy is unwound afterwards with the target's CFI tables
//! (`osprey_perf::Unwinder`), and all the frames named in one pass
//! (`osprey_pprof::symbolize`).
//!
//! A target that publishes OpenTelemetry thread contexts (OTEP 4947,
//! `otel_thread_ctx_v1`) shows each thread's trace id, span id and
//! attributes, read in the same stop (`osprey_perf::thread_ctx::Reader`: the
//! record is only consistent while its thread is stopped); a record caught
//! mid-update is skipped and counted, never shown.
//!
//! A CPython target's threads show their Python frames
//! ([`crate::dump_python`]), and with `--native` their native frames too.

use crate::dump_python::{self, PyFrame};
use crate::{target, Failure};
use osprey_perf::thread_ctx::{self, Reader, Reference, ThreadContext, ThreadRead};
use osprey_perf::{RawSample, UserRegs};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Bytes of stack copied above sp (bounded by the stack's mapping).
const STACK_COPY: usize = 32 << 10;

/// One thread's dump.
struct Thread {
    tid: i32,
    name: String,
    state: target::ThreadState,
    /// Leaf first; empty if the thread could not be read.
    pcs: Vec<u64>,
    truncated: bool,
    /// Why there are no frames.
    error: Option<String>,
    /// Its fs base (`pthread_self()` with glibc), 0 if not read.
    fs_base: u64,
    /// CPython: its Python frames, innermost first.
    python: Option<Vec<PyFrame>>,
    /// CPython: its `threading.Thread` name.
    python_name: Option<String>,
    /// CPython 3.14+: the asyncio task it is running.
    task: Option<String>,
    /// Its OTEP 4947 context, when it published one with ids or attributes.
    context: Option<ThreadContext>,
}

pub fn run(pid: i32, json: bool, native: bool) -> Result<u8, Failure> {
    target::check(pid)?;
    let cpython = osprey_python::is_cpython_process(pid);
    let maps = osprey_pprof::maps::ProcMaps::read(pid).map_err(|e| Failure::from(format!("pid {pid}: maps: {e}")))?;
    let mut unwinder = osprey_perf::Unwinder::new(pid as u32);
    let started = Instant::now();
    let mut longest = Duration::ZERO;
    let mut stack = vec![0u8; STACK_COPY];
    let mut threads = Vec::new();
    // Located before any stop, so each stop only adds the record's reads.
    let otel = Reader::open(pid).ok().flatten();
    let mut torn = 0;
    for tid in target::threads(pid) {
        let state = target::thread_state(pid, tid);
        let name = target::thread_name(pid, tid);
        let mut t = Thread {
            tid,
            name,
            state,
            pcs: Vec::new(),
            truncated: true,
            error: None,
            fs_base: 0,
            python: None,
            python_name: None,
            task: None,
            context: None,
        };
        match copy_stack(tid, &maps, &mut stack, otel.as_ref()) {
            Ok(Copied { regs, fs_base, len, stopped, context }) => {
                longest = longest.max(stopped);
                t.fs_base = fs_base;
                match context {
                    Some(ThreadRead::Record(c)) if c.trace_id != 0 || c.span_id != 0 || !c.attributes.is_empty() => {
                        t.context = Some(c)
                    }
                    Some(ThreadRead::Torn) => torn += 1,
                    _ => {}
                }
                let raw = RawSample {
                    pid: pid as u32,
                    tid: tid as u32,
                    time: osprey_perf::now_ns(),
                    period: 0,
                    ip: regs.ip,
                    regs: Some(regs),
                    stack: &stack[..len],
                };
                let st = unwinder.unwind(&raw);
                t.pcs = st.pcs;
                t.truncated = st.truncated;
            }
            // Gone since the listing: left out.
            Err(e)
                if e.raw_os_error() == Some(libc::ESRCH)
                    && !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() =>
            {
                continue
            }
            Err(e) if threads.is_empty() && matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
                if target::exiting(pid, tid) {
                    return Err(Failure::from(format!("pid {pid} exited during the dump: nothing printed")));
                }
                // A thread has one tracer: a debugger, strace, or another dump at this moment.
                if let Some(by) = tracer(pid, tid) {
                    return Err(Failure::from(format!(
                        "pid {pid} is being traced by pid {by} (a debugger, strace, or another `osprey dump`): try again once it detaches"
                    )));
                }
                let hint = osprey_python::permission_hint(pid);
                return Err(Failure::from(format!("permission denied: ptrace of process {pid} refused ({e}): {hint}")));
            }
            Err(e) => t.error = Some(e.to_string()),
        }
        threads.push(t);
    }
    let took = started.elapsed();
    let mut show_native = true;
    if cpython {
        let fs_bases: HashMap<u64, i32> =
            threads.iter().filter(|t| t.fs_base != 0).map(|t| (t.fs_base, t.tid)).collect();
        match dump_python::stacks(pid, &fs_bases) {
            Ok(mut py) => {
                for t in &mut threads {
                    if let Some(p) = py.remove(&t.tid) {
                        (t.python, t.python_name, t.task) = (Some(p.frames), p.name, p.task);
                    }
                }
                show_native = native;
            }
            // Gone meanwhile: said once, below.
            Err(_) if !target::alive(pid) => {}
            Err(e) => eprintln!(
                "osprey: pid {pid} runs CPython, yet its Python frames could not be read ({e}): native frames shown"
            ),
        }
    }
    let names = name_frames(pid, &threads, unwinder.modules());
    // Its maps, which named the frames, and its Python state are gone with it.
    // The leader is checked for being on its way out too: during an
    // `exit_group` the other threads vanish before the process is a zombie.
    if target::exiting(pid, pid) {
        return Err(Failure::from(format!("pid {pid} exited during the dump: nothing printed")));
    }
    let process = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string();
    let keys = otel.as_ref().and_then(|_| thread_ctx::read_reference(pid));
    let d = Dump { pid, process: &process, threads: &threads, names: &names, native: show_native, keys: keys.as_ref() };
    print!("{}", if json { d.json() } else { d.text() });
    let torn = if torn > 0 { format!("; {torn} thread contexts caught mid-update, not shown") } else { String::new() };
    eprintln!(
        "osprey: {} threads in {:.3} s; each stopped at most {} us{torn}",
        threads.len(),
        took.as_secs_f64(),
        longest.as_micros()
    );
    Ok(0)
}

/// What one stop of a thread gave.
struct Copied {
    regs: UserRegs,
    fs_base: u64,
    /// Bytes of stack copied.
    len: usize,
    /// How long the thread was held stopped.
    stopped: Duration,
    /// Its OTEP 4947 record, when the process publishes them.
    context: Option<ThreadRead>,
}

/// Stops `tid`, copies its registers, up to `buf.len()` bytes of stack from
/// sp (within sp's mapping) and its `otel` record, resumes it.
fn copy_stack(
    tid: i32,
    maps: &osprey_pprof::maps::ProcMaps,
    buf: &mut [u8],
    otel: Option<&Reader>,
) -> std::io::Result<Copied> {
    let stopped = osprey_python::ptrace::Stopped::new(tid, false)?;
    // From the stop being seen to the detach: the time the thread stood still
    // because of us (it may have reached the stop a little earlier).
    let t0 = Instant::now();
    let r = stopped.regs()?;
    let regs = UserRegs { ip: r.rip, sp: r.rsp, bp: r.rbp };
    let end = maps.find(regs.sp).map_or(regs.sp, |i| maps.regions[i].end);
    let len = (end.saturating_sub(regs.sp) as usize).min(buf.len());
    let n = read_remote(tid, regs.sp, &mut buf[..len]);
    let context = otel.map(|o| o.read(tid, r.fs_base));
    drop(stopped);
    Ok(Copied { regs, fs_base: r.fs_base, len: n, stopped: t0.elapsed(), context })
}

/// The process tracing thread `tid` of `pid`, if it is traced.
fn tracer(pid: i32, tid: i32) -> Option<i32> {
    let field = |path: String, key: &str| -> Option<i32> {
        let status = std::fs::read_to_string(path).ok()?;
        status.lines().find_map(|l| l.strip_prefix(key))?.trim().parse().ok()
    };
    // `TracerPid` is the tracing thread; its `Tgid` the process.
    let by = field(format!("/proc/{pid}/task/{tid}/status"), "TracerPid:").filter(|&b| b != 0)?;
    Some(field(format!("/proc/{by}/status"), "Tgid:").unwrap_or(by))
}

/// `process_vm_readv` of `buf.len()` bytes at `addr` of `tid`'s process; bytes read.
fn read_remote(tid: i32, addr: u64, buf: &mut [u8]) -> usize {
    if buf.is_empty() {
        return 0;
    }
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: `local` covers `buf`; the remote iovec is only read by the kernel.
    let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
    usize::try_from(n).unwrap_or(0)
}

/// The function name of every frame, keyed by (pc, is a return address).
fn name_frames(pid: i32, threads: &[Thread], modules: &osprey_unwind::ModuleSet) -> HashMap<(u64, bool), String> {
    let mut keys: Vec<(u64, bool)> =
        threads.iter().flat_map(|t| t.pcs.iter().enumerate().map(|(i, &pc)| (pc, i > 0))).collect();
    keys.sort_unstable();
    keys.dedup();
    name_pcs(pid, &keys, Some(modules)).collect()
}

/// Names `(pc, is a return address)` keys of `pid` in one symbolization
/// pass; `module+0xoffset` (from `modules`) or `[unknown]` when unnamed.
pub(crate) fn name_pcs<'a>(
    pid: i32,
    keys: &'a [(u64, bool)],
    modules: Option<&'a osprey_unwind::ModuleSet>,
) -> impl Iterator<Item = ((u64, bool), String)> + 'a {
    let resolved: Vec<Option<String>> = osprey_pprof::symbolize::symbolize(pid, keys, false)
        .into_iter()
        .map(|r| r.lines.last().map(|l| l.name.clone()))
        .collect();
    // What the live process's maps could not name (it exited, or the module
    // is unmapped since) is named from the unwinder's modules' files.
    let unnamed = keys.iter().zip(&resolved).filter(|(_, r)| r.is_none()).map(|(k, _)| *k);
    let offline = modules.map(|m| crate::attach_native::name_from_modules(m, unnamed)).unwrap_or_default();
    keys.iter().zip(resolved).map(move |(&key, r)| {
        let name = r.or_else(|| offline.get(&key).cloned()).unwrap_or_else(|| "[unknown]".to_string());
        (key, name)
    })
}

fn state_text(s: &target::ThreadState) -> String {
    match &s.syscall {
        Some(call) => format!("{} in {call}", s.word()),
        None => s.word().to_string(),
    }
}

/// What is printed.
struct Dump<'a> {
    pid: i32,
    process: &'a str,
    threads: &'a [Thread],
    names: &'a HashMap<(u64, bool), String>,
    /// Print the native frames (always, but for a CPython target without `--native`).
    native: bool,
    /// The process context's attribute key names, if it publishes them.
    keys: Option<&'a Reference>,
}

impl Dump<'_> {
    fn name(&self, pc: u64, i: usize) -> &str {
        self.names.get(&(pc, i > 0)).map_or("?", String::as_str)
    }

    /// Attribute key `index`'s name: the process context's, else `#index`.
    fn key(&self, index: u8) -> String {
        let named = self.keys.and_then(|r| r.attribute_keys.get(index as usize)).filter(|k| !k.is_empty());
        named.cloned().unwrap_or_else(|| format!("#{index}"))
    }

    /// ` trace T span S k=v ...` for the thread line (empty without a context).
    fn context_text(&self, c: Option<&ThreadContext>) -> String {
        let Some(c) = c else { return String::new() };
        let mut o = String::new();
        if c.trace_id != 0 || c.span_id != 0 {
            let _ = write!(o, " trace {} span {:016x}", c.trace_hex(), c.span_id);
        }
        for (k, v) in &c.attributes {
            let _ = write!(o, " {}={v:?}", self.key(*k));
        }
        o
    }

    fn text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "pid {} ({}): {} threads", self.pid, self.process, self.threads.len());
        for t in self.threads {
            // A Python thread's name first, as py-spy shows it; the OS name after when it differs.
            let name = match &t.python_name {
                Some(p) if *p != t.name => format!("\"{p}\" (os \"{}\")", t.name),
                _ => format!("\"{}\"", t.name),
            };
            let task = t.task.as_ref().map_or(String::new(), |n| format!(" task {n:?}"));
            let ctx = self.context_text(t.context.as_ref());
            let _ = writeln!(o, "\nthread {} {name} {}{task}{ctx}", t.tid, state_text(&t.state));
            for f in t.python.iter().flatten() {
                let _ = writeln!(o, "  py  {} ({}:{})", f.function, f.file, f.line);
            }
            if !self.native {
                continue;
            }
            if let Some(e) = &t.error {
                let _ = writeln!(o, "  (stack not read: {e})");
                continue;
            }
            for (i, &pc) in t.pcs.iter().enumerate() {
                let _ = writeln!(o, "  #{i:<3} {pc:#018x} {}", self.name(pc, i));
            }
            if t.truncated {
                let _ = writeln!(o, "  {}", osprey::internals::collector::FRAME_TRUNCATED);
            }
        }
        o
    }

    fn json(&self) -> String {
        let threads: Vec<serde_json::Value> = self
            .threads
            .iter()
            .map(|t| {
                let mut v = serde_json::json!({
                    "tid": t.tid,
                    "name": t.name,
                    "state": t.state.word(),
                    "syscall": t.state.syscall,
                    "error": t.error,
                });
                if let Some(n) = &t.python_name {
                    v["python_name"] = n.as_str().into();
                }
                if let Some(n) = &t.task {
                    v["task"] = n.as_str().into();
                }
                if let Some(c) = &t.context {
                    if c.trace_id != 0 || c.span_id != 0 {
                        v["trace_id"] = c.trace_hex().into();
                        v["span_id"] = format!("{:016x}", c.span_id).into();
                        v["trace_flags"] = c.trace_flags.into();
                    }
                    if !c.attributes.is_empty() {
                        let attrs: serde_json::Map<String, serde_json::Value> =
                            c.attributes.iter().map(|(k, val)| (self.key(*k), val.as_str().into())).collect();
                        v["attributes"] = attrs.into();
                    }
                }
                if self.native {
                    let frames: Vec<serde_json::Value> = t
                        .pcs
                        .iter()
                        .enumerate()
                        .map(|(i, &pc)| serde_json::json!({ "pc": format!("{pc:#x}"), "function": self.name(pc, i) }))
                        .collect();
                    v["frames"] = frames.into();
                    v["truncated"] = t.truncated.into();
                }
                if let Some(py) = &t.python {
                    let py: Vec<serde_json::Value> = py
                        .iter()
                        .map(|f| serde_json::json!({ "function": f.function, "file": f.file, "line": f.line }))
                        .collect();
                    v["python"] = py.into();
                }
                v
            })
            .collect();
        let v = serde_json::json!({ "pid": self.pid, "process": self.process, "threads": threads });
        format!("{v}\n")
    }
}
