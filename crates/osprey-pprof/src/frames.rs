//! A profile's stacks as function frames: every location expanded into its
//! (inlined) functions, with their source file and line.
//!
//! Invariant: a location without a named function is one frame named
//! `0x<address>` (what `summary` and the report formats show for an
//! unsymbolized address), so no sample's stack loses a level.

use super::pprof::{Profile, Sample};
use std::collections::HashMap;

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameInfo {
    /// Function name, or `0x<address>`.
    pub name: String,
    /// Source file; empty when unknown.
    pub file: String,
    /// Line in `file`; 0 when unknown.
    pub line: i64,
}

/// Location id -> its frames, innermost first, for one profile.
pub struct FrameTable {
    by_location: HashMap<u64, Vec<FrameInfo>>,
}

impl FrameTable {
    /// The frames of every location of `p`.
    pub fn new(p: &Profile) -> FrameTable {
        let funcs: HashMap<u64, (&str, &str)> =
            p.function.iter().map(|f| (f.id, (p.string(f.name), p.string(f.filename)))).collect();
        let by_location = p
            .location
            .iter()
            .map(|l| {
                let named = l.line.iter().filter_map(|ln| {
                    let (name, file) = funcs.get(&ln.function_id).copied().filter(|(n, _)| !n.is_empty())?;
                    Some(FrameInfo { name: name.to_string(), file: file.to_string(), line: ln.line })
                });
                let mut frames: Vec<FrameInfo> = named.collect();
                if frames.is_empty() {
                    frames.push(FrameInfo { name: format!("0x{:x}", l.address), file: String::new(), line: 0 });
                }
                (l.id, frames)
            })
            .collect();
        FrameTable { by_location }
    }

    /// The frames of sample `s`, leaf first.
    pub fn stack<'a>(&'a self, s: &'a Sample) -> impl Iterator<Item = &'a FrameInfo> + 'a {
        s.location_id.iter().flat_map(move |id| self.by_location.get(id).map_or(&[][..], |f| &f[..]))
    }
}
