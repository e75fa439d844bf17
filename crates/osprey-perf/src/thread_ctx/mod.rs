//! Reading the OpenTelemetry thread context (OTEP 4947) of another process:
//! each thread's `otel_thread_ctx_v1` TLS pointer and the record it points
//! at (W3C trace id, span id, trace flags, attributes), whichever library
//! published it (osprey's agent, an OTel SDK, a C program).
//!
//! How: the module exporting `otel_thread_ctx_v1` in `.dynsym` is found from
//! `/proc/PID/maps` ([`elf`]); each thread is stopped in turn with
//! `PTRACE_SEIZE` + `PTRACE_INTERRUPT` just long enough to read its thread
//! pointer (`fs_base`, `PTRACE_GETREGS`) and, with `process_vm_readv`, the
//! TLS pointer and the 28-byte record head plus attributes, then detached.
//! The OTEP requires the reader to look at a thread only while it is stopped
//! (the writer relies on signal-handler-like ordering); a stop is the least
//! intrusive way to get both that and the thread pointer, which `/proc` and
//! perf user registers do not give. A record stopped mid-update (`valid`
//! not 1) is skipped and counted in [`Contexts::torn`], never reported.
//! [`Reader`] serves callers that stop the threads themselves; [`LiveReader`]
//! samplers that must not stop them again after one stop per thread.
//!
//! Limits: x86-64; TLS placed statically (the executable, libraries loaded
//! at start, `LD_PRELOAD`) or dynamically through TLSDESC/legacy GD (the
//! thread's DTV must already hold the block; otherwise the thread counts as
//! unreadable).

mod elf;
mod live;
mod mem;
mod process_ctx;

pub use elf::{TlsSlot, SYMBOL};
pub use live::LiveReader;
pub use process_ctx::{decode as decode_process_ctx, Reference};

use crate::{Error, Result};
use mem::Memory;

/// One thread's context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadContext {
    /// The thread.
    pub tid: i32,
    /// W3C trace id as a number (its 32 hex digits); 0 = none.
    pub trace_id: u128,
    /// Span id (its 16 hex digits); 0 = none.
    pub span_id: u64,
    /// W3C trace flags.
    pub trace_flags: u8,
    /// Attributes: (key index, UTF-8 value), in record order, later entries
    /// of a key replacing earlier ones.
    pub attributes: Vec<(u8, String)>,
}

impl ThreadContext {
    /// The trace id as W3C writes it (32 lowercase hex digits).
    pub fn trace_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// What [`read_thread_contexts`] found.
#[derive(Clone, Debug, Default)]
pub struct Contexts {
    /// Threads with a valid record (a record with zero ids means "no span").
    pub threads: Vec<ThreadContext>,
    /// Threads whose TLS pointer is NULL (no context published).
    pub empty: u32,
    /// Records skipped because the thread was stopped mid-update.
    pub torn: u32,
    /// Threads that could not be stopped or read (exited, refused, TLS block
    /// not allocated yet).
    pub unreadable: u32,
    /// The module that exports the symbol (`None`: no module does).
    pub module: Option<String>,
    /// The OTEP 4719 reference data, if the process publishes it.
    pub reference: Option<Reference>,
}

impl Contexts {
    /// The name of attribute key `index` from the process context.
    pub fn key_name(&self, index: u8) -> Option<&str> {
        self.reference.as_ref()?.attribute_keys.get(index as usize).map(String::as_str)
    }
}

/// Where `otel_thread_ctx_v1` is, for every thread of one process.
struct Located {
    slot: TlsSlot,
    bias: u64,
}

/// One process's `otel_thread_ctx_v1`, located once, for callers that stop
/// threads themselves (e.g. to copy their stacks) and read each thread's
/// record in the same stop with [`Reader::read`].
pub struct Reader {
    mem: Memory,
    at: Located,
    module: String,
}

/// One thread's record, read while the thread was stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThreadRead {
    /// A valid record.
    Record(ThreadContext),
    /// The TLS pointer is NULL: no context published.
    Null,
    /// The thread was stopped mid-update (`valid` not 1): skipped.
    Torn,
    /// The TLS block or the record could not be read.
    Unreadable,
}

impl Reader {
    /// Locates the symbol in `pid`'s modules; `None` when no module exports it.
    pub fn open(pid: i32) -> Result<Option<Reader>> {
        Ok(locate(pid)?.map(|(at, module)| Reader { mem: Memory { pid }, at, module }))
    }

    /// The module that exports the symbol.
    pub fn module(&self) -> &str {
        &self.module
    }

    /// Thread `tid`'s record. The thread must be stopped (ptrace-stop or
    /// equivalent) and `thread_pointer` be its `fs_base`.
    pub fn read(&self, tid: i32, thread_pointer: u64) -> ThreadRead {
        read_one(&self.mem, &self.at, tid, thread_pointer).unwrap_or(ThreadRead::Unreadable)
    }
}

/// Reads every thread's OTEP 4947 context of process `pid`, stopping each
/// thread in turn for the read.
pub fn read_thread_contexts(pid: i32) -> Result<Contexts> {
    let mut out = Contexts { reference: process_ctx::read(pid, &Memory { pid }), ..Contexts::default() };
    let Some(reader) = Reader::open(pid)? else { return Ok(out) };
    out.module = Some(reader.module.clone());
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| Error::NoSuchProcess { pid: pid as u32 })?;
    let mut tids: Vec<i32> = tasks.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    for tid in tids {
        match stopped(tid, |tp| Some(reader.read(tid, tp))).unwrap_or(ThreadRead::Unreadable) {
            ThreadRead::Record(c) => out.threads.push(c),
            ThreadRead::Null => out.empty += 1,
            ThreadRead::Torn => out.torn += 1,
            ThreadRead::Unreadable => out.unreadable += 1,
        }
    }
    Ok(out)
}

/// The OTEP 4719 reference data of `pid` (attribute key names), if it
/// publishes a process context.
pub fn read_reference(pid: i32) -> Option<Reference> {
    process_ctx::read(pid, &Memory { pid })
}

/// The module exporting the symbol and its slot.
fn locate(pid: i32) -> Result<Option<(Located, String)>> {
    let maps = osprey_procfs::maps::read(pid).map_err(|_| Error::NoSuchProcess { pid: pid as u32 })?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut seen = std::collections::HashSet::new();
    for e in osprey_procfs::maps::entries(&maps) {
        if !e.is_file() || e.offset != 0 || !seen.insert(e.path.to_vec()) {
            continue;
        }
        let path = e.path_os();
        // Through the target's root, so a container's files are the ones read.
        let Ok(data) = std::fs::read(
            std::path::Path::new(&format!("/proc/{pid}/root"))
                .join(std::path::Path::new(path).strip_prefix("/").unwrap_or(std::path::Path::new(path))),
        ) else {
            continue;
        };
        let is_main = exe.as_deref() == Some(std::path::Path::new(path));
        let (Some(slot), Some(first)) = (elf::find(&data, is_main), elf::first_load(&data)) else { continue };
        let bias = e.start.wrapping_sub(first);
        return Ok(Some((Located { slot, bias }, path.to_string_lossy().into_owned())));
    }
    Ok(None)
}

/// The record of thread `tid`, whose thread pointer is `tp`.
fn read_one(mem: &Memory, at: &Located, tid: i32, tp: u64) -> Option<ThreadRead> {
    read_record(mem, var_address(mem, at, tp)?, tid)
}

/// The address of the thread's `otel_thread_ctx_v1` variable (fixed for the
/// thread's life once its TLS block exists).
fn var_address(mem: &Memory, at: &Located, tp: u64) -> Option<u64> {
    Some(match at.slot {
        TlsSlot::TpOff(off) => tp.wrapping_add(off as u64),
        TlsSlot::TpOffGot(got) => tp.wrapping_add(mem.word(at.bias + got)?),
        TlsSlot::Desc(got) => {
            let arg = mem.word(at.bias + got + 8)?;
            if (arg as i64) < 0 && (arg as i64) > -(1 << 32) {
                tp.wrapping_add(arg) // static TLS: the offset itself
            } else {
                // glibc's dynamic descriptor argument: (module id, offset, generation).
                dtv_address(mem, tp, mem.word(arg)?, mem.word(arg + 8)?)?
            }
        }
        TlsSlot::ModuleGot(got) => dtv_address(mem, tp, mem.word(at.bias + got)?, mem.word(at.bias + got + 8)?)?,
    })
}

/// The record the variable at `var` points at (one read of each part).
fn read_record(mem: &Memory, var: u64, tid: i32) -> Option<ThreadRead> {
    let record = mem.word(var)?;
    if record == 0 {
        return Some(ThreadRead::Null);
    }
    let head = mem.read(record, 28)?;
    if head[24] != 1 {
        return Some(ThreadRead::Torn);
    }
    let size = u16::from_ne_bytes([head[26], head[27]]) as usize;
    let attrs = if size > 0 { mem.read(record + 28, size)? } else { Vec::new() };
    Some(ThreadRead::Record(ThreadContext {
        tid,
        trace_id: u128::from_be_bytes(head[..16].try_into().ok()?),
        span_id: u64::from_be_bytes(head[16..24].try_into().ok()?),
        trace_flags: head[25],
        attributes: parse_attributes(&attrs),
    }))
}

/// The variable at `offset` in module `module`'s block, from the thread's
/// DTV (glibc: `tp + 8` points at it; entries of 16 bytes, block pointer
/// first; an unallocated block is -1 or 0).
fn dtv_address(mem: &Memory, tp: u64, module: u64, offset: u64) -> Option<u64> {
    let dtv = mem.word(tp + 8)?;
    let block = mem.word(dtv + 16 * module)?;
    (block != 0 && block != u64::MAX).then(|| block + offset)
}

/// The OTEP's `attrs_data` entries `(key, length, bytes)`; a truncated entry
/// ends the list.
pub fn parse_attributes(mut b: &[u8]) -> Vec<(u8, String)> {
    let mut out: Vec<(u8, String)> = Vec::new();
    while let [key, len, rest @ ..] = b {
        let Some(value) = rest.get(..*len as usize) else { break };
        let value = String::from_utf8_lossy(value).into_owned();
        match out.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = value,
            None => out.push((*key, value)),
        }
        b = &rest[*len as usize..];
    }
    out
}

/// The thread pointer (`fs_base`) of `tid`, read in a stop as short as can
/// be; `None` if the thread cannot be stopped (gone, refused, already traced).
pub fn thread_pointer(tid: i32) -> Option<u64> {
    stopped(tid, Some)
}

/// Runs `f` with the thread pointer of `tid` while the thread is stopped
/// (`PTRACE_SEIZE` + `PTRACE_INTERRUPT`), then lets it go. `None` if the
/// thread cannot be stopped (gone, refused, already traced).
fn stopped<T>(tid: i32, f: impl FnOnce(u64) -> Option<T>) -> Option<T> {
    // SAFETY: ptrace requests on a thread id with valid pointers; every
    // successful seize is followed by a detach.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            return None;
        }
        let (mut out, mut pass_on) = (None, 0);
        if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) == 0 {
            let mut status = 0;
            if libc::waitpid(tid, &mut status, libc::__WALL) == tid && libc::WIFSTOPPED(status) {
                // A signal arriving first gives a signal-delivery stop (no
                // ptrace event): the signal goes back with the detach, or the
                // program would lose it.
                if status >> 16 == 0 {
                    pass_on = libc::WSTOPSIG(status);
                }
                let mut regs: libc::user_regs_struct = std::mem::zeroed();
                if libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs) == 0 {
                    out = f(regs.fs_base);
                }
            }
        }
        libc::ptrace(libc::PTRACE_DETACH, tid, 0, pass_on as libc::c_long);
        out
    }
}
