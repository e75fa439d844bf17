//! [`ProfileData`] -> pprof [`Profile`].
//!
//! Invariants of the output:
//! - strings, functions (by name, system name, file, start line) and locations
//!   are deduplicated; ids are 1-based positions in their vectors;
//! - a native location is keyed by `(address, return_address)` (a leaf and a
//!   return address can be the same number yet symbolize differently), an
//!   interpreted or synthetic one by `(function, line)`;
//! - every native address inside a region of `/proc/<pid>/maps` has that
//!   region as mapping; `mapping[0]` is the main binary's text when known;
//! - samples with the same location ids and (sorted) labels are merged by
//!   adding their values; every sample has `sample_type.len()` values;
//! - every sample carries a `pid` label (the profiled process) and, when the
//!   process name is known, a `process` label (its `comm`), unless it already
//!   has them, so files of several processes can be merged and filtered.

use super::build_id;
use super::maps::{proc_dir, ProcMaps, Region};
use super::pprof::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use super::strings::StringTable;
use super::symbolize::Resolved;
use super::{Frame, LabelValue, ProfileData};
use std::collections::HashMap;

/// Encodes `data`; `symbolize` gets every distinct `(addr, return_address)`
/// once and returns one [`Resolved`] per input, in order. The samples
/// `late` returns, called once `symbolize` is done, are encoded with
/// `data`'s (their native frames, if any, are not symbolized).
pub fn encode(
    data: &ProfileData,
    maps: &ProcMaps,
    symbolize: impl FnOnce(&[(u64, bool)]) -> Vec<Resolved>,
    late: impl FnOnce() -> Vec<super::Sample>,
) -> Profile {
    encode_deferring(data, maps, &|_| false, symbolize, late)
}

/// As [`encode`], leaving the addresses of the regions `defer` picks to the
/// process that merges the profile ([`crate::deferred`]): they are not given
/// to `symbolize`, and their mappings carry a mark instead of a build id.
pub fn encode_deferring(
    data: &ProfileData,
    maps: &ProcMaps,
    defer: &dyn Fn(&Region) -> bool,
    symbolize: impl FnOnce(&[(u64, bool)]) -> Vec<Resolved>,
    late: impl FnOnce() -> Vec<super::Sample>,
) -> Profile {
    let natives = distinct_natives(data);
    let deferred = |&(a, _): &(u64, bool)| maps.find(a).is_some_and(|i| defer(&maps.regions[i]));
    let named: Vec<(u64, bool)> = natives.iter().copied().filter(|k| !deferred(k)).collect();
    let resolved: HashMap<(u64, bool), Resolved> = named.iter().copied().zip(symbolize(&named)).collect();
    let extra = late();
    let mut enc = Encoder { resolved, ..Encoder::new(maps) };
    enc.add_mappings(data.pid, &natives, defer, data.lines);
    let sample_type = data.sample_types.iter().map(|(t, u)| enc.value_type(t, u)).collect();
    let sample = enc.samples(data, &extra);
    let (t, u, period) = &data.period;
    let period_type = Some(enc.value_type(t, u));
    let comment = data.comments.iter().map(|c| enc.strings.intern(c)).collect();
    enc.finish_mappings();
    Profile {
        sample_type,
        sample,
        mapping: enc.mappings,
        location: enc.locations,
        function: enc.functions,
        string_table: enc.strings.into_vec(),
        time_nanos: data.start_realtime_ns,
        duration_nanos: data.duration_ns,
        period_type,
        period: *period,
        comment,
        ..Profile::default()
    }
}

/// osprey's functions that sit between a thread's start and its start
/// routine (the preload library's `pthread_create` trampoline): dropped from
/// stacks.
pub const OWN_FUNCTIONS: &[&str] = &["osprey_preload::trampoline"];

/// `libz.so.1+0x3a26`: the region's file name and the file offset of the
/// address looked up (a return address at `addr - 1`, inside the call).
pub(crate) fn module_offset_name(r: &Region, addr: u64, ret: bool) -> Option<String> {
    if r.path.is_empty() || r.path.starts_with('[') {
        return None;
    }
    let at = if ret { addr.wrapping_sub(1) } else { addr };
    let offset = at.checked_sub(r.start)?.checked_add(r.offset)?;
    let file = r.path.rsplit('/').next().unwrap_or(&r.path);
    Some(format!("{file}+{offset:#x}"))
}

fn distinct_natives(data: &ProfileData) -> Vec<(u64, bool)> {
    let mut seen = std::collections::HashSet::new();
    let frames = data.samples.iter().flat_map(|s| &s.frames);
    frames
        .filter_map(|f| match *f {
            Frame::Native { addr, return_address } => Some((addr, return_address)),
            _ => None,
        })
        .filter(|k| seen.insert(*k))
        .collect()
}

/// Build id of a file-backed region: through its path, else through
/// `/proc/<pid>/map_files` (deleted or unreachable path; needs privileges).
fn build_id_of(pid: i32, r: &Region) -> Option<String> {
    if r.path.is_empty() || r.path.starts_with('[') {
        return None;
    }
    let map_file = proc_dir(pid).join(format!("map_files/{:x}-{:x}", r.start, r.end));
    build_id::read_hex(r.path.as_ref()).or_else(|| build_id::read_hex(&map_file))
}

/// How well the locations of one mapping were symbolized.
#[derive(Default, Clone, Copy)]
struct Coverage {
    locations: usize,
    functions: usize,
    files: usize,
    lines: usize,
}

struct Encoder<'a> {
    maps: &'a ProcMaps,
    resolved: HashMap<(u64, bool), Resolved>,
    strings: StringTable,
    functions: Vec<Function>,
    function_ids: HashMap<(i64, i64, i64, i64), u64>,
    locations: Vec<Location>,
    native_ids: HashMap<(u64, bool), u64>,
    interp_ids: HashMap<(u64, i64), u64>,
    mappings: Vec<Mapping>,
    /// maps region index -> mapping id.
    region_mapping: HashMap<usize, u64>,
    /// `coverage[id - 1]` for each mapping.
    coverage: Vec<Coverage>,
}

impl<'a> Encoder<'a> {
    fn new(maps: &'a ProcMaps) -> Self {
        Encoder {
            maps,
            resolved: HashMap::new(),
            strings: StringTable::default(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            native_ids: HashMap::new(),
            interp_ids: HashMap::new(),
            mappings: Vec::new(),
            region_mapping: HashMap::new(),
            coverage: Vec::new(),
        }
    }

    fn value_type(&mut self, t: &str, u: &str) -> ValueType {
        ValueType { r#type: self.strings.intern(t), unit: self.strings.intern(u) }
    }

    /// One mapping per region holding a native address; the main text first.
    /// `lines`: the deferred mappings' DWARF lines are wanted.
    fn add_mappings(&mut self, pid: i32, natives: &[(u64, bool)], defer: &dyn Fn(&Region) -> bool, lines: bool) {
        let mut used: Vec<usize> = natives.iter().filter_map(|&(a, _)| self.maps.find(a)).collect();
        used.sort_unstable();
        used.dedup();
        let main = self.maps.main_text().or_else(|| used.iter().copied().find(|&i| self.maps.is_main(i)));
        if let Some(m) = main {
            used.retain(|&i| i != m);
            used.insert(0, m);
        }
        let mut build_ids: HashMap<String, i64> = HashMap::new();
        for i in used {
            let r = &self.maps.regions[i];
            let build_id = match build_ids.get(&r.path) {
                Some(&b) => b,
                None => {
                    let id = match &r.build_id {
                        _ if defer(r) => crate::deferred::mark(r, lines),
                        Some(id) => id.clone(),
                        None => build_id_of(pid, r).unwrap_or_default(),
                    };
                    let b = self.strings.intern(&id);
                    build_ids.insert(r.path.clone(), b);
                    b
                }
            };
            let id = self.mappings.len() as u64 + 1;
            let filename = self.strings.intern(&r.path);
            self.mappings.push(Mapping {
                id,
                memory_start: r.start,
                memory_limit: r.end,
                file_offset: r.offset,
                filename,
                build_id,
                ..Mapping::default()
            });
            self.coverage.push(Coverage::default());
            self.region_mapping.insert(i, id);
        }
    }

    /// Sets the `has_*` flags: true only if every location of the mapping has
    /// that information (so pprof re-symbolizes mappings that need it).
    fn finish_mappings(&mut self) {
        for (m, c) in self.mappings.iter_mut().zip(&self.coverage) {
            let all = |n: usize| c.locations > 0 && n == c.locations;
            m.has_functions = all(c.functions);
            m.has_filenames = all(c.files);
            m.has_line_numbers = all(c.lines);
            // Line numbers come from DWARF, which blazesym also asked for inlining.
            m.has_inline_frames = m.has_line_numbers;
        }
    }

    /// A function by name and file. `native` names are also its system
    /// name; an interpreted or synthetic frame has none, so that readers do
    /// not take `<module>` or `<lambda>` for C++ template arguments and strip
    /// them (`go tool pprof` shows such a name as `<unknown>`).
    fn function(&mut self, name: &str, file: &str, native: bool) -> u64 {
        let n = self.strings.intern(name);
        let key = (n, if native { n } else { 0 }, self.strings.intern(file), 0);
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(Function { id, name: key.0, system_name: key.1, filename: key.2, start_line: key.3 });
        self.function_ids.insert(key, id);
        id
    }

    fn location(&mut self, frame: &Frame) -> u64 {
        match frame {
            Frame::Native { addr, return_address } => self.native(*addr, *return_address),
            Frame::Function { name, file, line } => {
                let f = self.function(name, file, false);
                self.interpreted(f, *line)
            }
            Frame::Synthetic(name) => {
                let f = self.function(name, "", false);
                self.interpreted(f, 0)
            }
        }
    }

    fn interpreted(&mut self, function_id: u64, line: i64) -> u64 {
        if let Some(&id) = self.interp_ids.get(&(function_id, line)) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location { id, line: vec![Line { function_id, line, column: 0 }], ..Location::default() });
        self.interp_ids.insert((function_id, line), id);
        id
    }

    fn native(&mut self, addr: u64, ret: bool) -> u64 {
        if let Some(&id) = self.native_ids.get(&(addr, ret)) {
            return id;
        }
        let resolved = self.resolved.get(&(addr, ret)).cloned().unwrap_or_default();
        let mut line: Vec<Line> = resolved
            .lines
            .iter()
            .map(|l| Line { function_id: self.function(&l.name, &l.file, true), line: l.line, column: 0 })
            .collect();
        let region = self.maps.find(addr);
        if line.is_empty() {
            // No symbol: `libz.so.1+0x3a26` (file offset of the looked-up
            // address), and the mapping (file, build id) lets tools do better.
            if let Some(name) = region.and_then(|i| module_offset_name(&self.maps.regions[i], addr, ret)) {
                line.push(Line { function_id: self.function(&name, "", true), line: 0, column: 0 });
            }
        }
        let mapping_id = region.and_then(|i| self.region_mapping.get(&i)).copied().unwrap_or(0);
        if mapping_id != 0 {
            let named = !resolved.lines.is_empty();
            let c = &mut self.coverage[mapping_id as usize - 1];
            c.locations += 1;
            c.functions += usize::from(named);
            c.files += usize::from(named && resolved.lines.iter().all(|l| !l.file.is_empty()));
            c.lines += usize::from(named && resolved.debug_info);
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location { id, mapping_id, address: addr, line, is_folded: false });
        self.native_ids.insert((addr, ret), id);
        id
    }

    fn samples(&mut self, data: &ProfileData, extra: &[super::Sample]) -> Vec<Sample> {
        let width = data.sample_types.len();
        let mut out: Vec<Sample> = Vec::new();
        let mut index: HashMap<(Vec<u64>, Vec<super::Label>), usize> = HashMap::new();
        let process = process_labels(data.pid, data.process.as_deref());
        for s in data.samples.iter().chain(extra) {
            let mut ids: Vec<u64> = Vec::with_capacity(s.frames.len());
            for f in &s.frames {
                if !self.is_own(f) {
                    ids.push(self.location(f));
                }
            }
            let mut labels = s.labels.clone();
            for l in &process {
                if !labels.iter().any(|have| have.key == l.key) {
                    labels.push(l.clone());
                }
            }
            labels.sort();
            let mut values = s.values.clone();
            values.resize(width, 0);
            match index.get(&(ids.clone(), labels.clone())) {
                Some(&i) => out[i].value.iter_mut().zip(&values).for_each(|(a, b)| *a += b),
                None => {
                    let label = labels.iter().map(|l| self.label(l)).collect();
                    index.insert((ids.clone(), labels), out.len());
                    out.push(Sample { location_id: ids, value: values, label });
                }
            }
        }
        out
    }

    /// Whether `f` is one of osprey's own frames, which never appear in a
    /// user's stacks (see [`OWN_FUNCTIONS`]).
    fn is_own(&self, f: &Frame) -> bool {
        let Frame::Native { addr, return_address } = f else { return false };
        let physical = self.resolved.get(&(*addr, *return_address)).and_then(|r| r.lines.last());
        physical.is_some_and(|l| OWN_FUNCTIONS.contains(&l.name.as_str()))
    }

    fn label(&mut self, l: &super::Label) -> Label {
        let key = self.strings.intern(&l.key);
        match &l.value {
            LabelValue::Str(s) => Label { key, str: self.strings.intern(s), ..Label::default() },
            LabelValue::Num(n) => Label { key, num: *n, ..Label::default() },
        }
    }
}

/// `pid` and `process` labels of the process `pid` (0: this process), named
/// `name` or by its `/proc/<pid>/comm`; the name is left out when neither
/// is known (process gone).
fn process_labels(pid: i32, name: Option<&str>) -> Vec<super::Label> {
    let pid = if pid > 0 { pid } else { std::process::id() as i32 };
    let mut out = vec![super::Label { key: "pid".into(), value: LabelValue::Num(pid as i64) }];
    let read = || osprey_procfs::read_file(&proc_dir(pid).join("comm")).ok();
    let name = name.map(str::to_string).or_else(|| read().map(|n| String::from_utf8_lossy(&n).trim_end().to_string()));
    if let Some(name) = name {
        out.push(super::Label { key: "process".into(), value: LabelValue::Str(name) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_without_symbols_are_named_by_module_and_offset() {
        let r = Region {
            start: 0x7f00_0000_2000,
            end: 0x7f00_0001_0000,
            offset: 0x2000,
            executable: true,
            path: "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13".into(),
            deleted: false,
            build_id: None,
        };
        assert_eq!(module_offset_name(&r, 0x7f00_0000_3a26, false).as_deref(), Some("libz.so.1.2.13+0x3a26"));
        assert_eq!(module_offset_name(&r, 0x7f00_0000_3a27, true).as_deref(), Some("libz.so.1.2.13+0x3a26"));
        let anon = Region { path: String::new(), ..r.clone() };
        assert_eq!(module_offset_name(&anon, 0x7f00_0000_3a26, false), None);
        let vdso = Region { path: "[vdso]".into(), ..r };
        assert_eq!(module_offset_name(&vdso, 0x7f00_0000_3a26, false), None);
    }
}
