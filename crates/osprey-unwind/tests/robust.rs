//! Walks that must end cleanly: garbage stacks, pc in no module, a module
//! set republished by a dlopen/dlclose loop while another thread unwinds
//! through it, and a handler running on a sigaltstack.

use osprey_testkit::unwind::*;
use osprey_unwind::{unwind, CopiedStack, Regs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// xorshift: deterministic "random" words.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn garbage_stacks_never_fault() {
    let _s = serial();
    lib();
    let shared = refresh();
    let mut seed = 0x9e3779b97f4a7c15u64;
    // Code addresses of real modules, so walks get past the first frame.
    let pcs: Vec<u64> = shared
        .read(|s| s.modules().iter().flat_map(|m| [m.start, (m.start + m.end) / 2, m.end - 1]).collect())
        .unwrap();
    let mut bytes = vec![0u8; 64 << 10];
    let mut frames = [0u64; 64];
    let (mut total, mut multi) = (0u64, 0u64);
    for round in 0..2000 {
        for w in bytes.chunks_mut(8) {
            // Half the words look like code addresses, the rest like anything.
            let v = if rng(&mut seed) % 2 == 0 { pcs[(rng(&mut seed) as usize) % pcs.len()] } else { rng(&mut seed) };
            w.copy_from_slice(&v.to_le_bytes());
        }
        let base = 0x7ff0_0000_0000u64;
        let stack = CopiedStack { base, bytes: &bytes };
        let regs = Regs {
            pc: pcs[round % pcs.len()],
            sp: base + (rng(&mut seed) % bytes.len() as u64),
            fp: if round % 2 == 0 { base + rng(&mut seed) % bytes.len() as u64 } else { rng(&mut seed) },
        };
        let walk = shared.read(|s| unwind(s, regs, |a| stack.read(a), &mut frames)).unwrap();
        assert!(walk.len >= 1 && walk.len <= frames.len());
        total += 1;
        multi += (walk.len > 1) as u64;
    }
    assert_eq!(total, 2000);
    // The garbage was followed some way, not just rejected at the first frame.
    assert!(multi > 100, "only {multi} walks went past the leaf");
}

#[test]
fn pc_in_no_module_is_truncated() {
    let _s = serial();
    let shared = refresh();
    let mut frames = [0u64; 8];
    let regs = Regs { pc: 0x10, sp: 0x1000, fp: 0 };
    let walk = shared.read(|s| unwind(s, regs, |_| Some(0), &mut frames)).unwrap();
    assert_eq!((walk.len, walk.truncated), (1, true));
    let walk = shared.read(|s| unwind(s, regs, |_| None, &mut [])).unwrap();
    assert_eq!((walk.len, walk.truncated), (0, true));
}

/// A unique copy of libframeless.so per dlopen (so the loader really maps and
/// unmaps it).
fn copy_lib(i: usize) -> std::ffi::CString {
    let dst = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("libframeless-loop-{}.so", i % 4));
    if !dst.exists() {
        std::fs::copy(&lib().path, &dst).unwrap();
    }
    std::ffi::CString::new(dst.to_str().unwrap()).unwrap()
}

#[test]
fn dlopen_dlclose_loop_while_unwinding() {
    let _s = serial();
    lib();
    let shared = refresh();
    let stop = Arc::new(AtomicBool::new(false));
    let walks = Arc::new(AtomicU64::new(0));
    // Unwinder: a copied stack of code addresses of whatever modules are
    // currently published, walked at a high rate.
    let u = {
        let (stop, walks, shared) = (stop.clone(), walks.clone(), shared.clone());
        std::thread::spawn(move || {
            let mut frames = [0u64; 32];
            let mut seed = 7u64;
            let mut bytes = vec![0u8; 4096];
            while !stop.load(SeqCst) {
                shared.read(|s| {
                    let ms = s.modules();
                    for w in bytes.chunks_mut(8) {
                        let m = &ms[(rng(&mut seed) as usize) % ms.len()];
                        let v = m.start + rng(&mut seed) % (m.end - m.start);
                        w.copy_from_slice(&v.to_le_bytes());
                    }
                    let stack = CopiedStack { base: 0x1000, bytes: &bytes };
                    let m = &ms[(rng(&mut seed) as usize) % ms.len()];
                    let regs = Regs { pc: m.start + rng(&mut seed) % (m.end - m.start), sp: 0x1000, fp: 0x1800 };
                    unwind(s, regs, |a| stack.read(a), &mut frames)
                });
                walks.fetch_add(1, SeqCst);
            }
        })
    };
    let mut published = 0;
    // At least 200 rounds, and as many more as it takes for the unwinder to
    // have walked 2000 times meanwhile (however the machine schedules it).
    let mut i = 0;
    while i < 200 || walks.load(SeqCst) < 2000 {
        i += 1;
        let name = copy_lib(i);
        // SAFETY: loading and unloading a copy of our test library.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null());
        published += refresh_count();
        // SAFETY: `h` came from dlopen above.
        assert_eq!(unsafe { libc::dlclose(h) }, 0);
        published += refresh_count();
    }
    stop.store(true, SeqCst);
    u.join().unwrap();
    // Every dlopen and every dlclose moved the loader's generation counters.
    assert_eq!(published, 2 * i, "the generation counters did not notice every dlopen/dlclose");
}

fn refresh_count() -> usize {
    refresh_report().1 as usize
}

#[test]
fn handler_on_sigaltstack_unwinds_the_interrupted_stack() {
    let _s = serial();
    lib();
    let set = refresh();
    install_handler();
    let h = std::thread::spawn(move || {
        let mut alt = vec![0u8; 64 << 10];
        // SAFETY: an alternate signal stack for this thread, removed below
        // before `alt` is freed.
        unsafe {
            let ss = libc::stack_t { ss_sp: alt.as_mut_ptr().cast(), ss_flags: 0, ss_size: alt.len() };
            assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
        }
        let got = on_this_thread();
        // SAFETY: disabling the alternate stack.
        unsafe {
            let ss = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
            assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
        }
        got
    });
    let (frames, walk) = h.join().unwrap();
    let names = Namer::new(set).names(&frames);
    assert!(names.iter().any(|n| n.contains("on_this_thread")), "{names:#?}");
    assert!(!walk.truncated, "{names:#?}");
}

#[inline(never)]
fn on_this_thread() -> (Vec<u64>, osprey_unwind::Walk) {
    std::hint::black_box(sample_self())
}

#[test]
fn proc_maps_agree_with_the_loader() {
    let _s = serial();
    lib();
    let (_, loader) = osprey_unwind::scan::loaded();
    let maps = osprey_unwind::scan::loaded_in(std::process::id()).unwrap();
    let mut checked = 0;
    for l in loader.iter().filter(|l| l.path.is_absolute() && l.path.is_file()) {
        let canon = std::fs::canonicalize(&l.path).unwrap();
        let m = maps.iter().find(|m| std::fs::canonicalize(&m.path).ok() == Some(canon.clone()));
        let m = m.unwrap_or_else(|| panic!("{} not in /proc/self/maps", l.path.display()));
        assert_eq!(m.bias, l.bias, "{}", l.path.display());
        assert!(m.start <= l.start && l.end <= m.end.max(l.end), "{}", l.path.display());
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} modules compared");
}

static PUBLISHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The real case: a thread sampled from its SIGPROF handler at a high rate
/// while another thread dlopens and dlcloses libraries and republishes the
/// module set each time (the handler reads the set being replaced).
#[test]
fn sampling_while_dlopen_dlclose_republishes() {
    let _s = serial();
    let l = lib();
    let set = refresh();
    install_handler();
    let worker: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void = l.sym("fl_spin_worker");
    let stop_c: *mut libc::c_int = l.sym("fl_stop");
    // SAFETY: starting the C worker on a plain pthread; `fl_stop` is its flag.
    let t = unsafe {
        *stop_c = 0;
        let mut t: libc::pthread_t = std::mem::zeroed();
        assert_eq!(libc::pthread_create(&mut t, std::ptr::null(), worker, std::ptr::null_mut()), 0);
        t
    };
    STACK_HI.store(stack_hi(t), SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let loader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut published = 0;
            let mut i = 0;
            while !stop.load(SeqCst) {
                let name = copy_lib(i);
                i += 1;
                // SAFETY: loading and unloading a copy of our test library.
                let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                assert!(!h.is_null());
                published += refresh_count();
                // SAFETY: `h` came from dlopen above.
                assert_eq!(unsafe { libc::dlclose(h) }, 0);
                published += refresh_count();
                PUBLISHED.store(published, SeqCst);
                // Leave the sampled thread some CPU on a 2-core machine.
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            published
        })
    };
    // Wait for the loader to be under way, then sample until at least 400
    // samples and 10 publications were taken (the loader's pace depends on
    // the machine: 400 samples alone once raced only 6), for at most 20 s.
    while PUBLISHED.load(SeqCst) < 2 {
        std::thread::yield_now();
    }
    let before = PUBLISHED.load(SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut taken = Vec::new();
    while taken.len() < 400 || (PUBLISHED.load(SeqCst) - before < 10 && std::time::Instant::now() < deadline) {
        taken.push(sample(t));
    }
    let during = PUBLISHED.load(SeqCst) - before;
    stop.store(true, SeqCst);
    let published = loader.join().unwrap();
    // SAFETY: stop and join the worker.
    unsafe {
        std::ptr::write_volatile(stop_c, 1);
        libc::pthread_join(t, std::ptr::null_mut());
    }
    let mut namer = Namer::new(set);
    let samples = taken.len();
    let good = taken
        .iter()
        .filter(|(frames, walk)| !walk.truncated && namer.names(frames).iter().any(|n| n == "fl_spin_worker"))
        .count();
    eprintln!("{samples} samples, {good} complete, {during} publications while sampling ({published} in all)");
    assert!(during >= 10, "only {during} publications raced the samples");
    // A sample whose read raced 4 publications in a row has no frames; all
    // others must be complete.
    assert!(good * 100 >= samples * 95, "{good}/{samples} complete");
}
