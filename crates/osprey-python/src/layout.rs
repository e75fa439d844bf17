//! Per-version offsets of the CPython structures osprey reads (x86-64,
//! release builds). Numbers were computed with `offsetof` against each
//! version's installed headers; `tests/layout_headers.rs` recomputes them
//! with a C compiler and compares. 3.13 publishes `_Py_DebugOffsets` at the
//! start of `_PyRuntime`: when present, those values override the table.

use crate::process::{rd_u64, Mem};

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
    Lnotab,       // < 3.10: co_lnotab
    Linetable310, // 3.10: co_linetable (sdelta, ldelta) pairs
    Locations,    // 3.11+: location table
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub minor: u32,
    pub runtime_interpreters_head: u64,
    pub runtime_autotsskey: u64,
    /// Offset of the `_gil_runtime_state` in `_PyRuntime` (3.8–3.11).
    pub runtime_gil: Option<u64>,
    /// Offset of the `struct _gil_runtime_state *` in the interpreter (3.12+).
    pub interp_gil_ptr: Option<u64>,
    pub gil_last_holder: u64,
    pub gil_locked: u64,
    pub gil_size: u64,
    pub interp_next: u64,
    pub interp_tstate_head: u64,
    pub tstate_next: u64,
    pub tstate_interp: u64,
    pub tstate_thread_id: u64,
    pub tstate_native_thread_id: Option<u64>,
    /// `frame` (3.8–3.10), `cframe` (3.11–3.12), `current_frame` (3.13).
    pub tstate_frame: u64,
    /// `_PyCFrame.current_frame` (3.11–3.12): tstate_frame is a pointer to a cframe.
    pub cframe_current_frame: Option<u64>,
    pub frame_code: u64,
    pub frame_previous: u64,
    pub frame_instr: u64,
    pub frame_owner: Option<u64>,
    pub frame_size_to_read: usize,
    pub instr_kind: InstrKind,
    pub code_filename: u64,
    pub code_name: u64,
    pub code_qualname: Option<u64>,
    pub code_firstlineno: u64,
    pub code_linetable: u64,
    pub code_code_adaptive: Option<u64>,
    pub code_size_to_read: usize,
    pub line_table: LineTable,
    pub bytes_sval: u64,
    pub unicode_state: u64,
    pub unicode_ascii_size: u64,
    pub unicode_compact_size: u64,
}

/// Owner value of a frame that belongs to the C stack (3.12+ shim frames).
pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

impl Layout {
    pub fn for_version(major: u32, minor: u32) -> Option<Layout> {
        if major != 3 {
            return None;
        }
        let old_unicode = minor < 12;
        let mut l = Layout {
            minor,
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
            frame_size_to_read: 0,
            instr_kind: InstrKind::Pointer,
            code_filename: 0,
            code_name: 0,
            code_qualname: None,
            code_firstlineno: 0,
            code_linetable: 0,
            code_code_adaptive: None,
            code_size_to_read: 0,
            line_table: LineTable::Locations,
            bytes_sval: 32,
            unicode_state: 32,
            unicode_ascii_size: if old_unicode { 48 } else { 40 },
            unicode_compact_size: if old_unicode { 72 } else { 56 },
        };
        match minor {
            8..=10 => {
                l.runtime_interpreters_head = 32;
                (l.runtime_autotsskey, l.runtime_gil) = if minor == 8 { (1392, Some(1152)) } else { (584, Some(352)) };
                l.tstate_thread_id = 176;
                l.tstate_frame = 24;
                l.frame_code = 32;
                l.frame_previous = 24;
                l.frame_instr = if minor == 10 { 96 } else { 104 };
                l.instr_kind = if minor == 10 { InstrKind::LastiUnits } else { InstrKind::LastiBytes };
                l.code_filename = 104;
                l.code_name = 112;
                l.code_firstlineno = 40;
                l.code_linetable = 120;
                l.line_table = if minor == 10 { LineTable::Linetable310 } else { LineTable::Lnotab };
            }
            11 => {
                l.runtime_interpreters_head = 40;
                l.runtime_autotsskey = 592;
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
            13 => {
                l.runtime_interpreters_head = 632;
                l.runtime_autotsskey = 2160;
                l.interp_gil_ptr = Some(16);
                l.interp_next = 7264;
                l.interp_tstate_head = 7344;
                l.tstate_thread_id = 152;
                l.tstate_native_thread_id = Some(160);
                l.tstate_frame = 72;
                l.frame_code = 0;
                l.frame_previous = 8;
                l.frame_instr = 56;
                l.frame_owner = Some(70);
                l.code_filename = 112;
                l.code_name = 120;
                l.code_qualname = Some(128);
                l.code_code_adaptive = Some(200);
                l.code_firstlineno = 68;
                l.code_linetable = 136;
            }
            _ => return None,
        }
        l.fix_sizes();
        Some(l)
    }

    fn fix_sizes(&mut self) {
        let mut f = self.frame_code.max(self.frame_previous).max(self.frame_instr) + 8;
        if let Some(o) = self.frame_owner {
            f = f.max(o + 1);
        }
        self.frame_size_to_read = f as usize;
        let mut c = self.code_filename.max(self.code_name).max(self.code_firstlineno).max(self.code_linetable) + 8;
        if let Some(q) = self.code_qualname {
            c = c.max(q + 8);
        }
        self.code_size_to_read = c as usize;
    }

    /// Applies `_Py_DebugOffsets` (3.13+) read from the start of `_PyRuntime`.
    /// Returns whether the cookie was found and the offsets used.
    pub fn apply_debug_offsets(&mut self, mem: &Mem, runtime: u64) -> bool {
        let Ok(b) = mem.read_vec(runtime, 8 * 64) else { return false };
        if &b[0..8] != b"xdebugpy" {
            return false;
        }
        let q = |i: usize| rd_u64(&b, 8 * i);
        // Index of each field in the struct as u64 words (3.13 layout):
        // 0 cookie, 1 version, 2 free_threaded,
        // runtime_state: 3 size, 4 finalizing, 5 interpreters_head,
        // interpreter_state: 6 size, 7 id, 8 next, 9 threads_head, 10 gc,
        //   11 imports_modules, 12 sysdict, 13 builtins, 14 ceval_gil,
        //   15 gil_runtime_state, 16 gil_enabled, 17 gil_locked, 18 gil_holder,
        // thread_state: 19 size, 20 prev, 21 next, 22 interp, 23 current_frame,
        //   24 thread_id, 25 native_thread_id, 26 datastack_chunk, 27 status,
        // interpreter_frame: 28 size, 29 previous, 30 executable, 31 instr_ptr,
        //   32 localsplus, 33 owner,
        // code_object: 34 size, 35 filename, 36 name, 37 qualname, 38 linetable,
        //   39 firstlineno, 40 argcount, 41 localsplusnames, 42 localspluskinds,
        //   43 co_code_adaptive,
        // pyobject: 44 size, 45 ob_type, type_object: 46..49, tuple 50..52,
        // list 53..55, dict 56..58, float 59..60, long 61..63
        let version = q(1);
        if (version >> 24) != 3 || ((version >> 16) & 0xff) != 13 {
            // Other versions have other layouts of this struct.
            return false;
        }
        self.runtime_interpreters_head = q(5);
        self.interp_next = q(8);
        self.interp_tstate_head = q(9);
        self.interp_gil_ptr = Some(q(14));
        // The GIL fields are published relative to the interpreter (its
        // inline `_gil`); osprey reads them relative to the GIL itself.
        self.gil_locked = q(17).wrapping_sub(q(15));
        self.gil_last_holder = q(18).wrapping_sub(q(15));
        self.tstate_next = q(21);
        self.tstate_interp = q(22);
        self.tstate_frame = q(23);
        self.tstate_thread_id = q(24);
        self.tstate_native_thread_id = Some(q(25));
        self.frame_previous = q(29);
        self.frame_code = q(30);
        self.frame_instr = q(31);
        self.frame_owner = Some(q(33));
        self.code_filename = q(35);
        self.code_name = q(36);
        self.code_qualname = Some(q(37));
        self.code_linetable = q(38);
        self.code_firstlineno = q(39);
        self.code_code_adaptive = Some(q(43));
        // bytes_object and unicode_object follow long_object (64..).
        let b2 = mem.read_vec(runtime + 8 * 64, 8 * 8).unwrap_or_default();
        let q2 = |i: usize| rd_u64(&b2, 8 * i);
        // bytes: 64 size, 65 ob_size, 66 ob_sval; unicode: 67 size, 68 state,
        // 69 length, 70 asciiobject_size
        if b2.len() == 64 {
            let sval = q2(2);
            let state = q2(4);
            let ascii = q2(6);
            if sval < 64 && state < 64 && ascii < 128 {
                self.bytes_sval = sval;
                self.unicode_state = state;
                self.unicode_ascii_size = ascii;
                self.unicode_compact_size = ascii + 16;
            }
        }
        self.fix_sizes();
        true
    }
}
