//! Unwinding from a real signal handler through frameless C code built here
//! (`gcc -O2 -fomit-frame-pointer`) and through the system zlib.

use osprey_testkit::unwind::*;
use std::sync::atomic::Ordering::SeqCst;

static CAPTURED: std::sync::Mutex<Option<(Vec<u64>, osprey_unwind::Walk)>> = std::sync::Mutex::new(None);

/// Called by the C leaf: samples the current thread from its SIGPROF handler.
extern "C" fn capture(_arg: *mut libc::c_void) {
    *CAPTURED.lock().unwrap() = Some(sample_self());
}

#[inline(never)]
fn run_frameless(depth: i32) -> u64 {
    let run: RunFn = lib().sym("fl_run");
    // SAFETY: calling our C library with a valid callback.
    let r = unsafe { run(depth, Some(capture), std::ptr::null_mut()) };
    std::hint::black_box(r)
}

fn captured() -> (Vec<u64>, osprey_unwind::Walk) {
    CAPTURED.lock().unwrap().take().expect("callback ran")
}

#[test]
fn reaches_the_test_through_frameless_c() {
    let _s = serial();
    lib();
    let set = refresh();
    install_handler();
    LIMIT.store(MAX_FRAMES, SeqCst);
    run_frameless(20);
    let (frames, walk) = captured();
    let names = Namer::new(set).names(&frames);
    let recursions = names.iter().filter(|n| *n == "fl_recurse").count();
    let pos = |f: &str| names.iter().position(|n| n.contains(f));
    assert!(names.iter().any(|n| n == "fl_leaf"), "{names:#?}");
    // fl_recurse(20..=1) call it; fl_recurse(0) tail-calls fl_leaf (a jmp, no frame).
    assert_eq!(recursions, 20, "{names:#?}");
    let (leaf, run, test) = (pos("fl_leaf").unwrap(), pos("fl_run"), pos("run_frameless"));
    assert!(run.is_some_and(|r| r > leaf) && test > run, "{names:#?}");
    // The test harness's thread runs to its start (clone3, whose CFI marks the
    // return address undefined): an outermost frame, not a truncation.
    assert!(!walk.truncated, "{names:#?}");
    assert!(names.iter().any(|n| n.contains("thread_start")), "{names:#?}");
}

#[test]
fn deep_recursion_is_truncated_cleanly() {
    let _s = serial();
    lib();
    refresh();
    install_handler();
    // 10k frames of fl_recurse: run on a thread with room for them.
    let h = std::thread::Builder::new().stack_size(64 << 20).spawn(|| {
        LIMIT.store(128, SeqCst);
        run_frameless(10_000);
        LIMIT.store(MAX_FRAMES, SeqCst);
        captured()
    });
    let (frames, walk) = h.unwrap().join().unwrap();
    assert_eq!(walk.len, 128);
    assert!(walk.truncated);
    assert_eq!(frames.len(), 128);
}

#[test]
fn zlib_thread_reaches_its_caller() {
    let _s = serial();
    let l = lib();
    let set = refresh();
    install_handler();
    let worker: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void = l.sym("fl_zlib_worker");
    let stop: *mut libc::c_int = l.sym("fl_stop");
    // SAFETY: starting the C worker on a plain pthread; `fl_stop` is its flag.
    let t = unsafe {
        *stop = 0;
        let mut t: libc::pthread_t = std::mem::zeroed();
        assert_eq!(libc::pthread_create(&mut t, std::ptr::null(), worker, std::ptr::null_mut()), 0);
        t
    };
    STACK_HI.store(stack_hi(t), SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut namer = Namer::new(set);
    let (mut in_zlib, mut reached, mut complete) = (0, 0, 0);
    for _ in 0..300 {
        let (frames, walk) = sample(t);
        let names = namer.names(&frames);
        let leaf_module = names.first().cloned().unwrap_or_default();
        let in_z = frames.first().is_some_and(|&pc| {
            namer_module_is(&leaf_module, pc, l) // named by libz's symbols or libz+off
        });
        if in_z {
            in_zlib += 1;
            reached += names.iter().any(|n| n == "fl_zlib_worker") as u32;
            complete += !walk.truncated as u32;
        }
        std::thread::sleep(std::time::Duration::from_micros(300));
    }
    // SAFETY: stop and join the worker.
    unsafe {
        std::ptr::write_volatile(stop, 1);
        libc::pthread_join(t, std::ptr::null_mut());
    }
    eprintln!("zlib thread: {in_zlib}/300 samples in libz; of those {reached} reach fl_zlib_worker, {complete} reach the thread start");
    assert!(in_zlib >= 150, "only {in_zlib}/300 samples in zlib");
    assert!(reached * 100 >= in_zlib * 90, "{reached}/{in_zlib} zlib samples reach fl_zlib_worker");
    assert!(complete * 100 >= in_zlib * 90, "{complete}/{in_zlib} zlib samples reach the thread start");
}

/// Whether `pc` lies in the system libz (and not in our library).
fn namer_module_is(_name: &str, pc: u64, _l: &Lib) -> bool {
    // SAFETY: an all-zero Dl_info is a valid value for dladdr to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr on an address of this process (test side, not a handler).
    if unsafe { libc::dladdr(pc as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: NUL-terminated string from dladdr.
    let f = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    f.contains("libz.so")
}

#[test]
fn frameless_leaf_gives_its_caller() {
    let _s = serial();
    let l = lib();
    let set = refresh();
    install_handler();
    let worker: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void = l.sym("fl_spin_worker");
    let stop: *mut libc::c_int = l.sym("fl_stop");
    // SAFETY: starting the C worker on a plain pthread; `fl_stop` is its flag.
    let t = unsafe {
        *stop = 0;
        let mut t: libc::pthread_t = std::mem::zeroed();
        assert_eq!(libc::pthread_create(&mut t, std::ptr::null(), worker, std::ptr::null_mut()), 0);
        t
    };
    STACK_HI.store(stack_hi(t), SeqCst);
    let mut namer = Namer::new(set);
    let (mut in_leaf, mut right) = (0, 0);
    for _ in 0..200 {
        let (frames, walk) = sample(t);
        let names = namer.names(&frames);
        if names.first().is_some_and(|n| n == "fl_spin_leaf") {
            in_leaf += 1;
            right += (names.get(1).is_some_and(|n| n == "fl_spin_worker") && !walk.truncated) as u32;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    // SAFETY: stop and join the worker.
    unsafe {
        std::ptr::write_volatile(stop, 1);
        libc::pthread_join(t, std::ptr::null_mut());
    }
    assert!(in_leaf >= 100, "only {in_leaf}/200 samples in the leaf");
    assert_eq!(right, in_leaf, "the frameless leaf's caller must be fl_spin_worker");
}
