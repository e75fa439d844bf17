//! Offsets of the CPython structures osprey reads (x86-64, release
//! builds). 3.8–3.12: per-version tables, computed with `offsetof` against
//! each version's installed headers (`tests/layout_and_errors.rs`
//! recomputes them with a C compiler and compares). 3.13 and later describe
//! themselves: see [`debug_offsets`]. Where thread-local data lives comes
//! from the target's machine code (`decode`).

pub mod debug_offsets;
pub(crate) mod decode;
pub mod objects;

pub use objects::ObjectLayout;

/// How a frame's instruction position is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstrKind {
    /// `int f_lasti` byte offset (3.8, 3.9).
    LastiBytes,
    /// `int f_lasti` index in code units (3.10).
    LastiUnits,
    /// `_Py_CODEUNIT *prev_instr` / `instr_ptr` (3.11+), relative to
    /// `co_code_adaptive`.
    Pointer,
}

/// Line table format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTable {
    /// Before 3.10: `co_lnotab`.
    Lnotab,
    /// 3.10: `co_linetable` (sdelta, ldelta) pairs.
    Linetable310,
    /// 3.11+: the location table.
    Locations,
}

/// Offsets (bytes) of the CPython structure fields osprey reads, and how
/// much of each structure to read, for one minor version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Python minor version (3.`minor`).
    pub minor: u32,
    /// A free-threaded build (PEP 703, `Py_GIL_DISABLED`, 3.13+): a bigger
    /// object header, and no GIL: `runtime_gil` and `interp_gil_ptr` are
    /// None, so nothing holds or waits for one.
    pub free_threaded: bool,
    /// `interpreters.head` in `_PyRuntime`.
    pub runtime_interpreters_head: u64,
    /// The gilstate `autoTSSkey` (a `Py_tss_t`) in `_PyRuntime`.
    pub runtime_autotsskey: u64,
    /// Offset of the `_gil_runtime_state` in `_PyRuntime` (3.8–3.11).
    pub runtime_gil: Option<u64>,
    /// Offset of the `struct _gil_runtime_state *` in the interpreter (3.12+).
    pub interp_gil_ptr: Option<u64>,
    /// `last_holder` in `_gil_runtime_state`.
    pub gil_last_holder: u64,
    /// `locked` in `_gil_runtime_state`.
    pub gil_locked: u64,
    /// Bytes of `_gil_runtime_state` to read.
    pub gil_size: u64,
    /// `next` in `PyInterpreterState`.
    pub interp_next: u64,
    /// `threads.head` (`tstate_head`) in `PyInterpreterState`.
    pub interp_tstate_head: u64,
    /// `next` in `PyThreadState`.
    pub tstate_next: u64,
    /// `interp` in `PyThreadState`.
    pub tstate_interp: u64,
    /// `thread_id` (`pthread_self()`) in `PyThreadState`.
    pub tstate_thread_id: u64,
    /// `native_thread_id` (the OS tid) in `PyThreadState`, where it exists.
    pub tstate_native_thread_id: Option<u64>,
    /// `frame` (3.8–3.10), `cframe` (3.11–3.12), `current_frame` (3.13).
    pub tstate_frame: u64,
    /// `recursion_depth` in `PyThreadState` (3.8-3.10): the calls of the
    /// evaluation function under way, one per frame of a Python stack.
    pub tstate_recursion_depth: Option<u64>,
    /// `datastack_chunk`, followed by `datastack_top`, in `PyThreadState`
    /// (3.11): the frame stack's current chunk, and where its next frame
    /// will be pushed.
    pub tstate_datastack: Option<u64>,
    /// `_PyCFrame.current_frame` (3.11–3.12): tstate_frame is a pointer to a cframe.
    pub cframe_current_frame: Option<u64>,
    /// The code object (`f_code`, `f_executable`) in a frame.
    pub frame_code: u64,
    /// The calling frame (`f_back`, `previous`) in a frame.
    pub frame_previous: u64,
    /// The current instruction (see [`InstrKind`]) in a frame.
    pub frame_instr: u64,
    /// `owner` in `_PyInterpreterFrame` (3.11+).
    pub frame_owner: Option<u64>,
    /// `is_entry` in `_PyInterpreterFrame` (3.11 only: the outermost frame
    /// of a call of the evaluation function).
    pub frame_is_entry: Option<u64>,
    /// The byte of a frame object that says whether it runs (3.8/3.9
    /// `f_executing`, 3.10 `f_state`): a frame that returned keeps its other
    /// fields.
    pub frame_live: Option<u64>,
    /// `f_gen` in a frame object (3.8-3.10): its generator, or 0.
    pub frame_gen: Option<u64>,
    /// `co_zombieframe` in `PyCodeObject` (3.8-3.10): the frame the
    /// interpreter keeps for that code object's next call.
    pub code_zombieframe: Option<u64>,
    /// Bytes of a frame to read (covers the fields above).
    pub frame_size_to_read: usize,
    /// What `frame_instr` holds.
    pub instr_kind: InstrKind,
    /// `co_filename` in `PyCodeObject`.
    pub code_filename: u64,
    /// `co_name` in `PyCodeObject`.
    pub code_name: u64,
    /// `co_qualname` in `PyCodeObject` (3.11+).
    pub code_qualname: Option<u64>,
    /// `co_firstlineno` in `PyCodeObject`.
    pub code_firstlineno: u64,
    /// The line table (`co_lnotab`, `co_linetable`) in `PyCodeObject`.
    pub code_linetable: u64,
    /// `co_code_adaptive` in `PyCodeObject` (3.11+).
    pub code_code_adaptive: Option<u64>,
    /// `tlbc_index` (an `int32_t`) in `_PyInterpreterFrame`, free-threaded
    /// 3.14+: which copy of its code's bytecode the frame runs (0: the
    /// code's own `co_code_adaptive`; else an entry of `co_tlbc`).
    pub frame_tlbc_index: Option<u64>,
    /// `co_tlbc` in `PyCodeObject`, free-threaded 3.14+: a `_PyCodeArray *`,
    /// `{ Py_ssize_t size; char *entries[size]; }`.
    pub code_tlbc: Option<u64>,
    /// Bytes of a code object to read (covers the fields above).
    pub code_size_to_read: usize,
    /// Format of the line table.
    pub line_table: LineTable,
    /// `ob_sval` (the data) in `PyBytesObject`.
    pub bytes_sval: u64,
    /// `state` (kind, compact, ascii bits) in `PyASCIIObject`.
    pub unicode_state: u64,
    /// First bit of the 3-bit `kind` in `state`; `compact` and `ascii`
    /// follow it. 2 (after `interned:2`), or 8 where `interned` is a whole
    /// byte (free-threaded 3.14+).
    pub unicode_kind_bit: u32,
    /// Size of `PyASCIIObject` (where compact ASCII data starts).
    pub unicode_ascii_size: u64,
    /// Size of `PyCompactUnicodeObject` (where other compact data starts).
    pub unicode_compact_size: u64,
    /// `ob_type` in `PyObject` (8; larger in free-threaded builds).
    pub object_type: u64,
    /// `ob_size` in `PyBytesObject`.
    pub bytes_size: u64,
    /// `length` in `PyASCIIObject`.
    pub unicode_length: u64,
    /// `gc.collecting` (an int, non-zero during a collection) relative to the
    /// interpreter (3.9+), or to `_PyRuntime` (3.8).
    pub interp_gc_collecting: Option<u64>,
    /// `gc.collecting` relative to `_PyRuntime` (3.8).
    pub runtime_gc_collecting: Option<u64>,
    /// `holds_gil` (an int) in the thread state (3.15+).
    pub tstate_holds_gil: Option<u64>,
    /// Modules, dicts, instances and ints (the thread-name lookup).
    pub objects: ObjectLayout,
}

/// Lowest owner value of a frame that is not a Python function's: the C
/// stack's shim frames (3.12, 3.13: 3), the interpreter's base frame and
/// the C stack's (3.14+: 3 and 4).
pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Owner value of a generator's or coroutine's frame (3.11+), which lives
/// in its generator object.
pub const FRAME_OWNED_BY_GENERATOR: u8 = 1;

impl Layout {
    /// The opcodes that return from a frame, with their instrumented forms
    /// (`opcode.opmap` of each release; fixed within one). Empty before
    /// 3.11 and for a version not listed.
    pub fn return_opcodes(&self) -> &'static [u8] {
        match self.minor {
            11 => &[83],
            12 => &[83, 121, 242, 247],
            13 => &[36, 103, 239, 240],
            14 => &[35, 246],
            15 => &[33, 245],
            _ => &[],
        }
    }

    /// Values shared by every version (the PyObject header, GIL and string
    /// fields that did not move); version-specific fields are zero.
    pub fn base(minor: u32) -> Layout {
        let old_unicode = minor < 12;
        Layout {
            minor,
            free_threaded: false,
            runtime_interpreters_head: 0,
            runtime_autotsskey: 0,
            runtime_gil: None,
            interp_gil_ptr: None,
            gil_last_holder: 8,
            gil_locked: 16,
            gil_size: 208,
            interp_next: 0,
            interp_tstate_head: 8,
            tstate_next: 8,
            tstate_interp: 16,
            tstate_thread_id: 0,
            tstate_native_thread_id: None,
            tstate_frame: 0,
            cframe_current_frame: None,
            frame_code: 0,
            frame_previous: 0,
            frame_instr: 0,
            frame_owner: None,
            frame_is_entry: None,
            frame_live: None,
            frame_gen: None,
            code_zombieframe: None,
            tstate_recursion_depth: None,
            tstate_datastack: None,
            frame_size_to_read: 0,
            instr_kind: InstrKind::Pointer,
            code_filename: 0,
            code_name: 0,
            code_qualname: None,
            code_firstlineno: 0,
            code_linetable: 0,
            code_code_adaptive: None,
            frame_tlbc_index: None,
            code_tlbc: None,
            code_size_to_read: 0,
            line_table: LineTable::Locations,
            bytes_sval: 32,
            unicode_state: 32,
            unicode_kind_bit: 2,
            unicode_ascii_size: if old_unicode { 48 } else { 40 },
            unicode_compact_size: if old_unicode { 72 } else { 56 },
            object_type: 8,
            bytes_size: 16,
            unicode_length: 16,
            interp_gc_collecting: None,
            runtime_gc_collecting: None,
            tstate_holds_gil: None,
            objects: ObjectLayout::for_version(minor),
        }
    }

    /// The table for 3.8–3.12 (None for other versions: 3.13+ describe
    /// themselves).
    pub fn for_version(major: u32, minor: u32) -> Option<Layout> {
        if major != 3 {
            return None;
        }
        let mut l = Layout::base(minor);
        match minor {
            8..=10 => {
                l.runtime_interpreters_head = 32;
                (l.runtime_autotsskey, l.runtime_gil) = if minor == 8 { (1392, Some(1152)) } else { (584, Some(352)) };
                l.tstate_thread_id = 176;
                l.tstate_frame = 24;
                l.tstate_recursion_depth = Some(32);
                l.frame_code = 32;
                l.frame_previous = 24;
                l.frame_instr = if minor == 10 { 96 } else { 104 };
                l.instr_kind = if minor == 10 { InstrKind::LastiUnits } else { InstrKind::LastiBytes };
                l.code_filename = 104;
                l.code_name = 112;
                l.code_firstlineno = 40;
                l.code_linetable = 120;
                l.line_table = if minor == 10 { LineTable::Linetable310 } else { LineTable::Lnotab };
                l.frame_live = Some(if minor == 10 { 108 } else { 116 });
                l.frame_gen = Some(if minor == 10 { 88 } else { 96 });
                l.code_zombieframe = Some(128);
                if minor == 8 {
                    l.runtime_gc_collecting = Some(544);
                } else {
                    l.interp_gc_collecting = Some(816);
                }
            }
            11 => {
                l.runtime_interpreters_head = 40;
                l.runtime_autotsskey = 592;
                l.interp_gc_collecting = Some(848);
                l.runtime_gil = Some(360);
                l.interp_tstate_head = 16;
                l.tstate_thread_id = 152;
                l.tstate_native_thread_id = Some(160);
                l.tstate_frame = 56;
                l.cframe_current_frame = Some(8);
                l.frame_code = 32;
                l.frame_previous = 48;
                l.frame_instr = 56;
                l.frame_owner = Some(69);
                l.frame_is_entry = Some(68);
                l.tstate_datastack = Some(296);
                l.code_filename = 112;
                l.code_name = 120;
                l.code_qualname = Some(128);
                l.code_code_adaptive = Some(184);
                l.code_firstlineno = 72;
                l.code_linetable = 136;
            }
            12 => {
                l.runtime_interpreters_head = 40;
                l.runtime_autotsskey = 1544;
                l.interp_gc_collecting = Some(312);
                l.interp_gil_ptr = Some(384);
                l.interp_tstate_head = 72;
                l.tstate_thread_id = 136;
                l.tstate_native_thread_id = Some(144);
                l.tstate_frame = 56;
                l.cframe_current_frame = Some(0);
                l.frame_code = 0;
                l.frame_previous = 8;
                l.frame_instr = 56;
                l.frame_owner = Some(70);
                l.code_filename = 112;
                l.code_name = 120;
                l.code_qualname = Some(128);
                l.code_code_adaptive = Some(192);
                l.code_firstlineno = 68;
                l.code_linetable = 136;
            }
            _ => return None,
        }
        l.fix_sizes();
        Some(l)
    }

    /// Sets how much of a frame and of a code object to read at once.
    pub fn fix_sizes(&mut self) {
        let mut f = self.frame_code.max(self.frame_previous).max(self.frame_instr) + 8;
        for o in [self.frame_owner, self.frame_is_entry, self.frame_live].into_iter().flatten() {
            f = f.max(o + 1);
        }
        if let Some(o) = self.frame_gen {
            f = f.max(o + 8);
        }
        if let Some(o) = self.frame_tlbc_index {
            f = f.max(o + 4);
        }
        self.frame_size_to_read = f as usize;
        let mut c = self.code_filename.max(self.code_name).max(self.code_firstlineno).max(self.code_linetable) + 8;
        for o in [self.code_qualname, self.code_tlbc].into_iter().flatten() {
            c = c.max(o + 8);
        }
        c = c.max(self.object_type + 8);
        self.code_size_to_read = c as usize;
    }
}
