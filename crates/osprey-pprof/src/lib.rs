//! osprey's profile model and pprof files: symbolization, encoding, gzip
//! files, reading them back, summaries. Shared by the in-process agent, the
//! out-of-process Python sampler and `osprey report`; links neither.
//!
//! | file | what |
//! |---|---|
//! | [`pprof`] | the pprof protobuf messages (prost derive) |
//! | [`strings`] | deduplicated string table |
//! | [`maps`] | `/proc/<pid>/maps` regions, main binary |
//! | [`build_id`] | GNU build id of an ELF file |
//! | [`symbolize`] | native addresses -> functions, files, lines (blazesym) |
//! | [`encode`] | [`ProfileData`] -> [`pprof::Profile`] |
//! | [`file`] | file names, gzip, write-then-rename |
//! | [`read`] | reading pprof files back |
//! | [`summary`] | flat/cum per function, folded stacks |
//! | [`top`] | the top-functions table of a summary |
//!
//! Nothing here is signal-safe: in the agent it runs on the collector thread
//! at flush.

pub mod build_id;
pub mod encode;
pub mod file;
pub mod maps;
pub mod pprof;
pub mod read;
pub mod strings;
pub mod summary;
pub mod symbolize;
pub mod top;

pub use read::read_profile;
pub use summary::{summarize, FunctionStat, Summary};

/// One frame of a sample, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// A native instruction address in the profiled process. `return_address`
    /// is true for every frame but the leaf (symbolize `addr - 1`).
    Native { addr: u64, return_address: bool },
    /// An interpreted function (e.g. Python), already symbolized.
    Function {
        name: String,
        file: String,
        line: i64,
    },
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

/// Key of the numeric label holding a sample's wall-clock time in ns since
/// the Unix epoch (a timeline). Datadog reads it under this name; the OTLP
/// exporter turns it into the sample's timestamp. Samples that carry it are
/// only merged with samples of the same instant, so profiles with a
/// timeline hold one sample per stack and moment.
pub const TIMESTAMP_LABEL: &str = "end_timestamp_ns";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub frames: Vec<Frame>,
    /// One value per `ProfileData::sample_types` entry.
    pub values: Vec<i64>,
    pub labels: Vec<Label>,
}

impl Sample {
    /// The sample's time ([`TIMESTAMP_LABEL`]), if it has one.
    pub fn timestamp_ns(&self) -> Option<i64> {
        self.labels.iter().find_map(|l| match (&l.value, l.key == TIMESTAMP_LABEL) {
            (LabelValue::Num(n), true) => Some(*n),
            _ => None,
        })
    }

    /// Sets the sample's time ([`TIMESTAMP_LABEL`]).
    pub fn set_timestamp_ns(&mut self, ns: i64) {
        self.labels.retain(|l| l.key != TIMESTAMP_LABEL);
        self.labels.push(Label { key: TIMESTAMP_LABEL.into(), value: LabelValue::Num(ns) });
    }
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
    /// Symbolize native frames with DWARF (file, line, inlined functions).
    /// Off: function names from ELF symbol tables only. DWARF parsing costs
    /// memory in the profiled process at every flush (tens of MiB for a
    /// binary with full debug info); symbol tables cost a few.
    pub lines: bool,
}

/// Symbolizes, encodes and writes `data` as a gzip pprof file in `dir`
/// (created if missing); returns the file's path. The file appears complete
/// or not at all. If `/proc/<pid>/maps` is unreadable (process gone), native
/// frames are written unsymbolized and without mappings.
pub fn write_profile(
    dir: &std::path::Path,
    data: &ProfileData,
) -> std::io::Result<std::path::PathBuf> {
    let profile = to_pprof(data);
    file::publish(dir, data.pid, &prost::Message::encode_to_vec(&profile))
}

/// Symbolizes and encodes `data` (what [`write_profile`] writes, before gzip).
pub fn to_pprof(data: &ProfileData) -> pprof::Profile {
    match maps::ProcMaps::read(data.pid) {
        Ok(maps) => encode::encode(data, &maps, |addrs| symbolize::symbolize(data.pid, addrs, data.lines)),
        Err(_) => encode::encode(data, &maps::ProcMaps::default(), |addrs| {
            vec![Default::default(); addrs.len()]
        }),
    }
}
