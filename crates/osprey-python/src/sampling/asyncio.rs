//! asyncio tasks (3.14+): which task a thread is running.
//!
//! The `_asyncio` module publishes `_Py_AsyncioModuleDebugOffsets` in its
//! `.AsyncioDebug` section: three groups of `uint64_t` (task object: size,
//! name, awaited_by, is_task, awaited_by_is_set, coro, node; interpreter
//! state: size, tasks head; thread state: size, running loop, running task,
//! tasks head). The thread-state offsets are relative to the thread state.
//! The running task's coroutine frames are already on the thread's own
//! frame chain; what the sample gains is the task's name (a `task` label).
//! The module is usually loaded after start-up (`import asyncio`), so it is
//! looked for again, at most every [`RETRY`], until found.

use std::time::{Duration, Instant};

use crate::remote::process::{self, rd_u32, rd_u64};
use crate::target::pyobject::{Long, Reader};
use crate::target::Target;

/// How often to look for the `_asyncio` module while it is not loaded.
pub const RETRY: Duration = Duration::from_secs(1);

/// Words of `_Py_AsyncioModuleDebugOffsets` (3.14, 3.15).
const WORDS: usize = 13;

/// The offsets osprey uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `sizeof` a task object.
    pub task_size: u64,
    /// Offset of a task's name in the task object.
    pub task_name: u64,
    /// Offset of the running task in a thread state.
    pub tstate_running_task: u64,
}

impl Offsets {
    /// Parses and checks the section's words.
    pub fn parse(b: &[u8]) -> Option<Offsets> {
        if b.len() < 8 * WORDS {
            return None;
        }
        let w = |i: usize| rd_u64(b, 8 * i);
        let o = Offsets { task_size: w(0), task_name: w(1), tstate_running_task: w(11) };
        // The running loop's offset (word 10) is not used, only checked with
        // the task's: both fit the thread state of the layout read.
        let tstate_size = w(9);
        let ok = (32..=4096).contains(&o.task_size)
            && o.task_name % 8 == 0
            && o.task_name + 8 <= o.task_size
            && [w(10), o.tstate_running_task].iter().all(|&f| f % 8 == 0 && f + 8 <= tstate_size)
            && tstate_size <= 1 << 20;
        ok.then_some(o)
    }
}

/// Finds the task offsets of the target, once `_asyncio` is loaded.
#[derive(Default)]
pub struct Tasks {
    offsets: Option<Offsets>,
    looked: Option<Instant>,
    checked_interpreter: bool,
}

impl Tasks {
    fn offsets(&mut self, t: &Target) -> Option<Offsets> {
        if self.offsets.is_some() || t.version.minor < 14 {
            return self.offsets;
        }
        if self.looked.is_some_and(|i| i.elapsed() < RETRY) {
            return None;
        }
        self.looked = Some(Instant::now());
        let maps = process::read_maps(t.pid).ok()?;
        let mut paths: Vec<&str> = maps
            .iter()
            .map(|m| m.path.as_str())
            .filter(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("_asyncio")))
            .collect();
        // Built into the interpreter itself in some builds: its (large) file
        // is looked at once.
        if !self.checked_interpreter {
            self.checked_interpreter = true;
            paths.push(t.module.path.as_str());
        }
        for p in paths {
            if let Ok(Some((addr, size))) = process::section_in(t.pid, &maps, p, ".AsyncioDebug") {
                let b = t.mem.read_vec(addr, size.min(512) as usize).ok()?;
                self.offsets = Offsets::parse(&b);
                return self.offsets;
            }
        }
        None
    }

    /// Where `tstate` holds the task it is running (0: no `_asyncio` found
    /// yet), for a copy of the word at the sampling interrupt.
    pub fn running_at(&mut self, t: &Target, tstate: u64) -> u64 {
        self.offsets(t).map_or(0, |o| tstate + o.tstate_running_task)
    }

    /// The task `tstate` is running (0: none, or unknown yet).
    pub fn running(&mut self, t: &Target, tstate: u64) -> u64 {
        match self.running_at(t, tstate) {
            0 => 0,
            at => t.mem.u64(at).unwrap_or(0),
        }
    }

    /// The name of `task` (from [`Tasks::running`]).
    pub fn name(&self, t: &Target, task: u64) -> Option<String> {
        let o = self.offsets.filter(|_| task != 0)?;
        let name = t.mem.u64(task + o.task_name).ok()?;
        object_name(t, name)
    }
}

/// Characters of a task name, at most (a longer one is a torn read).
const MAX_NAME: usize = 4096;

/// A task's name object: a `str`, or the counter (a small `int`) 3.14 keeps
/// until the name is first asked for, shown as asyncio would (`Task-N`).
fn object_name(t: &Target, obj: u64) -> Option<String> {
    let l = &t.layout;
    let ty = t.mem.u64(obj + l.object_type).ok()?;
    if t.long_type.is_some_and(|lt| lt == ty) {
        // 3.12+ long: lv_tag (ndigits << 3 | sign) at 16, 30-bit digits at 24.
        let b = t.mem.read_vec(obj, 32).ok()?;
        let tag = rd_u64(&b, 16);
        let (ndigits, sign) = (tag >> 3, tag & 3);
        return (ndigits <= 1 && sign != 2).then(|| format!("Task-{}", if ndigits == 0 { 0 } else { rd_u32(&b, 24) }));
    }
    Reader::new(t, 2).str(obj, MAX_NAME, Long::Refuse).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_checks_ranges() {
        let mut w = [0u64; WORDS];
        w[0] = 240; // sizeof task
        w[1] = 112; // task_name
        w[9] = 1024; // sizeof thread state
        w[10] = 976; // running loop
        w[11] = 984; // running task
        let b: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(Offsets::parse(&b), Some(Offsets { task_size: 240, task_name: 112, tstate_running_task: 984 }));
        for (i, v) in [(10, 1024), (11, 1024)] {
            let mut bad = w;
            bad[i] = v;
            let b: Vec<u8> = bad.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(Offsets::parse(&b), None, "word {i} past the thread state");
        }
        assert_eq!(Offsets::parse(&[0; 16]), None);
    }
}
