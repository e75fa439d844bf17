//! What a thread's walks remember for its next walk: the addresses it will
//! read again all at once (see [`super::snapshot`]).

use std::collections::{HashMap, HashSet};

use super::chain::Resumed;

/// Cframes remembered per thread (one per call of the interpreter from C
/// on its stack, usually a few), and moves up or down among them at most.
pub(crate) const CFRAMES: usize = 16;
/// Frame addresses remembered per thread beyond its last walk's.
pub(crate) const HINT_FRAMES: usize = 256;
/// Generators whose last caller is remembered, per thread.
pub(crate) const GENS: usize = 64;
/// Threads remembered at most (all are forgotten past it).
const THREADS: usize = 4096;
/// Distinct entry frame offsets counted at most before the rare ones are dropped.
const ENTRY_OFFSETS: usize = 64;

/// What earlier walks of one thread found, each list the latest first.
#[derive(Default)]
pub(crate) struct Hints {
    /// Frame addresses, innermost first.
    pub(crate) chain: Vec<u64>,
    /// Cframes its frame pointer named (3.11-3.12).
    pub(crate) cframes: Vec<u64>,
    /// Code objects of its walks' frames (3.8-3.10), whose zombie frame
    /// slots are copied last.
    pub(crate) codes: Vec<u64>,
    /// Generator frames and the caller each had when last seen running
    /// (see [`super::chain::walk_from`]).
    pub(crate) gens: Vec<Resumed>,
    /// The outermost frame of its last walk that reached one (3.8-3.10,
    /// the thread running; see [`super::read`]).
    pub(crate) root: Option<u64>,
}

/// The hints of every thread state, and (3.12) where a call of the
/// interpreter's C evaluation function keeps its entry frame.
#[derive(Default)]
pub(crate) struct Memory {
    threads: HashMap<u64, Hints>,
    /// Distance from a cframe to its call's entry frame (both are that
    /// call's locals), and how often walks found each: the most found is used.
    entry_offsets: HashMap<i64, u32>,
}

impl Memory {
    /// The hints of `tstate`, to be handed back with [`Memory::keep`].
    pub(crate) fn take(&mut self, tstate: u64) -> Hints {
        self.threads.remove(&tstate).unwrap_or_default()
    }

    pub(crate) fn keep(&mut self, tstate: u64, hints: Hints) {
        self.threads.insert(tstate, hints);
        if self.threads.len() > THREADS {
            self.threads.clear();
        }
    }

    /// The entry frame offset walks found most often.
    pub(crate) fn entry_offset(&self) -> Option<i64> {
        self.entry_offsets.iter().max_by_key(|e| *e.1).map(|e| *e.0)
    }

    /// A walk found a cframe's entry frame `offset` bytes from it.
    pub(crate) fn found_entry_offset(&mut self, offset: i64) {
        *self.entry_offsets.entry(offset).or_default() += 1;
        if self.entry_offsets.len() > ENTRY_OFFSETS {
            self.entry_offsets.retain(|_, n| *n > 1);
        }
    }
}

/// This walk's `new` first, then those of earlier walks (`old`) whose key
/// it lacks, at most `bound`.
pub(crate) fn latest_first<T: Copy, K: std::hash::Hash + Eq>(
    new: impl IntoIterator<Item = T>,
    old: &[T],
    key: impl Fn(&T) -> K,
    bound: usize,
) -> Vec<T> {
    let mut have = HashSet::new();
    new.into_iter().chain(old.iter().copied()).filter(|x| have.insert(key(x))).take(bound).collect()
}
