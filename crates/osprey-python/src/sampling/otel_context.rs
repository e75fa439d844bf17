//! The OpenTelemetry span a thread is in, read from the target (the Python
//! `opentelemetry-api`/`-sdk`, no change to the program).
//!
//! OTel's default runtime context is one `ContextVar` named
//! `current_context` (`opentelemetry.context._RUNTIME_CONTEXT.
//! _current_context`, found once through `sys.modules`). Its value in a
//! thread's current `contextvars.Context` ([`crate::target::contextvars`])
//! is an OTel `Context` (a `dict` subclass) whose key `current-span-<uuid>`
//! holds the current span (SDK `Span` or `NonRecordingSpan`); the span's
//! `_context` is a `SpanContext`, a `tuple` subclass (trace id, span id,
//! is remote, ...).
//!
//! A current span that is remote (another process's `SpanContext`, current
//! while no local span is) gives no span.
//!
//! Local root span: the SDK's `Span` keeps its parent's `SpanContext`
//! (`_parent`), not the parent span. A span whose parent is None or remote
//! is its own local root, and is remembered per trace id; a span with a
//! local parent gets the local root remembered for its trace, if one was
//! sampled, else 0 (unknown).
//!
//! Invariants: the main interpreter's variable only; a read does at most
//! [`BUDGET`] memory reads; every object's type is checked (types are
//! verified by name and flags once, then compared by address), so a torn
//! read gives no span, counted in [`SpanStats::torn`], never another's.
//! The context's variables are read before the stack and after the span
//! too: a thread that set or reset one during the stack or span read (an
//! asyncio task switch, a span begun or ended) gets [`Changed`], as the
//! span may not be the one the stack ran in; so does one not stopped whose read took over [`MAX_GAP`]
//! (the sampler preempted): a freed HAMT's memory is soon reused for the
//! next one of the same size, and enough time lets the thread reach a
//! state that reads the same. The sampler then reads stack and span
//! again. What does not change is kept for the process, not per thread (the
//! variable, the key objects, the verified classes): every thread shares
//! them. Until the module is found, `sys.modules`' new keys are looked at
//! when its size changed (checked every [`POLL`], two reads), all of them
//! every [`RETRY`]; a layout not recognised is said once ([`Spans::note`])
//! and not looked at again.
//!
//! What the reads verified (the variable, node types, classes, the span
//! key, where span classes keep `_context` and `_parent`) makes the
//! [`Recipe`] with which a running thread's span is copied at its sampling
//! interrupt instead ([`crate::sampling::span_copy`]; [`Spans::from_copy`]).

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use crate::layout::objects::{InstanceDict, TPFLAGS_INLINE_VALUES, TPFLAGS_MANAGED_DICT};
use crate::sampling::span_copy::{CopiedSpan, Recipe, SpanClass};
use crate::target::contextvars::{self, Mark, NodeKinds, Var};
use crate::target::pyobject::{Long, Reader, TPFLAGS_DICT_SUBCLASS, TPFLAGS_TUPLE_SUBCLASS};
use crate::target::Target;

/// How often to look for `opentelemetry.context` while it is not imported,
/// if `sys.modules` keeps its size.
pub const RETRY: Duration = Duration::from_secs(5);
/// How often to check the size of `sys.modules` meanwhile (programs import
/// OTel at start-up and begin spans at once).
pub const POLL: Duration = Duration::from_millis(20);
/// The longest time from [`Spans::mark`] to [`Spans::read`] whose span is
/// given: a stack read takes tens of microseconds, a sampler preempted on a
/// busy machine a few milliseconds (a shorter limit drops their spans).
pub const MAX_GAP: Duration = Duration::from_millis(10);
/// Memory reads per sample, at most.
pub const BUDGET: u32 = 64;
/// Memory reads to learn where a span class keeps its attributes, at most.
const CLASS_BUDGET: u32 = 256;
/// Memory reads to find the variable, at most.
const FIND_BUDGET: u32 = 8192;
/// Keys of `sys.modules` remembered as not OTel's, at most.
const MAX_SEEN: usize = 16384;
/// Local roots remembered (trace ids); the map is emptied when full.
const MAX_ROOTS: usize = 4096;
/// The prefix of the OTel `Context` key of the current span.
const SPAN_KEY: &str = "current-span-";
/// Characters of a `Context` key read (`current-span-` and a uuid4: 49).
const MAX_KEY: usize = 64;
/// Values of the variable, none an OTel `Context`, that make the layout
/// unrecognised.
const STRIKES: u32 = 3;

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The ids a sample in a span carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanIds {
    /// The W3C trace id (128 bits).
    pub trace_id: u128,
    /// The span's id.
    pub span_id: u64,
    /// The local root's span id (0: not known, see the module's doc).
    pub local_root_span_id: u64,
}

/// The thread's context changed while its stack was read: the span read
/// after it may not be the stack's (see [`Spans::read`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Changed;

/// A thread's context before its stack was read (see [`Spans::mark`]).
#[derive(Clone, Copy, Debug)]
pub struct Before {
    state: Mark,
    at: Instant,
    stopped: bool,
}

/// What span reads did.
#[derive(Clone, Debug, Default)]
pub struct SpanStats {
    /// Samples looked at (the variable known).
    pub lookups: u64,
    /// Samples given a span.
    pub found: u64,
    /// Reads that failed or met an unexpected object: no span given.
    pub torn: u64,
    /// Reads that gave [`Changed`]: the thread set or reset a variable
    /// while its stack was read, or the read took over [`MAX_GAP`].
    pub changed: u64,
    /// Memory reads done by the lookups.
    pub reads: u64,
    /// Samples whose span was copied at the interrupt with their stack.
    pub copied: u64,
    /// Copies at the interrupt without a span known (the walk met something
    /// the recipe does not have yet, or memory not resident): read from
    /// outside instead.
    pub not_copied: u64,
    /// Time the lookups took.
    pub time: Duration,
}

/// Where finding the variable stands.
enum Search {
    /// Not imported yet: when last looked or checked, when last looked, and
    /// the size of `sys.modules` then.
    Looked {
        checked: Instant,
        looked: Instant,
        modules: u64,
    },
    Found(Var),
    /// Imported, but not as expected: not looked at again.
    Unrecognised,
}

/// Key objects found last time (interned or module-constant strings).
#[derive(Default)]
struct Hints {
    module: u64,
    modules: u64,
    runtime: u64,
    var: u64,
    span_key: u64,
    context: u64,
    parent: u64,
}

/// The span of each sampled thread, read from the target.
pub struct Spans {
    search: Search,
    hints: Hints,
    kinds: NodeKinds,
    /// The OTel `Context` class and `SpanContext` class, once verified.
    context_class: Option<u64>,
    span_context_class: Option<u64>,
    /// Local root span id by trace id.
    roots: HashMap<u128, u64>,
    /// Classes of spans met, and for the first [`Recipe::classes`]' worth of
    /// those whose attributes the copy can read, where it finds them.
    span_classes: HashSet<u64>,
    copy_classes: Vec<SpanClass>,
    /// Keys of `sys.modules` seen not to be `opentelemetry.context` (see
    /// [`Spans::otel_module`]); emptied at every full look.
    not_otel: HashSet<u64>,
    /// A line for the user, once: why spans cannot be read.
    pub note: Option<String>,
    /// Values of the variable that were not an OTel `Context`.
    strikes: u32,
    /// What the reads did so far.
    pub stats: SpanStats,
}

impl Default for Spans {
    fn default() -> Self {
        Spans {
            search: Search::Looked { checked: Instant::now() - RETRY, looked: Instant::now() - RETRY, modules: 0 },
            hints: Hints::default(),
            kinds: NodeKinds::default(),
            context_class: None,
            span_context_class: None,
            roots: HashMap::new(),
            span_classes: HashSet::new(),
            copy_classes: Vec::new(),
            not_otel: HashSet::new(),
            note: None,
            strikes: 0,
            stats: SpanStats::default(),
        }
    }
}

impl Spans {
    /// Whether spans are read (the variable was found): a stack then has to
    /// be read between [`Spans::mark`] and [`Spans::read`], not copied
    /// earlier, or it could get a span it did not run in.
    pub fn found(&self) -> bool {
        matches!(self.search, Search::Found(_))
    }

    /// What to pass to [`Spans::read`], read before the thread's stack: the
    /// state of its context's variables then (default: none, or spans not
    /// read), and when; `stopped`: the thread stands still until then (no
    /// time limit).
    pub fn mark(&mut self, t: &Target, tstate: u64, stopped: bool) -> Before {
        let at = Instant::now();
        if !self.found() {
            return Before { state: Mark::default(), at, stopped };
        }
        let r = Reader::new(t, contextvars::STATE_READS);
        let state = contextvars::state(&r, tstate).ok().flatten().map(|s| s.0).unwrap_or_default();
        self.stats.reads += r.reads() as u64;
        Before { state, at, stopped }
    }

    /// The span the thread whose state is at `tstate` is in, if any, read
    /// after its stack; [`Changed`] if its context's variables are no
    /// longer `mark` (from [`Spans::mark`], before the stack): the span may
    /// have begun or ended meanwhile.
    pub fn read(&mut self, t: &Target, tstate: u64, mark: Before) -> Result<Option<SpanIds>, Changed> {
        let var = match self.search {
            Search::Found(v) => v,
            Search::Looked { checked, looked, modules } if checked.elapsed() >= POLL => {
                let now_modules = modules_len(t).unwrap_or(modules);
                if now_modules == modules && looked.elapsed() < RETRY {
                    self.search = Search::Looked { checked: Instant::now(), looked, modules };
                    return Ok(None);
                }
                self.find_var(t, now_modules, looked);
                match self.search {
                    Search::Found(v) => v,
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let start = Instant::now();
        let r = Reader::new(t, BUDGET);
        let got = self.span_of(&r, tstate, var, mark);
        self.stats.lookups += 1;
        self.stats.reads += r.reads() as u64;
        self.stats.time += start.elapsed();
        match got {
            Ok(Ok(Some(ids))) => {
                self.stats.found += 1;
                Ok(Some(ids))
            }
            Ok(Ok(None)) => Ok(None),
            Ok(Err(Changed)) => {
                self.stats.changed += 1;
                Err(Changed)
            }
            Err(_) => {
                self.stats.torn += 1;
                Ok(None)
            }
        }
    }

    /// Says once (in the session's warnings) why spans will not be read.
    fn unrecognised(&mut self, why: String) {
        if self.note.is_none() {
            self.note = Some(format!("OpenTelemetry context not recognised ({why}): Python samples carry no span ids"));
        }
    }

    /// Finds `opentelemetry.context._RUNTIME_CONTEXT._current_context`
    /// (`sys.modules` has `modules` entries); every key of `sys.modules` is
    /// looked at if the last full look, at `looked`, was [`RETRY`] ago.
    fn find_var(&mut self, t: &Target, modules: u64, looked: Instant) {
        let now = Instant::now();
        let full = looked.elapsed() >= RETRY;
        let looked = if full { now } else { looked };
        self.search = Search::Looked { checked: now, looked, modules };
        let Ok(interp) = t.interp_head() else { return };
        let r = Reader::new(t, FIND_BUDGET);
        let Some(module) = self.otel_module(&r, interp, full) else { return };
        let h = &mut self.hints;
        // The module is in `sys.modules` while its body runs: until it has
        // made its runtime context, it is looked at again at the next poll.
        let runtime = match r.module_global(module, "_RUNTIME_CONTEXT", &mut h.runtime) {
            Ok(Some(rt)) => rt,
            _ => {
                self.search = Search::Looked { checked: now, looked: now - RETRY, modules };
                return;
            }
        };
        let found = (|| -> Result<Var, String> {
            let attrs = r.attrs(runtime).map_err(|e| format!("runtime context: {e}"))?;
            let var =
                r.find(&attrs, "_current_context", &mut h.var).ok_or("a runtime context other than contextvars")?;
            let (name, _) = r.type_info(r.type_of(var).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            let var_name = r.u64(var + t.layout.objects.contextvar_name).map_err(|e| e.to_string())?;
            if !name.ends_with("ContextVar") || !r.str_is(var_name, "current_context") {
                return Err(format!("_current_context is a {name}"));
            }
            Var::read(&r, var).map_err(|e| e.to_string())
        })();
        match found {
            Ok(v) => self.search = Search::Found(v),
            Err(why) => {
                self.search = Search::Unrecognised;
                self.unrecognised(why);
            }
        }
    }

    /// `sys.modules["opentelemetry.context"]` in interpreter `interp`,
    /// checking only the keys not seen before (a program importing many
    /// modules at start-up is not scanned whole at every poll); `full`:
    /// every key, and the `sys` dict's `modules` if the interpreter's
    /// cannot be read.
    fn otel_module(&mut self, r: &Reader, interp: u64, full: bool) -> Option<u64> {
        if full {
            self.not_otel.clear();
        }
        let o = r.target().layout.objects;
        let Ok(entries) = r.u64(interp + o.interp_modules).and_then(|m| r.dict(m)) else {
            let h = &mut self.hints;
            return r.sys_module(interp, "opentelemetry.context", &mut h.module, &mut h.modules).ok().flatten();
        };
        for (k, v) in entries {
            if self.not_otel.contains(&k) {
                continue;
            }
            if r.str_is(k, "opentelemetry.context") {
                return Some(v);
            }
            if self.not_otel.len() < MAX_SEEN {
                self.not_otel.insert(k);
            }
        }
        None
    }

    /// Is `ty` the class `name` with `flag` set? Remembered in `slot` once so.
    fn verified(r: &Reader, slot: &mut Option<u64>, ty: u64, name: &str, flag: u64) -> io::Result<bool> {
        if *slot == Some(ty) {
            return Ok(true);
        }
        let (n, flags) = r.type_info(ty)?;
        let ok = n == name && flags & flag != 0;
        if ok && slot.is_none() {
            *slot = Some(ty);
        }
        Ok(ok)
    }

    fn span_of(
        &mut self,
        r: &Reader,
        tstate: u64,
        var: Var,
        mark: Before,
    ) -> io::Result<Result<Option<SpanIds>, Changed>> {
        let Some((now, root)) = contextvars::state(r, tstate)? else { return Ok(Ok(None)) };
        if now != mark.state || (!mark.stopped && mark.at.elapsed() > MAX_GAP) {
            return Ok(Err(Changed));
        }
        let span = self.span_in(r, root, var)?;
        // A running thread may end its span during the span's own reads, and
        // the objects freed be reused at once: ids of two spans mixed.
        if !mark.stopped && contextvars::state(r, tstate)?.map(|s| s.0) != Some(mark.state) {
            return Ok(Err(Changed));
        }
        Ok(Ok(span))
    }

    /// The span in the context variables whose HAMT root is `root`.
    fn span_in(&mut self, r: &Reader, root: u64, var: Var) -> io::Result<Option<SpanIds>> {
        let Some(ctx) = contextvars::lookup(r, &mut self.kinds, root, var)? else { return Ok(None) };
        let ty = r.type_of(ctx)?;
        if !Self::verified(r, &mut self.context_class, ty, "Context", TPFLAGS_DICT_SUBCLASS)? {
            // Never an OTel Context, several times over: not a torn read.
            self.strikes += 1;
            if self.context_class.is_none() && self.strikes >= STRIKES {
                let (n, _) = r.type_info(ty)?;
                self.search = Search::Unrecognised;
                self.unrecognised(format!("current_context holds a {n}"));
            }
            return Err(bad("not an OTel Context"));
        }
        let entries = r.dict_of(ctx, Some(ty))?;
        let span = match entries.iter().find(|e| e.0 == self.hints.span_key) {
            Some(&(_, v)) => v,
            None => {
                let key =
                    entries.iter().find(|e| r.str(e.0, MAX_KEY, Long::Cut).is_ok_and(|k| k.starts_with(SPAN_KEY)));
                let Some(&(k, v)) = key else { return Ok(None) };
                self.hints.span_key = k;
                v
            }
        };
        let attrs = r.attrs(span)?;
        let sc = r.find(&attrs, "_context", &mut self.hints.context).ok_or_else(|| bad("span without _context"))?;
        let (trace_id, span_id, remote) = self.span_context(r, sc)?;
        if trace_id == 0 || span_id == 0 || remote {
            // The invalid span (OTel's "no span"), or another process's: a
            // propagated parent is current while no local span is (a server
            // attaches it before its span starts, and after it ends).
            return Ok(None);
        }
        // SDK spans have a `_parent` (None for a root); others do not.
        let local_root = match r.find(&attrs, "_parent", &mut self.hints.parent) {
            Some(p) if Some(p) == r.target().none_obj => true,
            Some(p) => self.span_context(r, p)?.2,
            None => false,
        };
        if self.span_classes.len() < 16 {
            self.learn_class(r, span);
        }
        Ok(Some(self.ids(trace_id, span_id, local_root)))
    }

    /// The ids of a local span, its local root remembered or looked up.
    fn ids(&mut self, trace_id: u128, span_id: u64, local_root: bool) -> SpanIds {
        let local_root_span_id = if local_root {
            if self.roots.len() >= MAX_ROOTS && !self.roots.contains_key(&trace_id) {
                self.roots.clear();
            }
            self.roots.insert(trace_id, span_id);
            span_id
        } else {
            self.roots.get(&trace_id).copied().unwrap_or(0)
        };
        SpanIds { trace_id, span_id, local_root_span_id }
    }

    /// The span a copy made at the interrupt holds (see
    /// [`crate::sampling::span_copy`]); `Err` where it holds none known: the
    /// caller reads from outside.
    pub fn from_copy(&mut self, c: CopiedSpan) -> Result<Option<SpanIds>, Changed> {
        let got = match c {
            CopiedSpan::Unknown => {
                self.stats.not_copied += 1;
                return Err(Changed);
            }
            CopiedSpan::None => None,
            CopiedSpan::Span { trace_id, span_id, remote, .. } if trace_id == 0 || span_id == 0 || remote => None,
            CopiedSpan::Span { trace_id, span_id, local_root, .. } => {
                Some(self.ids(trace_id, span_id, local_root.unwrap_or(false)))
            }
        };
        self.stats.copied += 1;
        self.stats.found += got.is_some() as u64;
        Ok(got)
    }

    /// What the copy at the interrupt compares with, as verified so far.
    pub fn recipe(&self, t: &Target) -> Recipe {
        let Search::Found(var) = self.search else { return Recipe::default() };
        let (bitmap_node, array_node) = self.kinds.node_types();
        let mut classes = [SpanClass::default(); 2];
        for (c, k) in classes.iter_mut().zip(&self.copy_classes) {
            *c = *k;
        }
        Recipe {
            var: var.addr,
            hash: var.hash as u32,
            bitmap_node,
            array_node,
            context_class: self.context_class.unwrap_or(0),
            span_key: self.hints.span_key,
            span_context_class: self.span_context_class.unwrap_or(0),
            none: t.none_obj.unwrap_or(0),
            dict: t.dict_type.unwrap_or(0),
            classes,
        }
    }

    /// Notes where the class of `span` (a span just read whole) keeps
    /// `_context` and `_parent`, if the copy can read its instances there:
    /// their shared keys, in a values array.
    fn learn_class(&mut self, r: &Reader, span: u64) {
        let Ok(ty) = r.type_of(span) else { return };
        if !self.span_classes.insert(ty) || self.copy_classes.len() >= 2 {
            return;
        }
        let t = r.target();
        // Once per class: a budget of its own (a class has tens of attributes).
        let r = &Reader::new(t, CLASS_BUDGET);
        let o = &t.layout.objects;
        let Ok((flags, basic, dictoffset)) = r.instance_slots(ty) else { return };
        let param = match o.instance_dict {
            InstanceDict::TypeOffset => dictoffset,
            InstanceDict::ValuesOrDict | InstanceDict::Tagged if flags & TPFLAGS_MANAGED_DICT != 0 => 0,
            InstanceDict::Inline if flags & TPFLAGS_INLINE_VALUES != 0 => basic,
            _ => return,
        };
        if o.instance_dict == InstanceDict::TypeOffset && !(1..=1 << 16).contains(&param) {
            return;
        }
        let Ok(keys) = r.u64(ty + o.heap_type_cached_keys) else { return };
        let Ok(names) = r.shared_keys(keys) else { return };
        let slot = |name: &str| names.iter().position(|&k| k != 0 && r.str_is(k, name)).map(|i| i as u64);
        let Some(context_slot) = slot("_context") else { return };
        self.copy_classes.push(SpanClass { ty, param, keys, context_slot, parent_slot: slot("_parent") });
    }

    /// (trace id, span id, is remote) of the `SpanContext` at `addr`.
    fn span_context(&mut self, r: &Reader, addr: u64) -> io::Result<(u128, u64, bool)> {
        let (ty, len, items) = r.tuple(addr, 3)?;
        if len < 3 || !Self::verified(r, &mut self.span_context_class, ty, "SpanContext", TPFLAGS_TUPLE_SUBCLASS)? {
            return Err(bad("not a SpanContext"));
        }
        let trace_id = r.uint(items[0], 5)?;
        let span_id = u64::try_from(r.uint(items[1], 3)?).map_err(|_| bad("span id beyond 64 bits"))?;
        let remote = match r.target().true_obj {
            Some(t) => items[2] == t,
            None => false,
        };
        Ok((trace_id, span_id, remote))
    }
}

/// The number of entries of the main interpreter's `sys.modules`.
fn modules_len(t: &Target) -> io::Result<u64> {
    let r = Reader::new(t, 3);
    let o = &t.layout.objects;
    let modules = r.u64(t.interp_head()? + o.interp_modules)?;
    r.u64(modules + o.dict_used)
}
