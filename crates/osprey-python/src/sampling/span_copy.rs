//! The OpenTelemetry span a running thread is in, copied at its sampling
//! interrupt in the same run as its frames ([`osprey_perf::chain::Extra`]):
//! a copy's stack and span are of one instant, as a stopped reader's are.
//!
//! The program walks what [`crate::sampling::otel_context`] reads from
//! outside: the thread state's `Context`, its HAMT down to the OTel
//! variable's value (bitmap and array nodes), that OTel `Context`'s table
//! to the span key, the span's `_context` (and `_parent`) in its values
//! array, and copies the `SpanContext`'s bytes and its two ints' bytes. What
//! it compares with (the variable, node types, classes, the key, where a
//! class keeps `_context`) is a [`Recipe`] the outside reader fills once it
//! has verified each thing ([`crate::sampling::otel_context::Spans::recipe`]);
//! until then, or where the walk meets anything else (a collision node, a
//! materialised instance dict, an unknown class, memory not resident), the
//! copy says [`CopiedSpan::Unknown`] and the sampler reads from outside.
//!
//! Invariant: at the interrupt the thread is not running, and everything
//! on the walk is referenced from its current context, so alive; a copy is
//! therefore one state of the objects, never a mix of a freed one and its
//! successor (the reason copies are not used with a span read later).
//! Ints and `SpanContext` are decoded and checked here, after the copy.

use std::io;

use osprey_perf::bpf::{Alu, Asm, Cond, Label, Reg, Size, ValueMap, R0, R1, R10, R2, R3, R4, R5, R6, R9};
use osprey_perf::chain::{Extra, Site};

use crate::layout::objects::{DictKeys, InstanceDict};
use crate::layout::Layout;
use crate::remote::process::rd_u64;
use crate::target::pyobject::uint_in;
use crate::target::Target;

/// HAMT levels walked (5 hash bits each; a deeper key is not copied).
const LEVELS: i32 = 7;
/// Entries of an OTel `Context` scanned for the span key.
const ENTRIES: i32 = 8;
/// An OTel `Context` table with more index bytes than this is not scanned.
const MAX_LOG2_INDEX: i32 = 10;

/// Recipe words (byte offsets of the [`Recipe`] value).
mod at {
    pub const ENABLED: i16 = 0;
    pub const VAR: i16 = 8;
    pub const HASH: i16 = 16;
    pub const BITMAP: i16 = 24;
    pub const ARRAY: i16 = 32;
    pub const CONTEXT: i16 = 40;
    pub const SPAN_KEY: i16 = 48;
    pub const SPAN_CONTEXT: i16 = 56;
    pub const NONE: i16 = 64;
    pub const DICT: i16 = 72;
    pub const CLASSES: i16 = 80;
    /// A class block: type, param, keys, `_context` slot, `_parent` slot + 1.
    pub const CLASS: i16 = 40;
    pub const SIZE: usize = CLASSES as usize + 2 * CLASS as usize;
}

/// Copy words (byte offsets in the extra area).
mod out {
    pub const STATUS: i16 = 0;
    pub const CLASS: i16 = 8;
    pub const PARENT: i16 = 16;
    pub const PARENT_REMOTE: i16 = 24;
    pub const SPAN_CONTEXT: i16 = 32;
    pub const SPAN_CONTEXT_BYTES: i16 = 80;
    pub const TRACE: i16 = SPAN_CONTEXT + SPAN_CONTEXT_BYTES;
    pub const INT_BYTES: i16 = 64;
    pub const SPAN: i16 = TRACE + INT_BYTES;
    pub const SIZE: u32 = (SPAN + INT_BYTES) as u32;
}

/// Copy statuses.
const NO_SPAN: i32 = 1;
const SPAN: i32 = 2;

/// A class whose instances can be spans: where the program finds their
/// `_context` and `_parent`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpanClass {
    /// The class.
    pub ty: u64,
    /// 3.8–3.10: `tp_dictoffset`; 3.13+: `tp_basicsize` (the inline values).
    pub param: u64,
    /// 3.8–3.10: the shared keys an instance dict must have (its values
    /// array is indexed by them).
    pub keys: u64,
    /// Index of `_context` in the values array.
    pub context_slot: u64,
    /// Index of `_parent` (None: the class has none).
    pub parent_slot: Option<u64>,
}

/// What the program compares with; zero words are not known yet (the walk
/// fails there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recipe {
    /// The OTel `ContextVar` (the HAMT key).
    pub var: u64,
    /// Its hash as the HAMT uses it.
    pub hash: u32,
    /// The HAMT bitmap node type.
    pub bitmap_node: u64,
    /// The HAMT array node type.
    pub array_node: u64,
    /// The OTel `Context` class.
    pub context_class: u64,
    /// The `current-span-<uuid>` key object.
    pub span_key: u64,
    /// The `SpanContext` class.
    pub span_context_class: u64,
    /// `None`.
    pub none: u64,
    /// `dict` (3.8–3.10: an instance dict's type).
    pub dict: u64,
    /// Span classes (type 0: none).
    pub classes: [SpanClass; 2],
}

impl Recipe {
    /// The map's value; `enabled` once the variable is known.
    fn bytes(&self, switches: &Recipe) -> Vec<u8> {
        let mut b = vec![0u8; at::SIZE];
        let mut put = |off: i16, v: u64| b[off as usize..off as usize + 8].copy_from_slice(&v.to_ne_bytes());
        put(at::ENABLED, (switches.var != 0) as u64);
        put(at::VAR, self.var);
        put(at::HASH, self.hash as u64);
        put(at::BITMAP, self.bitmap_node);
        put(at::ARRAY, self.array_node);
        put(at::CONTEXT, self.context_class);
        put(at::SPAN_KEY, self.span_key);
        put(at::SPAN_CONTEXT, self.span_context_class);
        put(at::NONE, self.none);
        put(at::DICT, self.dict);
        for (k, c) in self.classes.iter().enumerate() {
            let base = at::CLASSES + k as i16 * at::CLASS;
            put(base, switches.classes[k].ty);
            put(base + 8, c.param);
            put(base + 16, c.keys);
            put(base + 24, c.context_slot);
            put(base + 32, c.parent_slot.map_or(0, |s| s + 1));
        }
        b
    }
}

/// The recipe's map and the program's code for one interpreter layout.
pub struct SpanCode {
    map: ValueMap,
    l: Layout,
    published: Recipe,
}

impl SpanCode {
    /// The map (empty: nothing copied until [`SpanCode::publish`]).
    pub fn new(l: &Layout) -> io::Result<SpanCode> {
        Ok(SpanCode { map: ValueMap::create("osprey_spans", at::SIZE)?, l: l.clone(), published: Recipe::default() })
    }

    /// Makes `r` the recipe. A run reading the map while it is written may
    /// see old and new words mixed: the switches (enabled, each class's
    /// type) are written after what they switch on, by a second write.
    pub fn publish(&mut self, r: &Recipe) -> io::Result<()> {
        if *r == self.published {
            return Ok(());
        }
        self.map.set(&r.bytes(&self.published))?;
        self.map.set(&r.bytes(r))?;
        self.published = r.clone();
        Ok(())
    }
}

/// A span as copied (see [`SpanCode::decode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopiedSpan {
    /// Not copied (recipe incomplete, or the walk met something else): read
    /// from outside.
    Unknown,
    /// The thread was in no span of this process.
    None,
    /// A span (maybe OTel's invalid one, or a remote parent).
    Span {
        /// Its trace id.
        trace_id: u128,
        /// Its span id.
        span_id: u64,
        /// Another process's span.
        remote: bool,
        /// Whether it is its own local root (None: the class does not say).
        local_root: Option<bool>,
    },
}

impl SpanCode {
    /// What the program copied into `extra` (a copy's extra area).
    pub fn decode(&self, t: &Target, extra: &[u8]) -> CopiedSpan {
        if extra.len() < out::SIZE as usize {
            return CopiedSpan::Unknown;
        }
        let w = |off: i16| rd_u64(extra, off as usize);
        match w(out::STATUS) as i32 {
            NO_SPAN => return CopiedSpan::None,
            SPAN => {}
            _ => return CopiedSpan::Unknown,
        }
        let o = &self.l.objects;
        let sc = &extra[out::SPAN_CONTEXT as usize..(out::SPAN_CONTEXT + out::SPAN_CONTEXT_BYTES) as usize];
        let items = |i: u64| rd_u64(sc, (o.tuple_items + 8 * i) as usize);
        let truthy = |p: u64| t.true_obj.is_some_and(|tr| tr == p);
        if rd_u64(sc, o.tuple_size as usize) < 3 {
            return CopiedSpan::Unknown;
        }
        let int = |off: i16, digits| uint_in(t, &extra[off as usize..(off + out::INT_BYTES) as usize], digits);
        let (Ok(trace_id), Ok(span_id)) = (int(out::TRACE, 5), int(out::SPAN, 3)) else {
            return CopiedSpan::Unknown;
        };
        let Ok(span_id) = u64::try_from(span_id) else { return CopiedSpan::Unknown };
        let class = w(out::CLASS).min(1) as usize;
        let local_root = match self.published.classes[class].parent_slot {
            None => None,
            Some(_) if Some(w(out::PARENT)) == t.none_obj => Some(true),
            Some(_) => Some(truthy(w(out::PARENT_REMOTE))),
        };
        CopiedSpan::Span { trace_id, span_id, remote: truthy(items(2)), local_root }
    }
}

/// Emits the walk; see the module's doc. Registers: r9 the recipe, r6 the
/// object walked; stack: [`Walk`]'s at `stack_low`, the recipe's key at its
/// top.
impl Extra for SpanCode {
    fn bytes(&self) -> u32 {
        out::SIZE
    }

    fn emit(&self, a: &mut Asm, s: Site) {
        let l = &self.l;
        let o = &l.objects;
        let (end, fail, no_span) = (a.label(), a.label(), a.label());
        let w = Walk { buf: s.stack_low, spill: s.stack_low + 96, fail };
        let spill = w.spill;
        a.lookup0(self.map.fd(), s.stack_high - 8, end);
        a.mov(R9, R0);
        a.load(Size::Dw, R1, R9, at::ENABLED);
        a.jump_if(Cond::Eq, R1, 0, end);
        // The thread state, its context, the context's HAMT and root.
        a.load(Size::Dw, R6, s.config, 8);
        a.add_imm(R6, -(l.tstate_frame as i32));
        w.read(a, R6, o.tstate_context as i64, 8);
        w.word(a, R6, 0);
        a.jump_if(Cond::Eq, R6, 0, no_span);
        for off in [o.context_vars, o.hamt_root] {
            w.read(a, R6, off as i64, 8);
            w.word(a, R6, 0);
            a.jump_if(Cond::Eq, R6, 0, fail);
        }
        // The HAMT walk (hamt.c's layouts: see `target::contextvars`).
        let head = l.object_type + 8;
        let var_head = head + 8;
        let found = a.label();
        for level in 0..LEVELS {
            let (bitmap, array, next) = (a.label(), a.label(), a.label());
            w.read(a, R6, 0, var_head + 8);
            w.word(a, R1, l.object_type);
            a.jump_if(Cond::Eq, R1, 0, fail);
            a.load(Size::Dw, R2, R9, at::BITMAP);
            a.jump_if_reg(Cond::Eq, R1, R2, bitmap);
            a.load(Size::Dw, R2, R9, at::ARRAY);
            a.jump_if_reg(Cond::Eq, R1, R2, array);
            a.jump(fail);
            // The variable's 5 hash bits at this level, in r1.
            let slot = |a: &mut Asm| {
                a.load(Size::Dw, R1, R9, at::HASH);
                a.alu_imm(Alu::Rsh, R1, 5 * level);
                a.alu_imm(Alu::And, R1, 0x1f);
            };
            a.place(bitmap);
            slot(a);
            a.mov_imm(R2, 1);
            a.alu(Alu::Lsh, R2, R1);
            a.load(Size::W, R3, R10, w.buf + var_head as i16);
            a.mov(R4, R3);
            a.alu(Alu::And, R4, R2);
            a.jump_if(Cond::Eq, R4, 0, no_span);
            a.alu_imm(Alu::Sub, R2, 1);
            a.alu(Alu::And, R3, R2);
            popcount(a, R3, R4);
            a.alu_imm(Alu::Lsh, R3, 4);
            a.alu(Alu::Add, R3, R6);
            w.read(a, R3, (var_head + 8) as i64, 16);
            w.word(a, R1, 0);
            w.word(a, R6, 8);
            a.jump_if(Cond::Eq, R1, 0, next);
            a.load(Size::Dw, R2, R9, at::VAR);
            a.jump_if_reg(Cond::Eq, R1, R2, found);
            a.jump(no_span);
            a.place(array);
            slot(a);
            a.alu_imm(Alu::Lsh, R1, 3);
            a.alu(Alu::Add, R1, R6);
            w.read(a, R1, head as i64, 8);
            w.word(a, R6, 0);
            a.jump_if(Cond::Eq, R6, 0, no_span);
            a.place(next);
            a.jump_if(Cond::Eq, R6, 0, fail);
        }
        a.jump(fail);
        // The OTel Context (a dict subclass, combined table): its keys.
        a.place(found);
        w.read(a, R6, 0, self.dict_head());
        w.known(a, R2, at::CONTEXT);
        w.word(a, R1, l.object_type);
        a.jump_if_reg(Cond::Ne, R1, R2, fail);
        w.word(a, R1, o.dict_values);
        a.jump_if(Cond::Ne, R1, 0, fail);
        w.word(a, R6, o.dict_keys);
        a.jump_if(Cond::Eq, R6, 0, fail);
        // r6: the first entry's key; spilled: entries used, entry size.
        match o.keys {
            DictKeys::Sized => {
                w.read(a, R6, 0, 40);
                w.word(a, R1, 8);
                a.jump_if(Cond::Gt, R1, 128, fail);
                w.word(a, R2, 32);
                a.store(Size::Dw, R10, spill, R2);
                a.store_imm(Size::Dw, R10, spill + 8, 24);
                a.add_imm(R6, 40 + 8);
                a.alu(Alu::Add, R6, R1);
            }
            DictKeys::Log2 => {
                let unicode = a.label();
                w.read(a, R6, 0, 32);
                a.load(Size::B, R1, R10, w.buf + 9);
                a.jump_if(Cond::Gt, R1, MAX_LOG2_INDEX, fail);
                a.mov_imm(R2, 1);
                a.alu(Alu::Lsh, R2, R1);
                a.alu(Alu::Add, R6, R2);
                a.add_imm(R6, 32);
                w.word(a, R1, 24);
                a.store(Size::Dw, R10, spill, R1);
                a.store_imm(Size::Dw, R10, spill + 8, 16);
                a.load(Size::B, R1, R10, w.buf + 10);
                a.jump_if(Cond::Ne, R1, 0, unicode);
                a.store_imm(Size::Dw, R10, spill + 8, 24);
                a.add_imm(R6, 8);
                a.place(unicode);
            }
        }
        let span_found = a.label();
        for i in 0..ENTRIES {
            let more = a.label();
            a.load(Size::Dw, R1, R10, spill);
            a.jump_if(Cond::Ge, R1, i + 1, more);
            a.jump(no_span);
            a.place(more);
            w.read(a, R6, 0, 16);
            w.word(a, R1, 0);
            w.known(a, R2, at::SPAN_KEY);
            a.jump_if_reg(Cond::Eq, R1, R2, span_found);
            a.load(Size::Dw, R1, R10, spill + 8);
            a.alu(Alu::Add, R6, R1);
        }
        a.jump(fail);
        // The span: which class, then its values array.
        a.place(span_found);
        w.word(a, R6, 8);
        a.jump_if(Cond::Eq, R6, 0, fail);
        w.read(a, R6, l.object_type as i64, 8);
        w.word(a, R1, 0);
        let classes: Vec<Label> = (0..2).map(|_| a.label()).collect();
        for (k, &c) in classes.iter().enumerate() {
            let skip = a.label();
            a.load(Size::Dw, R2, R9, at::CLASSES + k as i16 * at::CLASS);
            a.jump_if(Cond::Eq, R2, 0, skip);
            a.jump_if_reg(Cond::Eq, R1, R2, c);
            a.place(skip);
        }
        a.jump(fail);
        for (k, &c) in classes.iter().enumerate() {
            a.place(c);
            self.span(a, s, k as i16, &w);
            a.jump(end);
        }
        a.place(no_span);
        a.store_imm(Size::Dw, s.entry, s.area + out::STATUS, NO_SPAN);
        a.jump(end);
        a.place(fail);
        a.store_imm(Size::Dw, s.entry, s.area + out::STATUS, 0);
        a.place(end);
    }
}

impl SpanCode {
    /// The tail of the walk for class block `k`: r6 the span, r9 the recipe.
    fn span(&self, a: &mut Asm, s: Site, k: i16, w: &Walk) {
        let l = &self.l;
        let o = &l.objects;
        let class = at::CLASSES + k * at::CLASS;
        let (buf, spill, fail) = (w.buf, w.spill, w.fail);
        // r5: the values array.
        match o.instance_dict {
            InstanceDict::TypeOffset => {
                a.load(Size::Dw, R1, R9, class + 8);
                a.alu(Alu::Add, R1, R6);
                w.read(a, R1, 0, 8);
                w.word(a, R1, 0);
                a.jump_if(Cond::Eq, R1, 0, fail);
                a.store(Size::Dw, R10, spill, R1);
                w.read(a, R1, 0, self.dict_head());
                a.load(Size::Dw, R2, R9, at::DICT);
                w.word(a, R1, l.object_type);
                a.jump_if_reg(Cond::Ne, R1, R2, fail);
                a.load(Size::Dw, R2, R9, class + 16);
                w.word(a, R1, o.dict_keys);
                a.jump_if_reg(Cond::Ne, R1, R2, fail);
                w.word(a, R5, o.dict_values);
                a.jump_if(Cond::Eq, R5, 0, fail);
            }
            InstanceDict::ValuesOrDict => {
                w.read(a, R6, -32, 8);
                w.word(a, R5, 0);
                a.jump_if(Cond::Eq, R5, 0, fail);
            }
            InstanceDict::Tagged => {
                w.read(a, R6, -(o.managed_dict as i64), 8);
                w.word(a, R5, 0);
                a.mov(R1, R5);
                a.alu_imm(Alu::And, R1, 1);
                a.jump_if(Cond::Eq, R1, 0, fail);
                a.add_imm(R5, 1);
            }
            InstanceDict::Inline => {
                w.read(a, R6, -(o.managed_dict as i64), 8);
                w.word(a, R1, 0);
                a.jump_if(Cond::Ne, R1, 0, fail);
                a.load(Size::Dw, R5, R9, class + 8);
                a.alu(Alu::Add, R5, R6);
                a.store(Size::Dw, R10, spill, R5);
                w.read(a, R5, 0, 8);
                a.load(Size::Dw, R5, R10, spill);
                // `valid`, then `capacity` above the slot read.
                a.load(Size::B, R1, R10, buf + 3);
                a.jump_if(Cond::Eq, R1, 0, fail);
                a.load(Size::B, R1, R10, buf);
                a.load(Size::Dw, R2, R9, class + 24);
                a.jump_if_reg(Cond::Ge, R2, R1, fail);
                a.load(Size::Dw, R2, R9, class + 32);
                a.jump_if_reg(Cond::Gt, R2, R1, fail);
            }
        }
        a.add_imm(R5, o.values_array as i32);
        a.store(Size::Dw, R10, spill, R5);
        // `_context`: the SpanContext's bytes, then its ints'.
        a.load(Size::Dw, R1, R9, class + 24);
        a.alu_imm(Alu::Lsh, R1, 3);
        a.alu(Alu::Add, R1, R5);
        w.read(a, R1, 0, 8);
        w.word(a, R6, 0);
        a.jump_if(Cond::Eq, R6, 0, fail);
        let sc = s.area + out::SPAN_CONTEXT;
        let sc_len = (o.tuple_items + 24).min(out::SPAN_CONTEXT_BYTES as u64);
        a.read_user(s.entry, sc as i32, sc_len as i32, R6, 0, fail);
        a.load(Size::Dw, R1, s.entry, sc + l.object_type as i16);
        w.known(a, R2, at::SPAN_CONTEXT);
        a.jump_if_reg(Cond::Ne, R1, R2, fail);
        for (i, to) in [(0, out::TRACE), (1, out::SPAN)] {
            a.load(Size::Dw, R6, s.entry, sc + o.tuple_items as i16 + 8 * i);
            let len = (o.long_digits + 4 * [5, 3][i as usize]).div_ceil(8) * 8;
            a.read_user(s.entry, (s.area + to) as i32, len.min(out::INT_BYTES as u64) as i32, R6, 0, fail);
        }
        // `_parent`: None (a root) or a SpanContext, whose `is_remote` is read.
        let done = a.label();
        a.store_imm(Size::Dw, s.entry, s.area + out::PARENT, 0);
        a.load(Size::Dw, R1, R9, class + 32);
        a.jump_if(Cond::Eq, R1, 0, done);
        a.alu_imm(Alu::Sub, R1, 1);
        a.alu_imm(Alu::Lsh, R1, 3);
        a.load(Size::Dw, R5, R10, spill);
        a.alu(Alu::Add, R1, R5);
        w.read(a, R1, 0, 8);
        w.word(a, R6, 0);
        a.jump_if(Cond::Eq, R6, 0, fail);
        a.store(Size::Dw, s.entry, s.area + out::PARENT, R6);
        w.known(a, R2, at::NONE);
        a.jump_if_reg(Cond::Eq, R6, R2, done);
        w.read(a, R6, 0, o.tuple_items + 24);
        w.word(a, R1, l.object_type);
        a.load(Size::Dw, R2, R9, at::SPAN_CONTEXT);
        a.jump_if_reg(Cond::Ne, R1, R2, fail);
        w.word(a, R1, o.tuple_items + 16);
        a.store(Size::Dw, s.entry, s.area + out::PARENT_REMOTE, R1);
        a.place(done);
        a.store_imm(Size::Dw, s.entry, s.area + out::CLASS, k as i32);
        a.store_imm(Size::Dw, s.entry, s.area + out::STATUS, SPAN);
    }
}

/// The walk's stack (a 96-byte read buffer, two spilled words above it)
/// and where it goes when it meets anything the recipe does not have.
struct Walk {
    buf: i16,
    spill: i16,
    fail: Label,
}

impl Walk {
    /// Reads `len` bytes at `src + off` into the buffer.
    fn read(&self, a: &mut Asm, src: Reg, off: i64, len: u64) {
        a.read_user(R10, self.buf as i32, len as i32, src, off as i32, self.fail);
    }
    /// `dst` = the buffer's word at `off`.
    fn word(&self, a: &mut Asm, dst: Reg, off: u64) {
        a.load(Size::Dw, dst, R10, self.buf + off as i16);
    }
    /// `dst` = the recipe's word at `off` (r9: the recipe); to `fail` where
    /// it is not known yet.
    fn known(&self, a: &mut Asm, dst: Reg, off: i16) {
        a.load(Size::Dw, dst, R9, off);
        a.jump_if(Cond::Eq, dst, 0, self.fail);
    }
}

impl SpanCode {
    /// Bytes read of a dict's head: its type, keys and values pointers.
    fn dict_head(&self) -> u64 {
        let (l, o) = (&self.l, &self.l.objects);
        o.dict_keys.max(o.dict_values).max(l.object_type) + 8
    }
}

/// `x = popcount(x)` for a 32-bit `x`, `t` clobbered (no instruction for it
/// in BPF: the SWAR sum).
fn popcount(a: &mut Asm, x: u8, t: u8) {
    a.mov(t, x);
    a.alu_imm(Alu::Rsh, t, 1);
    a.alu_imm(Alu::And, t, 0x5555_5555);
    a.alu(Alu::Sub, x, t);
    a.mov(t, x);
    a.alu_imm(Alu::Rsh, t, 2);
    a.alu_imm(Alu::And, t, 0x3333_3333);
    a.alu_imm(Alu::And, x, 0x3333_3333);
    a.alu(Alu::Add, x, t);
    a.mov(t, x);
    a.alu_imm(Alu::Rsh, t, 4);
    a.alu(Alu::Add, x, t);
    a.alu_imm(Alu::And, x, 0x0f0f_0f0f);
    a.alu_imm(Alu::Mul, x, 0x0101_0101);
    a.alu_imm(Alu::Rsh, x, 24);
    a.alu_imm(Alu::And, x, 0xff);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk fits the kernel's limit for a program of any user
    /// (BPF_MAXINSNS), whatever the version's layouts; needs root (a map).
    #[test]
    fn the_walk_stays_small_on_every_version() {
        for minor in 8..=15 {
            let l = Layout::for_version(3, minor).unwrap_or_else(|| Layout::base(minor));
            let Ok(code) = SpanCode::new(&l) else { return };
            let mut a = Asm::default();
            let site = Site {
                config: osprey_perf::bpf::R7,
                entry: osprey_perf::bpf::R8,
                area: 40,
                stack_low: -272,
                stack_high: -16,
            };
            code.emit(&mut a, site);
            eprintln!("3.{minor}: {} instructions", a.len());
            assert!(a.len() < 4096, "3.{minor}: {} instructions", a.len());
        }
    }

    #[test]
    fn switches_are_written_last() {
        let mut r = Recipe { var: 0x1000, hash: 7, ..Recipe::default() };
        r.classes[0] = SpanClass { ty: 0x2000, param: 1, keys: 2, context_slot: 3, parent_slot: Some(4) };
        let first = r.bytes(&Recipe::default());
        let word = |b: &[u8], off: i16| u64::from_ne_bytes(b[off as usize..off as usize + 8].try_into().unwrap());
        assert_eq!((word(&first, at::ENABLED), word(&first, at::CLASSES)), (0, 0));
        assert_eq!(
            (word(&first, at::VAR), word(&first, at::CLASSES + 24), word(&first, at::CLASSES + 32)),
            (0x1000, 3, 5)
        );
        let second = r.bytes(&r);
        assert_eq!((word(&second, at::ENABLED), word(&second, at::CLASSES)), (1, 0x2000));
    }
}
