//! Reading general Python objects in the target, per the version's
//! [`ObjectLayout`]: `str` (compact ASCII, latin-1, UCS-2, UCS-4),
//! non-negative `int`s up to 128 bits, tuples, types' names and flags,
//! `dict`s (combined and split tables, the managed dicts and inline values
//! of instances, and instances of `dict` subclasses), and modules.
//!
//! Invariants: the target runs while it is read, so nothing read is
//! trusted. Every size is range-checked before it sizes a read; a [`Reader`]
//! does at most its budget of reads, strings are cut or refused past the
//! length asked ([`Long`]) and tables at [`MAX_ENTRIES`] entries; a `str` or `dict`
//! whose type is not `str` or `dict` is an error, never a guess.

use std::cell::Cell;
use std::io;

use crate::layout::objects::{DictKeys, InstanceDict, LongHeader, TPFLAGS_INLINE_VALUES, TPFLAGS_MANAGED_DICT};
use crate::remote::process::{rd_u32, rd_u64};
use crate::target::Target;

/// What [`Reader::str`] does with a `str` longer than asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Long {
    /// Keeps its first characters.
    Cut,
    /// Fails: no such string is expected there, so the read was torn.
    Refuse,
}
/// Entries of a dict table read at most (a larger table is an error).
pub const MAX_ENTRIES: u64 = 4096;
/// `Py_TPFLAGS_TUPLE_SUBCLASS` (set on `tuple` and its subclasses).
pub const TPFLAGS_TUPLE_SUBCLASS: u64 = 1 << 26;
/// `Py_TPFLAGS_DICT_SUBCLASS` (set on `dict` and its subclasses).
pub const TPFLAGS_DICT_SUBCLASS: u64 = 1 << 29;
/// Items of a tuple a torn read could claim, at most.
const MAX_TUPLE: u64 = 1 << 20;
/// Bytes of a type's name read (a longer one is cut).
const MAX_TYPE_NAME: usize = 64;

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// (key, value) object addresses of a dict's live entries, in table order.
pub type Entries = Vec<(u64, u64)>;

/// Reads objects of one target, counting reads against a budget.
pub struct Reader<'a> {
    t: &'a Target,
    reads: Cell<u32>,
    budget: u32,
}

impl<'a> Reader<'a> {
    /// A reader that fails once it has done `budget` reads.
    pub fn new(t: &'a Target, budget: u32) -> Self {
        Reader { t, reads: Cell::new(0), budget }
    }

    /// The target read.
    pub fn target(&self) -> &'a Target {
        self.t
    }

    /// Reads done so far.
    pub fn reads(&self) -> u32 {
        self.reads.get()
    }

    fn read(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        if self.reads.get() >= self.budget {
            return Err(bad("read budget spent"));
        }
        self.reads.set(self.reads.get() + 1);
        self.t.mem.read_vec(addr, len)
    }

    /// `len` bytes at `addr`.
    pub fn read_bytes(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        self.read(addr, len)
    }

    /// The pointer-sized word at `addr`.
    pub fn u64(&self, addr: u64) -> io::Result<u64> {
        Ok(rd_u64(&self.read(addr, 8)?, 0))
    }

    /// Is the type word of `hdr` (an object's first bytes) `want`, if known?
    fn type_is(&self, hdr: &[u8], want: Option<u64>) -> bool {
        want.is_none_or(|w| rd_u64(hdr, self.t.layout.object_type as usize) == w)
    }

    /// The `str` at `addr`, of at most `max` characters: a longer one is cut
    /// ([`Long::Cut`]) or an error ([`Long::Refuse`]). Code points that are
    /// not characters (lone surrogates) read as `?`.
    pub fn str(&self, addr: u64, max: usize, long: Long) -> io::Result<String> {
        let l = &self.t.layout;
        let hdr = self.read(addr, l.unicode_compact_size as usize)?;
        if !self.type_is(&hdr, self.t.unicode_type) {
            return Err(bad("not a str"));
        }
        let len = rd_u64(&hdr, l.unicode_length as usize) as usize;
        let len = match long {
            Long::Refuse if len > max => return Err(bad("str too long")),
            _ => len.min(max),
        };
        let state = rd_u32(&hdr, l.unicode_state as usize);
        let k = l.unicode_kind_bit;
        let (kind, compact, ascii) = ((state >> k) & 7, (state >> (k + 3)) & 1 == 1, (state >> (k + 4)) & 1 == 1);
        if !compact {
            return Err(bad("not a compact str"));
        }
        if ascii {
            let b = self.read(addr + l.unicode_ascii_size, len)?;
            return if b.is_ascii() { Ok(String::from_utf8_lossy(&b).into_owned()) } else { Err(bad("not ASCII")) };
        }
        let b = self.read(addr + l.unicode_compact_size, len * kind as usize)?;
        let char = |c: u32| char::from_u32(c).unwrap_or('?');
        match kind {
            1 => Ok(b.iter().map(|&c| c as char).collect()),
            2 => Ok(b.chunks_exact(2).map(|c| char(u16::from_le_bytes([c[0], c[1]]) as u32)).collect()),
            4 => Ok(b.chunks_exact(4).map(|c| char(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()),
            _ => Err(bad("bad str kind")),
        }
    }

    /// Is the object at `addr` the ASCII `str` `name`? One read.
    pub fn str_is(&self, addr: u64, name: &str) -> bool {
        let l = &self.t.layout;
        let Ok(b) = self.read(addr, l.unicode_ascii_size as usize + name.len()) else { return false };
        let state = rd_u32(&b, l.unicode_state as usize);
        self.type_is(&b, self.t.unicode_type)
            && (state >> (l.unicode_kind_bit + 3)) & 3 == 3
            && rd_u64(&b, l.unicode_length as usize) == name.len() as u64
            && &b[l.unicode_ascii_size as usize..] == name.as_bytes()
    }

    /// The non-negative `int` at `addr`, up to 60 bits (two digits: a
    /// thread ident, a pointer, fits).
    pub fn long(&self, addr: u64) -> io::Result<u64> {
        let v = self.uint(addr, 2)?;
        Ok(v as u64)
    }

    /// The non-negative `int` at `addr` (exactly an `int` where its type is
    /// known) of at most `max_digits` 30-bit digits (5: 128 bits), below
    /// 2^128. One read when the digits follow within what was read, else two.
    pub fn uint(&self, addr: u64, max_digits: u64) -> io::Result<u128> {
        let o = &self.t.layout.objects;
        let max_digits = max_digits.min(5);
        let short = (o.long_digits + 8) as usize;
        let full = (o.long_digits + 4 * max_digits) as usize;
        // The wider read can cross into an unmapped page after a small int.
        let mut b = match self.read(addr, full.max(short)) {
            Ok(b) => b,
            Err(_) => self.read(addr, short)?,
        };
        let need = (o.long_digits + 4 * digits_of(self.t, &b, max_digits)?) as usize;
        if b.len() < need {
            b = self.read(addr, need)?;
        }
        uint_in(self.t, &b, max_digits)
    }

    /// The keys of shared keys object `keys` (a class's `ht_cached_keys`)
    /// in their order: a split values array holds the value of key `i` at
    /// index `i`.
    pub fn shared_keys(&self, keys: u64) -> io::Result<Vec<u64>> {
        let (base, n, esize, key_at) = self.table_at(keys)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let e = self.read(base, (n * esize) as usize)?;
        Ok((0..n as usize).map(|i| rd_u64(&e, i * esize as usize + key_at)).collect())
    }

    /// The type of the object at `addr`.
    pub fn type_of(&self, addr: u64) -> io::Result<u64> {
        self.u64(addr + self.t.layout.object_type)
    }

    /// The name (`tp_name`, cut at [`MAX_TYPE_NAME`] bytes) and `tp_flags`
    /// of the type at `ty`.
    pub fn type_info(&self, ty: u64) -> io::Result<(String, u64)> {
        let o = &self.t.layout.objects;
        let b = self.read(ty, (o.type_flags.max(o.type_name) + 8) as usize)?;
        let name = self.read(rd_u64(&b, o.type_name as usize), MAX_TYPE_NAME)?;
        let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
        if !name.iter().all(|c| c.is_ascii_graphic()) {
            return Err(bad("bad type name"));
        }
        Ok((String::from_utf8_lossy(name).into_owned(), rd_u64(&b, o.type_flags as usize)))
    }

    /// The type, length and first (up to `max`) items of the tuple (or
    /// instance of a tuple subclass: the caller checks the type) at `addr`.
    /// One read.
    pub fn tuple(&self, addr: u64, max: usize) -> io::Result<(u64, u64, Vec<u64>)> {
        let o = &self.t.layout.objects;
        let b = self.read(addr, o.tuple_items as usize + 8 * max)?;
        let len = rd_u64(&b, o.tuple_size as usize);
        if len > MAX_TUPLE {
            return Err(bad("torn tuple"));
        }
        let items = (0..(len as usize).min(max)).map(|i| rd_u64(&b, o.tuple_items as usize + 8 * i)).collect();
        Ok((rd_u64(&b, self.t.layout.object_type as usize), len, items))
    }

    /// The live entries of the dict at `addr`.
    pub fn dict(&self, addr: u64) -> io::Result<Entries> {
        self.dict_of(addr, self.t.dict_type)
    }

    /// The live entries of the dict at `addr`, an instance of `ty` (a type
    /// the caller knows is `dict` or a subclass; unchecked if None).
    pub fn dict_of(&self, addr: u64, ty: Option<u64>) -> io::Result<Entries> {
        let o = &self.t.layout.objects;
        let hdr = self.read(addr, (o.dict_keys.max(o.dict_values) + 8) as usize)?;
        if !self.type_is(&hdr, ty) {
            return Err(bad("not a dict"));
        }
        let values = rd_u64(&hdr, o.dict_values as usize);
        self.table(rd_u64(&hdr, o.dict_keys as usize), (values != 0).then_some(values))
    }

    /// The live entries of keys object `keys`, their values from the split
    /// values `values` (what `ma_values` points to) when given.
    fn table(&self, keys: u64, values: Option<u64>) -> io::Result<Entries> {
        let o = &self.t.layout.objects;
        let (base, n, esize, key_at) = self.table_at(keys)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let e = self.read(base, (n * esize) as usize)?;
        let vals = match values {
            None => None,
            Some(v) => {
                let pre = o.values_array;
                let b = self.read(v, (pre + n * 8) as usize)?;
                // 3.13+: `capacity` is the values array's length.
                if pre > 0 && (b[0] as u64) < n {
                    return Err(bad("split values shorter than the keys"));
                }
                Some(b[pre as usize..].to_vec())
            }
        };
        let out = (0..n as usize)
            .map(|i| {
                let key = rd_u64(&e, i * esize as usize + key_at);
                let value = match &vals {
                    Some(v) => rd_u64(v, 8 * i),
                    None => rd_u64(&e, i * esize as usize + key_at + 8),
                };
                (key, value)
            })
            .filter(|&(k, v)| k != 0 && v != 0)
            .collect();
        Ok(out)
    }

    /// Where keys object `keys` has its entries: their address, how many
    /// are used, an entry's size and where its key is in it.
    fn table_at(&self, keys: u64) -> io::Result<(u64, u64, u64, usize)> {
        let o = &self.t.layout.objects;
        let (base, n, esize, key_at) = match o.keys {
            DictKeys::Sized => {
                let h = self.read(keys, 40)?;
                let (size, n) = (rd_u64(&h, 8), rd_u64(&h, 32));
                if !size.is_power_of_two() || size > 1 << 30 || n > size {
                    return Err(bad("torn dict keys"));
                }
                let ix = match size {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    0x1_0000..=0xffff_ffff => 4,
                    _ => 8,
                };
                (keys + 40 + size * ix, n, 24, 8)
            }
            DictKeys::Log2 => {
                let h = self.read(keys, 32)?;
                let (log2, log2_ix, kind, n) = (h[8] as u64, h[9] as u64, h[10], rd_u64(&h, 24));
                if !(3..=30).contains(&log2) || !(log2..=log2 + 3).contains(&log2_ix) || kind > 2 || n > 1 << log2 {
                    return Err(bad("torn dict keys"));
                }
                let (esize, key_at) = if kind == 0 { (24, 8) } else { (16, 0) };
                (keys + 32 + (1 << log2_ix), n, esize, key_at)
            }
        };
        if n > MAX_ENTRIES {
            return Err(bad("dict too large"));
        }
        Ok((base, n, esize, key_at as usize))
    }

    /// What says where instances of type `ty` keep their attributes: its
    /// `tp_flags`, `tp_basicsize` and `tp_dictoffset`, in one read.
    pub fn instance_slots(&self, ty: u64) -> io::Result<(u64, u64, u64)> {
        let o = &self.t.layout.objects;
        let tb = self.read(ty, (o.type_flags.max(o.type_basicsize).max(o.type_dictoffset) + 8) as usize)?;
        let at = |off: u64| rd_u64(&tb, off as usize);
        Ok((at(o.type_flags), at(o.type_basicsize), at(o.type_dictoffset)))
    }

    /// The attributes (`__dict__` entries) of the instance at `obj`.
    pub fn attrs(&self, obj: u64) -> io::Result<Entries> {
        let o = &self.t.layout.objects;
        let ty = self.u64(obj + self.t.layout.object_type)?;
        let (flags, basic, dictoffset) = self.instance_slots(ty)?;
        if o.instance_dict == InstanceDict::TypeOffset || flags & TPFLAGS_MANAGED_DICT == 0 {
            let off = dictoffset as i64;
            if off <= 0 || off > 1 << 16 {
                return Err(bad("no instance dict"));
            }
            return self.dict(self.u64(obj + off as u64)?);
        }
        let cached = || self.u64(ty + o.heap_type_cached_keys);
        match o.instance_dict {
            InstanceDict::TypeOffset => unreachable!("handled above"),
            InstanceDict::ValuesOrDict => {
                let pre = self.read(obj - 32, 16)?;
                let (values, dict) = (rd_u64(&pre, 0), rd_u64(&pre, 8));
                if values != 0 {
                    return self.table(cached()?, Some(values));
                }
                self.dict(dict)
            }
            InstanceDict::Tagged => {
                let dorv = self.u64(obj - o.managed_dict)?;
                if dorv & 1 == 1 {
                    return self.table(cached()?, Some(dorv + 1));
                }
                self.dict(dorv)
            }
            InstanceDict::Inline => {
                let dict = self.u64(obj - o.managed_dict)?;
                if dict != 0 {
                    return self.dict(dict);
                }
                if flags & TPFLAGS_INLINE_VALUES == 0 {
                    return Err(bad("no instance dict"));
                }
                if !(16..=1 << 16).contains(&basic) {
                    return Err(bad("bad tp_basicsize"));
                }
                let values = obj + basic;
                // `valid` (byte 3): the inline values hold the attributes.
                if self.read(values, 4)?[3] == 0 {
                    return Err(bad("inline values invalidated"));
                }
                self.table(cached()?, Some(values))
            }
        }
    }

    /// `sys.modules[name]` in interpreter `interp` (None: not imported),
    /// from the interpreter's `modules`, else its `sys` module's dict.
    /// `hint` is the key found last time for `name`, `modules` the one for
    /// `"modules"` in the `sys` dict (see [`Reader::find`]).
    pub fn sys_module(&self, interp: u64, name: &str, hint: &mut u64, modules: &mut u64) -> io::Result<Option<u64>> {
        let o = self.t.layout.objects;
        if let Ok(m) = self.u64(interp + o.interp_modules).and_then(|m| self.dict(m)) {
            if let Some(module) = self.find(&m, name, hint) {
                return Ok(Some(module));
            }
        }
        let sysdict = self.dict(self.u64(interp + o.interp_sysdict)?)?;
        match self.find(&sysdict, "modules", modules) {
            Some(m) => Ok(self.find(&self.dict(m)?, name, hint)),
            None => Ok(None),
        }
    }

    /// The global `name` of module `module` (None: not defined).
    pub fn module_global(&self, module: u64, name: &str, hint: &mut u64) -> io::Result<Option<u64>> {
        let globals = self.dict(self.u64(module + self.t.layout.objects.module_dict)?)?;
        Ok(self.find(&globals, name, hint))
    }

    /// The value of key `name` (an ASCII `str`) among `entries`. `hint` is
    /// the key object found last time (attribute names are interned, so the
    /// same object): it is checked first, and updated.
    pub fn find(&self, entries: &[(u64, u64)], name: &str, hint: &mut u64) -> Option<u64> {
        if let Some(&(k, v)) = entries.iter().find(|e| e.0 == *hint) {
            if self.str_is(k, name) {
                return Some(v);
            }
        }
        let &(k, v) = entries.iter().find(|e| e.0 != *hint && self.str_is(e.0, name))?;
        *hint = k;
        Some(v)
    }
}

/// The number of digits of the non-negative `int` whose first bytes are
/// `b` (its type checked against the target's `int` where known), at most
/// `max_digits` (at most 5).
fn digits_of(t: &Target, b: &[u8], max_digits: u64) -> io::Result<u64> {
    let o = &t.layout.objects;
    let l = &t.layout;
    if b.len() < (o.long_size + 8) as usize || b.len() < (l.object_type + 8) as usize {
        return Err(bad("short int"));
    }
    if t.long_type.is_some_and(|want| rd_u64(b, l.object_type as usize) != want) {
        return Err(bad("not an int"));
    }
    let size = rd_u64(b, o.long_size as usize);
    let ndigits = match o.long_header {
        LongHeader::SignedSize if (size as i64) < 0 => return Err(bad("negative int")),
        LongHeader::SignedSize => size,
        LongHeader::Tagged if size & 3 == 2 => return Err(bad("negative int")),
        LongHeader::Tagged => size >> 3,
    };
    if ndigits > max_digits.min(5) {
        return Err(bad("int too large"));
    }
    Ok(ndigits)
}

/// The non-negative `int` (below 2^128, at most `max_digits` 30-bit
/// digits) whose bytes, from its start, are `b`: an error where they are
/// not an `int` or do not hold all its digits.
pub fn uint_in(t: &Target, b: &[u8], max_digits: u64) -> io::Result<u128> {
    let o = &t.layout.objects;
    let ndigits = digits_of(t, b, max_digits)?;
    if b.len() < (o.long_digits + 4 * ndigits) as usize {
        return Err(bad("int cut short"));
    }
    let digit = |i: usize| (rd_u32(b, o.long_digits as usize + 4 * i) & 0x3fff_ffff) as u128;
    let top = ndigits.checked_sub(1).map_or(0, |i| digit(i as usize));
    // 4 full digits hold 120 bits: the fifth may hold 8 more.
    if ndigits == 5 && top >> 8 != 0 {
        return Err(bad("int too large"));
    }
    Ok((0..ndigits as usize).map(|i| digit(i) << (30 * i)).sum())
}
