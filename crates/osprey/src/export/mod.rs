//! Export: profile data model -> pprof (gzip) files, and reading them back.
//! STUB — the data model below is fixed; encoding is being implemented.

/// One frame of a sample, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// A native instruction address in the profiled process. `return_address`
    /// is true for every frame but the leaf (symbolize `addr - 1`).
    Native { addr: u64, return_address: bool },
    /// An interpreted function (e.g. Python), already symbolized.
    Function { name: String, file: String, line: i64 },
    /// A frame osprey makes up to show where samples went (e.g. "[osprey] dropped: storage full").
    Synthetic(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelValue {
    Str(String),
    Num(i64),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    pub key: String,
    pub value: LabelValue,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub frames: Vec<Frame>,
    /// One value per `ProfileData::sample_types` entry.
    pub values: Vec<i64>,
    pub labels: Vec<Label>,
}

#[derive(Clone, Debug, Default)]
pub struct ProfileData {
    /// pid whose address space `Frame::Native` addresses belong to.
    pub pid: i32,
    /// (type, unit), e.g. ("samples","count"), ("cpu","nanoseconds").
    pub sample_types: Vec<(String, String)>,
    /// (type, unit, value) of the sampling period, e.g. ("cpu","nanoseconds", 1_000_000).
    pub period: (String, String, i64),
    pub start_realtime_ns: i64,
    pub duration_ns: i64,
    pub samples: Vec<Sample>,
    pub comments: Vec<String>,
}

/// Symbolizes, encodes and writes `data` as a gzip pprof file in `dir`
/// (created if missing); returns the file's path. STUB.
pub fn write_profile(dir: &std::path::Path, data: &ProfileData) -> std::io::Result<std::path::PathBuf> {
    let _ = (dir, data);
    Err(std::io::Error::other("export not implemented yet"))
}
