//! What `osprey exec` tells the user at the end, on stderr, once
//! (`--quiet` silences it unless profiles were lost): where the work went
//! when the command's children did it, why a run has no samples, the profile
//! files written and what each backend accepted.

use crate::supervise::TreeCpu;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The profile files in `dir`.
pub fn profile_files(dir: &Path) -> BTreeSet<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return BTreeSet::new() };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("osprey-") && n.ends_with(".pb.gz"))
        })
        .collect()
}

/// The facts the messages are made of.
pub struct Run<'a> {
    pub command: &'a str,
    pub children: bool,
    pub wall: Duration,
    pub cpu: TreeCpu,
    pub hz: u32,
    /// Profile files that appeared in the output directory during the run.
    pub written: Vec<PathBuf>,
    /// Samples the processes reported taking (files or backends alike).
    pub samples: u64,
    /// Whether profiles went to a backend (its lines say how many arrived).
    pub uploads: bool,
}

/// The kernel's accounting tick (`/proc/<pid>/stat` CPU times are in it).
fn tick() -> Duration {
    // SAFETY: sysconf has no preconditions.
    Duration::from_nanos(1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64)
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// The messages, in order; the last one always names the files (or says
/// there are none).
pub fn messages(r: &Run) -> Vec<String> {
    let mut out = Vec::new();
    let period = Duration::from_nanos(1_000_000_000 / r.hz.max(1) as u64);
    let children_did_it = r.cpu.tree >= period && r.cpu.own.as_nanos() * 10 < r.cpu.tree.as_nanos();
    if children_did_it && !r.children {
        out.push(format!(
            "osprey: {} itself used {} of the {} CPU time of its process tree: its children did the work; \
             profile them too with `osprey exec --children -- ...`",
            r.command,
            ms(r.cpu.own),
            ms(r.cpu.tree)
        ));
    }
    if r.written.is_empty() && r.samples > 0 {
        if !r.uploads {
            out.push(format!("osprey: {} samples taken, yet no profile written (see above)", r.samples));
        }
    } else if r.written.is_empty() {
        let (cpu, whose) = if r.children { (r.cpu.tree, "its process tree") } else { (r.cpu.own, "it") };
        let why = if cpu < period {
            format!(
                "{} ran {} and {whose} used {} of CPU, less than one sample period ({} at {} Hz)",
                r.command,
                ms(r.wall),
                ms(cpu),
                ms(period),
                r.hz
            )
        } else {
            format!(
                "{} ran {} and {whose} used {} of CPU (counted in {} ticks), yet no sample was taken (one per {} of a thread's CPU)",
                r.command,
                ms(r.wall),
                ms(cpu),
                ms(tick()),
                ms(period)
            )
        };
        out.push(format!("osprey: no samples: {why}; no profile written"));
    } else {
        let names: Vec<String> = r.written.iter().map(|p| p.display().to_string()).collect();
        let noun = if names.len() == 1 { "profile" } else { "profiles" };
        out.push(format!("osprey: {} {noun} written: {}", names.len(), names.join(" ")));
    }
    out
}

/// One line per backend: what was delivered, and what was not and why.
/// With `quiet`, only the lines of backends that lost profiles.
pub fn upload_lines<'a>(stats: impl IntoIterator<Item = &'a osprey_upload::BackendStats>, quiet: bool) -> Vec<String> {
    let mut out = Vec::new();
    for s in stats {
        let noun = if s.delivered == 1 { "profile" } else { "profiles" };
        let mut line = format!("osprey: {}: {} {noun} delivered to {}", s.backend, s.delivered, s.url);
        let lost = s.queued > 0 || s.dropped > 0 || s.rejected > 0;
        if s.queued > 0 {
            line.push_str(&format!(", {} not delivered by exit", s.queued));
        }
        if s.dropped > 0 {
            line.push_str(&format!(", {} dropped (queue full)", s.dropped));
        }
        if s.rejected > 0 {
            line.push_str(&format!(", {} refused", s.rejected));
        }
        if let Some(e) = s.last_error.as_ref().filter(|_| lost) {
            line.push_str(&format!(" (last error: {e})"));
        }
        if !quiet || lost {
            out.push(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(own_ms: u64, tree_ms: u64, written: usize) -> Run<'static> {
        Run {
            command: "make",
            children: false,
            wall: Duration::from_millis(500),
            cpu: TreeCpu { own: Duration::from_millis(own_ms), tree: Duration::from_millis(tree_ms) },
            hz: 100,
            written: (0..written).map(|i| PathBuf::from(format!("profiles/osprey-{i}.pb.gz"))).collect(),
            samples: written as u64 * 10,
            uploads: false,
        }
    }

    #[test]
    fn children_hint_below_ten_percent() {
        let m = messages(&run(5, 200, 0));
        assert!(m[0].contains("--children"), "{m:?}");
        assert!(m[1].starts_with("osprey: no samples: make ran 500 ms"), "{m:?}");
        assert_eq!(m.len(), 2);
        assert_eq!(messages(&run(50, 200, 1)).len(), 1);
    }

    #[test]
    fn last_line_names_files() {
        let m = messages(&run(100, 100, 2));
        assert_eq!(m, vec!["osprey: 2 profiles written: profiles/osprey-0.pb.gz profiles/osprey-1.pb.gz"]);
    }

    #[test]
    fn no_samples_below_one_period() {
        let m = messages(&run(1, 1, 0));
        assert_eq!(m.len(), 1);
        assert!(m[0].contains("less than one sample period (10 ms at 100 Hz)"), "{m:?}");
    }

    #[test]
    fn samples_sent_to_a_backend_are_not_no_samples() {
        let mut r = run(100, 100, 0);
        r.samples = 2195;
        r.uploads = true;
        assert!(messages(&r).is_empty(), "{:?}", messages(&r));
        r.uploads = false;
        assert_eq!(messages(&r), vec!["osprey: 2195 samples taken, yet no profile written (see above)"]);
    }

    #[test]
    fn upload_lines_count_what_was_lost_and_why() {
        let ok = osprey_upload::BackendStats {
            backend: "otlp",
            url: "http://127.0.0.1:1/v".into(),
            delivered: 3,
            ..Default::default()
        };
        let down = osprey_upload::BackendStats {
            backend: "datadog",
            url: "http://127.0.0.1:2/p".into(),
            queued: 3,
            last_error: Some("connection refused".into()),
            ..Default::default()
        };
        assert_eq!(upload_lines([&ok], false), vec!["osprey: otlp: 3 profiles delivered to http://127.0.0.1:1/v"]);
        assert!(upload_lines([&ok], true).is_empty());
        assert_eq!(
            upload_lines([&down], true),
            vec!["osprey: datadog: 0 profiles delivered to http://127.0.0.1:2/p, 3 not delivered by exit (last error: connection refused)"]
        );
    }
}
