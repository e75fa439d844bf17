//! Finding the `PyThreadState` of each OS thread, four ways:
//!
//! 1. TLS (3.12+): `_Py_tss_tstate`, located by decoding
//!    `_PyThreadState_GetCurrent`; NULL when the thread does not hold the GIL.
//! 2. TSS: the gilstate `autoTSSkey` read through glibc's `struct pthread`
//!    key data (layout from decoding `pthread_getspecific`); from 3.15 the
//!    gilstate is a thread-local, found like method 1.
//! 3. Lists: `_PyRuntime` -> interpreters -> thread states.
//! 4. Cache: (thread) -> tstate map, keyed by `native_thread_id` (3.11+) or
//!    `pthread_self()` = fs base (< 3.11), refreshed from the lists.
//!    `native_thread_id` is the id in the target's PID namespace: host ids
//!    are mapped through [`TidMap`] first.
//!
//! 1 and 2 need each thread's fs base, obtained once per thread with a brief
//! ptrace interrupt and cached.

use std::collections::HashMap;
use std::io;
use std::time::{Duration, Instant};

use crate::layout::decode::TlsAccess;
use crate::remote::namespace::TidMap;
use crate::target::Target;

/// Ways to find each OS thread's `PyThreadState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `_Py_tss_tstate` thread-local (3.12+); NULL for threads without the GIL.
    Tls,
    /// pthread thread-specific data under the gilstate `autoTSSkey`.
    Tss,
    /// Interpreter and thread lists from `_PyRuntime`.
    Lists,
    /// A thread -> tstate map refreshed from the lists.
    Cache,
}

/// One thread state found in the interpreter lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TstateInfo {
    /// Address of the `PyThreadState`.
    pub addr: u64,
    /// Address of its `PyInterpreterState`.
    pub interp: u64,
    /// `pthread_self()` of the thread (= its fs base with glibc).
    pub thread_id: u64,
    /// Kernel tid (3.11+).
    pub native_tid: Option<i32>,
}

/// Gets a thread's fs base with a short ptrace interrupt (see
/// [`crate::remote::ptrace`]). The thread resumes immediately.
pub fn ptrace_fs_base(tid: i32, leave_exit: bool) -> io::Result<u64> {
    Ok(crate::remote::ptrace::Stopped::new(tid, leave_exit)?.regs()?.fs_base)
}

/// Walks `_PyRuntime` -> interpreters -> thread states.
pub fn list_tstates(t: &Target) -> io::Result<Vec<TstateInfo>> {
    let l = &t.layout;
    let mut out = Vec::new();
    let mut interp = t.interp_head()?;
    let mut ni = 0;
    let hdr =
        l.tstate_next.max(l.tstate_interp).max(l.tstate_thread_id).max(l.tstate_native_thread_id.unwrap_or(0)) + 8;
    while interp != 0 && ni < 64 {
        ni += 1;
        let mut ts = t.mem.u64(interp + l.interp_tstate_head)?;
        let mut nt = 0;
        while ts != 0 && nt < 10_000 {
            nt += 1;
            let b = t.mem.read_vec(ts, hdr as usize)?;
            let rd = |o: u64| crate::remote::process::rd_u64(&b, o as usize);
            out.push(TstateInfo {
                addr: ts,
                interp,
                thread_id: rd(l.tstate_thread_id),
                native_tid: l.tstate_native_thread_id.map(|o| crate::remote::process::rd_u32(&b, o as usize) as i32),
            });
            ts = rd(l.tstate_next);
        }
        interp = t.mem.u64(interp + l.interp_next)?;
    }
    Ok(out)
}

/// Maps OS threads to their `PyThreadState` addresses: per-thread state of
/// methods 1 and 2, and the map of method 4.
#[derive(Default)]
pub struct ThreadStateMap {
    fs_base: HashMap<i32, Option<u64>>,
    /// Per thread: resolved address of `_Py_tss_tstate` (method 1).
    tls_addr: HashMap<i32, u64>,
    /// Per thread: resolved address of the autoTSSkey value slot (method 2).
    tss_addr: HashMap<i32, u64>,
    /// Method 4: key (tid for 3.11+, pthread_self otherwise) -> tstate.
    cache: HashMap<u64, u64>,
    cache_refreshed: Option<Instant>,
    pub(crate) last_list: Vec<TstateInfo>,
    pub(crate) ptrace_errors: u64,
    pub(crate) last_ptrace_error: Option<String>,
    /// Combined mode only: skip TLS/TSS (which need a ptrace interrupt per
    /// thread) and use the cache. Set for 3.11+ targets that are our own
    /// children, whose ptrace stops a concurrent waitpid() could consume.
    pub no_ptrace: bool,
    /// The target's pid when it is a child of this process (its exit is
    /// left to the parent thread: see [`crate::remote::ptrace`]).
    pub child: Option<i32>,
    /// Host thread ids -> the target's PID namespace (None until first used).
    tids: Option<TidMap>,
}

impl ThreadStateMap {
    pub(crate) fn forget_thread(&mut self, tid: i32) {
        self.fs_base.remove(&tid);
        self.tls_addr.remove(&tid);
        self.tss_addr.remove(&tid);
    }

    pub(crate) fn retain_threads(&mut self, live: &[i32]) {
        if let Some(m) = &mut self.tids {
            m.retain(live);
        }
        self.fs_base.retain(|k, _| live.contains(k));
        self.tls_addr.retain(|k, _| live.contains(k));
        self.tss_addr.retain(|k, _| live.contains(k));
    }

    pub(crate) fn fs_base(&mut self, tid: i32) -> Option<u64> {
        if let Some(v) = self.fs_base.get(&tid) {
            return *v;
        }
        let v = match ptrace_fs_base(tid, self.child == Some(tid)) {
            Ok(v) => Some(v),
            Err(e) => {
                self.ptrace_errors += 1;
                let by = tracer_of(tid).map(|p| format!(", traced by pid {p} (a debugger or another profiler)"));
                self.last_ptrace_error = Some(format!("thread {tid}: {e}{}", by.unwrap_or_default()));
                None
            }
        };
        self.fs_base.insert(tid, v);
        v
    }

    /// Method 1. Ok(0) when the thread holds no GIL.
    pub fn via_tls(&mut self, t: &Target, tid: i32) -> io::Result<u64> {
        let acc = t.tls.ok_or_else(|| io::Error::other(t.tls_error.clone().unwrap_or_default()))?;
        if let Some(&a) = self.tls_addr.get(&tid) {
            return t.mem.u64(a);
        }
        let fs = self.fs_base(tid).ok_or_else(|| io::Error::other("no fs base"))?;
        let addr = tls_var_addr(t, acc, fs)?;
        self.tls_addr.insert(tid, addr);
        t.mem.u64(addr)
    }

    /// Method 2 (3.15+: the gilstate thread-local instead of a pthread key).
    pub fn via_tss(&mut self, t: &Target, tid: i32) -> io::Result<u64> {
        if let Some(&a) = self.tss_addr.get(&tid) {
            return t.mem.u64(a);
        }
        if let Some(acc) = t.gilstate_tls {
            let fs = self.fs_base(tid).ok_or_else(|| io::Error::other("no fs base"))?;
            let addr = tls_var_addr(t, acc, fs)?;
            self.tss_addr.insert(tid, addr);
            return t.mem.u64(addr);
        }
        let pl = t.pthread.ok_or_else(|| io::Error::other(t.pthread_error.clone().unwrap_or_default()))?;
        let fs = self.fs_base(tid).ok_or_else(|| io::Error::other("no fs base"))?;
        let keyaddr = t.runtime + t.layout.runtime_autotsskey;
        // Py_tss_t { int _is_initialized; pthread_key_t _key; }
        let init = t.mem.i32(keyaddr)?;
        if init == 0 {
            return Ok(0);
        }
        let key = t.mem.u32(keyaddr + 4)? as u64;
        if key >= pl.keys_max {
            return Err(io::Error::other("TSS key out of range"));
        }
        let pd = t.mem.u64(fs.wrapping_add(pl.self_off as u64))?;
        let slot = if key < pl.second_level_size {
            pd + pl.first_block_off + key * pl.key_data_size + pl.data_off
        } else {
            let idx1 = key / pl.second_level_size;
            let l2 = t.mem.u64(fs.wrapping_add(pl.specific_off as u64) + idx1 * 8)?;
            if l2 == 0 {
                return Ok(0);
            }
            // Second-level blocks are allocated once and never moved; the
            // first-level slot is only NULL before that.
            l2 + (key % pl.second_level_size) * pl.key_data_size + pl.data_off
        };
        self.tss_addr.insert(tid, slot);
        t.mem.u64(slot)
    }

    fn cache_key(&mut self, t: &Target, tid: i32) -> Option<u64> {
        if t.layout.tstate_native_thread_id.is_some() {
            let map = self.tids.get_or_insert_with(|| TidMap::new(t.pid));
            map.ns_tid(t.pid, tid).ok().map(|n| n as u32 as u64)
        } else {
            self.fs_base(tid)
        }
    }

    pub(crate) fn refresh_cache(&mut self, t: &Target) -> io::Result<()> {
        let list = list_tstates(t)?;
        self.cache.clear();
        for ts in &list {
            let key = match ts.native_tid {
                Some(n) => n as u64,
                None => ts.thread_id,
            };
            self.cache.insert(key, ts.addr);
        }
        self.last_list = list;
        self.cache_refreshed = Some(Instant::now());
        Ok(())
    }

    /// Method 4: the map, refreshed from the lists when stale, missing the
    /// thread, or when the cached tstate no longer belongs to the thread.
    pub fn via_cache(&mut self, t: &Target, tid: i32) -> io::Result<u64> {
        let Some(key) = self.cache_key(t, tid) else { return Err(io::Error::other("no fs base")) };
        let stale = self.cache_refreshed.is_none_or(|i| i.elapsed() > Duration::from_secs(1));
        if stale {
            self.refresh_cache(t)?;
        }
        for attempt in 0..2 {
            if let Some(&ts) = self.cache.get(&key) {
                // Validate: the address may have been reused by another thread.
                let off = t.layout.tstate_native_thread_id.unwrap_or(t.layout.tstate_thread_id);
                let v = if t.layout.tstate_native_thread_id.is_some() {
                    t.mem.u32(ts + off).map(|v| v as u64)
                } else {
                    t.mem.u64(ts + off)
                };
                if matches!(v, Ok(v) if v == key) {
                    return Ok(ts);
                }
            }
            if attempt == 0 && !stale {
                // Rate-limit refreshes on misses to ~20 ms.
                if self.cache_refreshed.is_none_or(|i| i.elapsed() > Duration::from_millis(20)) {
                    self.refresh_cache(t)?;
                    continue;
                }
            }
            break;
        }
        Ok(0)
    }

    /// Method 3 alone: the tstate of `tid` from a fresh walk of the lists.
    pub fn via_lists(&mut self, t: &Target, tid: i32) -> io::Result<u64> {
        let key = self.cache_key(t, tid).ok_or_else(|| io::Error::other("no fs base"))?;
        let list = list_tstates(t)?;
        Ok(list
            .iter()
            .find(|ts| match ts.native_tid {
                Some(n) => n as u64 == key,
                None => ts.thread_id == key,
            })
            .map(|ts| ts.addr)
            .unwrap_or(0))
    }

    /// The tstate of `tid` by `method` (None = combined: TLS, then TSS, then
    /// the cache). Returns 0 for a thread without one.
    pub fn find(&mut self, t: &Target, tid: i32, method: Option<Method>) -> io::Result<u64> {
        match method {
            Some(Method::Tls) => self.via_tls(t, tid),
            Some(Method::Tss) => self.via_tss(t, tid),
            Some(Method::Lists) => self.via_lists(t, tid),
            Some(Method::Cache) => self.via_cache(t, tid),
            None => {
                if self.no_ptrace {
                    return self.via_cache(t, tid);
                }
                if t.tls.is_some() {
                    if let Ok(v) = self.via_tls(t, tid) {
                        if v != 0 {
                            return Ok(v);
                        }
                    }
                }
                if t.pthread.is_some() || t.gilstate_tls.is_some() {
                    if let Ok(v) = self.via_tss(t, tid) {
                        if v != 0 {
                            return Ok(v);
                        }
                    }
                }
                self.via_cache(t, tid)
            }
        }
    }
}

/// Address of `_Py_tss_tstate` for the thread whose fs base is `fs`.
pub fn tls_var_addr(t: &Target, acc: TlsAccess, fs: u64) -> io::Result<u64> {
    Ok(match acc {
        TlsAccess::FsOffset(d) => fs.wrapping_add(d as u64),
        TlsAccess::TpoffGot { got, add } => {
            let off = t.mem.u64(got)?;
            fs.wrapping_add(off).wrapping_add(add as u64)
        }
        TlsAccess::TlsIndexGot { got, add } => {
            // tls_index { unsigned long ti_module; unsigned long ti_offset; }
            let module = t.mem.u64(got)?;
            let offset = t.mem.u64(got + 8)?;
            // tcbhead_t { void *tcb; dtv_t *dtv; ... }; dtv_t is 16 bytes
            // { void *val; void *to_free; }, indexed by module id.
            let dtv = t.mem.u64(fs + 8)?;
            let block = t.mem.u64(dtv + module * 16)?;
            if block == 0 || block == u64::MAX {
                return Err(io::Error::other("TLS block of libpython not allocated for this thread"));
            }
            block.wrapping_add(offset).wrapping_add(add as u64)
        }
    })
}

/// The process tracing thread `tid`, if another one does (`TracerPid`).
fn tracer_of(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let pid: i32 = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().parse().ok()?;
    // SAFETY: a plain id query.
    (pid != 0 && pid != unsafe { libc::getpid() }).then_some(pid)
}
