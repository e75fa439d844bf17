//! Layouts of the general objects the thread-name and span lookups read
//! (`sys.modules`, modules, `dict`s, instance attributes, `int`s, tuples,
//! `contextvars` contexts and their HAMTs), per
//! minor version, x86-64. 3.8–3.12: tables computed with `offsetof`
//! against each version's headers (`tests/layout_and_errors.rs` recomputes
//! them); 3.13+: the table, overridden by what `_Py_DebugOffsets`
//! publishes ([`super::debug_offsets::DebugOffsets::object_layout`]), and
//! for free-threaded builds moved by their bigger object header
//! ([`ObjectLayout::free_threaded`]).

/// How a dict's keys object (`PyDictKeysObject`) describes its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DictKeys {
    /// 3.8–3.10: `dk_size` (8), `dk_nentries` (32), indices at 40 (1, 2, 4
    /// or 8 bytes each by size); every entry is {hash, key, value}.
    Sized,
    /// 3.11+: `dk_log2_size` (8), `dk_log2_index_bytes` (9), `dk_kind` (10),
    /// `dk_nentries` (24), indices at 32; entries {hash, key, value} for
    /// general keys, {key, value} for unicode and split keys.
    Log2,
}

/// Where an instance of a class keeps its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceDict {
    /// 3.8–3.10: a dict pointer at the type's `tp_dictoffset`.
    TypeOffset,
    /// 3.11 (`Py_TPFLAGS_MANAGED_DICT`): values pointer at -32, dict
    /// pointer at -24, before the object.
    ValuesOrDict,
    /// 3.12: one word at -[`ObjectLayout::managed_dict`]: a dict, or (low
    /// bit set) values pointer - 1.
    Tagged,
    /// 3.13+: a dict pointer at -[`ObjectLayout::managed_dict`], else
    /// (`Py_TPFLAGS_INLINE_VALUES`) the values inline after the object, at
    /// `tp_basicsize`.
    Inline,
}

/// How an `int` stores its sign and digit count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongHeader {
    /// Before 3.12: `ob_size` = sign * number of digits.
    SignedSize,
    /// 3.12+: `lv_tag` = digits << 3 | sign (0 positive, 1 zero, 2 negative).
    Tagged,
}

/// `Py_TPFLAGS_INLINE_VALUES` (3.13+).
pub const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
/// `Py_TPFLAGS_MANAGED_DICT` (3.11+).
pub const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;

/// Offsets (bytes) of the object fields the thread-name lookup reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectLayout {
    /// `modules` (3.8–3.11) or `imports.modules` (3.12+): `sys.modules`, in
    /// `PyInterpreterState`.
    pub interp_modules: u64,
    /// `sysdict` (the `sys` module's dict) in `PyInterpreterState`.
    pub interp_sysdict: u64,
    /// `md_dict` in `PyModuleObject` (right after the object header).
    pub module_dict: u64,
    /// `ma_used` (the number of entries) in `PyDictObject`.
    pub dict_used: u64,
    /// `ma_keys` in `PyDictObject`.
    pub dict_keys: u64,
    /// `ma_values` in `PyDictObject` (NULL for a combined table).
    pub dict_values: u64,
    /// The keys object's format.
    pub keys: DictKeys,
    /// Where the values array starts in what a values pointer points to
    /// (0 before 3.13; 8 from 3.13, after `capacity, size, embedded, valid`).
    pub values_array: u64,
    /// `tp_flags` in `PyTypeObject`.
    pub type_flags: u64,
    /// `tp_basicsize` in `PyTypeObject`.
    pub type_basicsize: u64,
    /// `tp_dictoffset` in `PyTypeObject`.
    pub type_dictoffset: u64,
    /// `ht_cached_keys` (the shared keys of instances) in `PyHeapTypeObject`.
    pub heap_type_cached_keys: u64,
    /// Where instances keep their attributes.
    pub instance_dict: InstanceDict,
    /// How far before an instance its managed dict pointer lies (3.12+,
    /// `-MANAGED_DICT_OFFSET`): 24 behind the GC header, 8 in free-threaded
    /// builds, which have none.
    pub managed_dict: u64,
    /// How an `int` stores sign and size.
    pub long_header: LongHeader,
    /// `ob_size` / `lv_tag` in `PyLongObject`.
    pub long_size: u64,
    /// `ob_digit` (30-bit digits in `uint32_t`s) in `PyLongObject`.
    pub long_digits: u64,
    /// `context` (the current `contextvars.Context`, or NULL) in `PyThreadState`.
    pub tstate_context: u64,
    /// `ctx_vars` (the variables' HAMT) in `PyContext`.
    pub context_vars: u64,
    /// `h_root` (the root node) in `PyHamtObject`.
    pub hamt_root: u64,
    /// `h_count` (entries) in `PyHamtObject`.
    pub hamt_count: u64,
    /// `var_name` in `PyContextVar`.
    pub contextvar_name: u64,
    /// `var_hash` (what the HAMT is keyed by) in `PyContextVar`.
    pub contextvar_hash: u64,
    /// `ob_size` in `PyTupleObject`.
    pub tuple_size: u64,
    /// `ob_item` in `PyTupleObject` (3.14+: after the cached `ob_hash`).
    pub tuple_items: u64,
    /// `tp_name` (a C string) in `PyTypeObject`.
    pub type_name: u64,
}

impl ObjectLayout {
    /// The table for 3.`minor` (3.8+; newer than 3.15: the 3.15 values, to
    /// be overridden by the published ones).
    pub fn for_version(minor: u32) -> ObjectLayout {
        let (interp_modules, interp_sysdict, heap_type_cached_keys) = match minor {
            ..=8 => (56, 72, 872),
            9 => (856, 872, 864),
            10 => (856, 872, 872),
            11 => (888, 904, 872),
            12 => (944, 352, 880),
            13 => (7656, 7640, 880),
            14 => (7688, 7672, 880),
            _ => (7592, 7576, 888),
        };
        ObjectLayout {
            interp_modules,
            interp_sysdict,
            module_dict: 16,
            dict_used: 16,
            dict_keys: 32,
            dict_values: 40,
            keys: if minor <= 10 { DictKeys::Sized } else { DictKeys::Log2 },
            values_array: if minor <= 12 { 0 } else { 8 },
            type_flags: 168,
            type_basicsize: 32,
            type_dictoffset: 288,
            heap_type_cached_keys,
            instance_dict: match minor {
                ..=10 => InstanceDict::TypeOffset,
                11 => InstanceDict::ValuesOrDict,
                12 => InstanceDict::Tagged,
                _ => InstanceDict::Inline,
            },
            managed_dict: 24,
            long_header: if minor <= 11 { LongHeader::SignedSize } else { LongHeader::Tagged },
            long_size: 16,
            long_digits: 24,
            tstate_context: match minor {
                ..=10 => 240,
                11 => 224,
                12..=14 => 208,
                _ => 232,
            },
            context_vars: 24,
            hamt_root: 16,
            hamt_count: 32,
            contextvar_name: 16,
            contextvar_hash: 56,
            tuple_size: 16,
            tuple_items: if minor <= 13 { 24 } else { 32 },
            type_name: 24,
        }
    }

    /// This layout for a free-threaded build (3.13+) whose `PyObject` is
    /// `header` bytes (32: `ob_tid`, flags, `ob_ref_local`, `ob_ref_shared`
    /// before `ob_type`) instead of 16: every field after the header moves
    /// by the difference (a module's dict, a type's slots and a heap type's
    /// cached keys; the published fields are taken over this afterwards),
    /// and the managed dict sits right before the object (no GC header).
    /// Keys and values objects have no object header: they do not move.
    pub fn free_threaded(mut self, header: u64) -> ObjectLayout {
        let grow = header.saturating_sub(16);
        for f in [
            &mut self.module_dict,
            &mut self.dict_used,
            &mut self.dict_keys,
            &mut self.dict_values,
            &mut self.type_flags,
            &mut self.type_basicsize,
            &mut self.type_dictoffset,
            &mut self.heap_type_cached_keys,
            &mut self.long_size,
            &mut self.long_digits,
            &mut self.context_vars,
            &mut self.hamt_root,
            &mut self.hamt_count,
            &mut self.contextvar_name,
            &mut self.tuple_size,
            &mut self.tuple_items,
            &mut self.type_name,
        ] {
            *f += grow;
        }
        // No `var_cached*` fields without a GIL: the hash follows the name
        // and the default.
        self.contextvar_hash = self.contextvar_name + 16;
        self.managed_dict = 8;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_differ_where_cpython_changed() {
        assert_eq!(ObjectLayout::for_version(10).keys, DictKeys::Sized);
        assert_eq!(ObjectLayout::for_version(11).keys, DictKeys::Log2);
        assert_eq!(ObjectLayout::for_version(12).long_header, LongHeader::Tagged);
        assert_eq!(ObjectLayout::for_version(13).values_array, 8);
        assert_eq!(ObjectLayout::for_version(16), ObjectLayout::for_version(15));
    }

    #[test]
    fn free_threaded_fields_move_past_the_bigger_header() {
        let ft = ObjectLayout::for_version(13).free_threaded(32);
        // 3.13t's headers: PyModuleObject.md_dict, PyTypeObject.tp_flags,
        // tp_basicsize, tp_dictoffset, PyHeapTypeObject.ht_cached_keys.
        assert_eq!((ft.module_dict, ft.type_flags, ft.type_basicsize), (32, 184, 48));
        assert_eq!((ft.type_dictoffset, ft.heap_type_cached_keys, ft.managed_dict), (304, 896, 8));
        assert_eq!((ft.keys, ft.values_array), (DictKeys::Log2, 8));
        // PyContext.ctx_vars, PyContextVar.var_hash, PyTupleObject.ob_item.
        assert_eq!((ft.context_vars, ft.contextvar_hash, ft.tuple_items, ft.tstate_context), (40, 48, 40, 208));
    }
}
