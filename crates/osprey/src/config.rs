//! Profiler configuration, from the builder or from `OSPREY_*` variables.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `OSPREY_HZ` | samples per CPU-second per thread (1–10000) | 100 |
//! | `OSPREY_PERIOD` | seconds between profile files (0.1–86400) | 60 |
//! | `OSPREY_OUT` | output directory | `./profiles` |
//! | `OSPREY_STATUS` | directory for the end-of-run report `osprey exec` reads | none |
//! | `OSPREY_SPOOL` | `1`: `OSPREY_OUT` is the spool of a live `osprey exec --children`, which merges the files (written without `fsync`) | 0 |
//! | `OSPREY_PERIOD_ORIGIN` | with `OSPREY_SPOOL`: periods end at this `CLOCK_MONOTONIC` nanosecond plus multiples of the period (the tree's grid) | periods from the agent's start |
//! | `OSPREY_MAX_DEPTH` | frames kept per stack (1–256) | 128 |
//! | `OSPREY_THREADS` | thread records pre-allocated (1-65536) | 256 |
//! | `OSPREY_THREADS_GROW` | `0` forbids growing the pool | 1 |
//! | `OSPREY_SCAN_MS` | discovery scan interval, ms (1–1000) | 10 |
//! | `OSPREY_MEMORY` | call trace storage budget, bytes (`K`/`M`/`G` suffix, 64K-1G) | 8M |
//! | `OSPREY_SAMPLE_SIGNAL` / `OSPREY_PRIME_SIGNAL` | real-time signal numbers to use | first free from SIGRTMIN+6 / +7 |
//! | `OSPREY_SIGNAL` | `N`: sample with real-time signal N, prime with N+1 | (as above) |
//! | `OSPREY_FORK` | `continue` or `stop` profiling in a forked child | continue |
//! | `OSPREY_CHILDREN` | `1`: programs the target execs are profiled too | 0 |
//! | `OSPREY_LINES` | `1`: file, line and inlined frames from DWARF (costs memory at each flush) | 0 |
//! | `OSPREY_VERBOSE` | `1`: the preloaded agent says on stderr where it wrote the last profile | 0 |
//! | `OSPREY_WALL` | `1`: wall-time profile of every thread (`wall/nanoseconds`, `state` label) | 0 |
//! | `OSPREY_WALL_HZ` | wall-clock ticks per second (1–1000) | 20 |
//! | `OSPREY_WALL_THREADS` | threads sampled per wall tick, at most (1–1024) | 16 |
//! | `OSPREY_ALLOC` | `1`: allocation and live-heap profiles (`alloc-samples`, `alloc-space`, `inuse-space`) | 0 |
//! | `OSPREY_ALLOC_INTERVAL` | mean bytes allocated between allocation samples (`K`/`M`/`G`, 1-1G) | 512K |

use crate::error::Error;
use crate::signal::MAX_FRAMES;
use std::path::PathBuf;
use std::time::Duration;

/// Sampling rates accepted, in samples per CPU-second per thread.
pub const HZ_RANGE: (u32, u32) = (1, 10_000);
/// Profile periods accepted, in seconds.
pub const PERIOD_RANGE_S: (f64, f64) = (0.1, 86_400.0);
/// Call trace storage budgets accepted, in bytes.
pub const MEMORY_RANGE: (usize, usize) = (64 << 10, 1 << 30);
/// Most thread records mapped up front (the pool grows past it when allowed).
pub const MAX_THREADS: usize = 65_536;

/// The agent's settings. [`Config::validate`] is the one place their ranges
/// are checked; [`Config::from_env`] reads `OSPREY_*` variables over the defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Samples per CPU-second per thread.
    pub hz: u32,
    /// Time between profiles.
    pub period: Duration,
    /// Directory the profiles are written to.
    pub out_dir: PathBuf,
    /// Frames kept per stack.
    pub max_depth: usize,
    /// Thread records mapped up front.
    pub threads: usize,
    /// Whether the record pool may grow past `threads`.
    pub threads_grow: bool,
    /// Interval of the discovery scan for threads nobody announced.
    pub scan_interval: Duration,
    /// Interval at which the collector drains the per-thread sample rings.
    pub drain_interval: Duration,
    /// Call trace storage budget in bytes.
    pub memory_budget: usize,
    /// Real-time signal for sampling (`None`: the first free one from SIGRTMIN+6).
    pub sample_signal: Option<i32>,
    /// Real-time signal for priming (`None`: the first free one from SIGRTMIN+7).
    pub prime_signal: Option<i32>,
    /// Whether a forked child goes on profiling (into its own files).
    pub continue_after_fork: bool,
    /// Symbolize with DWARF (file, line, inlined frames); see `osprey_pprof::ProfileData::lines`.
    pub lines: bool,
    /// Wall-time profile: every thread, running or blocked, sampled
    /// `wall_hz` times a second (at most `wall_threads` threads a tick).
    pub wall: bool,
    /// Wall-clock ticks per second. The default, 20 (one tick per 50 ms),
    /// costs 0.6% of a core with 10 idle threads and 1.6% with 1000
    /// (release build); 100 costs 2.2% and 3%.
    pub wall_hz: u32,
    /// Threads sampled per wall tick, at most (a rotating subset, weighted).
    pub wall_threads: usize,
    /// Allocation and live-heap profiles (interposed `malloc` family, or the
    /// `osprey::alloc` wrapper in Rust programs).
    pub alloc: bool,
    /// Mean bytes allocated between two allocation samples (Poisson).
    pub alloc_interval: u64,
    /// Delivery to Datadog / Pyroscope / OTLP (and whether files are
    /// written), see `osprey_upload::config`. None: files in `out_dir` only.
    pub upload: Option<osprey_upload::UploadConfig>,
    /// Where the agent leaves its [`osprey_upload::RunReport`] at exit
    /// (`OSPREY_STATUS`, set by `osprey exec`). None: no report.
    pub status_dir: Option<PathBuf>,
    /// `out_dir` is the spool of an `osprey exec --children` that is alive
    /// and merges what is written there into files it syncs itself
    /// (`OSPREY_SPOOL`): the parts are published without `fsync`. A part
    /// is still complete or absent (hard link after the write), and it
    /// survives its writer's SIGKILL in the page cache; only a machine crash
    /// before the merge loses it, with the merge that would have synced it.
    pub spool: bool,
    /// The period ends the writers of a spool share (`OSPREY_PERIOD_ORIGIN`;
    /// see `osprey_pprof::periods`). None: periods run from the agent's start.
    pub period_grid: Option<osprey_pprof::periods::Grid>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hz: 100,
            period: Duration::from_secs(60),
            out_dir: PathBuf::from("profiles"),
            max_depth: 128,
            threads: 256,
            threads_grow: true,
            scan_interval: Duration::from_millis(10),
            drain_interval: Duration::from_millis(100),
            memory_budget: 8 << 20,
            sample_signal: None,
            prime_signal: None,
            continue_after_fork: true,
            lines: false,
            wall: false,
            wall_hz: 20,
            wall_threads: 16,
            alloc: false,
            alloc_interval: 512 << 10,
            upload: None,
            status_dir: None,
            spool: false,
            period_grid: None,
        }
    }
}

/// `OSPREY_*` variable of each field that has one (for error messages).
const ENV: &[(&str, &str)] = &[
    ("hz", "OSPREY_HZ"),
    ("period", "OSPREY_PERIOD"),
    ("out_dir", "OSPREY_OUT"),
    ("max_depth", "OSPREY_MAX_DEPTH"),
    ("threads", "OSPREY_THREADS"),
    ("scan_interval", "OSPREY_SCAN_MS"),
    ("memory_budget", "OSPREY_MEMORY"),
    ("sample_signal", "OSPREY_SAMPLE_SIGNAL"),
    ("prime_signal", "OSPREY_PRIME_SIGNAL"),
    ("wall_hz", "OSPREY_WALL_HZ"),
    ("wall_threads", "OSPREY_WALL_THREADS"),
    ("alloc_interval", "OSPREY_ALLOC_INTERVAL"),
];

impl Config {
    /// Reads `OSPREY_*` variables over the defaults. Errors name the variable.
    pub fn from_env() -> Result<Config, Error> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`Config::from_env`] over any source of variables.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, Error> {
        let mut c = Config::default();
        if let Some(v) = get("OSPREY_HZ") {
            c.hz = parse_num("OSPREY_HZ", &v)?;
        }
        if let Some(v) = get("OSPREY_PERIOD") {
            let s: f64 = parse_num("OSPREY_PERIOD", &v)?;
            c.period = Duration::try_from_secs_f64(s)
                .map_err(|_| Error::config("OSPREY_PERIOD", format!("`{v}` is not a duration in seconds")))?;
        }
        if let Some(v) = get("OSPREY_OUT") {
            c.out_dir = PathBuf::from(v);
        }
        if let Some(v) = get("OSPREY_STATUS").filter(|v| !v.is_empty()) {
            c.status_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = get("OSPREY_SPOOL") {
            c.spool = parse_bool("OSPREY_SPOOL", &v)?;
        }
        if let Some(v) = get(osprey_pprof::periods::ORIGIN_ENV).filter(|_| c.spool) {
            let grid = osprey_pprof::periods::Grid::from_env(&v, c.period);
            let bad =
                || Error::config(osprey_pprof::periods::ORIGIN_ENV, format!("`{v}` is not a number of nanoseconds"));
            c.period_grid = Some(grid.ok_or_else(bad)?);
        }
        if let Some(v) = get("OSPREY_MAX_DEPTH") {
            c.max_depth = parse_num("OSPREY_MAX_DEPTH", &v)?;
        }
        if let Some(v) = get("OSPREY_THREADS") {
            c.threads = parse_num("OSPREY_THREADS", &v)?;
        }
        if let Some(v) = get("OSPREY_THREADS_GROW") {
            c.threads_grow = parse_bool("OSPREY_THREADS_GROW", &v)?;
        }
        if let Some(v) = get("OSPREY_SCAN_MS") {
            c.scan_interval = Duration::from_millis(parse_num("OSPREY_SCAN_MS", &v)?);
        }
        if let Some(v) = get("OSPREY_MEMORY") {
            c.memory_budget = parse_bytes("OSPREY_MEMORY", &v)?;
        }
        if let Some(v) = get("OSPREY_SIGNAL") {
            let n: i32 = parse_num("OSPREY_SIGNAL", &v)?;
            if !(libc::SIGRTMIN()..libc::SIGRTMAX()).contains(&n) {
                let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX() - 1);
                return Err(Error::config("OSPREY_SIGNAL", format!("{n} is not a real-time signal ({lo}-{hi})")));
            }
            (c.sample_signal, c.prime_signal) = (Some(n), Some(n + 1));
        }
        if let Some(v) = get("OSPREY_SAMPLE_SIGNAL") {
            c.sample_signal = Some(parse_num("OSPREY_SAMPLE_SIGNAL", &v)?);
        }
        if let Some(v) = get("OSPREY_PRIME_SIGNAL") {
            c.prime_signal = Some(parse_num("OSPREY_PRIME_SIGNAL", &v)?);
        }
        if let Some(v) = get("OSPREY_FORK") {
            c.continue_after_fork = match v.as_str() {
                "continue" => true,
                "stop" => false,
                _ => return Err(Error::config("OSPREY_FORK", format!("must be `continue` or `stop`, not `{v}`"))),
            };
        }
        if let Some(v) = get("OSPREY_LINES") {
            c.lines = parse_bool("OSPREY_LINES", &v)?;
        }
        if let Some(v) = get("OSPREY_WALL") {
            c.wall = parse_bool("OSPREY_WALL", &v)?;
        }
        if let Some(v) = get("OSPREY_WALL_HZ") {
            c.wall_hz = parse_num("OSPREY_WALL_HZ", &v)?;
        }
        if let Some(v) = get("OSPREY_WALL_THREADS") {
            c.wall_threads = parse_num("OSPREY_WALL_THREADS", &v)?;
        }
        if let Some(v) = get("OSPREY_ALLOC") {
            c.alloc = parse_bool("OSPREY_ALLOC", &v)?;
        }
        if let Some(v) = get("OSPREY_ALLOC_INTERVAL") {
            c.alloc_interval = parse_bytes("OSPREY_ALLOC_INTERVAL", &v)? as u64;
        }
        // Delivery: a backend named (`osprey exec --datadog` ...), or files switched off.
        if ["OSPREY_DATADOG", "OSPREY_PYROSCOPE", "OSPREY_OTLP", "OSPREY_FILES"].iter().any(|k| get(k).is_some()) {
            let exe = std::env::current_exe().ok();
            let program = exe.as_deref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
            let mut up =
                osprey_upload::UploadConfig::resolve(&Default::default(), program.as_deref().unwrap_or(""), &|k| {
                    get(k)
                })
                .map_err(|e| Error::config("delivery", e.to_string()))?;
            up.out_spool = c.spool;
            if let Some(dir) = &up.out {
                c.out_dir = dir.clone();
            }
            c.upload = Some(up);
        }
        c.validate().map_err(|e| match e {
            Error::Config { field, reason } => {
                let var = ENV.iter().find(|(f, _)| *f == field).map_or(field, |(_, v)| v);
                Error::Config { field: var, reason }
            }
            e => e,
        })?;
        Ok(c)
    }

    /// Checks every range, and that the two signals differ. Errors name the field.
    pub fn validate(&self) -> Result<(), Error> {
        let (lo, hi) = HZ_RANGE;
        if !(lo..=hi).contains(&self.hz) {
            return Err(Error::config("hz", format!("{} Hz is out of range ({lo}-{hi})", self.hz)));
        }
        let (lo, hi) = PERIOD_RANGE_S;
        if !(lo..=hi).contains(&self.period.as_secs_f64()) {
            return Err(Error::config("period", format!("{:?} is out of range ({lo}-{hi} s)", self.period)));
        }
        if self.out_dir.as_os_str().is_empty() {
            return Err(Error::config("out_dir", "is empty"));
        }
        if !(1..=MAX_FRAMES).contains(&self.max_depth) {
            return Err(Error::config("max_depth", format!("{} is out of range (1-{MAX_FRAMES})", self.max_depth)));
        }
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(Error::config("threads", format!("{} is out of range (1-{MAX_THREADS})", self.threads)));
        }
        if !(1..=1000).contains(&self.scan_interval.as_millis()) {
            return Err(Error::config(
                "scan_interval",
                format!("{:?} is out of range (1-1000 ms)", self.scan_interval),
            ));
        }
        let (lo, hi) = MEMORY_RANGE;
        if !(lo..=hi).contains(&self.memory_budget) {
            return Err(Error::config(
                "memory_budget",
                format!("{} bytes is out of range (64K-1G)", self.memory_budget),
            ));
        }
        if !(1..=1000).contains(&self.wall_hz) {
            return Err(Error::config("wall_hz", format!("{} Hz is out of range (1-1000)", self.wall_hz)));
        }
        if !(1..=1024).contains(&self.wall_threads) {
            return Err(Error::config("wall_threads", format!("{} is out of range (1-1024)", self.wall_threads)));
        }
        if !(1..=1 << 30).contains(&self.alloc_interval) {
            return Err(Error::config(
                "alloc_interval",
                format!("{} bytes is out of range (1-1G)", self.alloc_interval),
            ));
        }
        let (rt_lo, rt_hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        for (field, sig) in [("sample_signal", self.sample_signal), ("prime_signal", self.prime_signal)] {
            if let Some(s) = sig.filter(|s| !(rt_lo..=rt_hi).contains(s)) {
                return Err(Error::config(field, format!("{s} is not a real-time signal ({rt_lo}-{rt_hi})")));
            }
        }
        if self.sample_signal.is_some() && self.sample_signal == self.prime_signal {
            return Err(Error::config("prime_signal", "sampling and priming signals must differ"));
        }
        Ok(())
    }

    /// CPU nanoseconds between samples.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.hz as u64
    }
}

fn parse_num<T: std::str::FromStr>(key: &'static str, v: &str) -> Result<T, Error> {
    v.trim().parse().map_err(|_| Error::config(key, format!("`{v}` is not a number")))
}

fn parse_bool(key: &'static str, v: &str) -> Result<bool, Error> {
    match v {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(Error::config(key, format!("must be 0 or 1, not `{v}`"))),
    }
}

fn parse_bytes(key: &'static str, v: &str) -> Result<usize, Error> {
    let v = v.trim();
    let (num, mul) = match v.chars().last() {
        Some('K' | 'k') => (&v[..v.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&v[..v.len() - 1], 1 << 20),
        Some('G' | 'g') => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| Error::config(key, format!("`{v}` is not a size (e.g. 8M)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let m: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned()).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_and_checks_variables() {
        let c = env(&[("OSPREY_HZ", "1000"), ("OSPREY_PERIOD", "2.5"), ("OSPREY_MEMORY", "4M")]).unwrap();
        assert_eq!((c.hz, c.period, c.memory_budget), (1000, Duration::from_millis(2500), 4 << 20));
        assert!(env(&[("OSPREY_HZ", "0")]).unwrap_err().contains("OSPREY_HZ"));
        assert!(env(&[("OSPREY_HZ", "fast")]).unwrap_err().contains("not a number"));
        assert!(env(&[("OSPREY_FORK", "maybe")]).is_err());
        let c = env(&[("OSPREY_SIGNAL", &(libc::SIGRTMIN() + 3).to_string())]).unwrap();
        assert_eq!((c.sample_signal, c.prime_signal), (Some(libc::SIGRTMIN() + 3), Some(libc::SIGRTMIN() + 4)));
        assert!(env(&[("OSPREY_SIGNAL", "10")]).unwrap_err().contains("OSPREY_SIGNAL"));
        let c = env(&[("OSPREY_WALL", "1"), ("OSPREY_ALLOC", "1"), ("OSPREY_ALLOC_INTERVAL", "64K")]).unwrap();
        assert!(c.wall && c.alloc && c.alloc_interval == 64 << 10);
        assert!(env(&[("OSPREY_WALL_THREADS", "0")]).unwrap_err().contains("OSPREY_WALL_THREADS"));
        assert!(env(&[("OSPREY_ALLOC_INTERVAL", "0")]).unwrap_err().contains("OSPREY_ALLOC_INTERVAL"));
    }

    /// `OSPREY_SPOOL` is read once, here, and reaches the delivery's files.
    #[test]
    fn spool_turns_off_the_delivery_files_sync() {
        let files = [("OSPREY_FILES", "1")];
        assert!(!env(&files).unwrap().upload.unwrap().out_spool);
        let c = env(&[files[0], ("OSPREY_SPOOL", "1")]).unwrap();
        assert!(c.spool && c.upload.unwrap().out_spool);
        assert!(env(&[("OSPREY_SPOOL", "sure")]).unwrap_err().contains("OSPREY_SPOOL"));
    }

    #[test]
    fn a_spool_s_agents_take_its_period_grid() {
        use osprey_pprof::periods::{Grid, ORIGIN_ENV};
        let c = env(&[("OSPREY_SPOOL", "1"), ("OSPREY_PERIOD", "2"), (ORIGIN_ENV, "5000")]).unwrap();
        assert_eq!(c.period_grid, Some(Grid::new(5000, Duration::from_secs(2))));
        assert_eq!(env(&[(ORIGIN_ENV, "5000")]).unwrap().period_grid, None, "outside a spool");
        assert!(env(&[("OSPREY_SPOOL", "1"), (ORIGIN_ENV, "now")]).unwrap_err().contains(ORIGIN_ENV));
    }
}
