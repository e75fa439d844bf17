//! An immutable set of loaded modules and their tables: what a handler reads.
//!
//! **Signal-safe** for lookups ([`ModuleSet::rule_for`],
//! [`ModuleSet::module_for`], [`ModuleSet::index_for`]): binary searches over boxed slices, no panic.
//! Invariant: `modules` is sorted by `start` and the `[start, end)` ranges do
//! not overlap (enforced by [`ModuleSet::new`]).

use crate::table::{Rule, Table};
use std::path::PathBuf;
use std::sync::Arc;

/// One mapped module: its executable address range in this process (AVMA),
/// the load bias (AVMA - ELF virtual address) and its compiled table.
#[derive(Debug, Clone)]
pub struct Module {
    /// File name as loaded.
    pub path: PathBuf,
    /// Lowest address of its executable segments.
    pub start: u64,
    /// One past the highest address of its executable segments.
    pub end: u64,
    /// Load bias: address in memory minus ELF virtual address.
    pub bias: u64,
    /// The file's GNU build id, if it has one.
    pub build_id: Option<Arc<[u8]>>,
    /// Its compiled unwind rules (empty if compiling failed).
    pub table: Table,
}

/// An immutable, sorted set of modules.
#[derive(Debug, Default)]
pub struct ModuleSet {
    modules: Box<[Module]>,
}

impl ModuleSet {
    /// Sorts `modules`; of overlapping ranges the later-starting one is dropped.
    pub fn new(mut modules: Vec<Module>) -> ModuleSet {
        modules.retain(|m| m.end > m.start);
        modules.sort_by_key(|m| m.start);
        let mut end = 0;
        modules.retain(|m| {
            let keep = m.start >= end;
            if keep {
                end = m.end;
            }
            keep
        });
        ModuleSet { modules: modules.into() }
    }

    /// The modules, sorted by `start`, not overlapping.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// The module whose executable range holds `pc`.
    #[inline]
    pub fn module_for(&self, pc: u64) -> Option<&Module> {
        self.modules.get(self.index_for(pc)?)
    }

    /// Index in [`ModuleSet::modules`] of the module holding `pc`.
    #[inline]
    pub fn index_for(&self, pc: u64) -> Option<usize> {
        let i = self.modules.partition_point(|m| m.start <= pc).checked_sub(1)?;
        self.modules.get(i).filter(|m| pc < m.end).map(|_| i)
    }

    /// The rule for `pc`: `None` when `pc` is in no module (JIT, anonymous
    /// code, garbage), `Some(Rule::STOP)` in a module but outside its CFI.
    #[inline]
    pub fn rule_for(&self, pc: u64) -> Option<Rule> {
        let mut hint = usize::MAX;
        self.rule_near(pc, &mut hint)
    }

    /// As [`ModuleSet::rule_for`], trying module `*hint` first (callers and
    /// callees are mostly in one module) and leaving the module found there.
    #[inline]
    pub fn rule_near(&self, pc: u64, hint: &mut usize) -> Option<Rule> {
        let m = match self.modules.get(*hint).filter(|m| m.start <= pc && pc < m.end) {
            Some(m) => m,
            None => {
                let i = self.modules.partition_point(|m| m.start <= pc).checked_sub(1)?;
                let m = self.modules.get(i).filter(|m| pc < m.end)?;
                *hint = i;
                m
            }
        };
        Some(m.table.lookup(pc.wrapping_sub(m.bias)).unwrap_or(Rule::STOP))
    }

    /// Heap bytes of all tables (shared tables counted once per module).
    pub fn table_bytes(&self) -> usize {
        self.modules.iter().map(|m| m.table.heap_bytes()).sum()
    }
}
