//! The call trace hash.
//!
//! **Signal-safe module.** Pure arithmetic, no panics.
//!
//! Two frames are folded per 64x64->128 multiply (the high and low halves are
//! xored), chained through the accumulator, and the result is finished with the
//! murmur3 64-bit finaliser so every output bit depends on every input bit.
//! The probe start uses the top bits (see `Table::start`), the full 64 bits
//! are stored as the entry key. A hash match is only a hint: entries are
//! confirmed by comparing frames.

const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;
const K3: u64 = 0x082e_fa98_ec4e_6c89;

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline(always)]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Hash of a stack (leaf first) and its truncation flag. Never 0 (0 marks an
/// empty table slot).
#[inline]
pub fn trace_hash(frames: &[u64], truncated: bool) -> u64 {
    let mut h = K0 ^ (frames.len() as u64).wrapping_mul(K1) ^ truncated as u64;
    let mut pairs = frames.chunks_exact(2);
    for pair in &mut pairs {
        if let [a, b] = *pair {
            h = fold(a ^ h ^ K1, b ^ K2).wrapping_add(h.rotate_left(29));
        }
    }
    if let [a] = *pairs.remainder() {
        h = fold(a ^ h ^ K1, K3).wrapping_add(h.rotate_left(29));
    }
    match fmix64(h) {
        0 => K0,
        h => h,
    }
}

#[cfg(test)]
mod tests {
    use super::trace_hash;

    #[test]
    fn distinguishes_order_length_and_truncation() {
        let a = trace_hash(&[1, 2, 3], false);
        assert_ne!(a, trace_hash(&[3, 2, 1], false));
        assert_ne!(a, trace_hash(&[1, 2, 3], true));
        assert_ne!(a, trace_hash(&[1, 2, 3, 0], false));
        assert_ne!(trace_hash(&[], false), 0);
    }

    #[test]
    fn top_bits_spread_for_nearby_addresses() {
        // Frames that differ only in low bits must spread like random values
        // (4096 balls in 4096 bins: ~2589 distinct expected).
        let mut seen = std::collections::HashSet::new();
        for i in 0..4096u64 {
            seen.insert(trace_hash(&[0x5555_0000_1000 + i * 4, 0x5555_0000_2000], false) >> 52);
        }
        assert!(seen.len() > 2450, "only {} distinct top-12-bit values", seen.len());
    }
}
