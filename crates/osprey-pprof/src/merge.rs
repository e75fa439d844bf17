//! Merging pprof profiles (of one process or several) into one: an
//! `exec --children` tree's period, or `osprey report --format pprof`.
//!
//! Invariants: every sample of every input is in the output with its values
//! and labels (a `pid`/`process` label keeps telling processes apart), under
//! the union of the inputs' sample types (a value a part does not have is
//! 0), so every sum per sample type is the sum over the inputs; mappings,
//! locations and functions are shared only when they are equal in every
//! field, so a merged profile symbolizes each sample exactly as its part
//! did. Samples with the same stack and the same labels are added up.

use crate::pprof::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use crate::strings::StringTable;
use std::collections::HashMap;

/// One profile holding every sample of `parts`; its span covers theirs
/// (earliest `time_nanos` to the latest end), its comments are theirs,
/// each once. The sampling period is the first part's.
pub fn merge(parts: &[Profile]) -> Profile {
    let mut m = Merger::default();
    for p in parts {
        m.add(p);
    }
    m.finish()
}

/// Content keys: two entries with the same key are the same entry.
type MappingKey = (u64, u64, u64, i64, i64, bool, bool, bool, bool);
type LocationKey = (u64, u64, Vec<(u64, i64, i64)>, bool);
type FunctionKey = (i64, i64, i64, i64);
/// A sample's locations and its labels (sorted).
type SampleKey = (Vec<u64>, Vec<(i64, i64, i64, i64)>);

#[derive(Default)]
struct Merger {
    strings: StringTable,
    out: Profile,
    types: HashMap<(i64, i64), usize>,
    mappings: HashMap<MappingKey, u64>,
    locations: HashMap<LocationKey, u64>,
    functions: HashMap<FunctionKey, u64>,
    comments: std::collections::HashSet<i64>,
    samples: HashMap<SampleKey, usize>,
    start: Option<i64>,
    end: i64,
}

impl Merger {
    fn add(&mut self, p: &Profile) {
        let s = |m: &mut Merger, i: i64| m.strings.intern(p.string(i));
        // Value i of this part goes to column `cols[i]` of the output.
        let cols: Vec<usize> = p
            .sample_type
            .iter()
            .map(|t| {
                let key = (s(self, t.r#type), s(self, t.unit));
                let next = self.types.len();
                *self.types.entry(key).or_insert_with(|| {
                    self.out.sample_type.push(ValueType { r#type: key.0, unit: key.1 });
                    next
                })
            })
            .collect();
        let mut mapping_ids = HashMap::new();
        for mp in &p.mapping {
            let (filename, build_id) = (s(self, mp.filename), s(self, mp.build_id));
            let key = (
                mp.memory_start,
                mp.memory_limit,
                mp.file_offset,
                filename,
                build_id,
                mp.has_functions,
                mp.has_filenames,
                mp.has_line_numbers,
                mp.has_inline_frames,
            );
            let next = self.out.mapping.len() as u64 + 1;
            let id = *self.mappings.entry(key).or_insert_with(|| {
                self.out.mapping.push(Mapping { id: next, filename, build_id, ..mp.clone() });
                next
            });
            mapping_ids.insert(mp.id, id);
        }
        let mut function_ids = HashMap::new();
        for f in &p.function {
            let key = (s(self, f.name), s(self, f.system_name), s(self, f.filename), f.start_line);
            let next = self.out.function.len() as u64 + 1;
            let id = *self.functions.entry(key).or_insert_with(|| {
                self.out.function.push(Function {
                    id: next,
                    name: key.0,
                    system_name: key.1,
                    filename: key.2,
                    start_line: key.3,
                });
                next
            });
            function_ids.insert(f.id, id);
        }
        let mut location_ids = HashMap::new();
        for l in &p.location {
            let mapping_id = mapping_ids.get(&l.mapping_id).copied().unwrap_or(0);
            let lines: Vec<(u64, i64, i64)> = l
                .line
                .iter()
                .map(|ln| (function_ids.get(&ln.function_id).copied().unwrap_or(0), ln.line, ln.column))
                .collect();
            let key = (mapping_id, l.address, lines, l.is_folded);
            let next = self.out.location.len() as u64 + 1;
            let id = *self.locations.entry(key.clone()).or_insert_with(|| {
                let line =
                    key.2.iter().map(|&(function_id, line, column)| Line { function_id, line, column }).collect();
                self.out.location.push(Location {
                    id: next,
                    mapping_id,
                    address: l.address,
                    line,
                    is_folded: l.is_folded,
                });
                next
            });
            location_ids.insert(l.id, id);
        }
        for smp in &p.sample {
            let mut labels: Vec<(i64, i64, i64, i64)> = smp
                .label
                .iter()
                .map(|l| {
                    let opt = |m: &mut Merger, i: i64| if i != 0 { s(m, i) } else { 0 };
                    (s(self, l.key), opt(self, l.str), l.num, opt(self, l.num_unit))
                })
                .collect();
            labels.sort_unstable();
            let location_id: Vec<u64> =
                smp.location_id.iter().map(|id| location_ids.get(id).copied().unwrap_or(0)).collect();
            let next = self.out.sample.len();
            let at = *self.samples.entry((location_id.clone(), labels.clone())).or_insert(next);
            if at == next {
                let label = labels.iter().map(|&(key, str, num, num_unit)| Label { key, str, num, num_unit }).collect();
                self.out.sample.push(Sample { location_id, value: Vec::new(), label });
            }
            let value = &mut self.out.sample[at].value;
            for (i, v) in smp.value.iter().enumerate() {
                if let Some(&c) = cols.get(i) {
                    if value.len() <= c {
                        value.resize(c + 1, 0);
                    }
                    value[c] += v;
                }
            }
        }
        for &c in &p.comment {
            let c = s(self, c);
            if self.comments.insert(c) {
                self.out.comment.push(c);
            }
        }
        if self.out.period_type.is_none() {
            if let Some(t) = &p.period_type {
                self.out.period_type = Some(ValueType { r#type: s(self, t.r#type), unit: s(self, t.unit) });
                self.out.period = p.period;
            }
        }
        let first = |slot: &mut i64, theirs: i64, strings: &mut StringTable| {
            if *slot == 0 && theirs != 0 {
                *slot = strings.intern(p.string(theirs));
            }
        };
        first(&mut self.out.drop_frames, p.drop_frames, &mut self.strings);
        first(&mut self.out.keep_frames, p.keep_frames, &mut self.strings);
        first(&mut self.out.default_sample_type, p.default_sample_type, &mut self.strings);
        if p.time_nanos > 0 {
            self.start = Some(self.start.map_or(p.time_nanos, |s| s.min(p.time_nanos)));
            self.end = self.end.max(p.time_nanos + p.duration_nanos);
        }
    }

    fn finish(mut self) -> Profile {
        // Samples of an earlier part are shorter when a later part added types.
        let width = self.out.sample_type.len();
        self.out.sample.iter_mut().for_each(|s| s.value.resize(width, 0));
        if let Some(start) = self.start {
            self.out.time_nanos = start;
            self.out.duration_nanos = self.end - start;
        }
        self.out.string_table = self.strings.into_vec();
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile of one stack `names` (leaf first) with `values` under
    /// `types`, labelled with `pid`.
    fn part(pid: i64, types: &[&str], names: &[&str], values: &[i64], start: i64) -> Profile {
        let mut st = StringTable::default();
        let sample_type = types.iter().map(|t| ValueType { r#type: st.intern(t), unit: st.intern("count") }).collect();
        let mapping =
            vec![Mapping { id: 7, memory_start: 0x1000, filename: st.intern("/bin/x"), ..Default::default() }];
        let function: Vec<Function> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Function { id: 100 + i as u64, name: st.intern(n), ..Default::default() })
            .collect();
        let location: Vec<Location> = function
            .iter()
            .enumerate()
            .map(|(i, f)| Location {
                id: 50 + i as u64,
                mapping_id: 7,
                address: 0x1000 + i as u64,
                line: vec![Line { function_id: f.id, line: 0, column: 0 }],
                is_folded: false,
            })
            .collect();
        let sample = vec![Sample {
            location_id: location.iter().map(|l| l.id).collect(),
            value: values.to_vec(),
            label: vec![Label { key: st.intern("pid"), num: pid, ..Default::default() }],
        }];
        let comment = vec![st.intern("osprey")];
        Profile {
            sample_type,
            sample,
            mapping,
            location,
            function,
            comment,
            time_nanos: start,
            duration_nanos: 10,
            string_table: st.into_vec(),
            ..Default::default()
        }
    }

    fn stacks(p: &Profile) -> Vec<(i64, Vec<&str>, Vec<i64>)> {
        p.sample
            .iter()
            .map(|s| {
                let pid = s.label.iter().find(|l| p.string(l.key) == "pid").map_or(-1, |l| l.num);
                let names = s
                    .location_id
                    .iter()
                    .map(|id| {
                        let l = p.location.iter().find(|l| l.id == *id).unwrap();
                        let f = p.function.iter().find(|f| f.id == l.line[0].function_id).unwrap();
                        p.string(f.name)
                    })
                    .collect();
                (pid, names, s.value.clone())
            })
            .collect()
    }

    #[test]
    fn keeps_every_sample_with_its_stack_and_pid() {
        let a = part(1, &["samples", "cpu"], &["leaf", "main"], &[2, 20], 100);
        let b = part(2, &["cpu", "wall"], &["other", "main"], &[30, 40], 50);
        let m = merge(&[a, b]);
        let types: Vec<&str> = m.sample_type.iter().map(|t| m.string(t.r#type)).collect();
        assert_eq!(types, ["samples", "cpu", "wall"]);
        assert_eq!(
            stacks(&m),
            vec![(1, vec!["leaf", "main"], vec![2, 20, 0]), (2, vec!["other", "main"], vec![0, 30, 40])]
        );
        // Equal mappings and functions are shared; locations with the same
        // address and function too ("main" is at 0x1001 in both).
        assert_eq!(m.mapping.len(), 1);
        assert_eq!(m.function.len(), 3);
        assert_eq!(m.location.len(), 3);
        assert_eq!((m.time_nanos, m.duration_nanos), (50, 60));
        assert_eq!(m.comment.len(), 1);
        // It encodes and decodes whole.
        let back = crate::read::decode(&prost::Message::encode_to_vec(&m)).unwrap();
        assert_eq!(stacks(&back), stacks(&m));
    }

    #[test]
    fn merging_one_part_keeps_it() {
        let a = part(3, &["samples"], &["f"], &[5], 1);
        assert_eq!(stacks(&merge(std::slice::from_ref(&a))), stacks(&a));
        assert!(merge(&[]).sample.is_empty());
    }

    #[test]
    fn equal_samples_are_added_up_and_sums_kept() {
        let a = part(1, &["cpu"], &["f", "main"], &[3], 1_000);
        let b = part(1, &["wall", "cpu"], &["f", "main"], &[7, 5], 2_000);
        let c = part(2, &["cpu"], &["f", "main"], &[4], 1_500);
        let m = merge(&[a, b, c]);
        crate::check::validate(&m).unwrap();
        assert_eq!(stacks(&m), vec![(1, vec!["f", "main"], vec![8, 7]), (2, vec!["f", "main"], vec![4, 0])]);
    }
}
