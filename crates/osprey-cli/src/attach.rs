//! `osprey attach`: a running process, CPython or native, sampled from
//! outside until it exits, Ctrl-C or `--duration`.

use crate::{exec, Failure, Sampling};
use std::time::Duration;

/// `osprey attach`: a CPython process is sampled by `osprey-python`, any
/// other by `perf_event_open` ([`crate::attach_native`]).
pub fn attach(pid: i32, duration: Option<f64>, s: &Sampling) -> Result<u8, Failure> {
    let duration = match duration {
        Some(d) if !(d > 0.0 && d.is_finite()) => {
            return Err(Failure::usage(format!("--duration {d} must be positive")))
        }
        d => d.map(Duration::from_secs_f64),
    };
    crate::target::check(pid)?;
    if !osprey_python::is_cpython_process(pid) {
        return crate::attach_native::run(pid, duration, s);
    }
    let up = exec::delivery(s, &python_program_name(pid))?;
    let cfg = exec::check_sampling(s, &up)?;
    let opts = exec::python_options(&cfg, &up, duration, s);
    let stop = exec::stop_on_ctrl_c();
    let meta = osprey_upload::Meta::new(osprey_upload::new_runtime_id(), pid, osprey_upload::Language::Python);
    let mut delivery = osprey_upload::Delivery::new(up.clone(), meta, cfg.period);
    let result = osprey_python::attach_with_sink(pid, &opts, stop, &mut |data| delivery.flush(data, Vec::new));
    exec::report_uploads(&delivery.finish(), s.quiet);
    let summary = result.map_err(|e| Failure::from(e.to_string()))?;
    if !s.quiet {
        print_summary(&summary, up.uploads());
    }
    Ok(0)
}

/// The service name of a CPython process by default: its script's name
/// without `.py`, else `python`.
fn python_program_name(pid: i32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    exec::script_name(&args)
}

/// `uploads`: profiles went to a backend, whose lines said how many arrived.
fn print_summary(s: &osprey_python::Summary, uploads: bool) {
    s.warnings.iter().for_each(|w| eprintln!("osprey: {w}"));
    if let Some(n) = &s.native {
        eprintln!(
            "osprey: --native: {} stacks unwound: {} merged, {} native walks ended early, {} unmatched; {} samples taken again (the calls changed around them); {} read stopped (waited for a CPU, or the calls kept changing)",
            n.unwound, n.matched, n.native_truncated, n.unmatched, n.moved, n.missed
        );
    }
    let names: Vec<String> = s.files.iter().map(|p| p.display().to_string()).collect();
    match names.len() {
        0 if s.samples > 0 && uploads => {}
        0 if s.samples > 0 => eprintln!("osprey: {} samples taken, yet no profile written (see above)", s.samples),
        0 => eprintln!("osprey: no samples ({} sampling passes); no profile written", s.passes_done),
        n => eprintln!("osprey: {} samples; {n} profile(s) written: {}", s.samples, names.join(" ")),
    }
}
