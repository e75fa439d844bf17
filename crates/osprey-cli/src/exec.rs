//! `osprey exec` and `osprey attach`.
//!
//! `exec` starts the command as its child with the agent preloaded and stays
//! its parent (see [`crate::supervise`]): whatever the command execs in its
//! own pid (shims, `env`, shebangs, `sh -c 'exec ..'`) keeps the agent, which
//! profiles native programs from inside and stays off in CPython, where this
//! process samples from outside instead (see [`crate::tree`]). Staying the
//! parent is what makes the Python sampler possible without knowing in
//! advance where a chain of execs ends, and keeps it an ancestor, which
//! `process_vm_readv` and ptrace permissions ask for. With files, the
//! tree's processes (with `--children` every descendant, else, when files
//! are the only destination, the command and what it forks) write into a
//! spool that this loop merges into one file per period (see
//! [`crate::spool`]).

use crate::spool::Spool;
use crate::status::StatusDir;
use crate::{hints, supervise, tree, Failure, Sampling};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub fn exec(s: &Sampling, children: bool, cmd: &[String]) -> Result<u8, Failure> {
    let program = resolve(&cmd[0])?;
    let name =
        if osprey_python::is_cpython_executable(&program) { script_name(cmd) } else { base_name(&cmd[0]).to_string() };
    let up = delivery(s, &name)?;
    let out_existed = up.out.as_ref().is_some_and(|o| o.exists());
    let cfg = check_sampling(s, &up)?;
    // With `--children` the tree's native processes are sampled by the
    // kernel rather than by an agent preloaded in each (see `native_tree`);
    // opened here, on the thread that spawns the command. Wall time and
    // allocations need the agent; so does a kernel that refuses the events.
    let native =
        (children && !cfg.wall && !cfg.alloc && std::env::var("OSPREY_TREE_SAMPLER").map_or(true, |v| v != "agent"))
            .then(|| crate::native_tree::open(cfg.hz).ok())
            .flatten();
    if let Some(why) = secure_exec(&program) {
        return Err(Failure::usage(format!(
            "{} is {why}: the loader ignores LD_PRELOAD for it, so it cannot be profiled",
            cmd[0]
        )));
    }
    if native.is_none() && !osprey_python::is_cpython_executable(&program) && is_static_elf(&program) {
        return Err(Failure::usage(format!(
            "{} is statically linked: the agent cannot be preloaded into it (link osprey as a library instead)",
            cmd[0]
        )));
    }
    // The agent's libraries, first in the program's LD_PRELOAD (none for a
    // tree the kernel samples: the user's own preloads only).
    let existing = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty());
    let preload = match native {
        Some(_) => existing,
        None => Some(agent_preload(s, &cfg, existing)?.into()),
    };
    let mut c = std::process::Command::new(&program);
    match preload {
        Some(p) => c.env("LD_PRELOAD", p),
        None => c.env_remove("LD_PRELOAD"),
    };
    c.arg0(&cmd[0])
        .args(&cmd[1..])
        .env("OSPREY_HZ", cfg.hz.to_string())
        .env("OSPREY_PERIOD", cfg.period.as_secs_f64().to_string())
        .env("OSPREY_PYTHON_SAMPLER", watcher_id())
        .env_remove("OSPREY_ROOT_PID");
    // Files and backends for the preloaded agent (OSPREY_OUT only when
    // files are written; see `osprey_upload::UploadConfig::to_env`).
    c.env_remove("OSPREY_OUT");
    // The tree's profiles go through a spool: one file a period, also for
    // the processes the command forks without `--children` (a shim's
    // subshells, a server's workers) when files are the only destination.
    // With a backend and no `--children`, each file stays the period the
    // backend received.
    let spooled = up.out.is_some() && (children || !up.uploads());
    let recovered = if spooled { crate::spool::recover(&cfg.out_dir) } else { Vec::new() };
    let spool = spooled.then(|| Spool::create(&absolute(&cfg.out_dir)).ok()).flatten();
    for (k, v) in up.to_env() {
        match (k.as_str(), &spool) {
            ("OSPREY_OUT", Some(s)) => c.env(k, s.path()),
            ("OSPREY_OUT", None) => c.env(k, absolute(Path::new(&v))),
            _ => c.env(k, v),
        };
    }
    // Parts of a spool need no fsync: this process merges and syncs them.
    match (&spool, up.out.is_some()) {
        (Some(_), true) => c.env("OSPREY_SPOOL", "1"),
        _ => c.env_remove("OSPREY_SPOOL"),
    };
    // The tree's writers end their periods together, and the merges follow.
    let grid = spool.as_ref().map(|_| osprey_pprof::periods::Grid::starting_now(cfg.period));
    match &grid {
        Some(g) => c.env(osprey_pprof::periods::ORIGIN_ENV, g.origin_env()),
        None => c.env_remove(osprey_pprof::periods::ORIGIN_ENV),
    };
    if children {
        c.env("OSPREY_CHILDREN", "1");
    } else {
        c.env_remove("OSPREY_CHILDREN");
    }
    if s.lines {
        c.env("OSPREY_LINES", "1");
    }
    for (k, on) in [("OSPREY_WALL", cfg.wall), ("OSPREY_ALLOC", cfg.alloc)] {
        c.env(k, if on { "1" } else { "0" });
    }
    c.env("OSPREY_WALL_HZ", cfg.wall_hz.to_string())
        .env("OSPREY_WALL_THREADS", cfg.wall_threads.to_string())
        .env("OSPREY_ALLOC_INTERVAL", cfg.alloc_interval.to_string());
    // Every agent of the tree leaves a report of what it sampled and delivered there.
    let status = StatusDir::create();
    match &status {
        Some(d) => c.env("OSPREY_STATUS", d.path()),
        None => c.env_remove("OSPREY_STATUS"),
    };
    let before = hints::profile_files(&cfg.out_dir);
    supervise::block_relayed(&mut c);
    let started = Instant::now();
    let child = c.spawn().map_err(|e| Failure { message: format!("{}: {e}", cmd[0]), code: 126 })?;
    let pid = child.id() as i32;
    let native = native.map(|t| {
        let periods = grid.unwrap_or_else(|| osprey_pprof::periods::Grid::starting_now(cfg.period));
        let spool = spool.as_ref().map(|sp| sp.path().to_path_buf());
        crate::native_tree::NativeTree::start(t, pid as u32, spool, periods, cfg.hz, s.lines, &up)
    });
    let mut opts = osprey_python::Options { from_start: true, ..python_options(&cfg, &up, None, s) };
    let mut tree_up = up.clone();
    opts.grid = grid;
    if let Some(sp) = &spool {
        opts.out_dir = sp.path().to_path_buf();
        tree_up.out = Some(sp.path().to_path_buf());
    }
    let mut tree = tree::Tree::new(pid, children, opts, tree_up);
    // Scans come every 5 ms while the command's pid changes (a launcher chain
    // execs within milliseconds) and back off while it does not; the
    // command's exit, relayed signals and a CPython image's agent (or its
    // forks) wake the loop at once. A `--children` tree changes all the time
    // (a build), and every CPython in it wakes the loop: scans at a steady
    // interval there, for the images the agent cannot announce.
    let (shortest, longest) = if children { (SCAN_MAX_TREE, SCAN_MAX_TREE) } else { (SCAN_MIN, SCAN_MAX) };
    let mut interval = shortest;
    let mut next_merge = grid.map(|g| Instant::now() + g.until_next_merge());
    let mut spool_errors = Vec::new();
    while !supervise::has_exited(pid) {
        interval = if tree.scan() { shortest } else { (interval * 2).min(longest) };
        if let (Some(sp), Some(_)) = (&spool, next_merge.filter(|&m| Instant::now() >= m)) {
            spool_errors.extend(sp.merge(pid).err());
            next_merge = grid.map(|g| Instant::now() + g.until_next_merge());
        }
        let until_merge = next_merge.map_or(interval, |m| m.saturating_duration_since(Instant::now()));
        supervise::relay(pid, interval.min(until_merge));
    }
    let wall = started.elapsed();
    let cpu = supervise::tree_cpu(pid);
    let ended = supervise::reap(pid);
    let natives = native.map(crate::native_tree::NativeTree::finish).unwrap_or_default();
    let finished = tree.finish();
    spool_errors.extend(spool.as_ref().and_then(|sp| sp.close(pid).err()));
    // The tree's agents report through the spool's journal, others in `status`.
    let mut reports = status.as_ref().map(StatusDir::reports).unwrap_or_default();
    reports.extend(spool.as_ref().map(Spool::reports).unwrap_or_default());
    let uploads = osprey_upload::report::merge_uploads(
        reports
            .iter()
            .flat_map(|r| r.uploads.iter())
            .chain(finished.iter().flat_map(|f| f.uploads.iter()))
            .chain(natives.uploads.iter()),
    );
    let samples = reports.iter().map(|r| r.samples).sum::<u64>()
        + finished.iter().filter_map(|f| f.result.as_ref().ok()).map(|s| s.samples).sum::<u64>()
        + natives.samples;
    if !s.quiet {
        if natives.lost > 0 {
            eprintln!("osprey: {} samples of the tree lost (the kernel's sample buffer was full)", natives.lost);
        }
        for e in &natives.errors {
            eprintln!("osprey: a profile of the tree not written: {e}");
        }
        // Each distinct warning once, with the processes it concerns.
        let mut warnings: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
        for f in &finished {
            match &f.result {
                Ok(summary) => summary.warnings.iter().for_each(|w| warnings.entry(w).or_default().push(f.pid)),
                Err(e) if f.root => eprintln!("osprey: {}: {e}", cmd[0]),
                Err(_) => {}
            }
        }
        for (w, pids) in warnings {
            let pids: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
            eprintln!("osprey: pid {}: {w}", pids.join(", "));
        }
        for f in &recovered {
            eprintln!("osprey: merged the profiles an interrupted run left: {}", f.display());
        }
    }
    // Not silenced by --quiet: the parts stay in the spool for the next run.
    if let Some(e) = spool_errors.first() {
        eprintln!("osprey: cannot merge the tree's profiles in {}: {e}", cfg.out_dir.display());
    }
    let written: Vec<PathBuf> = hints::profile_files(&cfg.out_dir).difference(&before).cloned().collect();
    if written.is_empty() && !out_existed && up.out.is_some() {
        let _ = std::fs::remove_dir(&cfg.out_dir);
    }
    if !s.quiet {
        let run =
            hints::Run { command: &cmd[0], children, wall, cpu, hz: cfg.hz, written, samples, uploads: up.uploads() };
        hints::messages(&run).iter().for_each(|m| eprintln!("{m}"));
    }
    report_uploads(&uploads, s.quiet);
    Ok(supervise::end_like(ended))
}

/// `LD_PRELOAD` for the agent: its library (after the allocators' with
/// `--alloc`: their `malloc` is the one the program's calls find), then
/// the `existing` preloads.
fn agent_preload(s: &Sampling, cfg: &osprey::Config, existing: Option<std::ffi::OsString>) -> Result<String, Failure> {
    let libs = crate::agent_libs::locate(&|line| {
        if !s.quiet {
            eprintln!("{line}");
        }
    })?;
    let mut preload = libs.agent.display().to_string();
    if cfg.alloc {
        let Some(allocators) = libs.alloc else {
            return Err(Failure::from(format!(
                "--alloc: libosprey_alloc.so not found next to {}",
                libs.agent.display()
            )));
        };
        preload = format!("{}:{preload}", allocators.display());
    }
    if let Some(existing) = existing {
        preload = format!("{preload}:{}", existing.to_string_lossy());
    }
    Ok(preload)
}

/// The delivery configuration: flags, then OSPREY_* and ecosystem variables.
pub(crate) fn delivery(s: &Sampling, program: &str) -> Result<osprey_upload::UploadConfig, Failure> {
    let d = &s.delivery;
    let flags = osprey_upload::Flags {
        service: d.service.clone(),
        env: d.env.clone(),
        version: d.version.clone(),
        tags: d.tags.clone(),
        datadog: d.datadog.clone(),
        pyroscope: d.pyroscope.clone(),
        otlp: d.otlp.clone(),
        out: s.out.clone(),
        timeout: d.upload_timeout,
        exit_wait: d.exit_wait,
    };
    osprey_upload::UploadConfig::resolve(&flags, program, &|k| std::env::var(k).ok())
        .map_err(|e| Failure::usage(e.to_string()))
}

fn base_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

pub(crate) fn script_name(args: &[String]) -> String {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "-m" {
            return it.next().cloned().unwrap_or_else(|| "python".into());
        }
        if a == "-c" {
            break;
        }
        if !a.starts_with('-') && !a.is_empty() {
            return base_name(a).trim_end_matches(".py").to_string();
        }
    }
    "python".into()
}

/// Prints [`hints::upload_lines`].
pub(crate) fn report_uploads<'a>(stats: impl IntoIterator<Item = &'a osprey_upload::BackendStats>, quiet: bool) {
    hints::upload_lines(stats, quiet).iter().for_each(|l| eprintln!("{l}"));
}

pub(crate) fn python_options(
    cfg: &osprey::Config,
    up: &osprey_upload::UploadConfig,
    duration: Option<Duration>,
    s: &Sampling,
) -> osprey_python::Options {
    osprey_python::Options {
        hz: cfg.hz,
        period: cfg.period,
        out_dir: cfg.out_dir.clone(),
        duration,
        method: None,
        timeline: up.timeline,
        native: s.native,
        blocking: s.blocking,
        from_start: false,
        grid: None,
    }
}

/// Ctrl-C (SIGINT/SIGTERM) sets the returned flag instead of killing osprey,
/// so the sampler can write its last profile.
pub(crate) fn stop_on_ctrl_c() -> &'static AtomicBool {
    static STOP: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_signal(_: libc::c_int) {
        STOP.store(true, Ordering::SeqCst);
    }
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as usize);
        libc::signal(libc::SIGTERM, on_signal as *const () as usize);
    }
    &STOP
}

/// Validates the sampling options and the output directory before anything runs.
pub(crate) fn check_sampling(s: &Sampling, up: &osprey_upload::UploadConfig) -> Result<osprey::Config, Failure> {
    let period = Duration::try_from_secs_f64(s.period)
        .map_err(|_| Failure::usage(format!("--period: {} is not a duration in seconds", s.period)))?;
    let out_dir = up.out.clone().unwrap_or_else(|| PathBuf::from("profiles"));
    let alloc_interval = parse_size(&s.alloc_interval)
        .ok_or_else(|| Failure::usage(format!("--alloc-interval: `{}` is not a size (e.g. 512K)", s.alloc_interval)))?;
    let cfg = osprey::Config {
        hz: s.hz,
        period,
        out_dir,
        lines: s.lines,
        wall: s.wall,
        wall_hz: s.wall_hz,
        wall_threads: s.wall_threads,
        alloc: s.alloc,
        alloc_interval,
        ..Default::default()
    };
    cfg.validate().map_err(config_failure)?;
    if let Some(out) = &up.out {
        osprey::internals::agent::check_writable(out).map_err(|e| Failure::usage(format!("--out: {e}")))?;
    }
    Ok(cfg)
}

/// Interval of `osprey exec`'s scan of its process tree while it changes.
const SCAN_MIN: Duration = Duration::from_millis(5);
/// ... and when nothing changed for a while, watching the command's pid
/// alone. A CPython image that loads the agent wakes the scan at once
/// (SIGCHLD, see `OSPREY_PYTHON_SAMPLER`); one that does not (its
/// environment cleared) runs at most this long before its sampler attaches.
/// A scan costs about 60 us of CPU here (0.15% of a core at 100 ms).
const SCAN_MAX: Duration = Duration::from_secs(1);
/// The interval with `--children`, changing or not. Found only by a scan:
/// a CPython the agent did not load in (its environment cleared) and one
/// embedding libpython. At 5 ms a build's tree cost `osprey exec` 0.17 ms
/// of CPU per process (docs/benchmarks/2026-12-02-agent-start.md).
const SCAN_MAX_TREE: Duration = Duration::from_millis(100);

/// `PID:STARTTIME` of this process (start time in clock ticks since boot,
/// field 22 of its `stat`): how the agent in a CPython image names the
/// watcher it wakes, so that a reused pid is never signalled.
fn watcher_id() -> String {
    let pid = std::process::id() as i32;
    format!("{pid}:{}", osprey::internals::threads::start_ticks(pid).unwrap_or(0))
}

/// `512K`, `1M`, `4096`: bytes.
fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 1u64 << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// A configuration error as the flag that caused it: `--hz: 0 Hz is out of range (1-10000)`.
fn config_failure(e: osprey::Error) -> Failure {
    match e {
        osprey::Error::Config { field, reason } => {
            let flag = match field {
                "out_dir" => "out".to_string(),
                f => f.replace('_', "-"),
            };
            Failure::usage(format!("--{flag}: {reason}"))
        }
        e => Failure::usage(e.to_string()),
    }
}

/// Finds `name` like a shell does: a path if it has a slash, else in `$PATH`.
fn resolve(name: &str) -> Result<PathBuf, Failure> {
    let not_found = || Failure { message: format!("{name}: command not found"), code: 127 };
    let candidates: Vec<PathBuf> = if name.contains('/') {
        vec![PathBuf::from(name)]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path).map(|d| d.join(name)).collect()
    };
    let mut found_not_exec = None;
    for c in candidates {
        if let Ok(m) = std::fs::metadata(&c) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return Ok(c);
            }
            found_not_exec.get_or_insert(c);
        }
    }
    match found_not_exec {
        Some(c) => Err(Failure { message: format!("{}: permission denied", c.display()), code: 126 }),
        None => Err(not_found()),
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| std::env::current_dir().map(|d| d.join(p)).unwrap_or(p.to_path_buf()))
}

/// `Some("setuid")`/`Some("setgid")` when executing `path` changes the
/// effective user or group (the loader then runs in secure mode and ignores
/// LD_PRELOAD).
fn secure_exec(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    // SAFETY: plain id queries.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if m.mode() & libc::S_ISUID != 0 && m.uid() != euid {
        return Some("setuid");
    }
    if m.mode() & libc::S_ISGID != 0 && m.gid() != egid {
        return Some("setgid");
    }
    None
}

/// An ELF executable without a program interpreter (PT_INTERP): the dynamic
/// loader never runs, so LD_PRELOAD does nothing. Scripts and non-ELF files: false.
fn is_static_elf(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return false };
    let u16_at = |o: usize| bytes.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |o: usize| bytes.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
    // 64-bit little-endian ELF only (the platform osprey runs on).
    if bytes.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    const PT_INTERP: u32 = 3;
    let has_interp = (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        bytes.get(at..at + 4).is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap()) == PT_INTERP)
    });
    !has_interp
}
