//! The compact unwind table of one module: sorted start offsets and one
//! 32-bit rule per range (async-profiler's FrameDesc / the OpenTelemetry
//! profiler's stack deltas, in spirit).
//!
//! **Signal-safe module** for lookups ([`Table::lookup`], [`Rule`] accessors):
//! no allocation, no panic (only `get` and `partition_point`).
//!
//! Invariants of a built [`Table`]:
//! - `entries[i]` packs `start << 32 | rule`; starts are strictly increasing;
//! - entry `i` covers `[base + start(i), base + start(i + 1))`; the last
//!   entry is always a [`Kind::Stop`] gap marking the end of the last FDE, so
//!   addresses past every FDE are never unwound with a stale rule.

use std::sync::Arc;

/// How to find the caller's frame from an address covered by a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// CFA = RSP + offset.
    Rsp,
    /// CFA = RBP + offset (the frame-pointer case).
    Rbp,
    /// The compact form cannot express the CFI here (DWARF expression: PLT
    /// stubs, signal trampolines), or there is no CFI: stop, truncated.
    Stop,
    /// Outermost frame (return address undefined: `_start`, thread start).
    End,
}

/// One packed rule. Layout (bits): 0-1 kind, 2 "RBP saved", 3-10 RBP slot
/// `n` (RBP saved at CFA - 8n), 11-31 CFA offset in bytes (< 2 MiB).
/// The return address is always at CFA - 8 (rows where it is not are `Stop`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Rule(pub(crate) u32);

const KIND_MASK: u32 = 0b11;
const RBP_SAVED: u32 = 1 << 2;
const RBP_SHIFT: u32 = 3;
const CFA_SHIFT: u32 = 11;
/// Largest CFA offset the packed form holds.
pub const MAX_CFA_OFFSET: u64 = (1 << (32 - CFA_SHIFT)) - 1;

impl Rule {
    /// The walk stops here, truncated ([`Kind::Stop`]).
    pub const STOP: Rule = Rule(2);
    /// The outermost frame ([`Kind::End`]).
    pub const END: Rule = Rule(3);

    /// A CFA rule; `rbp_slot` is `Some(n)` when RBP is saved at CFA - 8n.
    /// `None` when the offsets do not fit (the caller then emits [`Rule::STOP`]).
    pub fn cfa(kind: Kind, cfa_offset: u64, rbp_slot: Option<u64>) -> Option<Rule> {
        let k = match kind {
            Kind::Rsp => 0,
            Kind::Rbp => 1,
            Kind::Stop => return Some(Rule::STOP),
            Kind::End => return Some(Rule::END),
        };
        if cfa_offset > MAX_CFA_OFFSET {
            return None;
        }
        let rbp = match rbp_slot {
            None => 0,
            Some(n @ 1..=255) => RBP_SAVED | ((n as u32) << RBP_SHIFT),
            Some(_) => return None,
        };
        Some(Rule(k | rbp | ((cfa_offset as u32) << CFA_SHIFT)))
    }

    /// How the CFA is found.
    #[inline]
    pub fn kind(self) -> Kind {
        match self.0 & KIND_MASK {
            0 => Kind::Rsp,
            1 => Kind::Rbp,
            2 => Kind::Stop,
            _ => Kind::End,
        }
    }

    /// Offset added to RSP or RBP to get the CFA.
    #[inline]
    pub fn cfa_offset(self) -> u64 {
        u64::from(self.0 >> CFA_SHIFT)
    }

    /// Offset below the CFA where the caller's RBP is saved, if it is.
    #[inline]
    pub fn rbp_below_cfa(self) -> Option<u64> {
        if self.0 & RBP_SAVED == 0 {
            None
        } else {
            Some(u64::from((self.0 >> RBP_SHIFT) & 0xff) * 8)
        }
    }
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind() {
            Kind::Stop | Kind::End => write!(f, "{:?}", self.kind()),
            k => {
                write!(f, "cfa={k:?}+{}", self.cfa_offset())?;
                if let Some(o) = self.rbp_below_cfa() {
                    write!(f, " rbp@cfa-{o}")?;
                }
                Ok(())
            }
        }
    }
}

/// log2 of the page size of the lookup index.
const PAGE_SHIFT: u32 = 8;

/// Compiled table of one module, addresses relative to `base` (an ELF
/// virtual address, i.e. before the load bias).
///
/// `pages[k]` is the number of entries starting before `k << PAGE_SHIFT`, so
/// a lookup scans only the few entries of one 256-byte page of code (one
/// cache line) instead of searching the whole table. An entry is 4 bytes:
/// its start's offset inside its page (high 8 bits) and an index into
/// `palette`, the module's distinct rules (a few hundred). Cloning shares the
/// arrays: the handler's path is module -> slices -> entry -> palette.
#[derive(Debug, Default, Clone)]
pub struct Table {
    pub(crate) base: u64,
    pub(crate) entries: Arc<[u32]>,
    pub(crate) pages: Arc<[u32]>,
    pub(crate) palette: Arc<[u32]>,
}

const IN_PAGE_SHIFT: u32 = 24;
pub(crate) const INDEX_MASK: u32 = (1 << IN_PAGE_SHIFT) - 1;
const _: () = assert!(PAGE_SHIFT <= 32 - IN_PAGE_SHIFT, "the in-page offset must fit the entry's high bits");

impl Table {
    /// The rule covering ELF virtual address `svma`; `None` outside every FDE
    /// the table knows (which the unwinder treats as `Stop`).
    #[inline]
    pub fn lookup(&self, svma: u64) -> Option<Rule> {
        let off = svma.checked_sub(self.base)?;
        let off = u32::try_from(off).ok()?;
        let page = (off >> PAGE_SHIFT) as usize;
        let lo = *self.pages.get(page)? as usize;
        let hi = self.pages.get(page + 1).map_or(self.entries.len(), |&h| h as usize);
        // This page's entries starting at or before `off` are those below this key.
        let key = ((off & ((1 << PAGE_SHIFT) - 1)) << IN_PAGE_SHIFT) | INDEX_MASK;
        // A page holds a handful of entries: a branch-free count beats a search.
        let within = self.entries.get(lo..hi)?.iter().filter(|&&e| e <= key).count();
        // The last of them, or the last entry of an earlier page.
        let i = (lo + within).checked_sub(1)?;
        let e = self.entries.get(i)?;
        self.palette.get((e & INDEX_MASK) as usize).map(|&r| Rule(r))
    }

    /// Every entry as (ELF virtual address where it starts, rule), in order
    /// (decoded the slow way: for checks and tools, not the handler).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Rule)> + '_ {
        let pages = self.pages.len();
        (0..pages).flat_map(move |k| {
            let lo = self.pages[k] as usize;
            let hi = self.pages.get(k + 1).map_or(self.entries.len(), |&h| h as usize);
            self.entries[lo..hi].iter().map(move |&e| {
                let start = self.base + ((k as u64) << PAGE_SHIFT) + u64::from(e >> IN_PAGE_SHIFT);
                (start, Rule(self.palette[(e & INDEX_MASK) as usize]))
            })
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Heap bytes held by the table.
    pub fn heap_bytes(&self) -> usize {
        (self.entries.len() + self.pages.len() + self.palette.len()) * 4
    }

    /// Builds a table from rows `(start, end, rule)` in ELF virtual addresses,
    /// in any order. Overlapping rows keep the first one given for an address
    /// range start; gaps between rows become `Stop` entries.
    pub fn from_rows(mut rows: Vec<(u64, u64, Rule)>) -> Option<Table> {
        rows.retain(|r| r.1 > r.0);
        // Stable: among rows with the same start, the earlier-given one wins.
        rows.sort_by_key(|r| r.0);
        let Some(first) = rows.first() else {
            return Some(Table::default());
        };
        let base = first.0;
        let mut starts: Vec<u32> = Vec::with_capacity(rows.len() + 1);
        let mut rules: Vec<u32> = Vec::with_capacity(rows.len() + 1);
        let mut end = base;
        let push = |start: u64, rule: Rule, starts: &mut Vec<u32>, rules: &mut Vec<u32>| -> Option<()> {
            let off = u32::try_from(start - base).ok()?;
            if rules.last() == Some(&rule.0) {
                return Some(()); // Same rule continues: merge.
            }
            if starts.last() == Some(&off) {
                // A zero-length previous range: replace it.
                starts.pop();
                rules.pop();
                if rules.last() == Some(&rule.0) {
                    return Some(());
                }
            }
            starts.push(off);
            rules.push(rule.0);
            Some(())
        };
        for &(start, row_end, rule) in &rows {
            if start < end {
                // Overlaps a row already placed (e.g. a duplicate FDE): drop the
                // part that overlaps, keep the rest.
                if row_end <= end {
                    continue;
                }
                push(end, rule, &mut starts, &mut rules)?;
            } else {
                if start > end {
                    push(end, Rule::STOP, &mut starts, &mut rules)?;
                }
                push(start, rule, &mut starts, &mut rules)?;
            }
            end = row_end;
        }
        push(end, Rule::STOP, &mut starts, &mut rules)?;
        let last = starts.last().copied().unwrap_or(0);
        let pages = (0..=(last >> PAGE_SHIFT) + 1)
            .map(|k| starts.partition_point(|&s| u64::from(s) < u64::from(k) << PAGE_SHIFT) as u32)
            .collect();
        let mut palette: Vec<u32> = rules.clone();
        palette.sort_unstable();
        palette.dedup();
        if palette.len() > INDEX_MASK as usize {
            return None;
        }
        let entries = starts
            .iter()
            .zip(&rules)
            .map(|(&s, r)| {
                let index = palette.binary_search(r).unwrap_or(0) as u32;
                ((s & ((1 << PAGE_SHIFT) - 1)) << IN_PAGE_SHIFT) | index
            })
            .collect();
        Some(Table { base, entries, pages, palette: palette.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rsp(off: u64) -> Rule {
        Rule::cfa(Kind::Rsp, off, None).unwrap()
    }

    #[test]
    fn packs_and_unpacks() {
        let r = Rule::cfa(Kind::Rbp, 16, Some(2)).unwrap();
        assert_eq!((r.kind(), r.cfa_offset(), r.rbp_below_cfa()), (Kind::Rbp, 16, Some(16)));
        let r = Rule::cfa(Kind::Rsp, MAX_CFA_OFFSET, None).unwrap();
        assert_eq!((r.kind(), r.cfa_offset(), r.rbp_below_cfa()), (Kind::Rsp, MAX_CFA_OFFSET, None));
        assert!(Rule::cfa(Kind::Rsp, MAX_CFA_OFFSET + 1, None).is_none());
        assert!(Rule::cfa(Kind::Rsp, 8, Some(256)).is_none());
    }

    #[test]
    fn gaps_stop_and_equal_rules_merge() {
        let t = Table::from_rows(vec![
            (0x1000, 0x1004, rsp(8)),
            (0x1004, 0x1010, rsp(16)),
            (0x1010, 0x1020, rsp(16)),
            (0x2000, 0x2001, rsp(8)),
        ])
        .unwrap();
        assert_eq!(t.len(), 5, "{t:?}");
        assert_eq!(t.lookup(0xfff), None);
        assert_eq!(t.lookup(0x1000), Some(rsp(8)));
        assert_eq!(t.lookup(0x1003), Some(rsp(8)));
        assert_eq!(t.lookup(0x1004), Some(rsp(16)));
        assert_eq!(t.lookup(0x101f), Some(rsp(16)));
        assert_eq!(t.lookup(0x1020), Some(Rule::STOP));
        assert_eq!(t.lookup(0x1fff), Some(Rule::STOP));
        assert_eq!(t.lookup(0x2000), Some(rsp(8)));
        assert_eq!(t.lookup(0x2001), Some(Rule::STOP));
        assert_eq!(t.lookup(u64::MAX), None);
    }

    #[test]
    fn overlapping_rows_keep_first() {
        let t = Table::from_rows(vec![(0x10, 0x20, rsp(8)), (0x10, 0x30, rsp(24)), (0x18, 0x28, rsp(32))]).unwrap();
        assert_eq!(t.lookup(0x1f), Some(rsp(8)));
        assert_eq!(t.lookup(0x20), Some(rsp(24)));
        assert_eq!(t.lookup(0x2f), Some(rsp(24)));
        assert_eq!(t.lookup(0x30), Some(Rule::STOP));
    }
}
