//! Every thread of one process, each with its own event
//! ([`ThreadSampler`]).
//!
//! An event follows one thread only (a per-thread event cannot be inherited
//! and mapped at once), so threads started later are picked up by
//! [`ProcessSampler::refresh_threads`], which the caller runs every few
//! hundred milliseconds: a new thread's samples before that are not taken.
//! An exited thread's event stays until its ring has been drained once
//! more, so its last samples are kept.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::record::RawSample;
use crate::thread::{Drained, ThreadSampler};

struct Entry {
    sampler: ThreadSampler,
    /// The thread is gone (not in `/proc/<pid>/task`, or its event hung
    /// up): dropped after the next drain.
    gone: bool,
}

/// Samples every thread of process `pid` from outside it.
pub struct ProcessSampler {
    pid: u32,
    config: Config,
    threads: BTreeMap<u32, Entry>,
    scratch: Vec<u8>,
    totals: Drained,
}

/// What [`ProcessSampler::refresh_threads`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Threads newly sampled.
    pub added: usize,
    /// Threads found gone (their events go after the next drain).
    pub gone: usize,
}

impl ProcessSampler {
    /// Samples every thread of `pid` `hz` times a second of its CPU time,
    /// copying `stack_bytes` of stack per sample.
    pub fn attach(pid: u32, hz: u32, stack_bytes: u32) -> Result<ProcessSampler> {
        ProcessSampler::attach_with(pid, &Config::new(hz, stack_bytes))
    }

    /// As [`ProcessSampler::attach`] with every setting. Fails if no thread
    /// could be sampled; the first thread's refusal (permission, no perf
    /// events) is the error.
    pub fn attach_with(pid: u32, config: &Config) -> Result<ProcessSampler> {
        let config = config.validated()?;
        let mut p =
            ProcessSampler { pid, config, threads: BTreeMap::new(), scratch: Vec::new(), totals: Drained::default() };
        let tids = p.tids_now()?;
        for tid in tids {
            match ThreadSampler::open_with(tid, &p.config) {
                Ok(s) => {
                    p.threads.insert(tid, Entry { sampler: s, gone: false });
                }
                // Exited since the listing.
                Err(Error::NoSuchThread { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if p.threads.is_empty() {
            return Err(Error::NoSuchProcess { pid });
        }
        Ok(p)
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The settings in force (defaults filled).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Threads currently sampled (including gone ones not yet drained).
    pub fn tids(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.keys().copied()
    }

    /// Samples and losses over every drain so far.
    pub fn totals(&self) -> Drained {
        self.totals
    }

    /// `/proc/<pid>/task`.
    fn tids_now(&self) -> Result<Vec<u32>> {
        let dir = std::fs::read_dir(format!("/proc/{}/task", self.pid))
            .map_err(|_| Error::NoSuchProcess { pid: self.pid })?;
        Ok(dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
    }

    /// Starts sampling threads that appeared since the last call and marks
    /// the ones that exited. An error means the process itself is gone (or a
    /// new thread's event was refused); what is sampled so far stays.
    pub fn refresh_threads(&mut self) -> Result<Refreshed> {
        let now = match self.tids_now() {
            Ok(t) => t,
            Err(e) => {
                self.threads.values_mut().for_each(|t| t.gone = true);
                return Err(e);
            }
        };
        let mut r = Refreshed::default();
        for (tid, t) in self.threads.iter_mut() {
            if !t.gone && !now.contains(tid) {
                t.gone = true;
                r.gone += 1;
            }
        }
        for tid in now {
            if self.threads.contains_key(&tid) {
                continue;
            }
            match ThreadSampler::open_with(tid, &self.config) {
                Ok(s) => {
                    self.threads.insert(tid, Entry { sampler: s, gone: false });
                    r.added += 1;
                }
                Err(Error::NoSuchThread { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(r)
    }

    /// The events' descriptors, for the caller's own `poll`/`epoll`.
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> + '_ {
        self.threads.values().map(|t| t.sampler.fd())
    }

    /// Waits up to `timeout` for a ring to be half full or a thread to exit;
    /// true if one was. Threads whose event hung up are marked gone.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool> {
        let mut fds: Vec<libc::pollfd> =
            self.fds().map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        let n = crate::sys::poll(&mut fds, timeout).map_err(|source| Error::Io { what: "poll", source })?;
        // `fds` is in the map's order.
        for (t, p) in self.threads.values_mut().zip(&fds) {
            if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                t.gone = true;
            }
        }
        Ok(n > 0)
    }

    /// Passes every sample of every thread's ring to `f` (each thread's
    /// oldest first) and drops the events of threads found gone.
    pub fn drain(&mut self, f: &mut dyn FnMut(&RawSample<'_>)) -> Drained {
        let mut d = Drained::default();
        for t in self.threads.values_mut() {
            d += t.sampler.drain(&mut self.scratch, f);
        }
        self.threads.retain(|_, t| !t.gone);
        self.totals += d;
        d
    }
}

impl std::fmt::Debug for ProcessSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSampler").field("pid", &self.pid).field("threads", &self.threads.len()).finish()
    }
}
