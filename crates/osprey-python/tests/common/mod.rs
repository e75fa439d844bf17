//! osprey-python's own test helpers: sampling options and collecting
//! profiles with the in-process sampler. Interpreters, workloads and CPU
//! slots are the test kit's (`osprey_testkit::python`), re-exported here.
#![allow(dead_code)]

pub use osprey_testkit::python::*;

/// Sampling options for a test: `hz`, for `secs` (None: until stopped or
/// the process exits), one profile at the end.
pub fn options(hz: u32, secs: Option<f64>) -> osprey_python::Options {
    osprey_python::Options {
        hz,
        period: std::time::Duration::from_secs(3600),
        out_dir: std::env::temp_dir(),
        duration: secs.map(std::time::Duration::from_secs_f64),
        ..Default::default()
    }
}

/// Attaches to `pid` with `opts` until its duration, `stop` or the
/// process's exit: the profiles it flushed and its summary.
pub fn collect(
    pid: i32,
    opts: &osprey_python::Options,
    stop: &std::sync::atomic::AtomicBool,
) -> (Vec<osprey_pprof::ProfileData>, osprey_python::Summary) {
    let mut out = Vec::new();
    let summary = osprey_python::attach_with_sink(pid, opts, stop, &mut |d| {
        out.push(d.clone());
        Ok(None)
    })
    .unwrap_or_else(|e| panic!("attach: {e}"));
    (out, summary)
}
