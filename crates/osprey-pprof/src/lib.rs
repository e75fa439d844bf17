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
//! | [`file`](mod@file) | file names, gzip, write-then-rename |
//! | [`journal`] | the append-only parts file of a `--children` tree's spool |
//! | [`read`] | reading pprof files back |
//! | [`check`] | what makes decoded bytes a profile |
//! | [`frames`] | a sample's stack as functions, files, lines |
//! | [`merge`] | several profiles as one (a `--children` tree's period, `report --format pprof`) |
//! | [`periods`] | the period ends a `--children` tree's writers share |
//! | [`summary`] | flat/cum per function, folded stacks |
//! | [`top`] | the top-functions table of a summary |
//!
//! Nothing here is signal-safe: in the agent it runs on the collector thread
//! at flush.

pub mod build_id;
pub mod check;
pub mod deferred;
pub mod encode;
mod error;
pub mod file;
pub mod frames;
pub mod journal;
pub mod maps;
pub mod merge;
pub mod periods;
pub mod pprof;
pub mod read;
pub mod strings;
pub mod summary;
pub mod symbolize;
pub mod top;

pub use error::Error;
pub use read::read_profile;
pub use summary::{summarize, FunctionStat, Summary};

/// One frame of a sample, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// A native instruction address in the profiled process.
    Native {
        /// Instruction address in the address space of `ProfileData::pid`.
        addr: u64,
        /// True for every frame but the leaf: `addr` is a return address and is
        /// symbolized at `addr - 1`, inside the call instruction.
        return_address: bool,
    },
    /// An interpreted function (e.g. Python), already symbolized.
    Function {
        /// Function name.
        name: String,
        /// Source file of the function; empty when unknown.
        file: String,
        /// Line being executed in `file`; 0 when unknown.
        line: i64,
    },
    /// A frame osprey makes up to show where samples went (e.g. `[osprey] dropped: storage full`).
    Synthetic(String),
}

/// Value of a sample [`Label`]: a string or a number, never both.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelValue {
    /// A string value (pprof `Label.str`), e.g. a thread name.
    Str(String),
    /// A numeric value without unit (pprof `Label.num`), e.g. a thread id.
    Num(i64),
}

/// A key/value label attached to a sample (e.g. `"thread id"`, `"thread name"`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    /// Label name.
    pub key: String,
    /// Label value.
    pub value: LabelValue,
}

/// Key of the numeric label holding a sample's wall-clock time in ns since
/// the Unix epoch (a timeline). Datadog reads it under this name; the OTLP
/// exporter turns it into the sample's timestamp. Samples that carry it are
/// only merged with samples of the same instant, so profiles with a
/// timeline hold one sample per stack and moment.
pub const TIMESTAMP_LABEL: &str = "end_timestamp_ns";

/// One sampled stack with its values and labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// The stack, leaf first.
    pub frames: Vec<Frame>,
    /// One value per `ProfileData::sample_types` entry.
    pub values: Vec<i64>,
    /// Labels of the sample, in any order (sorted when encoding). Samples with
    /// the same frames and labels are merged when encoding.
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

/// One profile as collected: unsymbolized samples plus metadata, the input of
/// [`to_pprof`] and [`write_profile`].
#[derive(Clone, Debug, Default)]
pub struct ProfileData {
    /// pid whose address space `Frame::Native` addresses belong to.
    pub pid: i32,
    /// The process's name (its main thread's `comm`) for the `process`
    /// label; read from `/proc/<pid>/comm` at encoding when `None`.
    pub process: Option<String>,
    /// (type, unit), e.g. ("samples","count"), ("cpu","nanoseconds").
    pub sample_types: Vec<(String, String)>,
    /// (type, unit, value) of the sampling period, e.g. ("cpu","nanoseconds", 1_000_000).
    pub period: (String, String, i64),
    /// Wall-clock start of the profile, ns since the Unix epoch (pprof `time_nanos`).
    pub start_realtime_ns: i64,
    /// Length of the profiled period in ns (pprof `duration_nanos`).
    pub duration_ns: i64,
    /// The samples.
    pub samples: Vec<Sample>,
    /// Free-form comments, written to pprof `comment`.
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
pub fn write_profile(dir: &std::path::Path, data: &ProfileData) -> std::io::Result<std::path::PathBuf> {
    write_profile_late(dir, data, Vec::new)
}

/// As [`write_profile`], with the samples of `late` (see [`to_pprof_late`]).
pub fn write_profile_late(
    dir: &std::path::Path,
    data: &ProfileData,
    late: impl FnOnce() -> Vec<Sample>,
) -> std::io::Result<std::path::PathBuf> {
    write_profile_with(dir, data, late, Destination::File)
}

/// Where [`write_profile_with`] puts a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A gzip pprof file of its own in the directory, synced.
    File,
    /// A record appended to the journal of the spool the directory is
    /// (an agent of an `exec --children` tree; see [`journal`]).
    Journal,
}

/// As [`write_profile_late`], to `dest`; returns the file written (the
/// journal for [`Destination::Journal`]).
pub fn write_profile_with(
    dir: &std::path::Path,
    data: &ProfileData,
    late: impl FnOnce() -> Vec<Sample>,
    dest: Destination,
) -> std::io::Result<std::path::PathBuf> {
    if dest == Destination::Journal {
        let profile = to_pprof_part(data, late);
        return journal::append(dir, journal::Kind::Profile, &prost::Message::encode_to_vec(&profile));
    }
    let pending = file::Pending::create(dir)?;
    let profile = to_pprof_late(data, late);
    pending.publish(data.pid, &prost::Message::encode_to_vec(&profile))
}

/// Symbolizes and encodes `data` (what [`write_profile`] writes, before gzip).
pub fn to_pprof(data: &ProfileData) -> pprof::Profile {
    to_pprof_late(data, Vec::new)
}

/// As [`to_pprof`], adding the samples `late` returns once symbolization,
/// the costly step, is done: a profiler's own CPU time measured as late as
/// possible. Their frames should be synthetic or interpreted.
pub fn to_pprof_late(data: &ProfileData, late: impl FnOnce() -> Vec<Sample>) -> pprof::Profile {
    encode_late(data, late, &|_| false)
}

/// As [`to_pprof_late`], for a part of a spool that `osprey exec` merges:
/// the merge names what this process's files hold, once for the whole
/// tree ([`deferred`]); with DWARF lines asked for, everything is named here.
pub fn to_pprof_part(data: &ProfileData, late: impl FnOnce() -> Vec<Sample>) -> pprof::Profile {
    let own = to_pprof as fn(&ProfileData) -> pprof::Profile as usize as u64;
    let defer = |r: &maps::Region| !data.lines && deferred::defers(r, own);
    encode_late(data, late, &defer)
}

/// A spool part of process `data.pid` sampled from outside (`osprey exec`'s
/// kernel-sampled tree), with its map as the sampler recorded it (the
/// process may be gone): every region [`deferred::defers`] takes is left to
/// the merge, with their DWARF lines if `data.lines`; the others (the vDSO,
/// files without build id) stay unnamed.
pub fn to_pprof_part_of(data: &ProfileData, map: &maps::ProcMaps) -> pprof::Profile {
    let unnamed = |addrs: &[(u64, bool)]| vec![symbolize::Resolved::default(); addrs.len()];
    encode::encode_deferring(data, map, &|r| deferred::defers(r, 0), unnamed, Vec::new)
}

/// [`to_pprof_late`], leaving the regions `defer` picks unnamed (see
/// [`deferred`]). When every native address of this process is in a region
/// the loader knows and `defer` picks, the loader's map stands for
/// `/proc/self/maps` (nothing is named here, so nothing more is needed).
fn encode_late(
    data: &ProfileData,
    late: impl FnOnce() -> Vec<Sample>,
    defer: &dyn Fn(&maps::Region) -> bool,
) -> pprof::Profile {
    let unnamed = |addrs: &[(u64, bool)]| vec![symbolize::Resolved::default(); addrs.len()];
    let own = data.pid <= 0 || data.pid as u32 == std::process::id();
    let loaded = own.then(maps::ProcMaps::from_loader).filter(|l| !l.regions.is_empty());
    if let Some(l) = &loaded {
        let mut natives = data.samples.iter().flat_map(|s| &s.frames).filter_map(|f| match *f {
            Frame::Native { addr, .. } => Some(addr),
            _ => None,
        });
        if natives.all(|a| l.find(a).is_some_and(|i| defer(&l.regions[i]))) {
            return encode::encode_deferring(data, l, defer, unnamed, late);
        }
    }
    match maps::ProcMaps::read_with_text(data.pid) {
        Ok((mut maps, text)) => {
            if let Some(l) = &loaded {
                maps.take_build_ids(l);
            }
            let symbolize = |addrs: &[(u64, bool)]| symbolize::symbolize_in(data.pid, addrs, data.lines, Some(&text));
            encode::encode_deferring(data, &maps, defer, symbolize, late)
        }
        Err(_) => encode::encode(data, &maps::ProcMaps::default(), unnamed, late),
    }
}
