//! pprof wire messages (package `perftools.profiles`), written by hand with
//! `prost` derive so no `protoc` or build script is needed.
//!
//! Field numbers follow pprof's `profile.proto`. Every `int64` that names a
//! string is an index into [`Profile::string_table`], whose entry 0 is `""`.
//! Ids (`Mapping::id`, `Location::id`, `Function::id`) are nonzero; 0 means
//! "none" where a field refers to one.

/// A whole profile (`perftools.profiles.Profile`), the top-level message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// Type and unit of each value of a sample; every [`Sample::value`] has one
    /// entry per element, in this order.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// `mapping[0]` is the main binary.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Locations referenced by [`Sample::location_id`].
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions referenced by [`Line::function_id`].
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile, referred to by index; entry 0 is `""`.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Index into the string table of a regex: frames whose function name fully
    /// matches it are dropped from samples, with the frames they call; 0 = none.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Index into the string table of a regex: frames whose function name fully
    /// matches it are kept even if they match `drop_frames`; 0 = none.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Wall-clock start of the profile, ns since the Unix epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Length of the profiled period, ns.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// Type and unit of `period`, e.g. ("cpu", "nanoseconds").
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Number of `period_type` units between two samples.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Indexes into the string table of free-form comments.
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// 0 (unset): consumers use the last sample type.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// Type and unit of a measured value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// Index into the string table of the value's type, e.g. `"cpu"`.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// Index into the string table of the value's unit, e.g. `"nanoseconds"`.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack with its measured values and labels.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One per `Profile::sample_type`.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels attached to the sample.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// Exactly one of `str` (string index) and `num` is meaningful.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// Index into the string table of the label's key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// Index into the string table of the string value; 0 for a numeric label.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value, meaningful when `str` is 0.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// Index into the string table of the unit of `num` (e.g. `"bytes"`); 0 = none.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A range of the profiled process's address space mapped from a file (or
/// pseudo file such as `[vdso]`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Unique nonzero id, referenced by [`Location::mapping_id`].
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// First address of the mapped range.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// Exclusive end of the mapped range.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// Offset in the file of the byte mapped at `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// Index into the string table of the mapped file's path (or pseudo name).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Hex of the GNU build id note, or 0 when unknown.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Every location in this mapping has function names.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Every location in this mapping has source file names.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Every location in this mapping has line numbers.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Every location in this mapping has its inlined functions resolved.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A place in the program: a code address and/or the functions and lines it
/// stands for.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique nonzero id, referenced by [`Sample::location_id`].
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Id of the [`Mapping`] containing `address`; 0 = none (no address, or
    /// outside every known mapping).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Instruction address in the profiled process (a non-leaf one is a return
    /// address); 0 when there is none, e.g. an interpreted frame.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost (inlined) function first, the physical caller last.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Several functions share this address (e.g. identical code folding by
    /// the linker) and `line` shows only one of them.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// One function of a [`Location`] and the source line in it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// Id of the [`Function`].
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Source line number; 0 = unknown.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Source column number; 0 = unknown.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function of the profiled program.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Unique nonzero id, referenced by [`Line::function_id`].
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Index into the string table of the function's human-readable (demangled) name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Index into the string table of the function's name as the system knows
    /// it (e.g. mangled).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Index into the string table of the function's source file; `""` when unknown.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// Line where the function starts in `filename`; 0 = unknown.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

impl Profile {
    /// The numeric value of sample `s`'s label `key`, if it has one.
    pub fn label_num(&self, s: &Sample, key: &str) -> Option<i64> {
        s.label.iter().find(|l| l.str == 0 && self.string(l.key) == key).map(|l| l.num)
    }

    /// The string value of sample `s`'s label `key`, if it has one.
    pub fn label_str(&self, s: &Sample, key: &str) -> Option<&str> {
        s.label.iter().find(|l| l.str != 0 && self.string(l.key) == key).map(|l| self.string(l.str))
    }

    /// Index of the sample type named `name` (e.g. `"cpu"`).
    pub fn sample_type_index(&self, name: &str) -> Option<usize> {
        self.sample_type.iter().position(|t| self.string(t.r#type) == name)
    }

    /// Adds comment `c` unless the profile has it already.
    pub fn add_comment(&mut self, c: &str) {
        if !self.comment.iter().any(|&i| self.string(i) == c) {
            self.string_table.push(c.to_string());
            self.comment.push(self.string_table.len() as i64 - 1);
        }
    }

    /// The string at index `i`, or `""` when out of range.
    pub fn string(&self, i: i64) -> &str {
        usize::try_from(i).ok().and_then(|i| self.string_table.get(i)).map_or("", |s| s.as_str())
    }
}
