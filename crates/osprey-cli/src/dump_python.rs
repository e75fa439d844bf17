//! The Python frames of a CPython target's threads for `osprey dump`: one
//! read of each thread state's frame chain with `osprey-python`'s walker
//! (`process_vm_readv`, no stop; a stack that changes under the read is
//! retried, then kept with a `[truncated]` frame), and on 3.14+ the name of
//! the asyncio task it is running (read before the stack, as the sampler
//! does).

use osprey_pprof::Frame;
use std::collections::HashMap;

/// One Python frame: function, file, line.
#[derive(Clone, Debug)]
pub struct PyFrame {
    pub function: String,
    pub file: String,
    pub line: i64,
}

/// One thread's Python side.
#[derive(Clone, Debug)]
pub struct PyThread {
    /// Its `threading.Thread` name, if it has one that could be read.
    pub name: Option<String>,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    /// The asyncio task it is running (3.14+), by name.
    pub task: Option<String>,
}

/// The Python stacks and thread names of `pid`'s threads, by kernel thread
/// id. `fs_bases`: each thread's fs base (its `pthread_self`), which names
/// the thread states of Pythons before 3.11 (no native id in them).
pub fn stacks(pid: i32, fs_bases: &HashMap<u64, i32>) -> Result<HashMap<i32, PyThread>, String> {
    let t = osprey_python::open_target(pid).map_err(|e| e.to_string())?;
    let tstates = osprey_python::threads::list_tstates(&t).map_err(|e| format!("thread states: {e}"))?;
    // `threading._active`, as the sampler reads it (bounded reads, no stop).
    let mut names = osprey_python::thread_names::ThreadNames::default();
    names.refresh(&t);
    let mut tasks = osprey_python::asyncio::Tasks::default();
    let mut walks = osprey_python::stack::Walks::default();
    let mut retries = 0;
    let mut out = HashMap::new();
    for ts in tstates {
        let Some(tid) = ts.native_tid.or_else(|| fs_bases.get(&ts.thread_id).copied()) else { continue };
        let task = tasks.running(&t, ts.addr);
        let Ok(stack) = osprey_python::stack::read_stack(&t, &mut walks, ts.addr, &mut retries, false) else {
            continue;
        };
        let frames = stack
            .frames
            .into_iter()
            .map(|f| match f {
                Frame::Function { name, file, line } => PyFrame { function: name, file, line },
                Frame::Synthetic(name) => PyFrame { function: name, file: String::new(), line: 0 },
                Frame::Native { addr, .. } => PyFrame { function: format!("{addr:#x}"), file: String::new(), line: 0 },
            })
            .collect();
        let task = tasks.name(&t, task);
        out.insert(tid, PyThread { name: names.name(ts.addr).map(str::to_string), frames, task });
    }
    Ok(out)
}
