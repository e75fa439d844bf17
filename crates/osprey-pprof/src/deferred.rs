//! Native frames of a spool part named by the process that merges it, not
//! by the short process that sampled them.
//!
//! An agent of an `exec --children` tree leaves the addresses of modules
//! that are files with a build id unnamed ([`defers`]): such a location
//! carries the `module+0xOFFSET` name of an address without symbol (the
//! file offset looked up), and its mapping's build id is a [`mark`] of the
//! loaded object's build id. [`name_parts`] names them for a whole period,
//! reading each file once, and only if the file at that path still has
//! that build id; otherwise the `module+0xOFFSET` name stays. Invariant: no
//! mark leaves [`name_parts`].
//!
//! A part sampled from outside with DWARF lines asked for carries a
//! [`mark`] that says so: its files' lines and inlined functions are read
//! at the merge too. Kept in the agent: its own module (its frames are
//! dropped by name), deleted files, files without build id, pseudo-files
//! and anonymous memory, and, with DWARF lines asked for, everything.

use crate::maps::Region;
use crate::pprof::{Function, Line, Profile};
use crate::symbolize::{Resolved, SymLine};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const MARK: &str = "osprey-deferred:";
/// [`MARK`] of a mapping whose DWARF lines are wanted too.
const MARK_LINES: &str = "osprey-deferred-lines:";

/// Whether region `r` of this process can be left to the merge: an
/// executable mapping of a file still linked whose build id is known,
/// outside the module of `own` (an address of the agent's code).
pub fn defers(r: &Region, own: u64) -> bool {
    r.executable && r.path.starts_with('/') && !r.deleted && r.build_id.is_some() && !(r.start <= own && own < r.end)
}

/// The build id a deferred mapping carries until [`name_parts`]; `lines`:
/// DWARF lines are wanted.
pub(crate) fn mark(r: &Region, lines: bool) -> String {
    format!("{}{}", if lines { MARK_LINES } else { MARK }, r.build_id.as_deref().unwrap_or_default())
}

/// The build id in a [`mark`], and whether lines are wanted.
fn unmark(build_id: &str) -> Option<(&str, bool)> {
    let (id, lines) = match build_id.strip_prefix(MARK_LINES) {
        Some(id) => (id, true),
        None => (build_id.strip_prefix(MARK)?, false),
    };
    (!id.is_empty()).then_some((id, lines))
}

/// A file offset in a `module+0xOFFSET` name of `module`.
fn offset_in(name: &str, module: &str) -> Option<u64> {
    let hex = name.strip_prefix(module)?.strip_prefix("+0x")?;
    u64::from_str_radix(hex, 16).ok()
}

/// One file as loaded: path, build id, and whether its DWARF lines are wanted.
type FileKey = (PathBuf, String, bool);

/// What reading a file gave: its build id (hex, empty if none), the
/// functions at each file offset asked for (innermost first; one, without
/// file, from the symbol tables alone), and the file's own path (the loader
/// names a library by the link it opened, `/proc/PID/maps` by the file:
/// `liblzma.so.5` is `liblzma.so.5.4.1`).
#[derive(Default)]
struct Named {
    build_id: String,
    names: HashMap<u64, Resolved>,
    path: Option<String>,
}

/// Names the deferred locations of `parts` (see the module doc) and gives
/// their mappings the file's build id, or none.
pub fn name_parts(parts: &mut [Profile]) {
    let found: Vec<Vec<Deferred>> = parts.iter().map(deferred_in).collect();
    let mut wanted: HashMap<&FileKey, Vec<u64>> = HashMap::new();
    for (key, _, offsets) in found.iter().flatten() {
        wanted.entry(key).or_default().extend(offsets.iter().map(|&(_, off)| off));
    }
    let named: HashMap<&FileKey, Named> =
        wanted.into_iter().map(|(key, offsets)| (key, read_names(key, offsets))).collect();
    for (p, found) in parts.iter_mut().zip(&found) {
        rename(p, found, &named);
    }
}

/// A deferred mapping of a part: its file, its index, and `(location
/// index, file offset)` of each of its locations still named by offset.
type Deferred = (FileKey, usize, Vec<(usize, u64)>);

/// The deferred mappings of `p`.
fn deferred_in(p: &Profile) -> Vec<Deferred> {
    let mut out = Vec::new();
    for (mi, m) in p.mapping.iter().enumerate() {
        let Some((id, lines)) = unmark(p.string(m.build_id)) else { continue };
        let path = p.string(m.filename);
        let module = path.rsplit('/').next().unwrap_or(path);
        let mut offsets = Vec::new();
        for (li, l) in p.location.iter().enumerate() {
            if l.mapping_id != m.id || l.line.len() != 1 {
                continue;
            }
            let f = p.function.get((l.line[0].function_id as usize).wrapping_sub(1));
            if let Some(off) = f.and_then(|f| offset_in(p.string(f.name), module)) {
                offsets.push((li, off));
            }
        }
        out.push(((PathBuf::from(path), id.to_string(), lines), mi, offsets));
    }
    out
}

/// Reads the names at `offsets` of the file `key` names, if it still has the build id loaded.
fn read_names(key: &FileKey, offsets: Vec<u64>) -> Named {
    let path = std::fs::canonicalize(&key.0).ok().map(|p| p.to_string_lossy().into_owned());
    Named { path, ..read_symbols(key, offsets) }
}

/// [`read_names`] but the path.
fn read_symbols(key: &FileKey, mut offsets: Vec<u64>) -> Named {
    let (path, build_id, lines) = key;
    if crate::build_id::read_hex(path).as_ref() != Some(build_id) {
        return Named::default();
    }
    let build_id = build_id.clone();
    offsets.sort_unstable();
    offsets.dedup();
    let Some(svmas) = osprey_unwind::loaded::svmas_of_offsets(path, &offsets) else {
        return Named { build_id, ..Named::default() };
    };
    let known: Vec<(u64, u64)> = offsets.iter().zip(&svmas).filter_map(|(&o, s)| Some((o, (*s)?))).collect();
    let lookup: Vec<u64> = known.iter().map(|k| k.1).collect();
    let root = Path::new(osprey_unwind::compile::DEBUG_ROOT);
    let names = osprey_unwind::symbols::name_addresses(path, Some(root), &lookup).unwrap_or_default();
    let symbol =
        |name: String| Resolved { lines: vec![SymLine { name, file: String::new(), line: 0 }], debug_info: false };
    let mut names: HashMap<u64, Resolved> = known
        .iter()
        .zip(names)
        .filter_map(|(&(off, _), name)| Some((off, symbol(crate::symbolize::demangle(&name?)))))
        .collect();
    if *lines {
        let with_lines = crate::symbolize::file_lines(path, &offsets);
        names.extend(offsets.iter().zip(with_lines).filter(|(_, r)| !r.lines.is_empty()).map(|(&o, r)| (o, r)));
    }
    Named { build_id, names, path: None }
}

/// Gives `p`'s deferred locations their names and its deferred mappings
/// their build ids (marks removed).
fn rename(p: &mut Profile, found: &[Deferred], named: &HashMap<&FileKey, Named>) {
    let mut strings: HashMap<String, i64> = HashMap::new();
    let mut functions: HashMap<(i64, i64), u64> = HashMap::new();
    for (key, mi, offsets) in found {
        let (mi, n) = (*mi, named.get(key));
        let file = n.and_then(|n| n.path.clone());
        let module = file.as_deref().map(|f| f.rsplit('/').next().unwrap_or(f).to_string());
        let (mut all, mut files, mut debug) = (!offsets.is_empty(), true, true);
        for &(li, off) in offsets {
            let fallback;
            let found = match (n.and_then(|n| n.names.get(&off)), &module) {
                (Some(r), _) => r,
                (None, Some(module)) => {
                    all = false;
                    let name = format!("{module}+{off:#x}");
                    fallback =
                        Resolved { lines: vec![SymLine { name, file: String::new(), line: 0 }], debug_info: false };
                    &fallback
                }
                (None, None) => {
                    all = false;
                    continue;
                }
            };
            files &= found.lines.iter().all(|l| !l.file.is_empty());
            debug &= found.debug_info;
            let mut line = Vec::with_capacity(found.lines.len());
            for l in &found.lines {
                let (name, file) = (intern(p, &mut strings, &l.name), intern(p, &mut strings, &l.file));
                let f = *functions.entry((name, file)).or_insert_with(|| {
                    let id = p.function.len() as u64 + 1;
                    p.function.push(Function { id, name, system_name: name, filename: file, start_line: 0 });
                    id
                });
                line.push(Line { function_id: f, line: l.line, column: 0 });
            }
            p.location[li].line = line;
        }
        let id = n.map_or("", |n| n.build_id.as_str()).to_string();
        let id = intern(p, &mut strings, &id);
        let filename = file.map(|f| intern(p, &mut strings, &f));
        let m = &mut p.mapping[mi];
        m.build_id = id;
        m.has_functions = all;
        // DWARF gives files, lines and inlined functions together (as in `encode`).
        m.has_filenames = all && files;
        m.has_line_numbers = all && debug;
        m.has_inline_frames = all && debug;
        if let Some(f) = filename {
            m.filename = f;
        }
    }
}

/// Index of `s` in `p`'s string table, added if missing.
fn intern(p: &mut Profile, index: &mut HashMap<String, i64>, s: &str) -> i64 {
    if index.is_empty() {
        index.extend(p.string_table.iter().enumerate().rev().map(|(i, s)| (s.clone(), i as i64)));
    }
    if let Some(&i) = index.get(s) {
        return i;
    }
    p.string_table.push(s.to_string());
    let i = p.string_table.len() as i64 - 1;
    index.insert(s.to_string(), i);
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, ProfileData, Sample};

    #[inline(never)]
    fn marker_for_merge_names() -> u64 {
        std::hint::black_box(11)
    }

    fn data(addrs: &[(u64, bool)]) -> ProfileData {
        let frames = addrs.iter().map(|&(addr, return_address)| Frame::Native { addr, return_address }).collect();
        ProfileData {
            pid: 0,
            sample_types: vec![("cpu".into(), "nanoseconds".into())],
            period: ("cpu".into(), "nanoseconds".into(), 10_000_000),
            samples: vec![Sample { frames, values: vec![10], labels: vec![] }],
            ..ProfileData::default()
        }
    }

    fn names(p: &Profile) -> Vec<String> {
        p.sample[0]
            .location_id
            .iter()
            .map(|&id| {
                let l = &p.location[id as usize - 1];
                l.line
                    .iter()
                    .map(|x| p.string(p.function[x.function_id as usize - 1].name))
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// A part whose module was left to the merge names, once merged, what the
    /// agent would have named itself, with the file's build id and no mark.
    #[test]
    fn deferred_frames_are_named_at_merge_as_in_the_agent() {
        let f = marker_for_merge_names as fn() -> u64 as usize as u64;
        let libc_fn = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let addrs = [(f + 1, false), (libc_fn + 3, true)];
        let direct = crate::to_pprof(&data(&addrs));
        let maps = crate::maps::ProcMaps::from_loader();
        // `own` outside every module: everything file-backed is deferred.
        let mut part = crate::encode::encode_deferring(
            &data(&addrs),
            &maps,
            &|r| defers(r, 0),
            |a| vec![Default::default(); a.len()],
            Vec::new,
        );
        assert!(part.mapping.iter().all(|m| p_str(&part, m.build_id).starts_with(MARK)), "marked");
        assert!(names(&part).iter().all(|n| n.contains("+0x")), "{:?}", names(&part));
        name_parts(std::slice::from_mut(&mut part));
        assert_eq!(names(&part), names(&direct));
        assert!(names(&part)[0].ends_with("marker_for_merge_names"), "{:?}", names(&part));
        for (m, d) in part.mapping.iter().zip(&direct.mapping) {
            assert_eq!(p_str(&part, m.build_id), p_str(&direct, d.build_id));
            assert_eq!(p_str(&part, m.filename), p_str(&direct, d.filename), "the file, not the loader's link");
            assert!(m.has_functions);
        }
    }

    /// With DWARF lines asked for, the merge gives a sampled-from-outside
    /// part what the agent would have: files, lines, inlined functions.
    #[test]
    fn lines_are_read_at_merge_as_in_the_agent() {
        let f = marker_for_merge_names as fn() -> u64 as usize as u64;
        let mut d = data(&[(f + 1, false)]);
        d.lines = true;
        let direct = crate::to_pprof(&d);
        let maps = crate::maps::ProcMaps::from_loader();
        let unnamed = |a: &[(u64, bool)]| vec![Default::default(); a.len()];
        let mut part = crate::encode::encode_deferring(&d, &maps, &|r| defers(r, 0), unnamed, Vec::new);
        assert!(part.mapping.iter().all(|m| p_str(&part, m.build_id).starts_with(MARK_LINES)), "marked for lines");
        name_parts(std::slice::from_mut(&mut part));
        let lines = |p: &Profile| -> Vec<(String, String, i64)> {
            let l = &p.location[p.sample[0].location_id[0] as usize - 1];
            let f = |x: &Line| &p.function[x.function_id as usize - 1];
            l.line.iter().map(|x| (p_str(p, f(x).name), p_str(p, f(x).filename), x.line)).collect()
        };
        assert_eq!(lines(&part), lines(&direct));
        let (name, file, line) = lines(&part).pop().unwrap();
        assert!(
            name.ends_with("marker_for_merge_names") && file.ends_with("deferred.rs") && line > 0,
            "{name} {file}:{line}"
        );
        assert!(part
            .mapping
            .iter()
            .all(|m| m.has_line_numbers && m.has_filenames && !p_str(&part, m.build_id).is_empty()));
    }

    /// A file replaced since it was loaded (another build id at its path)
    /// is not read: the frames keep their `module+0xOFFSET` names.
    #[test]
    fn a_replaced_file_is_not_read() {
        let f = marker_for_merge_names as fn() -> u64 as usize as u64;
        let maps = crate::maps::ProcMaps::from_loader();
        let mut part = crate::encode::encode_deferring(
            &data(&[(f, false)]),
            &maps,
            &|r| defers(r, 0),
            |a| vec![Default::default(); a.len()],
            Vec::new,
        );
        let before = names(&part);
        for i in 0..part.mapping.len() {
            let id = unmark(&p_str(&part, part.mapping[i].build_id)).unwrap().0.replace(|c| c != '0', "0");
            part.string_table.push(format!("{MARK}{id}"));
            part.mapping[i].build_id = part.string_table.len() as i64 - 1;
        }
        name_parts(std::slice::from_mut(&mut part));
        assert_eq!(names(&part), before);
        assert!(part.mapping.iter().all(|m| p_str(&part, m.build_id).is_empty() && !m.has_functions));
    }

    fn p_str(p: &Profile, i: i64) -> String {
        p.string(i).to_string()
    }

    #[test]
    fn marks_and_offsets_parse() {
        assert_eq!(unmark("osprey-deferred:0123abcd"), Some(("0123abcd", false)));
        assert_eq!(unmark("osprey-deferred-lines:0123abcd"), Some(("0123abcd", true)));
        assert_eq!(unmark("osprey-deferred-lines:"), None);
        assert_eq!(unmark("0123abcd"), None);
        assert_eq!(unmark("osprey-deferred:"), None);
        assert_eq!(offset_in("libz.so.1+0x3a26", "libz.so.1"), Some(0x3a26));
        assert_eq!(offset_in("inflate", "libz.so.1"), None);
    }
}
