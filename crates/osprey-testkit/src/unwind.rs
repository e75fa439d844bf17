//! osprey-unwind's fixtures, shared by its tests and its benchmark: the
//! frameless C library (`tests/c/frameless.c`, built here with gcc), a
//! SIGPROF handler that unwinds the interrupted context from its ucontext
//! (the real case), and symbolization of the captured frames.
//!
//! The handler and its statics are one per test binary: tests that use them
//! hold [`serial`].

use osprey_unwind::scan::Tracker;
use osprey_unwind::symbols::Symbols;
use osprey_unwind::{unwind, ModuleSet, Regs, Shared, StackReader, Walk};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};

pub use crate::run::serial;

/// Builds `tests/c/frameless.c` with `-O2 -fomit-frame-pointer` into `out`
/// (`extra` adds flags, e.g. `-DFL_MAIN`).
pub fn build_c(out: &str, extra: &[&str]) -> PathBuf {
    let src = crate::paths::crate_dir("osprey-unwind").join("tests/c/frameless.c");
    // Where cargo's CARGO_TARGET_TMPDIR points: `<target>/tmp`.
    let tmp = crate::paths::target_dir().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    crate::cc::Cc::new("gcc")
        .flags(["-O2", "-fomit-frame-pointer", "-g"])
        .after(extra)
        .after(["-lz", "-lpthread"])
        .build(&src, &tmp.join(out))
}

/// The frameless library, built once and loaded (never unloaded).
pub struct Lib {
    /// Where it was built.
    pub path: PathBuf,
    /// Its `dlopen` handle.
    pub handle: *mut libc::c_void,
}
// SAFETY: a dlopen handle is usable from any thread.
unsafe impl Sync for Lib {}
// SAFETY: as for Sync: the handle and path may move between threads.
unsafe impl Send for Lib {}

/// The frameless library, built and loaded at the first call.
pub fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = build_c("libframeless.so", &["-shared", "-fPIC"]);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: loading our own test library.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen {path:?}");
        Lib { path, handle }
    })
}

impl Lib {
    /// The address of function `name`, as function pointer type `T`.
    pub fn sym<T: Copy>(&self, name: &str) -> T {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: looking up a symbol in our library.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        assert!(!p.is_null(), "{name}");
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut libc::c_void>());
        // SAFETY: T is the function pointer type of `name`.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

/// `fl_run(depth, callback, arg)`: recurses `depth` frameless frames, then calls back.
pub type RunFn = unsafe extern "C" fn(libc::c_int, Option<extern "C" fn(*mut libc::c_void)>, *mut libc::c_void) -> u64;

static SHARED: OnceLock<Arc<Shared<ModuleSet>>> = OnceLock::new();
static TRACKER: Mutex<Option<Tracker>> = Mutex::new(None);

/// Rescans loaded modules (after `lib()` loaded) and publishes them.
pub fn refresh() -> Arc<Shared<ModuleSet>> {
    refresh_report().0
}

/// As [`refresh`], also telling whether a new set was published.
pub fn refresh_report() -> (Arc<Shared<ModuleSet>>, bool) {
    let mut t = TRACKER.lock().unwrap_or_else(|e| e.into_inner());
    let t = t.get_or_insert_with(|| Tracker::new(Some(osprey_unwind::compile::DEBUG_ROOT.into())));
    let r = t.refresh();
    let _ = SHARED.set(t.shared().clone());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    (t.shared().clone(), r.published)
}

/// The most frames the handler records.
pub const MAX_FRAMES: usize = 256;
static FRAMES: [AtomicU64; MAX_FRAMES] = [const { AtomicU64::new(0) }; MAX_FRAMES];
static LEN: AtomicUsize = AtomicUsize::new(0);
static TRUNCATED: AtomicBool = AtomicBool::new(false);
static DONE: AtomicBool = AtomicBool::new(false);
/// Frames the handler may write (<= MAX_FRAMES), set by the test.
pub static LIMIT: AtomicUsize = AtomicUsize::new(MAX_FRAMES);
/// Top of the target thread's stack, set by the test before signalling.
pub static STACK_HI: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigprof(_sig: libc::c_int, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler's third argument.
    let regs = unsafe { Regs::from_ucontext(uc) };
    // SAFETY: [sp, stack top) of the interrupted thread is mapped.
    let reader = unsafe { StackReader::new(regs.sp, STACK_HI.load(SeqCst)) };
    let mut frames = [0u64; MAX_FRAMES];
    let limit = LIMIT.load(SeqCst).min(MAX_FRAMES);
    let walk = SHARED
        .get()
        .and_then(|s| s.read(|set| unwind(set, regs, |a| reader.read(a), &mut frames[..limit])))
        .unwrap_or(Walk { len: 0, truncated: true });
    for (slot, f) in FRAMES.iter().zip(&frames[..walk.len]) {
        slot.store(*f, SeqCst);
    }
    LEN.store(walk.len, SeqCst);
    TRUNCATED.store(walk.truncated, SeqCst);
    DONE.store(true, SeqCst);
}

/// Installs the SIGPROF handler (with SA_ONSTACK: an alternate stack is used
/// when the thread has one).
pub fn install_handler() {
    // SAFETY: installing a handler that only touches atomics and the stack.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigprof as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut()), 0);
    }
}

/// Top of the stack of thread `t`.
pub fn stack_hi(t: libc::pthread_t) -> u64 {
    // SAFETY: plain pthread attribute queries on a live thread.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(t, &mut attr), 0);
        let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        addr as u64 + size as u64
    }
}

/// Signals thread `t` (whose stack top is in STACK_HI) and returns what its
/// handler unwound.
pub fn sample(t: libc::pthread_t) -> (Vec<u64>, Walk) {
    DONE.store(false, SeqCst);
    // SAFETY: `t` is a live thread of this process.
    assert_eq!(unsafe { libc::pthread_kill(t, libc::SIGPROF) }, 0);
    while !DONE.load(SeqCst) {
        std::thread::yield_now();
    }
    let len = LEN.load(SeqCst);
    let frames = FRAMES[..len].iter().map(|f| f.load(SeqCst)).collect();
    (frames, Walk { len, truncated: TRUNCATED.load(SeqCst) })
}

/// Unwinds the calling thread from a SIGPROF sent to itself.
pub fn sample_self() -> (Vec<u64>, Walk) {
    // SAFETY: querying our own thread.
    let me = unsafe { libc::pthread_self() };
    STACK_HI.store(stack_hi(me), SeqCst);
    sample(me)
}

/// Names frames `function` (or `module+0xoff`), looking return addresses up
/// at `addr - 1`.
pub struct Namer {
    set: Arc<Shared<ModuleSet>>,
    syms: HashMap<PathBuf, Symbols>,
}

impl Namer {
    /// A namer over the modules of `set`.
    pub fn new(set: Arc<Shared<ModuleSet>>) -> Namer {
        Namer { set, syms: HashMap::new() }
    }

    /// The name of frame `addr` (`leaf`: the interrupted instruction itself).
    pub fn name(&mut self, addr: u64, leaf: bool) -> String {
        let at = if leaf { addr } else { addr - 1 };
        let found = self.set.read(|s| s.module_for(at).map(|m| (m.path.clone(), at - m.bias))).unwrap();
        let Some((path, svma)) = found else {
            return format!("{addr:#x}");
        };
        let syms = self.syms.entry(path.clone()).or_insert_with(|| Symbols::load(&path).unwrap_or_default());
        match syms.lookup(svma) {
            Some((name, _)) => name.to_owned(),
            None => osprey_unwind::symbols::module_offset_name(&path, svma),
        }
    }

    /// The names of `frames`, leaf first.
    pub fn names(&mut self, frames: &[u64]) -> Vec<String> {
        frames.iter().enumerate().map(|(i, &f)| self.name(f, i == 0)).collect()
    }
}
