//! Reading the OTEP 4719 process context of another process: the mapping
//! named `OTEL_CTX`, its 32-byte header and protobuf payload, read like a
//! seqlock (`published_at_ns` before and after). Only the thread-context
//! reference data is decoded: `threadlocal.schema_version` and
//! `threadlocal.attribute_key_map`.

use super::mem::Memory;

/// The thread-context reference data of a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reference {
    /// `threadlocal.schema_version` (empty: not announced).
    pub schema_version: String,
    /// `threadlocal.attribute_key_map`: attribute names by key index.
    pub attribute_keys: Vec<String>,
}

/// The process context's reference data, `None` without a readable one.
pub fn read(pid: i32, mem: &Memory) -> Option<Reference> {
    let maps = osprey_procfs::maps::read(pid).ok()?;
    let start = osprey_procfs::maps::entries(&maps)
        .find(|e| {
            let p = e.path;
            p.starts_with(b"/memfd:OTEL_CTX")
                || p.starts_with(b"[anon_shmem:OTEL_CTX]")
                || p.starts_with(b"[anon:OTEL_CTX]")
        })?
        .start;
    for _ in 0..8 {
        let h = mem.read(start, 32)?;
        let word = |at: usize| u64::from_ne_bytes(h[at..at + 8].try_into().unwrap_or_default());
        if &h[..8] != b"OTEL_CTX" || u32::from_ne_bytes(h[8..12].try_into().ok()?) != 2 {
            return None;
        }
        let (size, at) = (u32::from_ne_bytes(h[12..16].try_into().ok()?) as usize, word(16));
        if at == 0 || size > 1 << 20 {
            continue; // update in progress
        }
        let payload = mem.read(word(24), size)?;
        let again = mem.read(start + 16, 8)?;
        if u64::from_ne_bytes(again[..8].try_into().ok()?) == at {
            return Some(decode(&payload));
        }
    }
    None
}

/// `ProcessContext.extra_attributes` (field 2) entries this reader knows.
pub fn decode(payload: &[u8]) -> Reference {
    let mut r = Reference::default();
    for (field, kv) in fields(payload) {
        if field != 2 {
            continue;
        }
        let (mut key, mut value) = (&[][..], &[][..]);
        for (f, b) in fields(kv) {
            match f {
                1 => key = b,
                2 => value = b,
                _ => {}
            }
        }
        match key {
            b"threadlocal.schema_version" => r.schema_version = string_value(value).unwrap_or_default(),
            b"threadlocal.attribute_key_map" => {
                for (f, array) in fields(value) {
                    if f == 5 {
                        let values = fields(array).filter(|(f, _)| *f == 1);
                        r.attribute_keys = values.map(|(_, v)| string_value(v).unwrap_or_default()).collect();
                    }
                }
            }
            _ => {}
        }
    }
    r
}

/// `AnyValue.string_value` (field 1).
fn string_value(any: &[u8]) -> Option<String> {
    fields(any).find(|(f, _)| *f == 1).map(|(_, b)| String::from_utf8_lossy(b).into_owned())
}

/// The length-delimited fields of a message (others are skipped; a
/// malformed tail ends the iteration).
fn fields(mut b: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    std::iter::from_fn(move || loop {
        let tag = varint(&mut b)?;
        let len = match tag & 7 {
            0 => {
                varint(&mut b)?;
                continue;
            }
            1 => 8,
            5 => 4,
            2 => varint(&mut b)? as usize,
            _ => return None,
        };
        let (value, rest) = (b.get(..len)?, b.get(len..)?);
        b = rest;
        if tag & 7 == 2 {
            return Some((tag >> 3, value));
        }
    })
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}
