//! Unwinding through real Debian libraries built without frame pointers:
//! a thread spends its time in liblzma, libzstd or libsqlite3 (loaded by
//! soname) and is sampled from its SIGPROF handler; the stacks must reach the
//! Rust function that called the library and the thread's start.

use osprey_testkit::unwind::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

type Work = Box<dyn FnMut() + Send>;

struct Job {
    work: Work,
    stop: AtomicBool,
}

#[inline(never)]
fn worker_loop(job: &mut Job) {
    while !job.stop.load(SeqCst) {
        (job.work)();
    }
}

extern "C" fn worker(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the `Job` owned by `sample_library`, alive until join.
    worker_loop(unsafe { &mut *(arg as *mut Job) });
    std::ptr::null_mut()
}

fn open(soname: &str) -> *mut c_void {
    let c = std::ffi::CString::new(soname).unwrap();
    // SAFETY: loading a system library.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "{soname} not installed");
    h
}

fn sym<T: Copy>(h: *mut c_void, name: &str) -> T {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: looking up a function whose type the caller states.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name}");
    // SAFETY: T is that function's pointer type.
    unsafe { std::mem::transmute_copy(&p) }
}

/// Runs `work` on a pthread, samples it 200 times; returns (samples with the
/// leaf in `lib`, of those reaching `worker_loop`, of those reaching the start).
fn sample_library(lib: &str, work: Work) -> (u32, u32, u32) {
    let _s = serial();
    let set = refresh();
    install_handler();
    let mut job = Box::new(Job { work, stop: AtomicBool::new(false) });
    // SAFETY: a pthread running `worker` on `job`, joined below.
    let t = unsafe {
        let mut t: libc::pthread_t = std::mem::zeroed();
        assert_eq!(libc::pthread_create(&mut t, std::ptr::null(), worker, &mut *job as *mut Job as *mut c_void), 0);
        t
    };
    STACK_HI.store(stack_hi(t), SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut namer = Namer::new(set.clone());
    let (mut inside, mut reach, mut complete) = (0, 0, 0);
    for _ in 0..200 {
        let (frames, walk) = sample(t);
        let in_lib = frames
            .first()
            .and_then(|&pc| set.read(|s| s.module_for(pc).map(|m| m.path.to_string_lossy().contains(lib))).flatten())
            .unwrap_or(false);
        if in_lib {
            inside += 1;
            let names = namer.names(&frames);
            reach += names.iter().any(|n| n.contains("worker_loop")) as u32;
            complete += !walk.truncated as u32;
            if walk.truncated && std::env::var_os("SHOW_TRUNCATED").is_some() {
                let pcs: Vec<String> = frames.iter().map(|f| format!("{f:#x}")).collect();
                eprintln!("truncated: {names:?} {pcs:?}");
            }
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    job.stop.store(true, SeqCst);
    // SAFETY: joining the worker started above.
    unsafe { libc::pthread_join(t, std::ptr::null_mut()) };
    eprintln!("{lib}: {inside}/200 samples in the library; {reach} reach worker_loop, {complete} the thread start");
    (inside, reach, complete)
}

fn input() -> Vec<u8> {
    let mut seed = 1u64;
    (0..1 << 18)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            b"abcdefgh  \n"[(seed >> 60) as usize % 11]
        })
        .collect()
}

fn check(lib: &str, (inside, reach, complete): (u32, u32, u32)) {
    assert!(inside >= 100, "{lib}: only {inside}/200 samples inside");
    assert!(reach * 100 >= inside * 90, "{lib}: {reach}/{inside} reach the caller");
    assert!(complete * 100 >= inside * 90, "{lib}: {complete}/{inside} reach the thread start");
}

#[test]
fn through_liblzma() {
    let h = open("liblzma.so.5");
    type Enc = unsafe extern "C" fn(u32, u32, *const c_void, *const u8, usize, *mut u8, *mut usize, usize) -> u32;
    let enc: Enc = sym(h, "lzma_easy_buffer_encode");
    let src = input();
    let mut dst = vec![0u8; src.len() + 4096];
    let work: Work = Box::new(move || {
        let mut pos = 0usize;
        // SAFETY: buffers sized as the API requires; preset 1, CRC64 check (4).
        let r = unsafe { enc(1, 4, std::ptr::null(), src.as_ptr(), src.len(), dst.as_mut_ptr(), &mut pos, dst.len()) };
        assert_eq!(r, 0);
    });
    check("liblzma", sample_library("liblzma", work));
}

#[test]
fn through_libzstd() {
    let h = open("libzstd.so.1");
    type Compress = unsafe extern "C" fn(*mut u8, usize, *const u8, usize, i32) -> usize;
    let compress: Compress = sym(h, "ZSTD_compress");
    let src = input();
    let mut dst = vec![0u8; src.len() + 4096];
    let work: Work = Box::new(move || {
        // SAFETY: valid buffers; level 9.
        let n = unsafe { compress(dst.as_mut_ptr(), dst.len(), src.as_ptr(), src.len(), 9) };
        assert!(n > 0 && n < dst.len());
    });
    check("libzstd", sample_library("libzstd", work));
}

#[test]
fn through_libsqlite3() {
    let h = open("libsqlite3.so.0");
    type Open = unsafe extern "C" fn(*const libc::c_char, *mut *mut c_void) -> i32;
    type Exec = unsafe extern "C" fn(*mut c_void, *const libc::c_char, *const c_void, *mut c_void, *mut c_void) -> i32;
    let (open_db, exec): (Open, Exec) = (sym(h, "sqlite3_open"), sym(h, "sqlite3_exec"));
    let mut db = std::ptr::null_mut();
    // SAFETY: an in-memory database.
    assert_eq!(unsafe { open_db(c":memory:".as_ptr(), &mut db) }, 0);
    let db = db as usize;
    let sql = c"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) \
                SELECT sum(x * x % 7), group_concat(x % 10, '') FROM c;";
    let work: Work = Box::new(move || {
        // SAFETY: a valid connection (used by this thread only) and statement.
        let r = unsafe {
            exec(db as *mut c_void, sql.as_ptr(), std::ptr::null(), std::ptr::null_mut(), std::ptr::null_mut())
        };
        assert_eq!(r, 0);
    });
    check("libsqlite3", sample_library("libsqlite3", work));
}
