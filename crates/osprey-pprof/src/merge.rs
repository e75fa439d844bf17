//! Several pprof profiles as one: what `osprey report --format pprof` writes.
//!
//! Invariants of the result: its sample types are the union of the inputs'
//! (by type and unit, in order of first appearance), a sample's values for
//! types its profile lacks being 0; strings, functions, mappings and
//! locations are deduplicated with 1-based ids; samples with the same stack
//! and labels are added up, so every sum per sample type is the sum over
//! the inputs; the time range covers every input's.

use super::pprof::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use super::strings::StringTable;
use std::collections::HashMap;

type FunctionKey = (i64, i64, i64, i64);
type MappingKey = (u64, u64, u64, i64, i64);
type LocationKey = (u64, u64, Vec<(u64, i64, i64)>, bool);
type SampleKey = (Vec<u64>, Vec<(i64, i64, i64, i64)>);

#[derive(Default)]
struct Merger {
    strings: StringTable,
    types: Vec<(i64, i64)>,
    functions: HashMap<FunctionKey, u64>,
    mappings: HashMap<MappingKey, u64>,
    locations: HashMap<LocationKey, u64>,
    samples: HashMap<SampleKey, usize>,
    out: Profile,
}

/// Merges `profiles` into one profile (see the module's invariants).
pub fn merge(profiles: &[Profile]) -> Profile {
    let mut m = Merger::default();
    let (mut start, mut end) = (i64::MAX, i64::MIN);
    for p in profiles {
        m.add(p);
        if p.time_nanos != 0 {
            start = start.min(p.time_nanos);
            end = end.max(p.time_nanos.saturating_add(p.duration_nanos));
        }
    }
    let mut out = std::mem::take(&mut m.out);
    let width = m.types.len();
    for s in &mut out.sample {
        s.value.resize(width, 0);
    }
    out.sample_type = m.types.iter().map(|&(r#type, unit)| ValueType { r#type, unit }).collect();
    if let Some(first) = profiles.first() {
        out.period_type = first
            .period_type
            .as_ref()
            .map(|t| ValueType { r#type: m.intern(first, t.r#type), unit: m.intern(first, t.unit) });
        out.period = first.period;
    }
    if start <= end {
        (out.time_nanos, out.duration_nanos) = (start, end - start);
    }
    out.string_table = m.strings.into_vec();
    out
}

impl Merger {
    fn intern(&mut self, p: &Profile, i: i64) -> i64 {
        self.strings.intern(p.string(i))
    }

    fn add(&mut self, p: &Profile) {
        let columns: Vec<usize> = p
            .sample_type
            .iter()
            .map(|t| {
                let key = (self.intern(p, t.r#type), self.intern(p, t.unit));
                self.types.iter().position(|k| *k == key).unwrap_or_else(|| {
                    self.types.push(key);
                    self.types.len() - 1
                })
            })
            .collect();
        let mappings: HashMap<u64, u64> = p.mapping.iter().map(|mp| (mp.id, self.mapping(p, mp))).collect();
        let functions: HashMap<u64, u64> = p.function.iter().map(|f| (f.id, self.function(p, f))).collect();
        let locations: HashMap<u64, u64> =
            p.location.iter().map(|l| (l.id, self.location(l, &mappings, &functions))).collect();
        for c in &p.comment {
            let c = self.intern(p, *c);
            if !self.out.comment.contains(&c) {
                self.out.comment.push(c);
            }
        }
        for s in &p.sample {
            let ids: Vec<u64> = s.location_id.iter().filter_map(|id| locations.get(id).copied()).collect();
            let mut labels: Vec<(i64, i64, i64, i64)> = s
                .label
                .iter()
                .map(|l| (self.intern(p, l.key), self.intern(p, l.str), l.num, self.intern(p, l.num_unit)))
                .collect();
            labels.sort_unstable();
            let at = *self.samples.entry((ids.clone(), labels.clone())).or_insert_with(|| {
                let label = labels.iter().map(|&(key, str, num, num_unit)| Label { key, str, num, num_unit }).collect();
                self.out.sample.push(Sample { location_id: ids, value: Vec::new(), label });
                self.out.sample.len() - 1
            });
            let values = &mut self.out.sample[at].value;
            for (v, &c) in s.value.iter().zip(&columns) {
                if values.len() <= c {
                    values.resize(c + 1, 0);
                }
                values[c] += v;
            }
        }
    }

    fn mapping(&mut self, p: &Profile, mp: &Mapping) -> u64 {
        let (filename, build_id) = (self.intern(p, mp.filename), self.intern(p, mp.build_id));
        let key = (mp.memory_start, mp.memory_limit, mp.file_offset, filename, build_id);
        let next = self.out.mapping.len() as u64 + 1;
        let id = *self.mappings.entry(key).or_insert(next);
        if id == next {
            self.out.mapping.push(Mapping { id, filename, build_id, ..mp.clone() });
        }
        id
    }

    fn function(&mut self, p: &Profile, f: &Function) -> u64 {
        let (name, system_name) = (self.intern(p, f.name), self.intern(p, f.system_name));
        let filename = self.intern(p, f.filename);
        let next = self.out.function.len() as u64 + 1;
        let id = *self.functions.entry((name, system_name, filename, f.start_line)).or_insert(next);
        if id == next {
            self.out.function.push(Function { id, name, system_name, filename, start_line: f.start_line });
        }
        id
    }

    fn location(&mut self, l: &Location, mappings: &HashMap<u64, u64>, functions: &HashMap<u64, u64>) -> u64 {
        let mapping_id = mappings.get(&l.mapping_id).copied().unwrap_or(0);
        let line: Vec<Line> = l
            .line
            .iter()
            .map(|ln| Line { function_id: functions.get(&ln.function_id).copied().unwrap_or(0), ..ln.clone() })
            .collect();
        let key =
            (mapping_id, l.address, line.iter().map(|ln| (ln.function_id, ln.line, ln.column)).collect(), l.is_folded);
        let next = self.out.location.len() as u64 + 1;
        let id = *self.locations.entry(key).or_insert(next);
        if id == next {
            self.out.location.push(Location { id, mapping_id, address: l.address, line, is_folded: l.is_folded });
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use crate::{to_pprof, Frame, ProfileData, Sample};

    fn data(types: &[&str], stacks: &[(&str, i64)]) -> ProfileData {
        let f = |n: &str| Frame::Function { name: n.into(), file: "x.py".into(), line: 1 };
        ProfileData {
            pid: -1,
            sample_types: types.iter().map(|t| (t.to_string(), "nanoseconds".to_string())).collect(),
            period: ("cpu".into(), "nanoseconds".into(), 10),
            start_realtime_ns: 1_000,
            duration_ns: 50,
            samples: stacks
                .iter()
                .map(|&(s, v)| Sample {
                    frames: s.split(';').rev().map(f).collect(),
                    values: vec![v; types.len()],
                    labels: vec![],
                })
                .collect(),
            ..ProfileData::default()
        }
    }

    #[test]
    fn sums_are_kept_and_types_united() {
        let a = to_pprof(&data(&["cpu"], &[("main;f", 3), ("main;g", 4)]));
        let mut b = to_pprof(&data(&["wall", "cpu"], &[("main;f", 5)]));
        b.time_nanos = 2_000;
        let m = super::merge(&[a, b]);
        crate::check::validate(&m).unwrap();
        let types: Vec<&str> = m.sample_type.iter().map(|t| m.string(t.r#type)).collect();
        assert_eq!(types, ["cpu", "wall"]);
        let sum = |i: usize| m.sample.iter().map(|s| s.value[i]).sum::<i64>();
        assert_eq!((sum(0), sum(1)), (12, 5));
        assert_eq!(m.sample.len(), 2, "main;f merged across the inputs");
        assert_eq!(m.function.len(), 3);
        assert_eq!((m.time_nanos, m.duration_nanos), (1_000, 1_050));
    }
}
