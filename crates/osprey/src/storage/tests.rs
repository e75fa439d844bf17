//! Unit tests of the storage internals (collision confirmation, overflow, ids).

use super::*;
use std::collections::HashSet;

fn small(entries: usize, arena_words: usize) -> CallTraceStorage {
    CallTraceStorage::with_geometry(Geometry { table_entries: entries, arena_words }, 4).unwrap()
}

fn find(c: &Collected, frames: &[u64]) -> Option<CollectedTrace> {
    c.traces.iter().find(|t| t.frames == frames && t.id != DROPPED_TRACE_ID).cloned()
}

#[test]
fn equal_hash_different_frames_never_merge() {
    let s = small(64, 1024);
    const FORCED: u64 = 0xdead_beef_dead_beef;
    let a = s.put_hashed(0, FORCED, &[1, 2, 3], false, 1, 10, |_| {});
    let b = s.put_hashed(0, FORCED, &[1, 2, 4], false, 2, 20, |_| {});
    let c = s.put_hashed(0, FORCED, &[1, 2, 3], true, 4, 40, |_| {});
    let a2 = s.put_hashed(0, FORCED, &[1, 2, 3], false, 8, 80, |_| {});
    assert_eq!(a, a2);
    assert_eq!(HashSet::from([a, b, c]).len(), 3);
    let col = s.rotate();
    assert_eq!(col.traces.len(), 3);
    assert!(col.aliases.is_empty());
    let t = |id: u64| col.traces.iter().find(|t| t.id == id).unwrap().clone();
    assert_eq!((t(a).frames, t(a).truncated, t(a).count, t(a).value), (vec![1, 2, 3], false, 9, 90));
    assert_eq!((t(b).frames, t(b).count), (vec![1, 2, 4], 2));
    assert_eq!((t(c).truncated, t(c).count), (true, 4));
}

#[test]
fn ids_carry_epoch_and_slot() {
    let s = small(64, 1024);
    let a = s.put(0, &[5, 6], false, 1, 1, |_| {});
    assert_eq!(a >> 32, 1);
    assert!((a & 0xffff_ffff) < 64);
    s.rotate();
    let b = s.put(0, &[5, 6], false, 1, 1, |_| {});
    assert_eq!(b >> 32, 2);
    s.rotate();
    s.rotate();
    assert_eq!(s.put(0, &[5, 6], false, 1, 1, |_| {}) >> 32, 4);
}

#[test]
fn then_sees_the_returned_id() {
    let s = small(64, 1024);
    let mut seen = 0;
    let id = s.put(1, &[9], false, 1, 1, |id| seen = id);
    assert_eq!(seen, id);
    let mut seen = 0;
    assert_eq!(s.put(99, &[9], false, 1, 1, |id| seen = id), DROPPED_TRACE_ID);
    assert_eq!(seen, DROPPED_TRACE_ID);
}

#[test]
fn table_overflow_goes_to_dropped_trace() {
    let s = small(8, 4096);
    let mut stored = 0;
    for i in 0..20u64 {
        if s.put(0, &[i, i + 1], false, 1, 100, |_| {}) != DROPPED_TRACE_ID {
            stored += 1;
        }
    }
    assert_eq!(stored, 8);
    // Known stacks still land in their entries when the table is full.
    assert_ne!(s.put(0, &[0, 1], false, 1, 100, |_| {}), DROPPED_TRACE_ID);
    let c = s.rotate();
    let d = c.traces.iter().find(|t| t.id == DROPPED_TRACE_ID).unwrap();
    assert_eq!((d.count, d.value, d.frames.len()), (12, 1200, 0));
    assert_eq!(c.dropped.table_full, 12);
    assert_eq!(c.traces.iter().map(|t| t.count).sum::<u64>(), 21);
    // The next cycle starts empty.
    assert_ne!(s.put(0, &[100, 101], false, 1, 1, |_| {}), DROPPED_TRACE_ID);
}

#[test]
fn arena_overflow_goes_to_dropped_trace() {
    let s = small(64, 10);
    assert_ne!(s.put(0, &[1, 2, 3, 4], false, 1, 1, |_| {}), DROPPED_TRACE_ID); // 5 words
    assert_eq!(s.put(0, &[5, 6, 7, 8, 9], false, 1, 1, |_| {}), DROPPED_TRACE_ID); // 6 words
    assert_ne!(s.put(0, &[5, 6, 7], false, 1, 1, |_| {}), DROPPED_TRACE_ID); // 4 words
    assert_eq!(s.put(0, &[0; 100], false, 1, 1, |_| {}), DROPPED_TRACE_ID);
    let c = s.rotate();
    assert_eq!(c.dropped.arena_full, 2);
    assert_eq!(find(&c, &[5, 6, 7]).unwrap().count, 1);
    assert_eq!(c.traces.iter().find(|t| t.id == DROPPED_TRACE_ID).unwrap().count, 2);
}

#[test]
fn duplicates_are_merged_with_aliases() {
    let s = small(64, 1024);
    let h = trace_hash(&[1, 2], false);
    // Simulate a duplicate: an unpublished claim with the same hash makes the
    // next put skip it (invariant T2) and create a second entry.
    let a = s.put(0, &[1, 2], false, 1, 1, |_| {});
    {
        let t = &s.tables[s.active.load(sync::Ordering::Relaxed)];
        // A second entry for the same stack inserted the way a racing thread would.
        t.insert_preserved(h, 0x77, &[1, 2], false);
    }
    let c = s.rotate();
    assert_eq!(c.traces.len(), 1);
    assert_eq!(c.traces[0].id, a);
    assert_eq!(c.aliases, vec![(0x77, a)]);
}

#[test]
fn preserved_traces_keep_ids_and_restart_at_zero() {
    let s = small(64, 1024);
    let keep = std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()));
    let k = keep.clone();
    s.add_liveness_checker(Box::new(move |set| set.extend(k.lock().unwrap().iter().copied())));
    let a = s.put(0, &[1, 2, 3], false, 5, 50, |_| {});
    keep.lock().unwrap().insert(a);
    let c1 = s.rotate();
    assert_eq!(find(&c1, &[1, 2, 3]).unwrap().count, 5);
    assert_eq!(c1.preserved, 1);
    for _ in 0..4 {
        let c = s.rotate();
        let t = find(&c, &[1, 2, 3]).expect("preserved trace reported");
        assert_eq!((t.id, t.count, t.value), (a, 0, 0));
    }
    // Put again: new id in the new epoch, merged into the preserved id.
    let b = s.put(0, &[1, 2, 3], false, 2, 20, |_| {});
    assert_ne!(a, b);
    let c = s.rotate();
    let t = find(&c, &[1, 2, 3]).unwrap();
    assert_eq!((t.id, t.count, t.value), (a, 2, 20));
    assert_eq!(c.aliases, vec![(b, a)]);
    // Unknown ids are reported as failed.
    keep.lock().unwrap().insert(12345 << 32);
    assert_eq!(s.rotate().preserve_failed, 1);
    keep.lock().unwrap().clear();
    s.rotate();
    assert!(find(&s.rotate(), &[1, 2, 3]).is_none());
}

#[test]
fn geometry_respects_budget() {
    for budget in [1 << 16, 1 << 20, 3 << 20, 64 << 20, 1 << 30] {
        let g = Geometry::for_budget(budget);
        assert!(g.table_entries.is_power_of_two());
        let bytes = 3 * (g.table_entries * ENTRY_BYTES + g.arena_words * 8);
        assert!(bytes <= budget, "{budget}: {g:?}");
        assert!(bytes > budget / 2, "{budget}: {g:?}");
    }
    let s = CallTraceStorage::new(StorageConfig { memory_budget: 8 << 20, max_threads: 8 }).unwrap();
    assert!(s.mapped_bytes() <= 8 << 20);
}

/// The collector sweeps only the pages of slots that were claimed: every
/// trace is still found, wherever (and across whichever page boundary) its
/// probe ended, and a cleared table is empty and reusable.
#[test]
fn sweeps_find_every_claimed_slot() {
    let entries = 1 << 12; // 32 pages of slots
    let s = small(entries, 1 << 16);
    let mut want = Vec::new();
    for k in 0..300u64 {
        // Hashes chosen to start probes in scattered slots, some colliding,
        // some at the end of the table (wrapping to slot 0).
        let hash = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).rotate_right(12) ^ (k % 7);
        let frames = [k, k + 1];
        s.put_hashed(0, hash, &frames, false, 1, k, |_| {});
        want.push(frames.to_vec());
    }
    let col = s.rotate();
    let got: HashSet<Vec<u64>> =
        col.traces.iter().filter(|t| t.id != DROPPED_TRACE_ID).map(|t| t.frames.clone()).collect();
    assert_eq!(got, want.into_iter().collect::<HashSet<_>>());
    // Three more rotations: each table was cleared once since; nothing left.
    for _ in 0..3 {
        assert!(s.rotate().traces.iter().all(|t| t.id == DROPPED_TRACE_ID));
    }
    s.put(0, &[1], false, 1, 1, |_| {});
    assert_eq!(s.rotate().traces.iter().filter(|t| t.id != DROPPED_TRACE_ID).count(), 1);
}
