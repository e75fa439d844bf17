//! Unusual stacks: a thread with a tiny stack, and a `swapcontext`
//! coroutine running on a heap-allocated stack.

use osprey_testkit::unwind::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;

static CAPTURED: Mutex<Option<(Vec<u64>, osprey_unwind::Walk)>> = Mutex::new(None);

extern "C" fn capture(_: *mut libc::c_void) {
    // The test set STACK_HI to the top of the stack this runs on.
    // SAFETY: our own thread.
    let me = unsafe { libc::pthread_self() };
    *CAPTURED.lock().unwrap() = Some(sample(me));
}

#[test]
fn tiny_thread_stack() {
    let _s = serial();
    let l = lib();
    let set = refresh();
    install_handler();
    extern "C" fn body(_: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: our own thread.
        STACK_HI.store(stack_hi(unsafe { libc::pthread_self() }), SeqCst);
        let run: RunFn = lib().sym("fl_run");
        // SAFETY: calling our C library with a valid callback.
        unsafe { run(8, Some(capture), std::ptr::null_mut()) };
        std::ptr::null_mut()
    }
    let _ = l;
    // SAFETY: a pthread with the smallest stack allowed (16 KiB: the handler,
    // its 2 KiB frames array and the C frames fit), joined below.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        assert_eq!(libc::pthread_attr_setstacksize(&mut attr, libc::PTHREAD_STACK_MIN), 0);
        let mut t: libc::pthread_t = std::mem::zeroed();
        assert_eq!(libc::pthread_create(&mut t, &attr, body, std::ptr::null_mut()), 0);
        libc::pthread_join(t, std::ptr::null_mut());
    }
    let (frames, walk) = CAPTURED.lock().unwrap().take().unwrap();
    let names = Namer::new(set).names(&frames);
    assert_eq!(names.iter().filter(|n| *n == "fl_recurse").count(), 8, "{names:#?}");
    assert!(names.iter().any(|n| n.contains("body")), "{names:#?}");
    assert!(!walk.truncated, "{names:#?}");
}

static mut MAIN_CTX: std::mem::MaybeUninit<libc::ucontext_t> = std::mem::MaybeUninit::zeroed();
static mut CO_CTX: std::mem::MaybeUninit<libc::ucontext_t> = std::mem::MaybeUninit::zeroed();

#[inline(never)]
extern "C" fn coroutine() {
    let run: RunFn = lib().sym("fl_run");
    // SAFETY: calling our C library with a valid callback.
    let r = unsafe { run(5, Some(capture), std::ptr::null_mut()) };
    // Used after the call, so an optimised build keeps this frame (no tail call).
    std::hint::black_box(r);
    // Returning resumes uc_link (the main context).
}

#[test]
fn swapcontext_coroutine() {
    let _s = serial();
    lib();
    let set = refresh();
    install_handler();
    let mut stack = vec![0u8; 256 << 10];
    let top = (stack.as_mut_ptr() as u64 + stack.len() as u64) & !15;
    STACK_HI.store(top, SeqCst);
    // SAFETY: a coroutine on `stack`, which outlives it; the contexts are
    // only used by this test (serialized).
    unsafe {
        let co = &raw mut CO_CTX;
        let main = &raw mut MAIN_CTX;
        assert_eq!(libc::getcontext((*co).as_mut_ptr()), 0);
        let c = (*co).as_mut_ptr();
        (*c).uc_stack.ss_sp = stack.as_mut_ptr().cast();
        (*c).uc_stack.ss_size = stack.len();
        (*c).uc_link = (*main).as_mut_ptr();
        libc::makecontext(c, coroutine, 0);
        assert_eq!(libc::swapcontext((*main).as_mut_ptr(), c), 0);
    }
    let (frames, walk) = CAPTURED.lock().unwrap().take().unwrap();
    let names = Namer::new(set).names(&frames);
    assert_eq!(names.iter().filter(|n| *n == "fl_recurse").count(), 5, "{names:#?}");
    assert!(names.iter().any(|n| n.contains("coroutine")), "{names:#?}");
    // Below the coroutine's entry is glibc's __start_context (unnamed: libc
    // has no .symtab); its caller's frame would be above the coroutine's
    // stack, which the reader refuses: the walk ends there, truncated, and
    // never leaves the coroutine's stack.
    let pos = names.iter().position(|n| n.contains("coroutine")).unwrap();
    assert_eq!(frames.len(), pos + 2, "{names:#?}");
    assert!(names[pos + 1].starts_with("libc.so.6+"), "{names:#?}");
    assert!(walk.truncated);
    drop(stack);
}
