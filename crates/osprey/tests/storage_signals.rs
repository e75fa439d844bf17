//! Real signals: busy threads receive a storm of a real-time signal (tgkill)
//! whose handler `put`s a stack and pushes a ring record, while the collector
//! rotates every millisecond. Checks samples taken == samples collected, and
//! (through the global allocator below) that the handler never allocates.

use osprey::internals::record::{SampleRecord, SampleRing};
use osprey::internals::signal::sys;
use osprey::internals::storage::{CallTraceStorage, StorageConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

const THREADS: usize = 3;

/// tid of the thread in each slot while it runs the handler, else 0.
static IN_HANDLER: [AtomicI32; THREADS] = [const { AtomicI32::new(0) }; THREADS];
/// tid owning each slot.
static TIDS: [AtomicI32; THREADS] = [const { AtomicI32::new(0) }; THREADS];
static SEQ: [AtomicU64; THREADS] = [const { AtomicU64::new(0) }; THREADS];
static TAKEN: AtomicU64 = AtomicU64::new(0);
static RING_FULL: AtomicU64 = AtomicU64::new(0);
static STORAGE: AtomicPtr<CallTraceStorage> = AtomicPtr::new(core::ptr::null_mut());
static RINGS: AtomicPtr<SampleRing> = AtomicPtr::new(core::ptr::null_mut());

/// Aborts if the calling thread allocates while inside the profiling handler.
struct NoAllocInHandler;

fn check_not_in_handler() {
    let tid = sys::gettid();
    if IN_HANDLER.iter().any(|t| t.load(Relaxed) == tid) {
        let msg = b"FATAL: allocation inside the signal handler\n";
        // SAFETY: write(2) and abort(3) are async-signal-safe.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }
}

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for NoAllocInHandler {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        check_not_in_handler();
        // SAFETY: the caller's GlobalAlloc contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        check_not_in_handler();
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        check_not_in_handler();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: NoAllocInHandler = NoAllocInHandler;

extern "C" fn on_signal(_sig: libc::c_int) {
    let _errno = sys::ErrnoGuard::save();
    let tid = sys::gettid();
    let Some(slot) = TIDS.iter().position(|t| t.load(Relaxed) == tid) else { return };
    IN_HANDLER[slot].store(tid, Relaxed);
    // SAFETY: published before the handler was installed, never freed.
    let (storage, rings) = unsafe { (&*STORAGE.load(Acquire), RINGS.load(Acquire)) };
    // SAFETY: `slot` < THREADS and RINGS points at THREADS leaked rings.
    let ring = unsafe { &*rings.add(slot) };
    let n = SEQ[slot].fetch_add(1, Relaxed);
    // Mostly 40 known stacks, every 16th sample a new one.
    let key = if n % 16 == 0 { 1000 + n * THREADS as u64 + slot as u64 } else { n % 40 };
    let mut frames = [0u64; 32];
    let depth = 8 + (key % 25) as usize;
    for (i, f) in frames.iter_mut().enumerate() {
        *f = 0x7000_0000_0000 + key * 0x100 + i as u64;
    }
    storage.put(slot, &frames[..depth], false, 1, 1000, |id| {
        let rec = SampleRecord { trace_id: id, timestamp_ns: sys::monotonic_ns(), count: 1, tid, ..Default::default() };
        if !ring.push(&rec) {
            RING_FULL.fetch_add(1, Relaxed);
        }
    });
    TAKEN.fetch_add(1, Relaxed);
    IN_HANDLER[slot].store(0, Relaxed);
}

#[test]
fn signal_storm_while_rotating() {
    let storage = Box::leak(Box::new(
        CallTraceStorage::new(StorageConfig { memory_budget: 4 << 20, max_threads: THREADS }).unwrap(),
    ));
    let rings: &'static [SampleRing] =
        Box::leak((0..THREADS).map(|_| SampleRing::new()).collect::<Vec<_>>().into_boxed_slice());
    STORAGE.store(storage, Release);
    RINGS.store(rings.as_ptr() as *mut SampleRing, Release);

    let sig = libc::SIGRTMIN() + 5;
    // SAFETY: plain sigaction with a handler that only uses signal-safe code.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, core::ptr::null_mut()), 0);
    }

    static STOP_BUSY: AtomicBool = AtomicBool::new(false);
    static STOP_STORM: AtomicBool = AtomicBool::new(false);
    let busy: Vec<_> = (0..THREADS)
        .map(|slot| {
            std::thread::spawn(move || {
                TIDS[slot].store(sys::gettid(), Release);
                let mut x = 1u64;
                while !STOP_BUSY.load(Relaxed) {
                    for _ in 0..1000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    core::hint::black_box(x);
                }
            })
        })
        .collect();
    while TIDS.iter().any(|t| t.load(Acquire) == 0) {
        std::thread::yield_now();
    }
    let pid = sys::getpid();
    let storm = std::thread::spawn(move || {
        let mut sent = 0u64;
        while !STOP_STORM.load(Relaxed) {
            for t in &TIDS {
                if sys::tgkill(pid, t.load(Relaxed), sig) == 0 {
                    sent += 1;
                }
            }
        }
        sent
    });

    let (mut collected, mut value, mut records, mut rotations) = (0u64, 0u64, 0u64, 0u64);
    let mut drain = |c: osprey::internals::storage::Collected| {
        for t in &c.traces {
            collected += t.count;
            value += t.value;
        }
        for r in rings {
            r.drain(|_| records += 1);
        }
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        drain(storage.rotate());
        rotations += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    STOP_STORM.store(true, Relaxed);
    let sent = storm.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    STOP_BUSY.store(true, Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    drain(storage.rotate());
    drain(storage.rotate());
    let taken = TAKEN.load(Relaxed);
    eprintln!(
        "sent {sent}, taken {taken}, collected {collected}, ring records {records} (+{} ring full), rotations {rotations}",
        RING_FULL.load(Relaxed)
    );
    assert!(taken > 1000, "too few signals handled: {taken}");
    assert_eq!(collected, taken, "samples taken != samples collected");
    assert_eq!(value, taken * 1000);
    assert_eq!(records + RING_FULL.load(Relaxed), taken);
}
