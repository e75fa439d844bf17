//! Property test: random sequences of put / rotate / preserve against a
//! HashMap model, on a roomy table and on one small enough to overflow.

use osprey::internals::storage::{CallTraceStorage, Collected, Geometry, DROPPED_TRACE_ID};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
enum Op {
    Put {
        stack: usize,
        truncated: bool,
        count: u64,
    },
    Rotate,
    /// Keep the id returned by the n-th put so far (modulo), from now on.
    Preserve(usize),
    /// Stop keeping anything.
    Release,
}

fn stacks() -> Vec<Vec<u64>> {
    let mut v: Vec<Vec<u64>> = (0..10u64).map(|i| (0..(1 + i * 3)).map(|j| 0x4000 + i * 0x100 + j).collect()).collect();
    v.push(vec![]); // empty stack
    v.push(vec![0x4000, 0x4001, 0x4003]); // shares a prefix with stack 1
    v
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..12usize, any::<bool>(), 1..5u64).prop_map(|(stack, truncated, count)| Op::Put { stack, truncated, count }),
        2 => Just(Op::Rotate),
        1 => any::<usize>().prop_map(Op::Preserve),
        1 => Just(Op::Release),
    ]
}

type Key = (Vec<u64>, bool);

/// id -> key for every id this rotation reports (traces and aliases).
fn resolve(c: &Collected) -> HashMap<u64, Key> {
    let mut m: HashMap<u64, Key> =
        c.traces.iter().filter(|t| t.id != DROPPED_TRACE_ID).map(|t| (t.id, (t.frames.clone(), t.truncated))).collect();
    for &(from, to) in &c.aliases {
        let k = m[&to].clone();
        assert!(m.insert(from, k).is_none(), "alias {from:#x} is also a trace");
    }
    m
}

fn run(ops: Vec<Op>, geometry: Geometry) {
    let stacks = stacks();
    let s = CallTraceStorage::with_geometry(geometry, 2).unwrap();
    let keep: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let k = keep.clone();
    s.add_liveness_checker(Box::new(move |set| set.extend(k.lock().unwrap().iter().copied())));

    let mut since: HashMap<Key, (u64, u64)> = HashMap::new();
    let mut dropped = (0u64, 0u64);
    let mut returned: Vec<(u64, Key)> = Vec::new(); // ids put since the last rotation
    let mut history: Vec<u64> = Vec::new(); // every id ever returned
    let mut must_reappear: HashMap<u64, Key> = HashMap::new();
    let mut min_reappear = 0usize;

    let mut rotate =
        |since: &mut HashMap<Key, (u64, u64)>, dropped: &mut (u64, u64), returned: &mut Vec<(u64, Key)>| {
            let c = s.rotate();
            let ids = resolve(&c);
            // Counts: exactly the model's, one trace per distinct stack.
            let mut keys = HashSet::new();
            for t in &c.traces {
                if t.id == DROPPED_TRACE_ID {
                    assert_eq!((t.count, t.value), *dropped);
                    assert!(t.frames.is_empty());
                    continue;
                }
                let key = (t.frames.clone(), t.truncated);
                assert!(keys.insert(key.clone()), "stack reported twice: {key:?}");
                assert_eq!((t.count, t.value), since.get(&key).copied().unwrap_or((0, 0)), "counts of {key:?}");
            }
            if *dropped == (0, 0) {
                assert!(c.traces.iter().all(|t| t.id != DROPPED_TRACE_ID));
            }
            for (key, cv) in since.iter() {
                assert!(cv.0 == 0 || keys.contains(key), "lost {key:?}");
            }
            // Every id handed out since the last rotation resolves to its stack.
            for (id, key) in returned.iter() {
                assert_eq!(ids.get(id), Some(key), "id {id:#x}");
            }
            // Traces preserved last time come back under their ids.
            let back = must_reappear.iter().filter(|(id, key)| ids.get(id) == Some(key)).count();
            assert!(
                back >= min_reappear,
                "{back} of {} preserved ids came back, {min_reappear} expected",
                must_reappear.len()
            );
            let kept = keep.lock().unwrap().clone();
            must_reappear = ids.iter().filter(|(id, _)| kept.contains(id)).map(|(id, k)| (*id, k.clone())).collect();
            min_reappear = c.preserved.min(must_reappear.len());
            if c.preserve_failed == kept.len() - must_reappear.len() {
                assert_eq!(c.preserved, must_reappear.len());
            }
            since.clear();
            *dropped = (0, 0);
            returned.clear();
        };

    for op in ops {
        match op {
            Op::Put { stack, truncated, count } => {
                let frames = &stacks[stack];
                let mut seen = 0;
                let id = s.put(0, frames, truncated, count, count * 7, |id| seen = id);
                assert_eq!(seen, id);
                if id == DROPPED_TRACE_ID {
                    dropped.0 += count;
                    dropped.1 += count * 7;
                } else {
                    let e = since.entry((frames.clone(), truncated)).or_default();
                    e.0 += count;
                    e.1 += count * 7;
                    returned.push((id, (frames.clone(), truncated)));
                    history.push(id);
                }
            }
            Op::Rotate => rotate(&mut since, &mut dropped, &mut returned),
            Op::Preserve(n) => {
                if !history.is_empty() {
                    keep.lock().unwrap().insert(history[n % history.len()]);
                }
            }
            Op::Release => keep.lock().unwrap().clear(),
        }
    }
    rotate(&mut since, &mut dropped, &mut returned);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn roomy_table_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, Geometry { table_entries: 64, arena_words: 4096 });
    }

    #[test]
    fn tiny_table_matches_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops, Geometry { table_entries: 4, arena_words: 40 });
    }
}
