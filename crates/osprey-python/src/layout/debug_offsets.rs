//! `_Py_DebugOffsets`: the description of its own structures that CPython
//! 3.13+ publishes at the start of `_PyRuntime` (cookie `xdebugpy`, then
//! `PY_VERSION_HEX`, the free-threaded flag, and groups of `uint64_t`
//! offsets and sizes).
//!
//! The struct itself grows between minor versions, so osprey knows its
//! field order per version ([`schema`]); an interpreter newer than the
//! newest known schema is read with that schema and used only if what it
//! says checks out ([`DebugOffsets::validate`], then the live checks in
//! `target`). Nothing here trusts a value: every offset is range-checked
//! against the size its group declares before a layout is built from it.

use std::fmt;

use super::objects::ObjectLayout;
use super::{InstrKind, Layout, LineTable};

/// The cookie at `_PyRuntime + 0`.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// Newest minor version whose struct layout osprey knows and was tested on.
pub const NEWEST_KNOWN_MINOR: u32 = 15;

/// Field names of the 3.13 struct, one 8-byte word each, in memory order
/// (`cookie` is word 0). Names are the C member paths, so tests can check
/// them against the interpreter's own headers with `offsetof`.
const V313: &[&str] = &[
    "cookie",
    "version",
    "free_threaded",
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size",
    "gc.collecting",
];

/// 3.14: the main thread, code generations, the frame's stack pointer and
/// per-thread bytecode index, sets, generators, list nodes, remote debugging.
const V314: &[&str] = &[
    "cookie",
    "version",
    "free_threaded",
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.threads_main",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "interpreter_state.code_object_generation",
    "interpreter_state.tlbc_generation",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "interpreter_frame.stackpointer",
    "interpreter_frame.tlbc_index",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "code_object.co_tlbc",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "set_object.size",
    "set_object.used",
    "set_object.table",
    "set_object.mask",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size",
    "gc.collecting",
    "gen_object.size",
    "gen_object.gi_name",
    "gen_object.gi_iframe",
    "gen_object.gi_frame_state",
    "llist_node.next",
    "llist_node.prev",
    "debugger_support.eval_breaker",
    "debugger_support.remote_debugger_support",
    "debugger_support.remote_debugging_enabled",
    "debugger_support.debugger_pending_call",
    "debugger_support.debugger_script_path",
    "debugger_support.debugger_script_path_size",
];

/// 3.15: base and last-profiled frames, `holds_gil` and `gil_requested` in
/// the thread state, exception state, heap types, the GC's current frame
/// and statistics.
const V315: &[&str] = &[
    "cookie",
    "version",
    "free_threaded",
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.threads_main",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "interpreter_state.code_object_generation",
    "interpreter_state.tlbc_generation",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.base_frame",
    "thread_state.last_profiled_frame",
    "thread_state.last_profiled_frame_seq",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "thread_state.holds_gil",
    "thread_state.gil_requested",
    "thread_state.current_exception",
    "thread_state.exc_state",
    "err_stackitem.exc_value",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "interpreter_frame.stackpointer",
    "interpreter_frame.tlbc_index",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "code_object.co_tlbc",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "type_object.tp_basicsize",
    "type_object.tp_dictoffset",
    "heap_type_object.size",
    "heap_type_object.ht_cached_keys",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "set_object.size",
    "set_object.used",
    "set_object.table",
    "set_object.mask",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "unicode_object.compactunicodeobject_size",
    "gc.size",
    "gc.collecting",
    "gc.frame",
    "gc.generation_stats_size",
    "gc.generation_stats",
    "gen_object.size",
    "gen_object.gi_name",
    "gen_object.gi_iframe",
    "gen_object.gi_frame_state",
    "llist_node.next",
    "llist_node.prev",
    "debugger_support.eval_breaker",
    "debugger_support.remote_debugger_support",
    "debugger_support.remote_debugging_enabled",
    "debugger_support.debugger_pending_call",
    "debugger_support.debugger_script_path",
    "debugger_support.debugger_script_path_size",
];

/// The field order of the struct for `minor` (3.x), and whether that minor
/// version is one osprey knows. Versions newer than the newest known one
/// get the newest schema (their struct usually only grows at the end of
/// groups osprey does not read; validation catches it when not).
pub fn schema(minor: u32) -> Option<(&'static [&'static str], bool)> {
    match minor {
        13 => Some((V313, true)),
        14 => Some((V314, true)),
        15 => Some((V315, true)),
        m if m > NEWEST_KNOWN_MINOR => Some((V315, false)),
        _ => None,
    }
}

/// Why debug offsets were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The struct as read from the target: its words, named by a schema.
#[derive(Clone, Debug)]
pub struct DebugOffsets {
    /// The struct's words (u64 each), in schema order.
    pub words: Vec<u64>,
    /// Names of the words, e.g. "thread_state.thread_id".
    pub schema: &'static [&'static str],
    /// The schema is the one of this very minor version (not a newer
    /// interpreter read with the newest known schema).
    pub known: bool,
}

/// Bytes to read at `_PyRuntime` to have the whole struct of any known version.
pub fn max_len() -> usize {
    8 * V315.len().max(V314.len()).max(V313.len())
}

impl DebugOffsets {
    /// Interprets the bytes at the start of `_PyRuntime`. `None` without the
    /// cookie (3.12 and older, or not a runtime).
    pub fn parse(bytes: &[u8]) -> Result<Option<DebugOffsets>, Invalid> {
        if bytes.len() < 24 || &bytes[0..8] != COOKIE {
            return Ok(None);
        }
        let version = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        let (major, minor) = ((version >> 24) & 0xff, ((version >> 16) & 0xff) as u32);
        if major != 3 {
            return Err(Invalid(format!("debug offsets claim version {version:#x}, not 3.x")));
        }
        let Some((schema, known)) = schema(minor) else {
            return Err(Invalid(format!("debug offsets cookie in a 3.{minor} runtime (only 3.13+ have one)")));
        };
        if bytes.len() < 8 * schema.len() {
            return Err(Invalid("debug offsets truncated".into()));
        }
        let words =
            bytes.chunks_exact(8).take(schema.len()).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        Ok(Some(DebugOffsets { words, schema, known }))
    }

    /// The value of field `name` (a C member path, e.g. `thread_state.next`).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.schema.iter().position(|n| *n == name).map(|i| self.words[i])
    }

    fn must(&self, name: &str) -> Result<u64, Invalid> {
        self.get(name).ok_or_else(|| Invalid(format!("no {name} in the debug offsets")))
    }

    /// `PY_VERSION_HEX` of the interpreter.
    pub fn version_hex(&self) -> u64 {
        self.words[1]
    }

    /// Is the interpreter a free-threaded (no-GIL) build?
    pub fn free_threaded(&self) -> bool {
        self.words[2] != 0
    }

    /// Static checks: flags are flags, sizes are plausible, and each offset
    /// osprey uses lies inside the structure its group describes, aligned
    /// for what is read there.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.words[2] > 1 {
            return Err(Invalid(format!("free_threaded flag is {}", self.words[2])));
        }
        let sized = |group: &str, lo: u64, hi: u64| -> Result<u64, Invalid> {
            let s = self.must(&format!("{group}.size"))?;
            if !(lo..=hi).contains(&s) {
                return Err(Invalid(format!("sizeof {group} = {s}, expected {lo}..={hi}")));
            }
            Ok(s)
        };
        const MIB: u64 = 1 << 20;
        let groups = [
            ("runtime_state", sized("runtime_state", 256, 16 * MIB)?),
            ("interpreter_state", sized("interpreter_state", 256, 16 * MIB)?),
            ("thread_state", sized("thread_state", 64, MIB)?),
            ("interpreter_frame", sized("interpreter_frame", 32, 4096)?),
            ("code_object", sized("code_object", 64, 4096)?),
            ("pyobject", sized("pyobject", 16, 64)?),
            ("bytes_object", sized("bytes_object", 24, 256)?),
            ("unicode_object", sized("unicode_object", 24, 256)?),
            ("gc", sized("gc", 8, MIB)?),
        ];
        // A free-threaded object header holds more than a refcount and a
        // type (its owner thread, two refcounts): the flag must agree.
        let object = groups[5].1;
        if self.free_threaded() != (object > 16) {
            return Err(Invalid(format!(
                "the free_threaded flag ({}) disagrees with sizeof PyObject = {object}",
                self.words[2]
            )));
        }
        // (field, bytes read there, must be 8-aligned)
        let used: &[(&str, u64, bool)] = &[
            ("runtime_state.interpreters_head", 8, true),
            ("interpreter_state.next", 8, true),
            ("interpreter_state.threads_head", 8, true),
            ("interpreter_state.ceval_gil", 8, true),
            ("interpreter_state.gil_runtime_state", 8, true),
            ("interpreter_state.gil_runtime_state_locked", 4, false),
            ("interpreter_state.gil_runtime_state_holder", 8, true),
            ("interpreter_state.gc", 8, false),
            ("thread_state.next", 8, true),
            ("thread_state.interp", 8, true),
            ("thread_state.current_frame", 8, true),
            ("thread_state.thread_id", 8, true),
            ("thread_state.native_thread_id", 4, false),
            ("interpreter_frame.previous", 8, true),
            ("interpreter_frame.executable", 8, true),
            ("interpreter_frame.instr_ptr", 8, true),
            ("interpreter_frame.owner", 1, false),
            ("code_object.filename", 8, true),
            ("code_object.name", 8, true),
            ("code_object.qualname", 8, true),
            ("code_object.linetable", 8, true),
            ("code_object.firstlineno", 4, false),
            ("code_object.co_code_adaptive", 2, false),
            ("pyobject.ob_type", 8, true),
            ("bytes_object.ob_size", 8, true),
            ("bytes_object.ob_sval", 1, false),
            ("unicode_object.state", 4, false),
            ("unicode_object.length", 8, true),
            ("gc.collecting", 4, false),
        ];
        for &(name, width, aligned) in used {
            let v = self.must(name)?;
            let group = name.split('.').next().unwrap_or("");
            let size = groups.iter().find(|g| g.0 == group).map(|g| g.1).unwrap_or(0);
            // co_code_adaptive is the start of a trailing array: it may sit at the very end.
            let end = if name == "code_object.co_code_adaptive" { v } else { v + width };
            if end > size {
                return Err(Invalid(format!("{name} = {v} lies outside sizeof {group} = {size}")));
            }
            if aligned && v % 8 != 0 {
                return Err(Invalid(format!("{name} = {v} is not aligned")));
            }
        }
        let ascii = self.must("unicode_object.asciiobject_size")?;
        if !(16..=128).contains(&ascii) {
            return Err(Invalid(format!("sizeof PyASCIIObject = {ascii}")));
        }
        let gil = self.must("interpreter_state.gil_runtime_state")?;
        let locked = self.must("interpreter_state.gil_runtime_state_locked")?;
        let holder = self.must("interpreter_state.gil_runtime_state_holder")?;
        if locked < gil || holder < gil || locked - gil >= GIL_SIZE || holder - gil >= GIL_SIZE {
            return Err(Invalid(format!("GIL fields ({locked}, {holder}) outside the GIL at {gil}")));
        }
        let ts = ["thread_state.next", "thread_state.interp", "thread_state.current_frame", "thread_state.thread_id"];
        let mut vals: Vec<u64> = ts.iter().map(|n| self.get(n).unwrap_or(0)).collect();
        vals.sort_unstable();
        vals.dedup();
        if vals.len() != ts.len() {
            return Err(Invalid("thread state fields overlap".into()));
        }
        Ok(())
    }

    /// The layout osprey reads the interpreter with. Call [`Self::validate`]
    /// first. `autotsskey` is not published: it comes from machine code.
    pub fn layout(&self, minor: u32, autotsskey: u64) -> Result<Layout, Invalid> {
        let g = |n: &str| self.must(n);
        let gil = g("interpreter_state.gil_runtime_state")?;
        let ascii = g("unicode_object.asciiobject_size")?;
        let compact = self.get("unicode_object.compactunicodeobject_size").unwrap_or(ascii + 16);
        let free_threaded = self.free_threaded();
        let mut l = Layout {
            minor,
            free_threaded,
            runtime_interpreters_head: g("runtime_state.interpreters_head")?,
            runtime_autotsskey: autotsskey,
            runtime_gil: None,
            // A free-threaded build keeps a GIL structure (disabled unless an
            // extension or PYTHON_GIL=1 enables it); it is not read.
            interp_gil_ptr: (!free_threaded).then_some(g("interpreter_state.ceval_gil")?),
            // The GIL fields are published relative to the interpreter (its
            // inline `_gil`); osprey reads them relative to the GIL itself.
            gil_last_holder: g("interpreter_state.gil_runtime_state_holder")? - gil,
            gil_locked: g("interpreter_state.gil_runtime_state_locked")? - gil,
            gil_size: GIL_SIZE,
            interp_next: g("interpreter_state.next")?,
            interp_tstate_head: g("interpreter_state.threads_head")?,
            tstate_next: g("thread_state.next")?,
            tstate_interp: g("thread_state.interp")?,
            tstate_thread_id: g("thread_state.thread_id")?,
            tstate_native_thread_id: Some(g("thread_state.native_thread_id")?),
            tstate_frame: g("thread_state.current_frame")?,
            cframe_current_frame: None,
            frame_code: g("interpreter_frame.executable")?,
            frame_previous: g("interpreter_frame.previous")?,
            frame_instr: g("interpreter_frame.instr_ptr")?,
            frame_owner: Some(g("interpreter_frame.owner")?),
            frame_is_entry: None,
            frame_live: None,
            frame_gen: None,
            code_zombieframe: None,
            tstate_recursion_depth: None,
            tstate_datastack: None,
            frame_size_to_read: 0,
            instr_kind: InstrKind::Pointer,
            code_filename: g("code_object.filename")?,
            code_name: g("code_object.name")?,
            code_qualname: Some(g("code_object.qualname")?),
            code_firstlineno: g("code_object.firstlineno")?,
            code_linetable: g("code_object.linetable")?,
            code_code_adaptive: Some(g("code_object.co_code_adaptive")?),
            code_size_to_read: 0,
            line_table: LineTable::Locations,
            bytes_sval: g("bytes_object.ob_sval")?,
            unicode_state: g("unicode_object.state")?,
            unicode_ascii_size: ascii,
            unicode_compact_size: compact,
            ..Layout::base(minor)
        };
        l.object_type = g("pyobject.ob_type")?;
        l.bytes_size = g("bytes_object.ob_size")?;
        l.unicode_length = g("unicode_object.length")?;
        l.interp_gc_collecting = Some(g("interpreter_state.gc")? + g("gc.collecting")?);
        l.tstate_holds_gil = self.get("thread_state.holds_gil");
        if free_threaded {
            l.objects = l.objects.free_threaded(g("pyobject.size")?);
            if minor >= 14 {
                // Per-thread bytecode: a frame's instruction pointer may
                // point into a copy of its code's bytecode.
                let frame = g("interpreter_frame.size")?;
                let code = g("code_object.size")?;
                let tlbc_index = g("interpreter_frame.tlbc_index")?;
                let tlbc = g("code_object.co_tlbc")?;
                if tlbc_index.saturating_add(4) > frame || tlbc.saturating_add(8) > code || tlbc % 8 != 0 {
                    return Err(Invalid(format!(
                        "per-thread bytecode fields (tlbc_index {tlbc_index}, co_tlbc {tlbc}) outside their structs ({frame}, {code})"
                    )));
                }
                l.frame_tlbc_index = Some(tlbc_index);
                l.code_tlbc = Some(tlbc);
                // `interned` is a whole byte, for atomic access.
                l.unicode_kind_bit = 8;
            }
        }
        self.object_layout(&mut l.objects);
        l.fix_sizes();
        Ok(l)
    }

    /// Takes the object offsets published (3.13+) over `o`'s, each one only
    /// if it lies inside the size its group declares.
    pub fn object_layout(&self, o: &mut ObjectLayout) {
        let inside = |field: &str, width: u64| -> Option<u64> {
            let group = field.split('.').next()?;
            let size = self.get(&format!("{group}.size"))?;
            let v = self.get(field)?;
            (v + width <= size).then_some(v)
        };
        let set = |dst: &mut u64, field: &str, width: u64| {
            if let Some(v) = inside(field, width) {
                *dst = v;
            }
        };
        set(&mut o.interp_modules, "interpreter_state.imports_modules", 8);
        set(&mut o.interp_sysdict, "interpreter_state.sysdict", 8);
        set(&mut o.dict_keys, "dict_object.ma_keys", 8);
        set(&mut o.dict_values, "dict_object.ma_values", 8);
        set(&mut o.type_flags, "type_object.tp_flags", 8);
        set(&mut o.type_basicsize, "type_object.tp_basicsize", 8);
        set(&mut o.type_dictoffset, "type_object.tp_dictoffset", 8);
        set(&mut o.heap_type_cached_keys, "heap_type_object.ht_cached_keys", 8);
        set(&mut o.long_size, "long_object.lv_tag", 8);
        set(&mut o.long_digits, "long_object.ob_digit", 4);
        set(&mut o.tuple_size, "tuple_object.ob_size", 8);
        set(&mut o.tuple_items, "tuple_object.ob_item", 8);
    }
}

/// `sizeof(struct _gil_runtime_state)` on x86-64 Linux, 3.12 to 3.15 (not
/// published; the futex a thread waiting for the GIL sleeps on lies in it).
pub const GIL_SIZE: u64 = 208;

#[cfg(test)]
mod tests {
    use super::*;

    fn words_to_bytes(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A plausible 3.14 struct (values from Debian's 3.14.8).
    fn sample_314() -> Vec<u64> {
        let mut w = vec![0u64; V314.len()];
        let set = |w: &mut Vec<u64>, n: &str, v: u64| w[V314.iter().position(|x| *x == n).unwrap()] = v;
        w[0] = u64::from_le_bytes(*COOKIE);
        set(&mut w, "version", 0x030e08f0);
        for (n, v) in [
            ("runtime_state.size", 2000),
            ("runtime_state.interpreters_head", 800),
            ("interpreter_state.size", 100_000),
            ("interpreter_state.next", 8),
            ("interpreter_state.threads_head", 80),
            ("interpreter_state.gc", 1000),
            ("interpreter_state.ceval_gil", 16),
            ("interpreter_state.gil_runtime_state", 2000),
            ("interpreter_state.gil_runtime_state_locked", 2016),
            ("interpreter_state.gil_runtime_state_holder", 2008),
            ("thread_state.size", 500),
            ("thread_state.next", 8),
            ("thread_state.interp", 16),
            ("thread_state.current_frame", 72),
            ("thread_state.thread_id", 152),
            ("thread_state.native_thread_id", 160),
            ("interpreter_frame.size", 80),
            ("interpreter_frame.previous", 8),
            ("interpreter_frame.executable", 0),
            ("interpreter_frame.instr_ptr", 56),
            ("interpreter_frame.owner", 70),
            ("code_object.size", 240),
            ("code_object.filename", 112),
            ("code_object.name", 120),
            ("code_object.qualname", 128),
            ("code_object.linetable", 136),
            ("code_object.firstlineno", 68),
            ("code_object.co_code_adaptive", 208),
            ("pyobject.size", 16),
            ("pyobject.ob_type", 8),
            ("bytes_object.size", 40),
            ("bytes_object.ob_size", 16),
            ("bytes_object.ob_sval", 32),
            ("unicode_object.size", 72),
            ("unicode_object.state", 32),
            ("unicode_object.length", 16),
            ("unicode_object.asciiobject_size", 40),
            ("gc.size", 400),
            ("gc.collecting", 100),
        ] {
            set(&mut w, n, v);
        }
        w
    }

    #[test]
    fn good_struct_gives_a_layout() {
        let d = DebugOffsets::parse(&words_to_bytes(&sample_314())).unwrap().unwrap();
        assert!(d.known);
        d.validate().unwrap();
        let l = d.layout(14, 2336).unwrap();
        assert_eq!(l.gil_locked, 16);
        assert_eq!(l.gil_last_holder, 8);
        assert_eq!(l.interp_gc_collecting, Some(1100));
        assert_eq!(l.unicode_compact_size, 56);
    }

    #[test]
    fn free_threaded_struct_gives_a_layout_without_a_gil() {
        let mut w = sample_314();
        let set = |w: &mut Vec<u64>, n: &str, v: u64| w[V314.iter().position(|x| *x == n).unwrap()] = v;
        for (n, v) in [("free_threaded", 1), ("pyobject.size", 32), ("pyobject.ob_type", 24)] {
            set(&mut w, n, v);
        }
        let d = DebugOffsets::parse(&words_to_bytes(&w)).unwrap().unwrap();
        assert!(d.free_threaded());
        d.validate().unwrap();
        // 3.14+: the per-thread bytecode fields must lie inside their structs.
        set(&mut w, "code_object.co_tlbc", 232);
        set(&mut w, "interpreter_frame.tlbc_index", 80);
        let d = DebugOffsets::parse(&words_to_bytes(&w)).unwrap().unwrap();
        assert!(d.layout(14, 0).unwrap_err().0.contains("per-thread bytecode"));
        set(&mut w, "interpreter_frame.tlbc_index", 72);
        let d = DebugOffsets::parse(&words_to_bytes(&w)).unwrap().unwrap();
        let l = d.layout(14, 0).unwrap();
        assert!(l.free_threaded && l.interp_gil_ptr.is_none());
        assert_eq!((l.frame_tlbc_index, l.code_tlbc, l.unicode_kind_bit), (Some(72), Some(232), 8));
        assert!(l.frame_size_to_read >= 76 && l.code_size_to_read >= 240);
        assert_eq!((l.object_type, l.objects.module_dict, l.objects.managed_dict), (24, 32, 8));
        // A default build's header with the flag set is refused.
        set(&mut w, "pyobject.size", 16);
        let d = DebugOffsets::parse(&words_to_bytes(&w)).unwrap().unwrap();
        assert!(d.validate().unwrap_err().0.contains("disagrees with sizeof PyObject"));
        let l = DebugOffsets::parse(&words_to_bytes(&sample_314())).unwrap().unwrap().layout(14, 0).unwrap();
        assert!(!l.free_threaded && l.interp_gil_ptr.is_some());
        assert_eq!((l.objects.module_dict, l.objects.managed_dict), (16, 24));
    }

    #[test]
    fn no_cookie_is_not_an_error() {
        assert!(DebugOffsets::parse(&[0u8; 64]).unwrap().is_none());
    }

    #[test]
    fn garbage_is_refused() {
        let cases: &[(&str, u64)] = &[
            ("thread_state.size", 0),
            ("thread_state.next", 1 << 40),
            ("interpreter_frame.previous", 3),
            ("code_object.name", 4096),
            ("pyobject.ob_type", 64),
            ("interpreter_state.gil_runtime_state_locked", 1),
            ("thread_state.interp", 8),
            ("free_threaded", 7),
        ];
        for &(name, v) in cases {
            let mut w = sample_314();
            w[V314.iter().position(|x| *x == name).unwrap()] = v;
            let d = DebugOffsets::parse(&words_to_bytes(&w)).unwrap().unwrap();
            assert!(d.validate().is_err(), "{name} = {v} accepted");
        }
        let mut w = sample_314();
        w[1] = 0x020e08f0;
        assert!(DebugOffsets::parse(&words_to_bytes(&w)).is_err());
        w[1] = 0x030c01f0;
        assert!(DebugOffsets::parse(&words_to_bytes(&w)).is_err(), "a cookie in a 3.12 runtime");
    }

    #[test]
    fn newer_versions_use_the_newest_schema() {
        let (s, known) = schema(16).unwrap();
        assert!(!known);
        assert_eq!(s.len(), V315.len());
        assert!(schema(12).is_none());
    }
}
