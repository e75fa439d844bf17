//! What `osprey top` shows: CPU time per function, own (the function was
//! the leaf) and total (it was anywhere on the stack, counted once per
//! stack however often it recurs), over the last interval and since the
//! start, for all threads or one; rendered as lines of text.

use super::sampling::Interval;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// Which column ranks the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    Own,
    Total,
}

/// Own and total CPU nanoseconds of one function.
#[derive(Clone, Copy, Default, Debug)]
struct Times {
    own: u64,
    total: u64,
}

/// Per thread, per function.
type ByThread = HashMap<u32, HashMap<Arc<str>, Times>>;

/// The figures since the start and of the last interval.
#[derive(Default)]
pub struct Stats {
    last: ByThread,
    since: ByThread,
    /// CPU sampled per thread: last interval, since the start.
    cpu_last: HashMap<u32, u64>,
    cpu_since: HashMap<u32, u64>,
    /// Thread names, the latest seen.
    names: BTreeMap<u32, String>,
    pub last_span: Duration,
    pub elapsed: Duration,
    pub intervals: u64,
}

impl Stats {
    /// Adds one interval; it becomes the "last" one.
    pub fn add(&mut self, iv: &Interval) {
        self.last.clear();
        self.cpu_last.clear();
        for st in &iv.stacks {
            let mut seen = HashSet::new();
            for (i, f) in st.frames.iter().enumerate() {
                let first = seen.insert(f.clone());
                for by in [&mut self.last, &mut self.since] {
                    let t = by.entry(st.tid).or_default().entry(f.clone()).or_default();
                    if i == 0 {
                        t.own += st.cpu_ns;
                    }
                    if first {
                        t.total += st.cpu_ns;
                    }
                }
            }
            *self.cpu_last.entry(st.tid).or_default() += st.cpu_ns;
            *self.cpu_since.entry(st.tid).or_default() += st.cpu_ns;
            self.names.entry(st.tid).or_default();
        }
        for (tid, name) in &iv.names {
            if !name.is_empty() {
                self.names.insert(*tid, name.clone());
            }
        }
        self.last_span = iv.span;
        self.elapsed += iv.span;
        self.intervals += 1;
    }

    /// The threads that used CPU, ascending by id.
    pub fn threads(&self) -> Vec<u32> {
        self.cpu_since.keys().copied().collect::<std::collections::BTreeSet<u32>>().into_iter().collect()
    }

    fn summed(by: &ByThread, thread: Option<u32>) -> HashMap<Arc<str>, Times> {
        let mut out: HashMap<Arc<str>, Times> = HashMap::new();
        for (tid, funcs) in by {
            if thread.is_some_and(|t| t != *tid) {
                continue;
            }
            for (f, t) in funcs {
                let o = out.entry(f.clone()).or_default();
                o.own += t.own;
                o.total += t.total;
            }
        }
        out
    }
}

/// How the table is shown.
#[derive(Clone, Copy, Debug)]
pub struct View {
    pub sort: Sort,
    /// One thread, or all.
    pub thread: Option<u32>,
    pub rows: usize,
}

/// The header lines and the table, one string per line; `target` names the
/// process, e.g. `pid 12 (server)`.
pub fn render(stats: &Stats, view: &View, target: &str) -> Vec<String> {
    let last = Stats::summed(&stats.last, view.thread);
    let since = Stats::summed(&stats.since, view.thread);
    let pick = |m: &HashMap<u32, u64>| match view.thread {
        Some(t) => m.get(&t).copied().unwrap_or(0),
        None => m.values().sum(),
    };
    let (cpu_last, cpu_since) = (pick(&stats.cpu_last), pick(&stats.cpu_since));
    let cores = |ns: u64, d: Duration| if d.is_zero() { 0.0 } else { ns as f64 / d.as_nanos() as f64 };
    let which = match view.thread {
        None => format!("all {} threads", stats.threads().len()),
        Some(t) => format!("thread {t} \"{}\"", stats.names.get(&t).map_or("", String::as_str)),
    };
    let mut lines = vec![
        format!("osprey top: {target}, {:.0} s sampled, {which}", stats.elapsed.as_secs_f64()),
        format!(
            "CPU: {:.2} cores over the last {:.1} s, {:.2} since the start; sorted by {} time",
            cores(cpu_last, stats.last_span),
            stats.last_span.as_secs_f64(),
            cores(cpu_since, stats.elapsed),
            if view.sort == Sort::Own { "own" } else { "total" },
        ),
        String::new(),
        format!("{:>6} {:>7} {:>9} {:>9}  FUNCTION", "%OWN", "%TOTAL", "OWN(s)", "TOTAL(s)"),
    ];
    let key = |f: &Arc<str>| {
        let (l, s) = (last.get(f).copied().unwrap_or_default(), since[f]);
        match view.sort {
            Sort::Own => (l.own, s.own, l.total, s.total),
            Sort::Total => (l.total, s.total, l.own, s.own),
        }
    };
    let mut funcs: Vec<&Arc<str>> = since.keys().collect();
    funcs.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.cmp(b)));
    let pct = |ns: u64, of: u64| if of == 0 { 0.0 } else { ns as f64 * 100.0 / of as f64 };
    for f in funcs.into_iter().take(view.rows) {
        let (l, s) = (last.get(f).copied().unwrap_or_default(), since[f]);
        let mut row = String::new();
        let _ = write!(
            row,
            "{:>6.1} {:>7.1} {:>9.2} {:>9.2}  {f}",
            pct(l.own, cpu_last),
            pct(l.total, cpu_last),
            s.own as f64 / 1e9,
            s.total as f64 / 1e9
        );
        lines.push(row);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::super::sampling::Stack;
    use super::*;

    fn stack(tid: u32, frames: &[&str], ms: u64) -> Stack {
        Stack { tid, frames: frames.iter().map(|f| Arc::from(*f)).collect(), cpu_ns: ms * 1_000_000 }
    }

    /// Own goes to the leaf, total once per stack (recursion counted once),
    /// shares are of the view's CPU, and one thread's view has its own only.
    #[test]
    fn own_total_shares_and_thread_views() {
        let mut s = Stats::default();
        let iv = Interval {
            stacks: vec![
                stack(1, &["leaf", "rec", "rec", "main"], 300),
                stack(1, &["main"], 100),
                stack(2, &["other", "start"], 600),
            ],
            names: vec![(2, "worker".into())],
            span: Duration::from_secs(1),
        };
        s.add(&iv);
        let all = render(&s, &View { sort: Sort::Total, thread: None, rows: 10 }, "pid 1 (t)");
        let row = |lines: &[String], f: &str| {
            lines.iter().find(|l| l.ends_with(&format!("  {f}"))).cloned().unwrap_or_else(|| panic!("{f}: {lines:#?}"))
        };
        assert!(row(&all, "rec").starts_with("   0.0    30.0      0.00      0.30"), "{all:#?}");
        assert!(row(&all, "main").starts_with("  10.0    40.0"), "{all:#?}");
        assert!(all[4].ends_with("  other") || all[4].ends_with("  start"), "{all:#?}");
        assert!(all[1].contains("1.00 cores"), "{all:#?}");
        let one = render(&s, &View { sort: Sort::Own, thread: Some(2), rows: 10 }, "pid 1 (t)");
        assert!(one[0].contains("thread 2 \"worker\""), "{one:#?}");
        assert!(row(&one, "other").starts_with(" 100.0   100.0"), "{one:#?}");
        assert_eq!(one.len(), 6, "{one:#?}");
    }
}
