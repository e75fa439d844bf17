//! Python stacks: frame chains, code objects (cached, invalidated when an
//! address is reused), strings and line tables of every supported version.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;

use osprey_pprof::Frame;

use crate::layout::{InstrKind, Layout, LineTable, FRAME_OWNED_BY_CSTACK, FRAME_OWNED_BY_GENERATOR};
use crate::process::{rd_u32, rd_u64, Mem};
use crate::target::Target;

/// Frames read per stack, at most (about 1 µs each); a deeper stack keeps
/// its innermost `MAX_DEPTH` frames and a `[truncated]` frame.
pub const MAX_DEPTH: usize = 2048;

/// Reads a `str` object.
pub fn read_unicode(mem: &Mem, l: &Layout, addr: u64) -> io::Result<String> {
    let hdr = mem.read_vec(addr, l.unicode_compact_size as usize)?;
    let len = rd_u64(&hdr, l.unicode_length as usize) as usize;
    let state = rd_u32(&hdr, l.unicode_state as usize);
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if len > 4096 || !compact {
        return Err(io::Error::other("unsupported str"));
    }
    if ascii {
        let b = mem.read_vec(addr + l.unicode_ascii_size, len)?;
        return Ok(String::from_utf8_lossy(&b).into_owned());
    }
    let data = addr + l.unicode_compact_size;
    let b = mem.read_vec(data, len * kind as usize)?;
    let s: String = match kind {
        1 => b.iter().map(|&c| c as char).collect(),
        2 => {
            b.chunks_exact(2).map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('?')).collect()
        }
        4 => b
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
        _ => return Err(io::Error::other("bad str kind")),
    };
    Ok(s)
}

/// Reads a `bytes` object's content.
pub fn read_bytes_obj(mem: &Mem, l: &Layout, addr: u64) -> io::Result<Vec<u8>> {
    let size = mem.u64(addr + l.bytes_size)? as usize;
    if size > 1 << 20 {
        return Err(io::Error::other("bytes too large"));
    }
    mem.read_vec(addr + l.bytes_sval, size)
}

/// Address ranges -> line, in the unit the frame reports (bytes for
/// lnotab/3.10 tables, code units for 3.11+ tables).
#[derive(Clone, Debug, Default)]
pub struct LineRanges(Vec<(u32, u32, i32)>);

impl LineRanges {
    pub(crate) fn line(&self, addr: u32) -> i32 {
        // Ranges are sorted and disjoint.
        let i = self.0.partition_point(|r| r.1 <= addr);
        match self.0.get(i) {
            Some(&(s, _, line)) if s <= addr => line,
            _ => self.0.last().map(|r| r.2).unwrap_or(-1),
        }
    }
}

/// co_lnotab (3.8, 3.9): (address increment, signed line increment) pairs.
pub fn parse_lnotab(tab: &[u8], first: i32) -> LineRanges {
    let mut out = Vec::new();
    let mut line = first;
    let mut addr: u32 = 0;
    for p in tab.chunks_exact(2) {
        let a = p[0] as u32;
        if a != 0 {
            out.push((addr, addr + a, line));
            addr += a;
        }
        line += p[1] as i8 as i32;
    }
    out.push((addr, u32::MAX, line));
    merge(out)
}

/// co_linetable of 3.10: (byte delta, signed line delta; -128 = no line).
pub fn parse_linetable_310(tab: &[u8], first: i32) -> LineRanges {
    let mut out = Vec::new();
    let mut line = first;
    let mut end: u32 = 0;
    for p in tab.chunks_exact(2) {
        let start = end;
        end += p[0] as u32;
        let ld = p[1] as i8;
        let cur = if ld == -128 {
            -1
        } else {
            line += ld as i32;
            line
        };
        if end > start {
            out.push((start, end, cur));
        }
    }
    merge(out)
}

/// 3.11+ location table, in code units.
pub fn parse_locations(tab: &[u8], first: i32) -> LineRanges {
    let mut out = Vec::new();
    let mut line = first;
    let mut addr: u32 = 0;
    let mut i = 0;
    let varint = |i: &mut usize| -> u32 {
        let mut v: u32 = 0;
        let mut shift = 0;
        while *i < tab.len() {
            let b = tab[*i];
            *i += 1;
            v |= ((b & 63) as u32) << shift;
            shift += 6;
            if b & 64 == 0 || shift > 30 {
                break;
            }
        }
        v
    };
    let svarint = |i: &mut usize| -> i32 {
        let u = varint(i);
        if u & 1 == 1 {
            -((u >> 1) as i32)
        } else {
            (u >> 1) as i32
        }
    };
    while i < tab.len() {
        let b = tab[i];
        i += 1;
        if b & 0x80 == 0 {
            continue; // not at an entry start: resync
        }
        let code = (b >> 3) & 15;
        let len = (b & 7) as u32 + 1;
        let cur = match code {
            15 => -1,
            14 => {
                line += svarint(&mut i);
                varint(&mut i);
                varint(&mut i);
                varint(&mut i);
                line
            }
            13 => {
                line += svarint(&mut i);
                line
            }
            10..=12 => {
                line += (code - 10) as i32;
                i += 2;
                line
            }
            _ => {
                i += 1;
                line
            }
        };
        out.push((addr, addr + len, cur));
        addr += len;
    }
    merge(out)
}

fn merge(v: Vec<(u32, u32, i32)>) -> LineRanges {
    let mut out: Vec<(u32, u32, i32)> = Vec::with_capacity(v.len());
    for r in v {
        if let Some(last) = out.last_mut() {
            if last.2 == r.2 && last.1 == r.0 {
                last.1 = r.1;
                continue;
            }
        }
        out.push(r);
    }
    LineRanges(out)
}

#[derive(Clone, Debug)]
struct CodeEntry {
    key: [u64; 5],
    name: String,
    file: String,
    lines: LineRanges,
}

/// Code objects by address; an entry is reused only while the object at that
/// address still has the same name, file, line table and first line.
#[derive(Default)]
pub struct CodeCache {
    map: HashMap<u64, CodeEntry>,
    /// 3.14+: the end of each cached code object's bytecode (which it
    /// holds inline), by the code object's address.
    spans: BTreeMap<u64, u64>,
    /// Code objects read from the target (not found, or stale, in the cache).
    pub misses: u64,
    /// Per thread state, what its previous walks found (see [`Snapshot`]).
    threads: HashMap<u64, Hints>,
    /// 3.12: where a call of the interpreter's C evaluation function keeps
    /// its entry frame, from its cframe (both are its locals), and how often
    /// walks found each distance; the most found is used.
    entry_offsets: HashMap<i64, u32>,
}

/// What earlier walks of one thread found, read again all at once at the
/// next walk.
#[derive(Default)]
struct Hints {
    /// Frame addresses, the latest innermost first.
    chain: Vec<u64>,
    /// Cframes its frame pointer named (3.11-3.12), the latest first.
    cframes: Vec<u64>,
    /// Code objects of its walks' frames (3.8-3.10), the latest first,
    /// whose zombie frame slots are copied last.
    codes: Vec<u64>,
    /// Generator frames and the caller each had when last seen running,
    /// the latest first: see [`walk_from`].
    gens: Vec<(u64, u64)>,
}

pub(crate) enum FrameErr {
    /// The chain changed under us (or pointed to garbage): retry or drop.
    Torn,
    Io(io::Error),
}

impl From<io::Error> for FrameErr {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ESRCH) => FrameErr::Io(e),
            _ => FrameErr::Torn,
        }
    }
}

impl CodeCache {
    fn entry(&mut self, t: &Target, code: u64) -> Result<Option<&CodeEntry>, FrameErr> {
        let l = &t.layout;
        let b = t.mem.read_vec(code, l.code_size_to_read)?;
        if let Some(ty) = t.code_type {
            if rd_u64(&b, l.object_type as usize) != ty {
                return Ok(None); // not a code object (3.13 shims), or torn
            }
        }
        let key = [
            rd_u64(&b, l.code_filename as usize),
            rd_u64(&b, l.code_name as usize),
            l.code_qualname.map(|o| rd_u64(&b, o as usize)).unwrap_or(0),
            rd_u64(&b, l.code_linetable as usize),
            rd_u32(&b, l.code_firstlineno as usize) as u64,
        ];
        let fresh = self.map.get(&code).is_some_and(|e| e.key == key);
        if !fresh {
            self.misses += 1;
            let name_ptr = if key[2] != 0 { key[2] } else { key[1] };
            let name = read_unicode(&t.mem, l, name_ptr)?;
            let file = read_unicode(&t.mem, l, key[0])?;
            let first = key[4] as i32;
            let tab = read_bytes_obj(&t.mem, l, key[3])?;
            let lines = match l.line_table {
                LineTable::Lnotab => parse_lnotab(&tab, first),
                LineTable::Linetable310 => parse_linetable_310(&tab, first),
                LineTable::Locations => parse_locations(&tab, first),
            };
            if self.map.len() > 100_000 {
                self.map.clear();
                self.spans.clear();
            }
            if let (Some(adaptive), true) = (l.code_code_adaptive, l.minor >= 14) {
                let units = rd_u64(&b, l.object_type as usize + 8);
                self.spans.insert(code, code + adaptive + 2 * units.min(1 << 24));
            }
            self.map.insert(code, CodeEntry { key, name, file, lines });
        }
        Ok(self.map.get(&code))
    }

    /// The cached code object whose bytecode holds `instr` (3.14+).
    fn code_at(&self, instr: u64) -> Option<u64> {
        let (&code, &end) = self.spans.range(..=instr).next_back()?;
        (instr < end).then_some(code)
    }
}

/// Pointer to the innermost frame of `tstate`.
fn top_frame(t: &Target, tstate: u64) -> io::Result<u64> {
    let l = &t.layout;
    let f = t.mem.u64(tstate + l.tstate_frame)?;
    match l.cframe_current_frame {
        Some(o) if f != 0 => t.mem.u64(f + o),
        Some(_) => Ok(0),
        None => Ok(f),
    }
}

/// Offset of a frame's "running" byte, and the values that mean running.
type LiveFlag = (usize, fn(u8) -> bool);

/// Where a 3.8–3.10 frame object says whether it is running
/// ([`Layout::frame_live`]), and which values mean it is (3.8/3.9
/// `f_executing` 1; 3.10 `f_state` EXECUTING or UNWINDING). A frame that
/// returned keeps its other fields, so a chain followed through a stale
/// pointer is told apart by this flag.
fn live_flag(l: &Layout) -> Option<LiveFlag> {
    let is_live: fn(u8) -> bool = if l.minor == 10 { |b| b == 0 || b == 2 } else { |b| b == 1 };
    l.frame_live.map(|o| (o as usize, is_live))
}

/// The zombie frame slot of the code object of a frame copied in `b`
/// (3.8-3.10, [`Layout::code_zombieframe`]): the frame the interpreter
/// keeps for that code object's next call, or 0 while it is in use. Read
/// from the snapshot, where the slots of the codes of the thread's previous
/// walk are copied after its frames.
///
/// A frame that returned keeps its code object and caller until reused,
/// and its code's zombie frame is only ever reused for a call of that code
/// object: so a frame that is (or, its slot taken, was) its code's zombie
/// still says which call it ran.
fn zombie_slot(t: &Target, snap: &Snapshot, b: &[u8]) -> Option<u64> {
    let off = t.layout.code_zombieframe?;
    let code = rd_u64(b, t.layout.frame_code as usize);
    (code != 0).then(|| snap.u64(code + off).map_or_else(|| t.mem.u64(code + off).ok(), Some))?
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// At the thread's outermost frame.
    Root,
    /// At a frame that was not a running frame when read (the stack moved
    /// under the reader, or the pointer was stale).
    Torn,
    /// Deeper than [`MAX_DEPTH`].
    Deep,
    /// A frame already seen: the chain loops.
    Cycle,
}

struct Walk {
    frames: Vec<Frame>,
    /// The first entry frame met (3.12: a frame the C stack owns).
    entry: Option<u64>,
    /// The innermost frame read was shown: a Python function's, not a
    /// shim's nor a torn one.
    top_shown: bool,
    /// Addresses of the frames visited, innermost first.
    chain: Vec<u64>,
    /// The code object field of each frame read, innermost first.
    codes: Vec<u64>,
    /// Generator frames met running, and their callers.
    gens: Vec<(u64, u64)>,
    /// A frame that was not running when copied was shown, the thread
    /// running (3.8-3.10).
    trusted: bool,
    /// The last frame read was running when copied.
    last_running: bool,
    end: End,
    evals: Evals,
}

/// Where each call of the interpreter's C evaluation function ends in a
/// walk's frames: a call runs one frame (3.8-3.10) or, from 3.11, the frames
/// pushed since it was entered (the outermost of them is marked: 3.11
/// `is_entry`, 3.12+ an entry frame owned by the C stack below it).
#[derive(Default)]
struct Evals {
    /// Per closed call, innermost first: one past its outermost shown frame.
    ends: Vec<usize>,
    /// Frames read (shown or not) since the last call closed.
    open: usize,
}

impl Evals {
    fn close(&mut self, shown: usize) {
        if self.open > 0 {
            self.ends.push(shown);
            self.open = 0;
        }
    }
}

/// Memory read in one `process_vm_readv`, before the walk: the frames of
/// the thread's previous walks, which a call-heavy program reuses depth for
/// depth (a LIFO free list, or its frame stack), and the pointers that say
/// which of them is innermost now. Read in one system call they are a
/// near-instant picture of the stack, where frame by frame reads take about
/// a microsecond each while the stack changes every few hundred
/// nanoseconds. Frames the walk meets elsewhere are read one by one.
///
/// The kernel pins and copies each remote iovec in turn (about half a
/// microsecond each here), so what is asked is merged into as few ranges
/// as it can be: frames in the same or adjacent pages are read as one (a
/// frame stack, or a C stack's cframes, in one copy), never a page nothing
/// was asked from (it may be a guard page, which would end the read).
///
/// Nothing the thread writes is copied before its frame pointer: the copy
/// takes those cache lines from the thread, whose next writes to them then
/// stall. Calls write a new frame's lines, so a copy of the frame stack
/// just before the pointer stretched them: the pointer then named the
/// caller more often than it runs (a 3-level call loop on 3.13, the sampler
/// on another CPU: the innermost at 25-29% of the samples against 36-41% by
/// py-spy's non-stopping reads, the outermost loop at 15-18% against 7%).
struct Snapshot {
    /// Copies by address, of the length asked.
    frames: HashMap<u64, Vec<u8>>,
}

impl Snapshot {
    /// Reads `asks` (address, length). The ranges are copied in the order
    /// of the first ask each holds.
    fn read(t: &Target, asks: &[(u64, usize)]) -> Snapshot {
        const PAGE: u64 = 4096;
        const MAX_RANGE: u64 = 256 << 10;
        // The kernel takes at most `UIO_MAXIOV` iovecs a call.
        const MAX_IOV: usize = 1024;
        // (address, length, rank in `asks`), in address order.
        let mut asks: Vec<(u64, usize, usize)> =
            asks.iter().enumerate().filter(|a| a.1 .0 != 0 && a.1 .1 > 0).map(|(i, a)| (a.0, a.1, i)).collect();
        asks.sort_unstable();
        // (start, end, first rank) of each range, in address order.
        let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
        for &(a, n, i) in &asks {
            let end = a.saturating_add(n as u64);
            match ranges.last_mut() {
                Some(r) if a / PAGE <= (r.1 - 1) / PAGE + 1 && end.max(r.1) - r.0 <= MAX_RANGE => {
                    r.1 = r.1.max(end);
                    r.2 = r.2.min(i);
                }
                _ => ranges.push((a, end, i)),
            }
        }
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_unstable_by_key(|&k| ranges[k].2);
        // What does not fit is what was asked last.
        order.truncate(MAX_IOV);
        let mut bufs: Vec<Vec<u8>> = order.iter().map(|&k| vec![0u8; (ranges[k].1 - ranges[k].0) as usize]).collect();
        let local: Vec<libc::iovec> =
            bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
        let remote: Vec<libc::iovec> = order
            .iter()
            .map(|&k| {
                let r = ranges[k];
                libc::iovec { iov_base: r.0 as usize as *mut libc::c_void, iov_len: (r.1 - r.0) as usize }
            })
            .collect();
        // SAFETY: `local` describes `bufs`, owned here and outliving the
        // call; the remote iovecs are only interpreted by the kernel.
        let n = unsafe {
            libc::process_vm_readv(t.mem.pid, local.as_ptr(), local.len() as _, remote.as_ptr(), remote.len() as _, 0)
        };
        // The kernel stops at the first remote iovec it cannot read: only
        // what came whole before it counts.
        let mut left = n.max(0) as u64;
        let mut frames = HashMap::with_capacity(asks.len());
        for (&k, b) in order.iter().zip(&bufs) {
            let r = ranges[k];
            if left < r.1 - r.0 {
                break;
            }
            left -= r.1 - r.0;
            let from = asks.partition_point(|a| a.0 < r.0);
            for &(a, n, _) in asks[from..].iter().take_while(|a| a.0 < r.1) {
                let at = (a - r.0) as usize;
                let e: &mut Vec<u8> = frames.entry(a).or_default();
                if n > e.len() {
                    *e = b[at..at + n].to_vec();
                }
            }
        }
        Snapshot { frames }
    }

    /// The pointer at `addr`, if it was asked for (or lies in what was).
    fn u64(&self, addr: u64) -> Option<u64> {
        self.frames.get(&addr).filter(|b| b.len() >= 8).map(|b| rd_u64(b, 0))
    }

    /// Candidate innermost frames of the snapshot itself: running frames
    /// that no other running frame of the snapshot has as its caller. Used
    /// when the stack moved between reading the thread's frame pointer and
    /// its frames; a frame that was popped and pushed again while the
    /// snapshot was copied leaves more than one.
    fn own_tops(&self, l: &Layout, live: LiveFlag) -> Vec<u64> {
        let running: Vec<(u64, u64)> = self
            .frames
            .iter()
            .filter(|(_, b)| b.len() > live.0 && b.len() >= l.frame_previous as usize + 8 && live.1(b[live.0]))
            .map(|(a, b)| (*a, rd_u64(b, l.frame_previous as usize)))
            .collect();
        let callers: HashSet<u64> = running.iter().map(|r| r.1).collect();
        running.iter().filter(|r| !callers.contains(&r.0)).map(|r| r.0).collect()
    }
}

/// Walks the stack of `tstate` once, leaf first, as far as it is valid.
/// With `last_resort`, a walk torn by the stack moving is replaced by one
/// found within the snapshot alone (see below).
fn walk_once(
    t: &Target,
    cache: &mut CodeCache,
    tstate: u64,
    last_resort: bool,
    still: bool,
) -> Result<Walk, io::Error> {
    let l = &t.layout;
    let live = live_flag(l);
    let size = l.frame_size_to_read;
    let mut hints = cache.threads.remove(&tstate).unwrap_or_default();
    let at = tstate + l.tstate_frame;
    let mut asks: Vec<(u64, usize)> = vec![(at, 8)];
    // Copied with the pointer, in the same range.
    let depth_at = l.tstate_recursion_depth.map(|o| tstate + o);
    asks.extend(depth_at.map(|a| (a, 4)));
    let entry_offset = cache.entry_offsets.iter().max_by_key(|e| *e.1).map(|e| *e.0).filter(|_| l.minor == 12);
    if let Some(off) = l.cframe_current_frame {
        // Each cframe's current frame and the cframe it was entered from,
        // and its call's entry frame.
        asks.extend(hints.cframes.iter().map(|c| (c + off, 16)));
        if let Some(d) = entry_offset {
            asks.extend(hints.cframes.iter().map(|&c| (c.wrapping_add(d as u64), size)));
        }
    }
    // The pointers first: a frame copied after them is the one they name,
    // or, if it returned meanwhile, still its content (or, 3.8-3.10 and
    // 3.14+, enough of it to tell).
    asks.extend(hints.chain.iter().take(MAX_DEPTH).map(|&a| (a, size)));
    // Last, whether a frame that returned is its code's zombie frame
    // ([`zombie_slot`]): a frame copied after it returned is then one.
    if let Some(off) = l.code_zombieframe.filter(|_| !still) {
        asks.extend(hints.codes.iter().map(|&c| (c + off, 8)));
    }
    let snap = Snapshot::read(t, &asks);
    // The cframe whose current frame the walk begins at, if known.
    let mut named = None;
    let top = match (snap.u64(at), l.cframe_current_frame) {
        (Some(top), None) => top,
        (Some(0), Some(_)) => 0,
        (Some(cframe), Some(off)) => {
            match current_frame(l, &snap, &hints.cframes, entry_offset, cframe, off, &mut || {
                let b = t.mem.read_vec(tstate + l.tstate_datastack?, 16).ok()?;
                Some((rd_u64(&b, 0), rd_u64(&b, 8)))
            }) {
                Some((c, top)) => {
                    named = Some(c);
                    top
                }
                None => {
                    hints.cframes.retain(|&c| c != cframe);
                    hints.cframes.insert(0, cframe);
                    hints.cframes.truncate(CFRAMES);
                    named = Some(cframe);
                    t.mem.u64(cframe + off)?
                }
            }
        }
        (None, _) => top_frame(t, tstate)?,
    };
    let from = if still { Top::Stopped } else { Top::Thread };
    let mut w = walk_from(t, cache, &snap, &hints.gens, top, size, from)?;
    let recursion_depth = depth_at.and_then(|a| snap.frames.get(&a)).map(|b| rd_u32(b, 0) as usize);
    let deep_enough = recursion_depth.is_some_and(|d| (w.chain.len()..=w.chain.len() + 1).contains(&d));
    if w.trusted && w.end == End::Root && !(deep_enough && w.last_running) {
        // A frame that returned was shown, and the walk through it is not
        // as deep as the stack was when its pointer was read, or does not
        // end at a running outermost frame: a frame of the free list,
        // handed to another depth since, took a part in it, or its link to
        // the next free frame was followed. (The depth counts a frame's
        // call of a C type too, `range(n)`: one more than the frames.)
        // The 20-deep recursion test found 2-3% of such walks with a wrong
        // outermost frame without the depth, 0.5% without the end.
        w.end = End::Torn;
    }
    if !still && !w.top_shown && !w.frames.is_empty() && w.end == End::Root {
        // The innermost frame, copied after the pointer, was not the one
        // it named (another call's frame, or its locals, had taken its
        // place: shown, its caller would be) or was a shim (the caller of
        // a short call that began meanwhile, 3.13+): read again.
        w.end = End::Torn;
    }
    if w.end == End::Torn && last_resort {
        // The stack moved on between the frame pointer and the frames: the
        // snapshot alone may still hold one whole stack. Every running
        // frame of the snapshot is walked from within it alone; of those
        // that reach the outermost frame, the deepest is kept (each of its
        // frames was running, the caller of the one before, when copied).
        // Only as a last resort: such a stack is one the thread was in
        // while the stack shrank under the copy, which favours callers
        // over their short callees if taken at every tear.
        let tops = live.map(|lv| snap.own_tops(l, lv)).unwrap_or_default();
        for own in tops {
            let again = walk_from(t, cache, &snap, &[], own, size, Top::Snapshot)?;
            if again.end == End::Root && (w.end != End::Root || again.frames.len() > w.frames.len()) {
                w = again;
            }
        }
    }
    // Addresses of this walk first, then those of earlier walks (the
    // deeper frames of a stack that was shallower just now).
    let bound = HINT_FRAMES.max(w.chain.len()).min(MAX_DEPTH);
    hints.chain = latest_first(w.chain.iter().copied(), &hints.chain, |&a| a, bound);
    hints.gens = latest_first(w.gens.iter().copied(), &hints.gens, |g| g.0, GENS);
    if l.code_zombieframe.is_some() {
        let codes = w.codes.iter().copied().filter(|&c| c != 0);
        hints.codes = latest_first(codes, &hints.codes, |&c| c, HINT_FRAMES);
    }
    if let (Some(c), Some(e), true) = (named, w.entry, l.minor == 12) {
        // The walk began at the current frame of cframe `c`: the first
        // entry frame it met is that call's own.
        *cache.entry_offsets.entry(e.wrapping_sub(c) as i64).or_default() += 1;
        if cache.entry_offsets.len() > 64 {
            cache.entry_offsets.retain(|_, n| *n > 1);
        }
    }
    cache.threads.insert(tstate, hints);
    if cache.threads.len() > 4096 {
        cache.threads.clear();
    }
    Ok(w)
}

/// What a thread's walks remember: this walk's `new` first, then those of
/// earlier walks (`old`) whose key it lacks, at most `bound`.
fn latest_first<T: Copy, K: std::hash::Hash + Eq>(
    new: impl IntoIterator<Item = T>,
    old: &[T],
    key: impl Fn(&T) -> K,
    bound: usize,
) -> Vec<T> {
    let mut have = HashSet::new();
    new.into_iter().chain(old.iter().copied()).filter(|x| have.insert(key(x))).take(bound).collect()
}

/// The innermost frame of a thread whose cframe pointer (3.11-3.12) read
/// `cframe`, and the cframe naming it, from the cframes of the same
/// snapshot; `None` if that cframe was not asked for (first seen).
///
/// The pointer and the cframes are read a fraction of a microsecond apart,
/// and a call of the interpreter from C (`__init__`, `__hash__`) may begin
/// or end in between: the caller's cframe then still names the caller, or
/// the callee's its entry frame. Both would charge the caller, and short
/// calls from C lost most of their samples that way. So the cframes copied
/// together in one range decide, at the instant of that copy: from the
/// pointer's cframe, up to the cframe it was entered from while its
/// current frame is its own entry frame (its call returned), down to a
/// known cframe entered from it whose entry frame is a live entry frame
/// whose caller is the current frame of the cframe above (a call began).
/// On 3.12 once the entry frame's place is known (`entry_offset`). On 3.11,
/// which has no entry frames, only down, to a cframe whose current frame
/// descends from a first frame (`is_entry`) entered from the current frame.
fn current_frame(
    l: &Layout,
    snap: &Snapshot,
    known: &[u64],
    entry_offset: Option<i64>,
    cframe: u64,
    off: u64,
    datastack_now: &mut dyn FnMut() -> Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    let size = l.frame_size_to_read;
    let cur = |c: u64| snap.u64(c + off);
    let previous = |c: u64| snap.frames.get(&(c + off)).filter(|b| b.len() >= 16).map(|b| rd_u64(b, 8));
    let mut c = cframe;
    let mut top = cur(c)?;
    if let Some(ie) = l.frame_is_entry {
        // 3.11 has no entry frames: a call from C marks its first frame.
        // Only "down" can be told: a known cframe entered from the current
        // one, whose current frame descends from a first frame entered
        // from the current frame above, and is still on the frame stack
        // (read once more now: a cframe and its frames stay in memory
        // after their call returned, until overwritten). A returned
        // cframe the pointer named still names its call's frame, as it
        // did when the pointer was read.
        let first_frame = |mut f: u64, caller: u64| {
            for _ in 0..64 {
                let b = snap.frames.get(&f).filter(|b| b.len() >= size)?;
                if b[ie as usize] != 0 {
                    return (rd_u64(b, l.frame_previous as usize) == caller).then_some(f);
                }
                f = rd_u64(b, l.frame_previous as usize);
            }
            None
        };
        let mut stack: Option<Option<(u64, u64)>> = None;
        for _ in 0..CFRAMES {
            let inner = known.iter().find_map(|&k| {
                let f = cur(k).filter(|&f| f != 0 && k != c && previous(k) == Some(c))?;
                Some((k, f, first_frame(f, top)?))
            });
            let Some((k, f, first)) = inner else { break };
            let Some((chunk, next)) = *stack.get_or_insert_with(&mut *datastack_now) else { break };
            if first < chunk || f >= next {
                break;
            }
            (c, top) = (k, f);
        }
        return Some((c, top));
    }
    let Some(d) = entry_offset else { return Some((c, top)) };
    let entry = |c: u64| c.wrapping_add(d as u64);
    // The entry frame of cframe `k`'s call, if it is one (owned by the C
    // stack) and was entered from frame `caller`.
    let entered_from = |k: u64, caller: u64| {
        let b = snap.frames.get(&entry(k)).filter(|b| b.len() >= size)?;
        let owner = l.frame_owner.map(|o| b[o as usize])?;
        (owner == FRAME_OWNED_BY_CSTACK && rd_u64(b, l.frame_previous as usize) == caller).then_some(())
    };
    for _ in 0..CFRAMES {
        match previous(c).filter(|p| top == entry(c) && known.contains(p)) {
            Some(p) => (c, top) = (p, cur(p)?),
            None => break,
        }
    }
    for _ in 0..CFRAMES {
        let inner = known.iter().find_map(|&k| {
            let f = cur(k).filter(|&f| f != 0 && f != entry(k))?;
            (k != c && previous(k) == Some(c) && entered_from(k, top).is_some()).then_some((k, f))
        });
        match inner {
            Some(next) => (c, top) = next,
            None => break,
        }
    }
    Some((c, top))
}

/// Where a walk's top (innermost) frame comes from, and so how far it is trusted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Top {
    /// The thread's frame pointer, the thread running: each frame must be
    /// running (or its code object's zombie frame, 3.8-3.10).
    Thread,
    /// The frame pointer of a stopped thread: its own, running or being
    /// entered or left.
    Stopped,
    /// A frame of the snapshot, walked within the snapshot alone.
    Snapshot,
}

/// Walks from frame `top`, using the snapshot's copies where it has them
/// (only them from [`Top::Snapshot`]).
///
/// A generator's frame found suspended (no caller: `yield` clears it) was
/// running when the pointer that led to it was read, called from the frame
/// that resumed it, which a loop over a generator keeps for many items: the
/// walk goes on from the caller the generator had when last seen running
/// (`gens`). Read again instead, a generator that yields every few hundred
/// nanoseconds lost a third of its samples to its consumer (a loop over a
/// generator, 3.9-3.13: 23-31% where py-spy, stopping the thread, gives
/// 37-43%).
fn walk_from(
    t: &Target,
    cache: &mut CodeCache,
    snap: &Snapshot,
    gens: &[(u64, u64)],
    top: u64,
    size: usize,
    from: Top,
) -> io::Result<Walk> {
    let l = &t.layout;
    let live = live_flag(l);
    let mut w = Walk {
        frames: Vec::new(),
        entry: None,
        top_shown: false,
        end: End::Root,
        chain: Vec::new(),
        codes: Vec::new(),
        gens: Vec::new(),
        trusted: false,
        last_running: false,
        evals: Evals::default(),
    };
    let mut seen = HashSet::new();
    let mut f = top;
    let mut depth = 0;
    let torn = |e: io::Error| if e.raw_os_error() == Some(libc::ESRCH) { Err(e) } else { Ok(End::Torn) };
    // A frame's copy: the snapshot's, or read now (`None`: neither).
    let copy = |f: u64| -> io::Result<Option<Vec<u8>>> {
        match snap.frames.get(&f).filter(|b| b.len() >= size) {
            Some(b) => Ok(Some(b.clone())),
            None if from == Top::Snapshot => Ok(None),
            None => t.mem.read_vec(f, size).map(Some),
        }
    };
    let running = |b: &[u8]| live.is_none_or(|(o, is_live)| is_live(b[o]));
    // The next frame's copy, when it was read to decide on this one.
    let mut ahead: Option<(u64, Vec<u8>)> = None;
    // Frames from the innermost on that had been popped when copied.
    let mut cleared = 0;
    // The owner of the last frame read (3.11+).
    let mut last_owner = None;
    while f != 0 {
        depth += 1;
        if depth > MAX_DEPTH {
            w.end = End::Deep;
            break;
        }
        if !seen.insert(f) {
            w.end = End::Cycle;
            break;
        }
        w.chain.push(f);
        let b = match ahead.take().filter(|a| a.0 == f) {
            Some((_, b)) => b,
            None => match copy(f) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    w.end = End::Torn;
                    break;
                }
                Err(e) => {
                    w.end = torn(e)?;
                    break;
                }
            },
        };
        // The frame's fields this walk reads, from its one copy.
        let code_raw = rd_u64(&b, l.frame_code as usize);
        let instr_raw = rd_u64(&b, l.frame_instr as usize);
        let mut prev = rd_u64(&b, l.frame_previous as usize);
        let owner = l.frame_owner.map(|o| b[o as usize]);
        last_owner = owner;
        w.codes.push(code_raw);
        w.last_running = running(&b);
        // A generator's frame with no caller is suspended: the caller that
        // resumed it last, if known.
        let gen = owner == Some(FRAME_OWNED_BY_GENERATOR) || l.frame_gen.is_some_and(|o| rd_u64(&b, o as usize) != 0);
        let mut resumed_by = None;
        if gen && from == Top::Thread {
            match prev {
                0 => resumed_by = gens.iter().find(|g| g.0 == f).map(|g| g.1),
                _ if w.last_running => w.gens.push((f, prev)),
                _ => {}
            }
        }
        if !w.last_running {
            // Not running when copied, but trusted: a stopped thread's own
            // innermost frame; or, named by the running thread or by a
            // running frame, a frame that returned (or was being entered)
            // during the copy ([`zombie_slot`]), shown if it is its code's
            // zombie frame; or if its caller, when copied, was running or
            // its own code's zombie; or if its code's zombie is in use
            // again and its caller runs other code (a recursion's frames
            // come from the free list, which puts a free frame of the same
            // code in a returned frame's caller's place).
            let slot = zombie_slot(t, snap, &b);
            let mut caller_vouches = || {
                let c = copy(prev).ok().flatten().filter(|c| {
                    running(c)
                        || zombie_slot(t, snap, c) == Some(prev)
                        || slot == Some(0) && rd_u64(c, l.frame_code as usize) != code_raw
                })?;
                ahead = Some((prev, c));
                Some(())
            };
            let trusted = depth == 1 && from == Top::Stopped
                || from == Top::Thread
                    && (slot == Some(f) || resumed_by.is_some() || prev != 0 && caller_vouches().is_some());
            if !trusted {
                w.end = End::Torn;
                break;
            }
            w.trusted |= from == Top::Thread;
        }
        if let Some(caller) = resumed_by {
            prev = caller;
        }
        // 3.14+: `f_executable` is a stack reference, its low bits a tag.
        let mut code = code_raw & !7;
        if code == 0 && cleared + 1 == depth && l.minor >= 14 && from != Top::Snapshot {
            // The innermost frame (or the caller of popped frames only)
            // returned after its pointer was read: 3.14+ clears its code
            // object reference when it pops it, but not its caller nor its
            // instruction pointer, into the code object's inline bytecode,
            // which tells the code object if it is cached.
            cleared += 1;
            code = cache.code_at(instr_raw).unwrap_or(0);
        }
        f = prev;
        // Highest owner value a frame can have: 3.14 added one (the C
        // stack's frames are 4, the interpreter's base frame 3).
        let max_owner = if l.minor >= 14 { FRAME_OWNED_BY_CSTACK + 1 } else { FRAME_OWNED_BY_CSTACK };
        if l.minor >= 12 && owner.is_some_and(|o| (FRAME_OWNED_BY_CSTACK..=max_owner).contains(&o)) {
            w.entry = w.entry.or(w.chain.last().copied());
            w.evals.close(w.frames.len());
            continue;
        }
        if owner.is_some_and(|o| o > max_owner) || code == 0 {
            w.end = End::Torn;
            break;
        }
        // This frame belongs to the open call, shown or not; a call that
        // runs one frame, or whose entry this frame is, closes after it.
        w.evals.open += 1;
        let closes = l.minor <= 10 || l.frame_is_entry.is_some_and(|o| b.get(o as usize).is_some_and(|&e| e != 0));
        let e = match cache.entry(t, code) {
            Ok(Some(e)) => Some(e),
            Ok(None) if l.minor >= 13 => None,
            Ok(None) | Err(FrameErr::Torn) => {
                w.end = End::Torn;
                break;
            }
            Err(FrameErr::Io(e)) => return Err(e),
        };
        if let Some(e) = e.filter(|e| !t.is_shim_code(code, &e.name, &e.file)) {
            let addr: i64 = match l.instr_kind {
                InstrKind::LastiBytes => (instr_raw as u32 as i32) as i64,
                InstrKind::LastiUnits => (instr_raw as u32 as i32) as i64 * 2,
                InstrKind::Pointer => {
                    let base = code + l.code_code_adaptive.unwrap_or(0);
                    (instr_raw as i64 - base as i64) / 2
                }
            };
            let line = e.lines.line(addr.clamp(0, u32::MAX as i64) as u32);
            w.top_shown |= depth == 1;
            w.frames.push(Frame::Function { name: e.name.clone(), file: e.file.clone(), line: line as i64 });
        }
        if closes {
            w.evals.close(w.frames.len());
        }
    }
    if w.end == End::Root && !can_be_outermost(l, last_owner) {
        w.end = End::Torn;
    }
    if w.end == End::Root {
        w.evals.close(w.frames.len());
    }
    Ok(w)
}

/// Whether a frame with no caller, owned by `owner`, can be a thread's
/// outermost frame: from 3.12 only a frame of the C stack (an entry frame,
/// or 3.14's base frame) is; on 3.11, any frame but a generator's. A
/// generator's frame loses its caller when it yields (`previous` is
/// cleared), so a walk that ends at one began at a generator that yielded
/// after its pointer was read, and whose callers are not known (see
/// [`walk_from`]). (Shown, such walks put generators' `yield` lines at the
/// root of short stacks: `black` on 3.12, a third of its CPU.) On 3.8-3.10
/// a yielded frame is not running, which [`walk_from`] already tells.
fn can_be_outermost(l: &Layout, owner: Option<u8>) -> bool {
    match owner {
        None => true,
        Some(o) if l.minor >= 12 => o >= FRAME_OWNED_BY_CSTACK,
        Some(o) => o != FRAME_OWNED_BY_GENERATOR,
    }
}

/// The frame that stands, at the root end of a kept sample, for the part
/// of the stack that could not be read.
pub const TRUNCATED: &str = "[truncated]";

/// One stack read.
#[derive(Debug)]
pub struct Stack {
    /// Innermost first; ending (root side) in a `[truncated]` frame when
    /// `truncated` is set.
    pub frames: Vec<Frame>,
    /// Why the stack could not be read to its outermost frame: it kept
    /// changing under the reader on every attempt, looped, or was deeper
    /// than [`MAX_DEPTH`].
    pub truncated: Option<End>,
    /// Per call of the interpreter's C evaluation function, innermost
    /// first: the index in `frames` one past the outermost frame it runs
    /// (how Python frames sit among native ones; complete only when the
    /// stack is not truncated).
    pub evals: Vec<usize>,
}

/// Reads the stack of `tstate`. Every frame is checked when read (a running
/// frame, a code object); a walk that meets one that is not, or loops, is
/// retried up to [`ATTEMPTS`] times, and the longest one is kept with a
/// `[truncated]` frame if none reaches the outermost frame. The first walk
/// that reaches it is kept even if the innermost frame moved on meanwhile:
/// each of its frames was the running caller of the one before when read,
/// and reading again until the stack holds still would favour the frames
/// that live longest (a caller over its short callees). Never drops a
/// sample. `still`: the thread is stopped (see [`crate::ptrace`]), so one
/// walk is all there is to read.
pub fn read_stack(t: &Target, cache: &mut CodeCache, tstate: u64, retries: &mut u64, still: bool) -> io::Result<Stack> {
    let mut longest: Option<Walk> = None;
    let attempts = if still { 1 } else { ATTEMPTS };
    for attempt in 0..attempts {
        if attempt > 0 {
            *retries += 1;
        }
        let w = walk_once(t, cache, tstate, attempt + 1 == attempts, still)?;
        match w.end {
            End::Root => return Ok(Stack { frames: w.frames, truncated: None, evals: w.evals.ends }),
            End::Deep => {
                longest = Some(w);
                break;
            }
            End::Torn | End::Cycle => {
                if longest.as_ref().is_none_or(|l| w.frames.len() > l.frames.len()) {
                    longest = Some(w);
                }
            }
        }
    }
    let w = longest.expect("at least one attempt");
    let mut frames = w.frames;
    frames.push(Frame::Synthetic(TRUNCATED.into()));
    Ok(Stack { frames, truncated: Some(w.end), evals: w.evals.ends })
}

/// Walks per stack read, at most.
const ATTEMPTS: u32 = 16;
/// Cframes remembered per thread (one per call of the interpreter from C
/// on its stack, usually a few), and moves up or down among them at most.
const CFRAMES: usize = 16;
/// Frame addresses remembered per thread beyond its last walk's.
const HINT_FRAMES: usize = 256;
/// Generators whose last caller is remembered, per thread.
const GENS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab() {
        // first line 10; bytes 0..6 -> 10, 6..8 -> 11, 8.. -> 13
        let r = parse_lnotab(&[6, 1, 2, 2], 10);
        assert_eq!(r.line(0), 10);
        assert_eq!(r.line(5), 10);
        assert_eq!(r.line(6), 11);
        assert_eq!(r.line(8), 13);
        assert_eq!(r.line(100), 13);
        // negative increments
        let r = parse_lnotab(&[4, 3, 4, 0xfe], 1);
        assert_eq!(r.line(0), 1);
        assert_eq!(r.line(4), 4);
        assert_eq!(r.line(8), 2);
    }

    #[test]
    fn linetable_310() {
        // (8 bytes, +0) line 5; (4 bytes, no line); (6 bytes, +2) line 7
        let r = parse_linetable_310(&[8, 0, 4, 0x80, 6, 2], 5);
        assert_eq!(r.line(0), 5);
        assert_eq!(r.line(7), 5);
        assert_eq!(r.line(8), -1);
        assert_eq!(r.line(12), 7);
        assert_eq!(r.line(17), 7);
    }

    #[test]
    fn locations_311() {
        // entry1: code 13 (no column), len 1, line delta +0 (svarint 0)
        // entry2: code 11 (one line, +1), len 2, then 2 column bytes
        // entry3: code 14 (long), len 3, line delta -1 (svarint 3), end delta 0, col 1, endcol 2
        // entry4: code 15 (none), len 1
        // entry5: code 0 (short), len 1, one byte
        let tab = [
            0x80 | (13 << 3),
            0x00,
            0x80 | (11 << 3) | 1,
            4,
            9,
            0x80 | (14 << 3) | 2,
            3,
            0,
            1,
            2,
            0x80 | (15 << 3),
            0x80,
            0x05,
        ];
        let r = parse_locations(&tab, 20);
        assert_eq!(r.line(0), 20);
        assert_eq!(r.line(1), 21);
        assert_eq!(r.line(2), 21);
        assert_eq!(r.line(3), 20);
        assert_eq!(r.line(5), 20);
        assert_eq!(r.line(6), -1);
        assert_eq!(r.line(7), 20);
        // varint with continuation: code 13, svarint 2*70=140 -> 0x40|12, 2
        let r = parse_locations(&[0x80 | (13 << 3), 0x40 | 12, 2], 1);
        assert_eq!(r.line(0), 71);
    }
}
