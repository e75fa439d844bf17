//! Which samples a report keeps: by process (`--pid`, `--process`), by
//! request (`--span`, `--trace`).
//!
//! Span ids are the agent's `span id` and `local root span id` labels
//! (numbers holding the id's 64 bits). No tracer hands osprey a trace id
//! label; the OpenTelemetry integration stores a trace id's low 64 bits as
//! the `local root span id`, so `--trace` matches a `trace id` label when a
//! profile has one, else the local root span id against those 64 bits.

use osprey_pprof::pprof::{Profile, Sample};

/// The labels the filter reads.
pub const SPAN_ID: &str = "span id";
/// The local root span's id label (the outermost span of the request in the process).
pub const LOCAL_ROOT_SPAN_ID: &str = "local root span id";
/// A trace id label, as other profilers write it (a number or a hex string).
pub const TRACE_ID: &str = "trace id";

/// Which samples to keep: every non-empty list must match (an empty list
/// keeps all).
#[derive(Default)]
pub struct Filter {
    /// Process ids to keep (`--pid`).
    pub pids: Vec<i64>,
    /// Program names to keep (`--process`).
    pub processes: Vec<String>,
    /// Span ids (`--span`): the sample's span or its local root span is one
    /// of them. Each argument may stand for two ids (see [`parse_id`]).
    pub spans: Vec<u64>,
    /// Trace ids (`--trace`), 128-bit.
    pub traces: Vec<u128>,
}

impl Filter {
    /// A filter with the `--span` and `--trace` arguments parsed.
    pub fn new(pids: Vec<i64>, processes: Vec<String>, spans: &[String], traces: &[String]) -> Result<Filter, String> {
        let mut f = Filter { pids, processes, ..Filter::default() };
        for s in spans {
            for id in parse_id(s).map_err(|e| format!("--span {s}: {e}"))? {
                let id = u64::try_from(id).map_err(|_| format!("--span {s}: a span id has 64 bits"))?;
                f.spans.push(id);
            }
        }
        for t in traces {
            f.traces.extend(parse_id(t).map_err(|e| format!("--trace {t}: {e}"))?);
        }
        Ok(f)
    }

    /// Does the filter keep any sample less than all?
    pub fn is_active(&self) -> bool {
        !(self.pids.is_empty() && self.processes.is_empty() && self.spans.is_empty() && self.traces.is_empty())
    }

    /// Keeps sample `s` of `p`?
    pub fn keep(&self, p: &Profile, s: &Sample) -> bool {
        let num = |k: &str| p.label_num(s, k);
        let ids = |k: &str| num(k).map(|n| n as u64).filter(|n| *n != 0);
        (self.pids.is_empty() || num("pid").is_some_and(|n| self.pids.contains(&n)))
            && (self.processes.is_empty()
                || p.label_str(s, "process").is_some_and(|n| self.processes.iter().any(|m| m == n)))
            && (self.spans.is_empty()
                || [ids(SPAN_ID), ids(LOCAL_ROOT_SPAN_ID)].iter().flatten().any(|id| self.spans.contains(id)))
            && (self.traces.is_empty() || self.traces.iter().any(|t| trace_matches(p, s, *t)))
    }

    /// Keeps only the samples of `p` the filter keeps.
    pub fn apply(&self, p: &mut Profile) {
        if self.is_active() {
            let kept: Vec<Sample> = p.sample.iter().filter(|s| self.keep(p, s)).cloned().collect();
            p.sample = kept;
        }
    }
}

/// Sample `s` ran in trace `t`: its `trace id` label (number or hex
/// string) is `t`, or, without one, its local root span id is `t`'s low 64 bits.
fn trace_matches(p: &Profile, s: &Sample, t: u128) -> bool {
    if let Some(text) = p.label_str(s, TRACE_ID) {
        return parse_id(text).is_ok_and(|ids| ids.contains(&t));
    }
    if let Some(n) = p.label_num(s, TRACE_ID) {
        return n as u64 as u128 == t;
    }
    p.label_num(s, LOCAL_ROOT_SPAN_ID).is_some_and(|n| n != 0 && n as u64 == t as u64)
}

/// The id(s) `text` stands for, as backends show ids: `0x`-prefixed hex,
/// 16 or 32 hex digits, or decimal. 16 or 32 decimal digits read both
/// ways (a hex id can be all digits): the result has both.
pub fn parse_id(text: &str) -> Result<Vec<u128>, String> {
    let t = text.trim();
    let hex = |h: &str| u128::from_str_radix(h, 16).map_err(|_| "not a hex id".to_string());
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return if h.is_empty() || h.len() > 32 { Err("not a hex id".into()) } else { Ok(vec![hex(h)?]) };
    }
    let all_hex = !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit());
    let all_dec = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mut ids = Vec::new();
    if all_dec {
        ids.push(t.parse::<u128>().map_err(|_| "decimal id out of range".to_string())?);
    }
    if all_hex && (t.len() == 16 || t.len() == 32) {
        let h = hex(t)?;
        if !ids.contains(&h) {
            ids.push(h);
        }
    }
    if ids.is_empty() {
        return Err("not an id (decimal, 0x-hex, or 16/32 hex digits)".into());
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::parse_id;

    #[test]
    fn ids_as_backends_show_them() {
        assert_eq!(parse_id("1234"), Ok(vec![1234]));
        assert_eq!(parse_id("0x4d2"), Ok(vec![1234]));
        assert_eq!(parse_id("00000000000004d2"), Ok(vec![1234]));
        assert_eq!(parse_id("0000000000001234"), Ok(vec![1234, 0x1234]));
        assert_eq!(parse_id("ffffffffffffffff"), Ok(vec![u64::MAX as u128]));
        assert_eq!(parse_id("18446744073709551615"), Ok(vec![u64::MAX as u128]));
        assert_eq!(parse_id("4bf92f3577b34da6a3ce929d0e0e4736"), Ok(vec![0x4bf92f3577b34da6a3ce929d0e0e4736]));
        for bad in ["", "0x", "12ab", "span", "-5", "0xg1"] {
            assert!(parse_id(bad).is_err(), "{bad:?}");
        }
    }
}
