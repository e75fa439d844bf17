//! Reading threads' records while they run, for sampling from outside:
//! each thread's thread pointer is read once, in one brief stop when the
//! thread is first seen (it never changes for the thread's life); every
//! later read is `process_vm_readv` only, the thread never stopped again.
//!
//! Without a stop the owner thread may be mid-update under the read (the
//! OTEP's `valid` byte only orders a reader that interrupts the writer), so
//! a record counts only when two reads in a row are both marked valid and
//! agree byte for byte in what they decode to; anything else is skipped and
//! counted in [`LiveReader::torn`], never reported as an id.

use super::{read_record, var_address, Reader, ThreadRead};
use crate::Result;
use std::collections::HashMap;

/// One process's thread contexts, read without stopping the threads.
pub struct LiveReader {
    reader: Reader,
    threads: HashMap<i32, Thread>,
    torn: u64,
    unreadable: u64,
}

/// What is kept per thread.
struct Thread {
    /// Its thread pointer; `None` if the one stop failed (not retried: a
    /// thread is stopped at most once).
    tp: Option<u64>,
    /// Its variable's address, once resolved (a dynamic TLS block may not
    /// exist yet when the thread is first seen).
    var: Option<u64>,
}

impl LiveReader {
    /// Locates `otel_thread_ctx_v1` in `pid`'s modules; `None` when no module
    /// exports it (then nothing is ever stopped).
    pub fn open(pid: i32) -> Result<Option<LiveReader>> {
        Ok(Reader::open(pid)?.map(|reader| LiveReader { reader, threads: HashMap::new(), torn: 0, unreadable: 0 }))
    }

    /// The module that exports the symbol.
    pub fn module(&self) -> &str {
        self.reader.module()
    }

    /// Follows exactly `tids`: a thread not seen before is stopped once, as
    /// briefly as can be, for its thread pointer; threads not listed are
    /// forgotten.
    pub fn track(&mut self, tids: impl IntoIterator<Item = i32>) {
        let mut kept = HashMap::new();
        for tid in tids {
            let t = self.threads.remove(&tid).unwrap_or_else(|| Thread { tp: super::thread_pointer(tid), var: None });
            kept.insert(tid, t);
        }
        self.threads = kept;
    }

    /// Thread `tid`'s record now, read twice; [`ThreadRead::Torn`] (and
    /// counted) unless both reads are valid and agree.
    pub fn read(&mut self, tid: i32) -> ThreadRead {
        let r = self.read_twice(tid);
        match r {
            ThreadRead::Torn => self.torn += 1,
            ThreadRead::Unreadable => self.unreadable += 1,
            _ => {}
        }
        r
    }

    fn read_twice(&mut self, tid: i32) -> ThreadRead {
        let (mem, at) = (&self.reader.mem, &self.reader.at);
        let Some(t) = self.threads.get_mut(&tid) else { return ThreadRead::Unreadable };
        let Some(tp) = t.tp else { return ThreadRead::Unreadable };
        let var = match t.var {
            Some(v) => v,
            None => match var_address(mem, at, tp) {
                Some(v) => *t.var.insert(v),
                None => return ThreadRead::Unreadable,
            },
        };
        match (read_record(mem, var, tid), read_record(mem, var, tid)) {
            (Some(a), Some(b)) if a == b => a,
            (Some(_), Some(_)) => ThreadRead::Torn,
            _ => ThreadRead::Unreadable,
        }
    }

    /// Reads skipped because the record changed under them (or was being
    /// written).
    pub fn torn(&self) -> u64 {
        self.torn
    }

    /// Reads that failed (thread not tracked or not stopped once, TLS block
    /// missing, memory gone).
    pub fn unreadable(&self) -> u64 {
        self.unreadable
    }
}
