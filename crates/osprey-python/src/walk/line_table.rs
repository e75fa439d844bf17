//! Line tables: code addresses to source lines, in each version's format.

/// Address ranges -> line, in the unit the frame reports (bytes for
/// lnotab/3.10 tables, code units for 3.11+ tables).
#[derive(Clone, Debug, Default)]
pub struct LineRanges(Vec<(u32, u32, i32)>);

impl LineRanges {
    pub(crate) fn line(&self, addr: u32) -> i32 {
        // Ranges are sorted and disjoint.
        let i = self.0.partition_point(|r| r.1 <= addr);
        match self.0.get(i) {
            Some(&(s, _, line)) if s <= addr => line,
            _ => self.0.last().map(|r| r.2).unwrap_or(-1),
        }
    }
}

/// co_lnotab (3.8, 3.9): (address increment, signed line increment) pairs.
pub fn parse_lnotab(tab: &[u8], first: i32) -> LineRanges {
    let mut out = Vec::new();
    let mut line = first;
    let mut addr: u32 = 0;
    for p in tab.chunks_exact(2) {
        let a = p[0] as u32;
        if a != 0 {
            out.push((addr, addr + a, line));
            addr += a;
        }
        line += p[1] as i8 as i32;
    }
    out.push((addr, u32::MAX, line));
    merge(out)
}

/// co_linetable of 3.10: (byte delta, signed line delta; -128 = no line).
pub fn parse_linetable_310(tab: &[u8], first: i32) -> LineRanges {
    let mut out = Vec::new();
    let mut line = first;
    let mut end: u32 = 0;
    for p in tab.chunks_exact(2) {
        let start = end;
        end += p[0] as u32;
        let ld = p[1] as i8;
        let cur = if ld == -128 {
            -1
        } else {
            line += ld as i32;
            line
        };
        if end > start {
            out.push((start, end, cur));
        }
    }
    merge(out)
}

/// 3.11+ location table, in code units.
pub fn parse_locations(tab: &[u8], first: i32) -> LineRanges {
    let mut out = Vec::new();
    let mut line = first;
    let mut addr: u32 = 0;
    let mut i = 0;
    let varint = |i: &mut usize| -> u32 {
        let mut v: u32 = 0;
        let mut shift = 0;
        while *i < tab.len() {
            let b = tab[*i];
            *i += 1;
            v |= ((b & 63) as u32) << shift;
            shift += 6;
            if b & 64 == 0 || shift > 30 {
                break;
            }
        }
        v
    };
    let svarint = |i: &mut usize| -> i32 {
        let u = varint(i);
        if u & 1 == 1 {
            -((u >> 1) as i32)
        } else {
            (u >> 1) as i32
        }
    };
    while i < tab.len() {
        let b = tab[i];
        i += 1;
        if b & 0x80 == 0 {
            continue; // not at an entry start: resync
        }
        let code = (b >> 3) & 15;
        let len = (b & 7) as u32 + 1;
        let cur = match code {
            15 => -1,
            14 => {
                line += svarint(&mut i);
                varint(&mut i);
                varint(&mut i);
                varint(&mut i);
                line
            }
            13 => {
                line += svarint(&mut i);
                line
            }
            10..=12 => {
                line += (code - 10) as i32;
                i += 2;
                line
            }
            _ => {
                i += 1;
                line
            }
        };
        out.push((addr, addr + len, cur));
        addr += len;
    }
    merge(out)
}

fn merge(v: Vec<(u32, u32, i32)>) -> LineRanges {
    let mut out: Vec<(u32, u32, i32)> = Vec::with_capacity(v.len());
    for r in v {
        if let Some(last) = out.last_mut() {
            if last.2 == r.2 && last.1 == r.0 {
                last.1 = r.1;
                continue;
            }
        }
        out.push(r);
    }
    LineRanges(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab() {
        // first line 10; bytes 0..6 -> 10, 6..8 -> 11, 8.. -> 13
        let r = parse_lnotab(&[6, 1, 2, 2], 10);
        assert_eq!(r.line(0), 10);
        assert_eq!(r.line(5), 10);
        assert_eq!(r.line(6), 11);
        assert_eq!(r.line(8), 13);
        assert_eq!(r.line(100), 13);
        // negative increments
        let r = parse_lnotab(&[4, 3, 4, 0xfe], 1);
        assert_eq!(r.line(0), 1);
        assert_eq!(r.line(4), 4);
        assert_eq!(r.line(8), 2);
    }

    #[test]
    fn linetable_310() {
        // (8 bytes, +0) line 5; (4 bytes, no line); (6 bytes, +2) line 7
        let r = parse_linetable_310(&[8, 0, 4, 0x80, 6, 2], 5);
        assert_eq!(r.line(0), 5);
        assert_eq!(r.line(7), 5);
        assert_eq!(r.line(8), -1);
        assert_eq!(r.line(12), 7);
        assert_eq!(r.line(17), 7);
    }

    #[test]
    fn locations_311() {
        // entry1: code 13 (no column), len 1, line delta +0 (svarint 0)
        // entry2: code 11 (one line, +1), len 2, then 2 column bytes
        // entry3: code 14 (long), len 3, line delta -1 (svarint 3), end delta 0, col 1, endcol 2
        // entry4: code 15 (none), len 1
        // entry5: code 0 (short), len 1, one byte
        let tab = [
            0x80 | (13 << 3),
            0x00,
            0x80 | (11 << 3) | 1,
            4,
            9,
            0x80 | (14 << 3) | 2,
            3,
            0,
            1,
            2,
            0x80 | (15 << 3),
            0x80,
            0x05,
        ];
        let r = parse_locations(&tab, 20);
        assert_eq!(r.line(0), 20);
        assert_eq!(r.line(1), 21);
        assert_eq!(r.line(2), 21);
        assert_eq!(r.line(3), 20);
        assert_eq!(r.line(5), 20);
        assert_eq!(r.line(6), -1);
        assert_eq!(r.line(7), 20);
        // varint with continuation: code 13, svarint 2*70=140 -> 0x40|12, 2
        let r = parse_locations(&[0x80 | (13 << 3), 0x40 | 12, 2], 1);
        assert_eq!(r.line(0), 71);
    }
}
