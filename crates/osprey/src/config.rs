//! Profiler configuration, from the builder or from `OSPREY_*` variables.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `OSPREY_HZ` | samples per CPU-second per thread (1–10000) | 100 |
//! | `OSPREY_PERIOD` | seconds between profile files (0.1–86400) | 60 |
//! | `OSPREY_OUT` | output directory | `./profiles` |
//! | `OSPREY_MAX_DEPTH` | frames kept per stack (1–256) | 128 |
//! | `OSPREY_THREADS` | thread records pre-allocated | 256 |
//! | `OSPREY_THREADS_GROW` | `0` forbids growing the pool | 1 |
//! | `OSPREY_SCAN_MS` | discovery scan interval, ms (1–1000) | 10 |
//! | `OSPREY_MEMORY` | call trace storage budget, bytes (`K`/`M` suffix) | 8M |
//! | `OSPREY_SAMPLE_SIGNAL` / `OSPREY_PRIME_SIGNAL` | real-time signal numbers to use | first free from SIGRTMIN+6 / +7 |
//! | `OSPREY_FORK` | `continue` or `stop` profiling in a forked child | continue |
//! | `OSPREY_CHILDREN` | `1`: programs the target execs are profiled too | 0 |
//! | `OSPREY_LINES` | `1`: file, line and inlined frames from DWARF (costs memory at each flush) | 0 |
//! | `OSPREY_VERBOSE` | `1`: the preloaded agent says on stderr where it wrote the last profile | 0 |

use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Config {
    pub hz: u32,
    pub period: Duration,
    pub out_dir: PathBuf,
    pub max_depth: usize,
    pub threads: usize,
    pub threads_grow: bool,
    pub scan_interval: Duration,
    pub drain_interval: Duration,
    pub memory_budget: usize,
    pub sample_signal: Option<i32>,
    pub prime_signal: Option<i32>,
    pub continue_after_fork: bool,
    /// Symbolize with DWARF (file, line, inlined frames); see `export::ProfileData::lines`.
    pub lines: bool,
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
        }
    }
}

impl Config {
    /// Reads `OSPREY_*` variables over the defaults. Errors name the variable.
    pub fn from_env() -> Result<Config, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("OSPREY_HZ") {
            c.hz = parse_range("OSPREY_HZ", &v, 1.0, 10_000.0)? as u32;
        }
        if let Some(v) = get("OSPREY_PERIOD") {
            c.period = Duration::from_secs_f64(parse_range("OSPREY_PERIOD", &v, 0.1, 86_400.0)?);
        }
        if let Some(v) = get("OSPREY_OUT") {
            if v.is_empty() {
                return Err("OSPREY_OUT is empty".into());
            }
            c.out_dir = PathBuf::from(v);
        }
        if let Some(v) = get("OSPREY_MAX_DEPTH") {
            c.max_depth = parse_range("OSPREY_MAX_DEPTH", &v, 1.0, 256.0)? as usize;
        }
        if let Some(v) = get("OSPREY_THREADS") {
            c.threads = parse_range("OSPREY_THREADS", &v, 1.0, 1_000_000.0)? as usize;
        }
        if let Some(v) = get("OSPREY_THREADS_GROW") {
            c.threads_grow = parse_bool("OSPREY_THREADS_GROW", &v)?;
        }
        if let Some(v) = get("OSPREY_SCAN_MS") {
            c.scan_interval = Duration::from_millis(parse_range("OSPREY_SCAN_MS", &v, 1.0, 1000.0)? as u64);
        }
        if let Some(v) = get("OSPREY_MEMORY") {
            c.memory_budget = parse_bytes("OSPREY_MEMORY", &v)?;
        }
        for (key, slot) in [("OSPREY_SAMPLE_SIGNAL", &mut c.sample_signal), ("OSPREY_PRIME_SIGNAL", &mut c.prime_signal)] {
            if let Some(v) = get(key) {
                let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
                *slot = Some(parse_range(key, &v, lo as f64, hi as f64)? as i32);
            }
        }
        if let Some(v) = get("OSPREY_FORK") {
            c.continue_after_fork = match v.as_str() {
                "continue" => true,
                "stop" => false,
                _ => return Err(format!("OSPREY_FORK must be `continue` or `stop`, not `{v}`")),
            };
        }
        if let Some(v) = get("OSPREY_LINES") {
            c.lines = parse_bool("OSPREY_LINES", &v)?;
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks ranges and that the two signals differ.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=10_000).contains(&self.hz) {
            return Err(format!("sampling rate {} Hz is out of range (1-10000)", self.hz));
        }
        if self.period < Duration::from_millis(100) {
            return Err("period must be at least 0.1 s".into());
        }
        if !(1..=crate::handler::MAX_FRAMES).contains(&self.max_depth) {
            return Err(format!("max depth must be 1-{}", crate::handler::MAX_FRAMES));
        }
        if self.memory_budget < 64 << 10 {
            return Err("storage memory budget must be at least 64K".into());
        }
        if self.sample_signal.is_some() && self.sample_signal == self.prime_signal {
            return Err("sampling and priming signals must differ".into());
        }
        Ok(())
    }

    /// CPU nanoseconds between samples.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.hz as u64
    }
}

fn parse_range(key: &str, v: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let x: f64 = v.trim().parse().map_err(|_| format!("{key}=`{v}` is not a number"))?;
    if !(lo..=hi).contains(&x) {
        return Err(format!("{key}={v} is out of range ({lo}-{hi})"));
    }
    Ok(x)
}

fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(format!("{key} must be 0 or 1, not `{v}`")),
    }
}

fn parse_bytes(key: &str, v: &str) -> Result<usize, String> {
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
        .ok_or_else(|| format!("{key}=`{v}` is not a size (e.g. 8M)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let m: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn reads_and_checks_variables() {
        let c = env(&[("OSPREY_HZ", "1000"), ("OSPREY_PERIOD", "2.5"), ("OSPREY_MEMORY", "4M")]).unwrap();
        assert_eq!((c.hz, c.period, c.memory_budget), (1000, Duration::from_millis(2500), 4 << 20));
        assert!(env(&[("OSPREY_HZ", "0")]).unwrap_err().contains("OSPREY_HZ"));
        assert!(env(&[("OSPREY_HZ", "fast")]).unwrap_err().contains("not a number"));
        assert!(env(&[("OSPREY_FORK", "maybe")]).is_err());
    }
}
