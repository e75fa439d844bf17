//! CPython interpreters found at run time, workloads run with them, and
//! CPU slots that keep workloads from sharing the 2 cores.
//!
//! A missing interpreter fails the test unless
//! `OSPREY_SKIP_MISSING_PYTHON=1` (then the helpers answer None: skip).
//! Paths are relative to [`PY_CRATE`], where the scripts and fixtures are.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The osprey-python crate's directory (its tests' scripts and fixtures).
pub const PY_CRATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../osprey-python");

/// The Debian testing root filesystem with CPython 3.13-3.15, built once by
/// `tests/chroot/build-forky.sh` (cached; `OSPREY_FORKY` overrides where).
/// None (skip) if it cannot be built and OSPREY_SKIP_MISSING_PYTHON=1.
pub fn forky() -> Option<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = DIR.get_or_init(|| {
        let dir = PathBuf::from(std::env::var("OSPREY_FORKY").unwrap_or_else(|_| "/var/cache/osprey/forky".into()));
        let script = Path::new(PY_CRATE).join("tests/chroot/build-forky.sh");
        let out = Command::new("bash").arg(&script).arg(&dir).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(dir)
    });
    match r {
        Ok(d) => Some(d.clone()),
        Err(e) if std::env::var("OSPREY_SKIP_MISSING_PYTHON").as_deref() == Ok("1") => {
            eprintln!("skipping: no forky chroot ({e})");
            None
        }
        Err(e) => panic!("building the forky chroot failed: {e} (set OSPREY_SKIP_MISSING_PYTHON=1 to skip)"),
    }
}

/// How to run one interpreter: directly, or inside a chroot (optionally in
/// a new PID namespace too), as containers run it.
#[derive(Clone, Debug)]
pub struct Py {
    /// The interpreter as this process sees it (for headers, detection).
    pub host_exe: PathBuf,
    /// The chroot it runs in, and its path there.
    pub root: Option<PathBuf>,
    /// The interpreter's path as it sees itself (inside its root).
    pub inner_exe: String,
    /// Runs under `unshare --pid --fork --mount-proc`.
    pub pidns: bool,
}

impl Py {
    /// Where `inner` (a path inside the interpreter's root) is from here.
    pub fn host_path(&self, inner: &str) -> PathBuf {
        match &self.root {
            Some(r) => r.join(inner.trim_start_matches('/')),
            None => PathBuf::from(inner),
        }
    }

    /// A scratch file path as the interpreter sees it, removed (file or
    /// directory) when the test process exits.
    pub fn scratch(&self, tag: &str) -> String {
        let name = format!(
            "osprey-py-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let inner = match &self.root {
            Some(_) => format!("/tmp/{name}"),
            None => std::env::temp_dir().join(name).to_string_lossy().into_owned(),
        };
        crate::tmp::remove_at_exit(&self.host_path(&inner));
        inner
    }

    /// The workload script, as the interpreter sees it (copied into the root).
    pub fn script(&self) -> String {
        self.script_at(&workload_path())
    }

    /// Script `host_script`, as the interpreter sees it (copied into the root).
    pub fn script_at(&self, host_script: &Path) -> String {
        match &self.root {
            None => host_script.to_string_lossy().into_owned(),
            Some(_) => {
                let inner = format!("/tmp/osprey-{}", host_script.file_name().unwrap().to_string_lossy());
                let host = self.host_path(&inner);
                let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let tmp = host.with_extension(format!("{}-{seq}", std::process::id()));
                std::fs::copy(host_script, &tmp).expect("copy the script into the chroot");
                std::fs::rename(&tmp, &host).unwrap();
                inner
            }
        }
    }

    /// The command line that runs this interpreter (then its arguments).
    pub fn argv(&self) -> Vec<String> {
        let exe = self.host_exe.to_string_lossy().into_owned();
        match (&self.root, self.pidns) {
            (None, _) => vec![exe],
            (Some(r), false) => vec!["chroot".into(), r.display().to_string(), self.inner_exe.clone()],
            (Some(r), true) => vec![
                "unshare".into(),
                "--pid".into(),
                "--fork".into(),
                format!("--mount-proc={}", r.join("proc").display()),
                "chroot".into(),
                r.display().to_string(),
                self.inner_exe.clone(),
            ],
        }
    }

    /// A command running this interpreter with `args`.
    pub fn command(&self, args: &[&str]) -> Command {
        let argv = self.argv();
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]).args(args);
        c
    }

    /// Starts `python workload.py args...` and waits for its "ready" line.
    pub fn start(&self, args: &[&str]) -> Workload {
        self.start_script(&workload_path(), args)
    }

    /// Starts `python SCRIPT args...` (`host_script` copied into the root)
    /// and waits for its "ready" line.
    pub fn start_script(&self, host_script: &Path, args: &[&str]) -> Workload {
        self.start_script_env(host_script, args, &[])
    }

    /// [`Py::start_script`] with the variables `env` set.
    pub fn start_script_env(&self, host_script: &Path, args: &[&str], env: &[(&str, &str)]) -> Workload {
        let script = self.script_at(host_script);
        let mut full = vec![script.as_str()];
        full.extend_from_slice(args);
        let mut child = self
            .command(&full)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python");
        let out = child.stdout.take().unwrap();
        let mut line = String::new();
        let mut r = BufReader::new(out);
        r.read_line(&mut line).expect("read ready");
        assert_eq!(line.trim(), "ready", "workload did not start");
        let pid = if self.pidns { python_descendant(child.id() as i32) } else { child.id() as i32 };
        Workload { child, pid, _out: Some(r) }
    }
}

static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The first descendant of `pid` whose executable is a python.
fn python_descendant(pid: i32) -> i32 {
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let exe = std::fs::read_link(format!("/proc/{p}/exe")).unwrap_or_default();
        if p != pid && exe.to_string_lossy().contains("python") {
            return p;
        }
        let kids = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        queue.extend(kids.split_whitespace().filter_map(|k| k.parse::<i32>().ok()));
    }
    panic!("no python under process {pid}");
}

/// The interpreter for `name`: "3.8".."3.13" (pyenv, shared libpython),
/// "debian-3.11" (/usr/bin/python3.11, static), "forky-3.13".."forky-3.15"
/// (Debian testing's static builds in a chroot), "forky-3.14-pidns" (the
/// same in a new PID namespace too), "3.13t" and "3.14t" (free-threaded,
/// optional: see [`free_threaded`]). A missing interpreter fails the test unless
/// OSPREY_SKIP_MISSING_PYTHON=1 (then None: skip).
pub fn python(name: &str) -> Option<Py> {
    if let Some(version @ ("3.13" | "3.14")) = name.strip_suffix('t') {
        let host_exe = free_threaded(version)?;
        return Some(Py { inner_exe: host_exe.to_string_lossy().into_owned(), host_exe, root: None, pidns: false });
    }
    if let Some(rest) = name.strip_prefix("forky-") {
        let (v, pidns) = match rest.strip_suffix("-pidns") {
            Some(v) => (v, true),
            None => (rest, false),
        };
        let root = forky()?;
        let inner_exe = format!("/usr/bin/python{v}");
        let host_exe = root.join(inner_exe.trim_start_matches('/'));
        if !host_exe.exists() {
            panic!("{} missing from the forky chroot", host_exe.display());
        }
        return Some(Py { host_exe, root: Some(root), inner_exe, pidns });
    }
    let host_exe = interpreter(name)?;
    Some(Py { inner_exe: host_exe.to_string_lossy().into_owned(), host_exe, root: None, pidns: false })
}

/// The interpreter for `name`: "3.8".."3.13" (pyenv, shared libpython) or
/// "debian-3.11" (/usr/bin/python3.11, static). A missing interpreter fails
/// the test unless OSPREY_SKIP_MISSING_PYTHON=1 (then None: skip).
pub fn interpreter(name: &str) -> Option<PathBuf> {
    let found = if let Some(v) = name.strip_prefix("debian-") {
        let p = PathBuf::from(format!("/usr/bin/python{v}"));
        p.exists().then_some(p)
    } else {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let root = Path::new(&home).join(".pyenv/versions");
        let prefix = format!("{name}.");
        let mut hits: Vec<PathBuf> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path().join("bin/python3"))
            .filter(|p| p.exists())
            .collect();
        hits.sort();
        hits.pop()
    };
    match found {
        Some(p) => Some(p),
        None if std::env::var("OSPREY_SKIP_MISSING_PYTHON").as_deref() == Ok("1") => {
            eprintln!("skipping: python {name} not found (OSPREY_SKIP_MISSING_PYTHON=1)");
            None
        }
        None => panic!("python {name} not found (set OSPREY_SKIP_MISSING_PYTHON=1 to skip)"),
    }
}

/// The free-threaded CPython `version` ("3.13" or "3.14", `--disable-gil`)
/// that `tests/freethreaded/build.sh {version}t` builds (7-10 minutes;
/// `.ci/run` starts it, cached), at `$OSPREY_PY313T/bin/python3.13t` or
/// `$OSPREY_PY314T/bin/python3.14t` (default `/var/cache/osprey/python{version}t`;
/// see [`crate::paths::cached_build`]).
pub fn free_threaded(version: &str) -> Option<PathBuf> {
    let var = format!("OSPREY_PY{}T", version.replace('.', ""));
    let dir = std::env::var(var).unwrap_or_else(|_| format!("/var/cache/osprey/python{version}t"));
    crate::paths::cached_build(
        Path::new(&dir),
        &format!("bin/python{version}t"),
        &format!("{PY_CRATE}/tests/freethreaded/build.sh {version}t"),
    )
}

/// osprey-python's shared workload script, `tests/py/workload.py`.
pub fn workload_path() -> PathBuf {
    Path::new(PY_CRATE).join("tests/py/workload.py")
}

/// A running workload, killed on drop.
pub struct Workload {
    /// The process started (python, or what runs it in a namespace).
    pub child: Child,
    /// The python process (the child, or its descendant in a PID namespace).
    pub pid: i32,
    _out: Option<BufReader<std::process::ChildStdout>>,
}

impl Workload {
    /// The python process's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if self.pid != self.child.id() as i32 {
            // SAFETY: kill(2) on a pid we started (inside the namespace).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `python workload.py args...` with a host interpreter.
pub fn start(python: &Path, args: &[&str]) -> Workload {
    Py { host_exe: python.to_path_buf(), root: None, inner_exe: python.to_string_lossy().into_owned(), pidns: false }
        .start(args)
}

/// CPU slots for workloads: the machine this runs on may have 2 cores, and
/// each workload keeps about one busy (plus its sampler). Tests take slots
/// before starting a workload so that at most [`SLOTS`] run at once,
/// whatever `--test-threads` is.
pub const SLOTS: usize = 2;
static USED: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

/// Holds `n` slots until dropped.
pub struct Slots(usize);

/// Waits for `n` (<= [`SLOTS`]) free slots. A measurement that must not
/// share the CPUs takes them all.
pub fn slots(n: usize) -> Slots {
    let n = n.min(SLOTS);
    let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
    while *used + n > SLOTS {
        used = FREED.wait(used).unwrap_or_else(|e| e.into_inner());
    }
    *used += n;
    Slots(n)
}

impl Drop for Slots {
    fn drop(&mut self) {
        *USED.lock().unwrap_or_else(|e| e.into_inner()) -= self.0;
        FREED.notify_all();
    }
}

/// Is `pid` running (not gone, not a zombie)?
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string)))
        .is_some_and(|st| st != "Z" && st != "X")
}

/// Every interpreter the per-interpreter tests run on, by [`python`]'s
/// names (the list [`per_interpreter!`] expands to).
pub const INTERPRETERS: [&str; 10] =
    ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "debian-3.11", "forky-3.13", "forky-3.14", "forky-3.15"];

/// One `#[test]` per interpreter, named after it:
/// - `per_interpreter!(f)`: `py38() { f("3.8") }` and so on over
///   [`INTERPRETERS`];
/// - `per_interpreter!(f; forky314_pidns => "forky-3.14-pidns")`: the same
///   plus the tests listed;
/// - `per_interpreter!(only f; py38 => "3.8", ...)`: the tests listed only;
/// - `per_interpreter!(mod { methods_agree => methods, ... })` (then
///   optionally `; extra => "name", ...`): a module per interpreter, each
///   holding `#[test] fn methods_agree() { super::methods(name) }` and so on.
#[macro_export]
macro_rules! per_interpreter {
    (only $f:ident; $($m:ident => $name:expr),* $(,)?) => {
        $(#[test] fn $m() { $f($name) })*
    };
    (@mod $m:ident $name:tt { $($t:ident => $g:ident),* $(,)? }) => {
        mod $m { $(#[test] fn $t() { super::$g($name) })* }
    };
    (mod only $tests:tt; $($m:ident => $name:expr),* $(,)?) => {
        $($crate::per_interpreter!(@mod $m $name $tests);)*
    };
    (mod $tests:tt $(; $($m:ident => $name:expr),* $(,)?)?) => {
        $crate::per_interpreter!(mod only $tests;
            py38 => "3.8", py39 => "3.9", py310 => "3.10", py311 => "3.11", py312 => "3.12", py313 => "3.13",
            debian311 => "debian-3.11", forky313 => "forky-3.13", forky314 => "forky-3.14", forky315 => "forky-3.15",
            $($($m => $name),*)?);
    };
    ($f:ident $(; $($m:ident => $name:expr),* $(,)?)?) => {
        $crate::per_interpreter!(only $f;
            py38 => "3.8", py39 => "3.9", py310 => "3.10", py311 => "3.11", py312 => "3.12", py313 => "3.13",
            debian311 => "debian-3.11", forky313 => "forky-3.13", forky314 => "forky-3.14", forky315 => "forky-3.15",
            $($($m => $name),*)?);
    };
}

/// The `opentelemetry-sdk` release installed for 3.`minor`: the newest
/// that still supports it (1.34 dropped 3.8, 1.42 dropped 3.9).
pub fn otel_sdk_version(minor: u32) -> &'static str {
    match minor {
        ..=8 => "1.33.1",
        9 => "1.41.1",
        _ => "1.45.2",
    }
}

/// A directory holding `opentelemetry-sdk` (PyPI, pinned by
/// [`otel_sdk_version`]) for interpreter `name` (as [`python`] names it),
/// as that interpreter sees it: put it on its `PYTHONPATH`. Installed with
/// pip into `<target>/otel-py/<name>` (`.ci/run` does it beforehand), with
/// the interpreter's own pip, or for a chroot's or one without pip (3.13t)
/// the host's `python3` pip told the version (the packages are pure
/// Python), then copied into the chroot. If it cannot be installed: None (skip) with
/// OSPREY_SKIP_MISSING_PYTHON=1, else the test fails.
pub fn otel_sdk(py: &Py, name: &str) -> Option<String> {
    otel_install(py, name, "", None, &[])
}

/// [`otel_sdk`] with `opentelemetry-instrumentation-wsgi` (0.66b2, the
/// release of SDK 1.45.2: 3.10+), in `<target>/otel-py/<name>-wsgi`.
pub fn otel_sdk_wsgi(py: &Py, name: &str) -> Option<String> {
    otel_install(py, name, "-wsgi", None, &["opentelemetry-instrumentation-wsgi==0.66b2"])
}

/// The packages of [`otel_servers`], pinned (`opentelemetry-sdk` 1.45.1:
/// the instrumentations' release 0.66b1 pins its semantic conventions).
pub const OTEL_SERVERS: [&str; 8] = [
    "opentelemetry-distro==0.66b1",
    "opentelemetry-instrumentation-flask==0.66b1",
    "opentelemetry-instrumentation-fastapi==0.66b1",
    "flask==3.1.3",
    "gunicorn==27.0.1",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "opentelemetry-instrumentation==0.66b1",
];

/// A directory holding real servers under auto-instrumentation for a host
/// interpreter (3.10+): `opentelemetry-instrument` (`opentelemetry-distro`)
/// with the Flask and FastAPI instrumentations, Flask, gunicorn, FastAPI
/// and uvicorn ([`OTEL_SERVERS`]), in `<target>/otel-py/<name>-servers`;
/// their console scripts in its `bin`. See [`otel_sdk`].
pub fn otel_servers(py: &Py, name: &str) -> Option<String> {
    otel_install(py, name, "-servers", Some("1.45.1"), &OTEL_SERVERS)
}

/// Installs the SDK (release `sdk`, else [`otel_sdk_version`]'s) and the
/// packages `extra` (pinned `name==version`) into
/// `<target>/otel-py/<name><suffix>`, see [`otel_sdk`].
fn otel_install(py: &Py, name: &str, suffix: &str, sdk: Option<&str>, extra: &[&str]) -> Option<String> {
    let version = name.trim_start_matches("forky-").trim_start_matches("debian-").trim_end_matches("-pidns");
    let version = version.trim_end_matches('t');
    let minor: u32 = version.strip_prefix("3.").and_then(|m| m.parse().ok()).expect("a 3.x interpreter name");
    let sdk = format!("opentelemetry-sdk=={}", sdk.unwrap_or(otel_sdk_version(minor)));
    let key = format!("{}{suffix}", name.trim_end_matches("-pidns"));
    let dir = crate::paths::target_dir().join("otel-py").join(&key);
    let wanted: Vec<&str> = std::iter::once(sdk.as_str()).chain(extra.iter().copied()).collect();
    // pip's record of each: `name_with_underscores-version.dist-info`.
    let installed = |req: &str| {
        let (n, v) = req.split_once("==").expect("a pinned requirement");
        dir.join(format!("{}-{v}.dist-info", n.replace('-', "_"))).exists()
    };
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !wanted.iter().all(|r| installed(r)) {
        let own = py.root.is_none()
            && Command::new(&py.host_exe).args(["-m", "pip", "--version"]).output().is_ok_and(|o| o.status.success());
        let mut pip = Command::new(if own { py.host_exe.as_os_str() } else { "python3".as_ref() });
        pip.args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--target"]).arg(&dir);
        if !own {
            pip.args(["--python-version", version, "--only-binary=:all:"]);
        }
        let out = pip.args(&wanted).output();
        let ok = out.as_ref().is_ok_and(|o| o.status.success()) && wanted.iter().all(|r| installed(r));
        if !ok {
            let why = match out {
                Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => e.to_string(),
            };
            if std::env::var("OSPREY_SKIP_MISSING_PYTHON").as_deref() == Ok("1") {
                eprintln!("skipping: {wanted:?} not installable for {name}: {why}");
                return None;
            }
            panic!("installing {wanted:?} for {name} into {} failed: {why}", dir.display());
        }
    }
    let Some(root) = &py.root else { return Some(dir.to_string_lossy().into_owned()) };
    let inner = format!("/tmp/osprey-otel-py-{key}-{}", otel_sdk_version(minor));
    let host = py.host_path(&inner);
    if !host.join("opentelemetry").exists() {
        let tmp = py.host_path(&format!("{inner}.{}", std::process::id()));
        let st = Command::new("cp").arg("-r").arg(&dir).arg(&tmp).status().expect("cp");
        assert!(st.success(), "copying {} into {}", dir.display(), root.display());
        if std::fs::rename(&tmp, &host).is_err() {
            // Another test copied it first.
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    Some(inner)
}
