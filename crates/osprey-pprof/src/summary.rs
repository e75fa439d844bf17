//! Per-function totals and folded stacks of one or more pprof profiles.
//!
//! Invariants: for the chosen sample value, `sum(flat) == total`; `cum` counts
//! a sample once per function even when the function recurses, so
//! `flat <= cum <= total`; folded stacks are `root;...;leaf` with no `;`
//! inside a frame name.

use super::frames::FrameTable;
use super::pprof::Profile;
use crate::Error;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Flat and cumulative value of one function over the summarized profiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionStat {
    /// Function name; `0x<address>` for an unsymbolized location.
    pub name: String,
    /// Value of samples whose leaf frame is this function.
    pub flat: i64,
    /// Value of samples with this function anywhere on the stack.
    pub cum: i64,
}

/// What [`summarize`] returns: totals, per-function values and folded stacks
/// for one sample type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// (type, unit) of the summarized value, e.g. ("cpu", "nanoseconds").
    pub sample_type: (String, String),
    /// Sum of the summarized value over all samples.
    pub total: i64,
    /// Sum of the first `count`-unit value when the profiles have one,
    /// else the number of sample records.
    pub samples: i64,
    /// Sorted by flat, then cum (both descending), then name.
    pub functions: Vec<FunctionStat>,
    /// `(root;...;leaf, value)`, sorted by stack, zero values left out.
    pub folded: Vec<(String, i64)>,
}

/// Summarizes `profiles` (merged) on the sample type named `sample_index`
/// (a type name such as `"cpu"`, or a number), by default `cpu` when the
/// first profile has it, else its last sample type. Every profile must have
/// that type.
pub fn summarize(profiles: &[Profile], sample_index: Option<&str>) -> Result<Summary, Error> {
    let first = profiles.first().ok_or(Error::NoProfiles)?;
    let types: Vec<&str> = first.sample_type.iter().map(|t| first.string(t.r#type)).collect();
    let pick = match sample_index {
        None => match types.iter().position(|t| *t == "cpu") {
            Some(i) => i,
            None => types.len().checked_sub(1).ok_or(Error::NoSampleTypes)?,
        },
        Some(s) => match s.parse::<usize>() {
            Ok(i) if i < types.len() => i,
            _ => types.iter().position(|t| *t == s).ok_or_else(|| Error::UnknownSampleType {
                asked: s.to_string(),
                have: types.iter().map(|t| t.to_string()).collect(),
            })?,
        },
    };
    let vt = &first.sample_type[pick];
    let mut out = Summary {
        sample_type: (first.string(vt.r#type).to_string(), first.string(vt.unit).to_string()),
        ..Summary::default()
    };
    let mut stats: HashMap<String, (i64, i64)> = HashMap::new();
    let mut folded: BTreeMap<String, i64> = BTreeMap::new();
    for p in profiles {
        let idx = p.sample_type.iter().position(|t| p.string(t.r#type) == out.sample_type.0);
        let idx = idx.ok_or_else(|| Error::MissingSampleType(out.sample_type.0.clone()))?;
        let count_idx = p.sample_type.iter().position(|t| p.string(t.unit) == "count");
        let frames = FrameTable::new(p);
        for s in &p.sample {
            out.samples += count_idx.map_or(1, |c| s.value.get(c).copied().unwrap_or(0));
            let v = s.value.get(idx).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            out.total += v;
            let stack: Vec<&str> = frames.stack(s).map(|f| f.name.as_str()).collect();
            let mut seen = HashSet::new();
            for (i, name) in stack.iter().enumerate() {
                let e = stats.entry(name.to_string()).or_default();
                if i == 0 {
                    e.0 += v;
                }
                if seen.insert(*name) {
                    e.1 += v;
                }
            }
            let root_first: Vec<String> = stack.iter().rev().map(|n| n.replace(';', ":")).collect();
            *folded.entry(root_first.join(";")).or_default() += v;
        }
    }
    out.functions = stats.into_iter().map(|(name, (flat, cum))| FunctionStat { name, flat, cum }).collect();
    out.functions.sort_by(|a, b| (b.flat, b.cum, &a.name).cmp(&(a.flat, a.cum, &b.name)));
    out.folded = folded.into_iter().collect();
    Ok(out)
}
