//! Checksum properties and corruption detection of `ContextRecord::read`.

use osprey::internals::record::{
    checksum, snapshot_checksum, tags_term, torn_reads, ContextRecord, ContextSnapshot, ValueBytes, KNUTH, TAG_SLOTS,
};
use proptest::prelude::*;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

/// Multiplicative inverse of an odd number mod 2^64 (Newton's iteration).
fn inverse(k: u64) -> u64 {
    let mut x = k; // correct to 3 bits
    for _ in 0..6 {
        x = x.wrapping_mul(2u64.wrapping_sub(k.wrapping_mul(x)));
    }
    assert_eq!(x.wrapping_mul(k), 1);
    x
}

/// The classic span/root checksum, written independently.
fn reference(span: u64, root: u64) -> u64 {
    let swapped = (root & 0xFFFF_FFFF) << 32 | root >> 32;
    let h = span.wrapping_mul(KNUTH) ^ swapped.wrapping_mul(KNUTH);
    if h == 0 {
        u64::MAX
    } else {
        h
    }
}

/// A span id that makes the raw hash 0 for the given root and tags.
fn zero_span(root: u64, tags: &[u32; TAG_SLOTS]) -> u64 {
    (root.rotate_left(32).wrapping_mul(KNUTH) ^ tags_term(tags)).wrapping_mul(inverse(KNUTH))
}

fn snap(span_id: u64, local_root_span_id: u64, tags: [u32; TAG_SLOTS]) -> ContextSnapshot {
    ContextSnapshot { span_id, local_root_span_id, tags, ..Default::default() }
}

/// No tag strings (the OTEP attributes stay empty).
const NO_VALUES: ValueBytes = &|_| None;

#[test]
fn never_zero_even_for_inputs_hashing_to_zero() {
    assert_eq!(checksum(0, 0, &[0; TAG_SLOTS]), u64::MAX);
    for (root, tags) in [(1u64, [0u32; TAG_SLOTS]), (7, [0; TAG_SLOTS]), (u64::MAX, [3, 0, 0, 9, 0, 0, 0, 0, 0, 1])] {
        let span = zero_span(root, &tags);
        assert_eq!(checksum(span, root, &tags), u64::MAX, "raw hash 0 must fold to all-ones");
        // Such a context is still published and read back.
        let r = ContextRecord::new();
        r.store(&snap(span, root, tags), NO_VALUES);
        assert_eq!(r.read(), Some(snap(span, root, tags)));
    }
}

#[test]
fn equals_reference_without_tags() {
    for (s, r) in [(1u64, 2u64), (0xDEAD_BEEF, 0x1234_5678_9ABC_DEF0), (u64::MAX, 0), (0, u64::MAX)] {
        assert_eq!(checksum(s, r, &[0; TAG_SLOTS]), reference(s, r));
    }
}

/// Raw views of the record's words (the layout is documented and fixed).
fn words(r: &ContextRecord) -> (&[AtomicU64; 3], &[AtomicU32; TAG_SLOTS]) {
    let p = r as *const ContextRecord as *const u8;
    // SAFETY: repr(C) layout asserted in the crate: 3 u64 then 10 u32.
    unsafe { (&*(p as *const [AtomicU64; 3]), &*(p.add(24) as *const [AtomicU32; TAG_SLOTS])) }
}

/// Flips every bit of every field in turn; each flip must make `read` fail
/// and count a torn read, and flipping back must restore the context.
fn check_all_flips(s: ContextSnapshot) {
    let r = ContextRecord::new();
    r.store(&s, NO_VALUES);
    assert_eq!(r.read(), Some(s));
    let (w64, w32) = words(&r);
    let mut flips = 0u64;
    let before = torn_reads();
    for (field, w) in [(0usize, &w64[0]), (1, &w64[1])] {
        for bit in 0..64 {
            w.fetch_xor(1 << bit, Relaxed);
            assert_eq!(r.read(), None, "id field {field} bit {bit} undetected for {s:?}");
            w.fetch_xor(1 << bit, Relaxed);
            flips += 1;
        }
    }
    for (slot, w) in w32.iter().enumerate() {
        for bit in 0..32 {
            w.fetch_xor(1 << bit, Relaxed);
            assert_eq!(r.read(), None, "tag {slot} bit {bit} undetected for {s:?}");
            w.fetch_xor(1 << bit, Relaxed);
            flips += 1;
        }
    }
    // The trace id's halves (W3C bytes at 64 and 72) and its flags (at 89).
    // SAFETY: the OTEP record sits at offset 64 (asserted in the crate).
    let (trace, flags) = unsafe {
        let p = &r as *const ContextRecord as *const u8;
        (&*(p.add(64) as *const [AtomicU64; 2]), &*(p.add(89) as *const AtomicU8))
    };
    for (half, w) in trace.iter().enumerate() {
        for bit in 0..64 {
            w.fetch_xor(1 << bit, Relaxed);
            assert_eq!(r.read(), None, "trace id half {half} bit {bit} undetected for {s:?}");
            w.fetch_xor(1 << bit, Relaxed);
            flips += 1;
        }
    }
    for bit in 0..8 {
        flags.fetch_xor(1 << bit, Relaxed);
        assert_eq!(r.read(), None, "trace flags bit {bit} undetected for {s:?}");
        flags.fetch_xor(1 << bit, Relaxed);
        flips += 1;
    }
    // Corrupting the checksum itself (to any nonzero value) is detected too.
    for bit in 0..64 {
        if w64[2].load(Relaxed) ^ (1 << bit) != 0 {
            w64[2].fetch_xor(1 << bit, Relaxed);
            assert_eq!(r.read(), None, "checksum bit {bit}");
            w64[2].fetch_xor(1 << bit, Relaxed);
            flips += 1;
        }
    }
    // Other tests in this binary may also count, never decrement.
    assert!(torn_reads() - before >= flips);
    assert_eq!(r.read(), Some(s));
}

#[test]
fn every_single_bit_flip_is_detected() {
    check_all_flips(snap(1, 1, [0; TAG_SLOTS]));
    check_all_flips(snap(0, 0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
    check_all_flips(snap(u64::MAX, u64::MAX, [u32::MAX; TAG_SLOTS]));
    check_all_flips(snap(0x0123_4567_89AB_CDEF, 42, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
    // Raw hash 0 (checksum folded to all-ones).
    let tags = [5, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    check_all_flips(snap(zero_span(99, &tags), 99, tags));
}

#[test]
fn trace_ids_are_checked() {
    let t = ContextSnapshot {
        trace_id: 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
        span_id: 0x00f0_67aa_0ba9_02b7,
        local_root_span_id: 3,
        tags: [0; TAG_SLOTS],
        trace_flags: 1,
    };
    check_all_flips(t);
    let halves_swapped = ContextSnapshot { trace_id: t.trace_id.rotate_left(64), ..t };
    assert_ne!(snapshot_checksum(&t), snapshot_checksum(&halves_swapped), "trace id halves");
    let no_trace = ContextSnapshot { trace_id: 0, trace_flags: 0, ..t };
    assert_eq!(snapshot_checksum(&no_trace), checksum(t.span_id, 3, &t.tags), "classic checksum without a trace id");
}

#[test]
fn swapped_fields_are_detected() {
    let s = snap(10, 20, [1, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
    let c = checksum(s.span_id, s.local_root_span_id, &s.tags);
    assert_ne!(c, checksum(20, 10, &s.tags), "span <-> root");
    assert_ne!(c, checksum(10, 20, &[2, 1, 0, 0, 0, 0, 0, 0, 0, 0]), "tags within a pair");
    assert_ne!(c, checksum(10, 20, &[0, 2, 1, 0, 0, 0, 0, 0, 0, 0]), "tags across pairs");
}

#[test]
fn empty_record_reads_none_without_counting() {
    let r = ContextRecord::new();
    assert_eq!(r.read(), None);
    r.store(&snap(5, 6, [0; TAG_SLOTS]), NO_VALUES);
    r.store_ids(0, 0, 0, 0);
    assert_eq!(r.read(), None, "(0, 0) without tags is no context");
    r.store_tag(3, 7, NO_VALUES);
    assert_eq!(r.read(), Some(snap(0, 0, [0, 0, 0, 7, 0, 0, 0, 0, 0, 0])), "tags alone are a context");
    r.reset();
    assert_eq!(r.read(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_nonzero_deterministic(span: u64, root: u64, tags: [u32; TAG_SLOTS]) {
        let c = checksum(span, root, &tags);
        prop_assert_ne!(c, 0);
        prop_assert_eq!(c, checksum(span, root, &tags));
    }

    #[test]
    fn prop_flips_detected(span: u64, root: u64, tags: [u32; TAG_SLOTS], trace: u128, flags: u8) {
        check_all_flips(ContextSnapshot { trace_id: trace, trace_flags: flags, ..snap(span, root, tags) });
    }

    #[test]
    fn prop_store_variants_agree(span: u64, root: u64, tags: [u32; TAG_SLOTS], slot in 0..TAG_SLOTS, v: u32) {
        let a = ContextRecord::new();
        a.store(&snap(span, root, tags), NO_VALUES);
        a.store_tag(slot, v, NO_VALUES);
        a.store_ids(0, 0, root, span);
        let mut t = tags;
        t[slot] = v;
        let want = snap(root, span, t);
        prop_assert_eq!(a.read(), if want.is_empty() { None } else { Some(want) });
    }
}

/// A span switch hashes the tags from the record's cached term: after tags
/// change by `store` or `store_tag`, every id switch still publishes the
/// checksum a reader computes from the fields.
#[test]
fn id_switches_after_tag_changes_read_back() {
    let r = ContextRecord::new();
    let tags = [4, 0, 8, 0, 0, 0, 0, 0, 0, 0];
    r.store(&snap(1, 2, tags), NO_VALUES);
    for (slot, id) in [(1, 6), (0, 0), (9, 3), (2, 0), (1, 0), (9, 0)] {
        r.store_tag(slot, id, NO_VALUES);
        let want_tags = r.load().map_or([0; TAG_SLOTS], |s| s.tags);
        assert_eq!(want_tags[slot], id);
        for (trace, flags, span, root) in
            [(0u128, 0u8, 7u64, 9u64), (0xabc << 64 | 5, 1, 11, 0), (0, 1, 0, 0), (0, 0, 0, 0)]
        {
            r.store_ids(trace, flags, span, root);
            let want = ContextSnapshot {
                trace_id: trace,
                span_id: span,
                local_root_span_id: root,
                tags: want_tags,
                trace_flags: flags,
            };
            let empty = span == 0 && root == 0 && trace == 0 && want_tags == [0; TAG_SLOTS];
            assert_eq!(r.read(), (!empty).then_some(want), "slot {slot} = {id}, ids {trace:x}/{span}/{root}");
        }
        r.store_ids(0, 0, 1, 2);
    }
}
