//! Loom model of put vs rotation vs reclamation, on the real code path (the
//! tables are heap buffers of loom atomics, see `mem.rs`).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p osprey --lib --release storage::loom`
//!
//! Checked in every explored interleaving:
//! - no put is lost or double counted (sum over all rotations == sum put);
//! - every id returned by put resolves to its own frames in some rotation;
//! - no table is cleared while a put is inside it (`Table::clear` asserts the
//!   loom-only writer count is 0: invariant T4 / H).

use super::*;
use ::loom::sync::Arc;
use ::loom::thread;

fn storage() -> CallTraceStorage {
    CallTraceStorage::with_geometry(Geometry { table_entries: 2, arena_words: 8 }, 1).unwrap()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = ::loom::model::Builder::new();
    b.preemption_bound = None;
    b.check(f);
}

/// Sums counts over rotations and checks each id maps to `frames`.
fn check(collected: &[Collected], puts: &[(u64, &[u64], u64)]) {
    let mut total = 0;
    for c in collected {
        total += c.traces.iter().map(|t| t.count).sum::<u64>();
    }
    assert_eq!(total, puts.iter().map(|p| p.2).sum::<u64>(), "lost or double-counted puts: {collected:#?} {puts:x?}");
    for &(id, frames, _) in puts {
        if id == DROPPED_TRACE_ID {
            continue;
        }
        let found = collected.iter().any(|c| {
            let id = c.aliases.iter().find(|a| a.0 == id).map_or(id, |a| a.1);
            c.traces.iter().any(|t| t.id == id && t.frames == frames)
        });
        assert!(found, "id {id:#x} does not resolve to {frames:?}");
    }
}

#[test]
fn put_races_rotation() {
    model(|| {
        let s = Arc::new(storage());
        let s2 = s.clone();
        let h = thread::spawn(move || {
            let a = s2.put(0, &[1, 2], false, 1, 10, |_| {});
            let b = s2.put(0, &[1, 2], false, 2, 20, |_| {});
            (a, b)
        });
        let c1 = s.rotate();
        let (a, b) = h.join().unwrap();
        let c2 = s.rotate();
        check(&[c1, c2], &[(a, &[1, 2], 1), (b, &[1, 2], 2)]);
    });
}

#[test]
fn put_races_two_rotations_with_preservation() {
    model(|| {
        let s = Arc::new(storage());
        let first = s.put(0, &[7], false, 1, 1, |_| {});
        s.add_liveness_checker(Box::new(move |keep| {
            keep.insert(first);
        }));
        let s2 = s.clone();
        let h = thread::spawn(move || s2.put(0, &[8], false, 1, 1, |_| {}));
        let c1 = s.rotate();
        let c2 = s.rotate();
        let b = h.join().unwrap();
        let c3 = s.rotate();
        check(&[c1, c2, c3], &[(first, &[7], 1), (b, &[8], 1)]);
        // The preserved id is reported by the later rotations, with count 0.
        let c4 = s.rotate();
        assert!(c4.traces.iter().any(|t| t.id == first && t.frames == [7] && t.count == 0));
    });
}

#[test]
fn two_putters_same_stack_race_rotation() {
    // Both threads may claim separate entries for [3] (a duplicate); the
    // rotation must merge them and report the loser's id as an alias.
    let mut b = ::loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let s = Arc::new(CallTraceStorage::with_geometry(Geometry { table_entries: 2, arena_words: 8 }, 2).unwrap());
        let hs: Vec<_> = (0..2)
            .map(|slot| {
                let s = s.clone();
                thread::spawn(move || s.put(slot, &[3], false, 1, 1, |_| {}))
            })
            .collect();
        let c1 = s.rotate();
        let ids: Vec<u64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let c2 = s.rotate();
        for c in [&c1, &c2] {
            assert!(c.traces.iter().filter(|t| t.frames == [3]).count() <= 1, "duplicate not merged");
        }
        check(&[c1, c2], &[(ids[0], &[3], 1), (ids[1], &[3], 1)]);
    });
}
