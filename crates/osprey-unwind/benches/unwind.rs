//! p50/p99 of one 32-deep unwind, osprey-unwind's compact tables vs framehop
//! (`MustNotAllocateDuringUnwind`, warm per-thread cache), on the same
//! captured stack of frameless C frames (`tests/c/frameless.c`), and the
//! memory each keeps. Also checks both give the same 32 frames.
//!
//! `cargo bench -p osprey-unwind --bench unwind`

use osprey_testkit::unwind as fixture;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, MustNotAllocateDuringUnwind, Unwinder};
use object::{Object, ObjectSection};
use osprey_unwind::{unwind, CopiedStack, Regs};
use std::arch::asm;
use std::sync::Mutex;
use std::time::Instant;

const DEPTH: usize = 32;
const BATCH: usize = 8;

struct Snapshot {
    regs: Regs,
    base: u64,
    bytes: Vec<u8>,
}

static SNAP: Mutex<Option<Snapshot>> = Mutex::new(None);

/// Called by the C leaf: copies 64 KiB of stack above its own sp.
#[inline(never)]
extern "C" fn snap(_: *mut libc::c_void) {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads rip/rsp/rbp; no memory access, no stack change.
    unsafe { asm!("lea {0}, [rip]", "mov {1}, rsp", "mov {2}, rbp", out(reg) pc, out(reg) sp, out(reg) fp) };
    // SAFETY: querying our own thread.
    let hi = fixture::stack_hi(unsafe { libc::pthread_self() });
    let len = (hi - sp).min(64 << 10) as usize;
    // SAFETY: [sp, hi) is this thread's mapped stack.
    let bytes = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
    *SNAP.lock().unwrap() = Some(Snapshot { regs: Regs { pc, sp, fp }, base: sp, bytes });
}

/// Fills 16 KiB of this thread's stack below the caller with a pattern and
/// returns its address range.
#[inline(never)]
fn paint() -> (u64, u64) {
    let mut buf = [0xa5u8; 16 << 10];
    std::hint::black_box(&mut buf);
    (buf.as_ptr() as u64, buf.as_ptr() as u64 + buf.len() as u64)
}

/// What a handler does: enter the module set, unwind, leave.
#[inline(never)]
fn handler_walk(shared: &osprey_unwind::Shared<osprey_unwind::ModuleSet>, s: &Snapshot, frames: &mut [u64]) -> usize {
    let stack = CopiedStack { base: s.base, bytes: &s.bytes };
    shared.read(|set| unwind(set, s.regs, |a| stack.read(a), frames).len).unwrap_or(0)
}

/// Bytes of stack below the caller that `handler_walk` dirtied.
#[inline(never)]
fn stack_use(shared: &osprey_unwind::Shared<osprey_unwind::ModuleSet>, s: &Snapshot) -> u64 {
    let mut frames = [0u64; DEPTH];
    let (lo, hi) = paint();
    std::hint::black_box(handler_walk(shared, s, &mut frames));
    // SAFETY: [lo, hi) is this thread's stack, below our frame, still mapped.
    let dirty = (lo..hi).find(|&a| unsafe { std::ptr::read_volatile(a as *const u8) } != 0xa5);
    dirty.map_or(0, |d| hi - d)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn time(mut f: impl FnMut() -> usize) -> (f64, f64) {
    let mut ns = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let t0 = Instant::now();
        for _ in 0..BATCH {
            std::hint::black_box(f());
        }
        ns.push(t0.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    (pct(&mut ns, 0.5), pct(&mut ns, 0.99))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let lib = fixture::lib();
    let shared = fixture::refresh();
    let run: fixture::RunFn = lib.sym("fl_run");
    // SAFETY: calling our C library with a valid callback.
    unsafe { run(40, Some(snap), std::ptr::null_mut()) };
    let s = SNAP.lock().unwrap().take().unwrap();
    let stack = CopiedStack { base: s.base, bytes: &s.bytes };

    // Ours.
    let mut ours = [0u64; DEPTH];
    let walk = shared.read(|set| unwind(set, s.regs, |a| stack.read(a), &mut ours)).unwrap();
    assert_eq!(walk.len, DEPTH, "the captured stack is {} deep", walk.len);
    let (p50, p99) = time(|| {
        let mut frames = [0u64; DEPTH];
        shared.read(|set| unwind(set, s.regs, |a| stack.read(a), &mut frames).len).unwrap()
    });
    // Rule lookups alone, for the same 32 pcs (return addresses at pc - 1).
    let pcs: Vec<u64> = ours.iter().enumerate().map(|(i, &p)| if i == 0 { p } else { p - 1 }).collect();
    let (l50, l99) = time(|| {
        shared.read(|set| pcs.iter().map(|&p| set.rule_for(p).map_or(0, |r| r.cfa_offset() as usize)).sum()).unwrap()
    });
    println!("32 rule lookups alone: p50 {l50:.0} ns, p99 {l99:.0} ns");
    let (ours_bytes, n_modules) = shared.read(|set| (set.table_bytes(), set.modules().len())).unwrap();

    // framehop, on the same modules.
    let mut fh: UnwinderX86_64<Vec<u8>, MustNotAllocateDuringUnwind> = UnwinderX86_64::new();
    let mut fh_bytes = 0usize;
    let modules: Vec<_> = shared.read(|set| set.modules().to_vec()).unwrap();
    for m in &modules {
        let Ok(data) = std::fs::read(&m.path) else { continue };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        let sect = |name: &str| {
            file.section_by_name(name)
                .and_then(|s| Some((s.address()..s.address() + s.size(), s.data().ok()?.to_vec())))
        };
        let (eh, hdr, text, got) = (sect(".eh_frame"), sect(".eh_frame_hdr"), sect(".text"), sect(".got"));
        fh_bytes += [&eh, &hdr].iter().map(|s| s.as_ref().map_or(0, |s| s.1.len())).sum::<usize>();
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: text.as_ref().map(|t| t.0.clone()),
            got_svma: got.as_ref().map(|g| g.0.clone()),
            eh_frame_svma: eh.as_ref().map(|e| e.0.clone()),
            eh_frame: eh.map(|e| e.1),
            eh_frame_hdr_svma: hdr.as_ref().map(|h| h.0.clone()),
            eh_frame_hdr: hdr.map(|h| h.1),
            ..Default::default()
        };
        fh.add_module(framehop::Module::new(m.path.display().to_string(), m.start..m.end, m.bias, info));
    }
    let mut cache = CacheX86_64::<MustNotAllocateDuringUnwind>::new_in();
    let fh_walk = |out: &mut [u64; DEPTH], cache: &mut CacheX86_64<MustNotAllocateDuringUnwind>| -> usize {
        let mut read = |a: u64| stack.read(a).ok_or(());
        let regs = UnwindRegsX86_64::new(s.regs.pc, s.regs.sp, s.regs.fp);
        let mut it = fh.iter_frames(s.regs.pc, regs, cache, &mut read);
        let mut n = 0;
        while n < DEPTH {
            match it.next() {
                Ok(Some(f)) => {
                    out[n] = match f {
                        FrameAddress::InstructionPointer(a) => a,
                        FrameAddress::ReturnAddress(a) => a.get(),
                    };
                    n += 1;
                }
                _ => break,
            }
        }
        n
    };
    let mut theirs = [0u64; DEPTH];
    let n = fh_walk(&mut theirs, &mut cache);
    let same = ours.iter().zip(&theirs[..n]).filter(|(a, b)| a == b).count();
    let (f50, f99) = time(|| {
        let mut frames = [0u64; DEPTH];
        fh_walk(&mut frames, &mut cache)
    });

    // Cold cache: a fresh (preallocated) cache for each unwind, made outside
    // the timed region: the first unwind of a stack never seen before.
    let mut cold = Vec::with_capacity(5000);
    for _ in 0..5000 {
        let mut c = CacheX86_64::<MustNotAllocateDuringUnwind>::new_in();
        let mut frames = [0u64; DEPTH];
        let t0 = Instant::now();
        std::hint::black_box(fh_walk(&mut frames, &mut c));
        cold.push(t0.elapsed().as_nanos() as f64);
    }
    let (c50, c99) = (pct(&mut cold, 0.5), pct(&mut cold, 0.99));

    println!(
        "stack used below the caller by enter + 32-deep unwind + leave: {} bytes (frames array is the caller's)",
        stack_use(&shared, &s)
    );
    println!("32-deep unwind of a copied stack through frameless C ({n_modules} modules loaded), ns per unwind:");
    println!("| unwinder | p50 ns | p99 ns | unwind data kept (KiB) |");
    println!("|---|---|---|---|");
    println!("| osprey-unwind compact tables | {p50:.0} | {p99:.0} | {} |", ours_bytes / 1024);
    println!(
        "| framehop 0.16 (no-alloc, warm cache) | {f50:.0} | {f99:.0} | {} (.eh_frame + hdr) + {} cache |",
        fh_bytes / 1024,
        std::mem::size_of::<CacheX86_64<MustNotAllocateDuringUnwind>>() / 1024
    );
    println!("| framehop 0.16 (no-alloc, cold cache) | {c50:.0} | {c99:.0} | same |");
    println!("ratio framehop/ours: p50 {:.2}x, p99 {:.2}x", f50 / p50, f99 / p99);
    println!("frames agreeing: {same}/{DEPTH} (framehop gave {n})");
}
