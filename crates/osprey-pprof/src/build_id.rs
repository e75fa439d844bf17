//! GNU build id of an ELF file (`NT_GNU_BUILD_ID` note), read from the
//! program headers only: at most a few KiB are read, never the whole file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

const PT_NOTE: u32 = 4;
const NT_GNU_BUILD_ID: u32 = 3;
/// Notes bigger than this are not build ids; skip them rather than read them.
const MAX_NOTE_SEGMENT: u64 = 64 * 1024;

/// Lowercase hex of the build id, or `None` if the file is not a readable
/// little-endian ELF64 with such a note.
pub fn read_hex(path: &Path) -> Option<String> {
    let mut f = File::open(path).ok()?;
    find(&mut f).ok()?.map(|id| hex(&id))
}

/// Lowercase hex of a build id.
pub fn hex(id: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    id.iter().flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]).map(char::from).collect()
}

fn find(f: &mut File) -> io::Result<Option<Vec<u8>>> {
    let mut eh = [0u8; 64];
    f.read_exact(&mut eh)?;
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Ok(None);
    }
    let phoff = u64_at(&eh, 0x20);
    let phentsize = u16::from_le_bytes([eh[0x36], eh[0x37]]) as u64;
    let phnum = u16::from_le_bytes([eh[0x38], eh[0x39]]) as u64;
    if phentsize < 56 || phnum > 4096 {
        return Ok(None);
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.seek(SeekFrom::Start(phoff))?;
    f.read_exact(&mut ph)?;
    for entry in ph.chunks_exact(phentsize as usize) {
        let p_type = u32::from_le_bytes(entry[..4].try_into().unwrap());
        let (offset, size) = (u64_at(entry, 8), u64_at(entry, 32));
        if p_type != PT_NOTE || size > MAX_NOTE_SEGMENT {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(&mut notes)?;
        if let Some(id) = scan_notes(&notes) {
            return Ok(Some(id.to_vec()));
        }
    }
    Ok(None)
}

/// The `NT_GNU_BUILD_ID` note's bytes among `notes` (a note segment, of a
/// file or in memory): `namesz, descsz, type, name, desc` records, 4-byte
/// aligned, little-endian.
pub(crate) fn scan_notes(mut notes: &[u8]) -> Option<&[u8]> {
    let align = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let word = |i: usize| u32::from_le_bytes(notes[i..i + 4].try_into().unwrap()) as usize;
        let (namesz, descsz, kind) = (word(0), word(4), word(8) as u32);
        let name_end = 12usize.checked_add(align(namesz))?;
        let desc_end = name_end.checked_add(align(descsz))?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && &notes[12..12 + namesz] == b"GNU\0" {
            return Some(&notes[name_end..name_end + descsz]);
        }
        notes = &notes[desc_end..];
    }
    None
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_a_gnu_note() {
        let mut n = Vec::new();
        for w in [4u32, 3, NT_GNU_BUILD_ID] {
            n.extend_from_slice(&w.to_le_bytes());
        }
        n.extend_from_slice(b"GNU\0\xab\xcd\xef\0");
        assert_eq!(scan_notes(&n), Some(&b"\xab\xcd\xef"[..]));
        assert_eq!(read_hex(Path::new("/proc/self/cmdline")), None);
    }
}
