//! Stress: several threads `put` (known and new stacks) while the collector
//! rotates every millisecond. Checks conservation of counts/values, id
//! uniqueness, id -> frames resolution through the sample rings, and that a
//! preserved id survives every rotation.

use osprey::internals::record::{SampleRecord, SampleRing};
use osprey::internals::storage::{CallTraceStorage, Collected, StorageConfig, DROPPED_TRACE_ID};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: usize = 3;
const KNOWN: u64 = 64;

/// Deterministic frames for a key: keys < KNOWN are the shared "known" stacks.
fn frames_for(key: u64, buf: &mut [u64; 48]) -> usize {
    let depth = 4 + (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59) as usize; // 4..35
    for (i, f) in buf.iter_mut().take(depth).enumerate() {
        *f = 0x5555_0000_0000 + key * 0x40 + i as u64 * 8;
    }
    depth
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn concurrent_puts_and_rotations() {
    let s =
        Arc::new(CallTraceStorage::new(StorageConfig { memory_budget: 3 << 20, max_threads: THREADS + 1 }).unwrap());
    let rings: Arc<Vec<SampleRing>> = Arc::new((0..THREADS).map(|_| SampleRing::new()).collect());

    // A preserved trace, put before the workers start.
    let pframes = [0xdead_0000u64, 0xdead_0008, 0xdead_0010];
    let preserved = s.put(THREADS, &pframes, false, 1, 1, |_| {});
    s.add_liveness_checker(Box::new(move |keep| {
        keep.insert(preserved);
    }));

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|slot| {
            let (s, rings, stop) = (s.clone(), rings.clone(), stop.clone());
            std::thread::spawn(move || {
                let ring = &rings[slot];
                let mut rng = 0x1234_5678_9abc_def1u64 ^ (slot as u64 + 1) << 40;
                let (mut count, mut value, mut n_new) = (0u64, 0u64, 0u64);
                let mut buf = [0u64; 48];
                while !stop.load(Relaxed) {
                    let r = xorshift(&mut rng);
                    let key = if r % 10 == 0 {
                        n_new += 1;
                        KNOWN + ((slot as u64) << 40) + n_new
                    } else {
                        r % KNOWN
                    };
                    let depth = frames_for(key, &mut buf);
                    let c = 1 + (r >> 60) % 3;
                    s.put(slot, &buf[..depth], false, c, c * 1000, |id| {
                        ring.push(&SampleRecord { trace_id: id, span_id: key, count: c as u32, ..Default::default() });
                    });
                    count += c;
                    value += c * 1000;
                }
                (count, value)
            })
        })
        .collect();

    let mut got = (0u64, 0u64);
    let mut seen_ids = HashSet::new();
    let mut pending: Vec<SampleRecord> = Vec::new();
    let mut prev: HashMap<u64, Vec<u64>> = HashMap::new();
    let (mut rotations, mut resolved, mut dropped_puts) = (0u64, 0u64, 0u64);
    let mut check = |c: &Collected, last: bool, pending: &mut Vec<SampleRecord>, prev: &mut HashMap<u64, Vec<u64>>| {
        let mut ids = HashSet::new();
        let mut map = HashMap::new();
        for t in &c.traces {
            got.0 += t.count;
            got.1 += t.value;
            assert!(ids.insert(t.id), "duplicate id {:#x} in one rotation", t.id);
            if t.id == DROPPED_TRACE_ID {
                dropped_puts += t.count;
                continue;
            }
            assert!(t.id >> 32 >= 1);
            if t.id != preserved {
                assert!(seen_ids.insert(t.id), "id {:#x} collected twice", t.id);
            }
            map.insert(t.id, t.frames.clone());
        }
        for &(from, to) in &c.aliases {
            assert!(ids.insert(from), "alias {from:#x} clashes");
            let f = map[&to].clone();
            map.insert(from, f);
        }
        assert_eq!(map.get(&preserved).map(|f| &f[..]), Some(&pframes[..]), "preserved id lost");
        let mut buf = [0u64; 48];
        let mut still = Vec::new();
        for r in pending.drain(..) {
            if r.trace_id == DROPPED_TRACE_ID {
                continue;
            }
            let depth = frames_for(r.span_id, &mut buf);
            match map.get(&r.trace_id).or_else(|| prev.get(&r.trace_id)) {
                Some(f) => {
                    assert_eq!(&f[..], &buf[..depth], "id {:#x} resolves to the wrong frames", r.trace_id);
                    resolved += 1;
                }
                None => still.push(r),
            }
        }
        // Records of the new ACTIVE epoch resolve at the next rotation at the latest.
        if last {
            assert!(still.is_empty(), "{} records never resolved", still.len());
        }
        for r in &still {
            assert!(!prev.contains_key(&r.trace_id));
        }
        *pending = still;
        *prev = map;
    };

    let mut in_rotate = Duration::ZERO;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        let c = s.rotate();
        in_rotate += t.elapsed();
        rotations += 1;
        for ring in rings.iter() {
            ring.drain(|r| pending.push(*r));
        }
        check(&c, false, &mut pending, &mut prev);
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Relaxed);
    let mut put = (1u64, 1u64); // the preserved trace's own put
    for w in workers {
        let (c, v) = w.join().unwrap();
        put.0 += c;
        put.1 += v;
    }
    for i in 0..2 {
        let c = s.rotate();
        for ring in rings.iter() {
            ring.drain(|r| pending.push(*r));
        }
        check(&c, i == 1, &mut pending, &mut prev);
    }
    eprintln!("rotations {rotations} ({in_rotate:?} in rotate), puts (count) {}, resolved records {resolved}, dropped {dropped_puts}", put.0);
    assert_eq!(got, put, "sum collected != sum put (count, value)");
    // Debug builds on a loaded 2-core machine manage ~25-80, release ~250+.
    assert!(rotations >= 20, "only {rotations} rotations");
}
