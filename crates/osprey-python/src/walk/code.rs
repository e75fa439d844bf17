//! Code objects: name, file and line table, cached by address.

use std::collections::{BTreeMap, HashMap};
use std::io;

use super::line_table::{parse_linetable_310, parse_lnotab, parse_locations, LineRanges};
use crate::layout::{Layout, LineTable};
use crate::remote::process::{rd_u32, rd_u64, Mem};
use crate::target::pyobject::{Long, Reader};
use crate::target::Target;

/// Characters of a code object's name or file, at most (a longer one is a torn read).
const MAX_STR: usize = 4096;
/// Code objects cached at most (all are dropped past it).
const MAX_CODES: usize = 100_000;

/// Reads a `bytes` object's content.
fn read_bytes_obj(mem: &Mem, l: &Layout, addr: u64) -> io::Result<Vec<u8>> {
    let size = mem.u64(addr + l.bytes_size)? as usize;
    if size > 1 << 20 {
        return Err(io::Error::other("bytes too large"));
    }
    mem.read_vec(addr + l.bytes_sval, size)
}

/// A code object as read, and the fields it was read from.
#[derive(Clone, Debug)]
pub(crate) struct CodeEntry {
    /// Filename, name, qualname, line table and first line fields.
    key: [u64; 5],
    pub(crate) name: String,
    pub(crate) file: String,
    pub(crate) lines: LineRanges,
    /// The bytecode's length in code units (3.11+: `ob_size`).
    units: u64,
    /// Code units holding a return opcode ([`Layout::return_opcodes`]),
    /// ascending; inline cache units may add a few that are not
    /// instructions. Read at the first [`CodeCache::returns_at`]: only
    /// walks through a generator ask.
    returns: Option<Box<[u32]>>,
}

/// Code objects by address; an entry is reused only while the object at that
/// address still has the same name, file, line table and first line.
#[derive(Default)]
pub struct CodeCache {
    map: HashMap<u64, CodeEntry>,
    /// 3.14+: the end of each cached code object's bytecode (which it
    /// holds inline), by the code object's address.
    spans: BTreeMap<u64, u64>,
    /// Code objects read from the target (not found, or stale, in the cache).
    pub misses: u64,
}

/// Why a code object could not be read.
pub(crate) enum FrameErr {
    /// The chain changed under us (or pointed to garbage): retry or drop.
    Torn,
    Io(io::Error),
}

impl From<io::Error> for FrameErr {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ESRCH) => FrameErr::Io(e),
            _ => FrameErr::Torn,
        }
    }
}

impl CodeCache {
    /// The code object at `code`; `None` if the object there is not one.
    pub(crate) fn entry(&mut self, t: &Target, code: u64) -> Result<Option<&CodeEntry>, FrameErr> {
        let l = &t.layout;
        let b = t.mem.read_vec(code, l.code_size_to_read)?;
        if let Some(ty) = t.code_type {
            if rd_u64(&b, l.object_type as usize) != ty {
                return Ok(None); // not a code object (3.13 shims), or torn
            }
        }
        let key = [
            rd_u64(&b, l.code_filename as usize),
            rd_u64(&b, l.code_name as usize),
            l.code_qualname.map(|o| rd_u64(&b, o as usize)).unwrap_or(0),
            rd_u64(&b, l.code_linetable as usize),
            rd_u32(&b, l.code_firstlineno as usize) as u64,
        ];
        let fresh = self.map.get(&code).is_some_and(|e| e.key == key);
        if !fresh {
            self.misses += 1;
            let name_ptr = if key[2] != 0 { key[2] } else { key[1] };
            let r = Reader::new(t, 4);
            let name = r.str(name_ptr, MAX_STR, Long::Refuse)?;
            let file = r.str(key[0], MAX_STR, Long::Refuse)?;
            let first = key[4] as i32;
            let tab = read_bytes_obj(&t.mem, l, key[3])?;
            let lines = match l.line_table {
                LineTable::Lnotab => parse_lnotab(&tab, first),
                LineTable::Linetable310 => parse_linetable_310(&tab, first),
                LineTable::Locations => parse_locations(&tab, first),
            };
            if self.map.len() > MAX_CODES {
                self.map.clear();
                self.spans.clear();
            }
            // `ob_size`: the bytecode's length in code units (3.11+).
            let units = rd_u64(&b, l.object_type as usize + 8).min(1 << 24);
            if let (Some(adaptive), true) = (l.code_code_adaptive, l.minor >= 14) {
                self.spans.insert(code, code + adaptive + 2 * units);
            }
            self.map.insert(code, CodeEntry { key, name, file, lines, units, returns: None });
        }
        Ok(self.map.get(&code))
    }

    /// Whether the instruction at code unit `unit` of the cached code object
    /// at `code` returns from its frame; its bytecode is read the first time.
    pub(crate) fn returns_at(&mut self, t: &Target, code: u64, unit: i64) -> Result<bool, FrameErr> {
        let l = &t.layout;
        let Some(e) = self.map.get_mut(&code) else { return Ok(false) };
        if e.returns.is_none() {
            let ops = l.return_opcodes();
            // A larger one is a torn read: nothing to read for it.
            e.returns = Some(match l.code_code_adaptive.filter(|_| !ops.is_empty() && e.units <= 1 << 19) {
                Some(adaptive) => {
                    let bytecode = t.mem.read_vec(code + adaptive, 2 * e.units as usize)?;
                    (0..e.units as u32).filter(|&u| ops.contains(&bytecode[2 * u as usize])).collect()
                }
                None => Box::default(),
            });
        }
        let returns = e.returns.as_deref().unwrap_or_default();
        Ok(u32::try_from(unit).is_ok_and(|u| returns.binary_search(&u).is_ok()))
    }

    /// The cached code object whose bytecode holds `instr` (3.14+).
    pub(crate) fn code_at(&self, instr: u64) -> Option<u64> {
        let (&code, &end) = self.spans.range(..=instr).next_back()?;
        (instr < end).then_some(code)
    }
}
