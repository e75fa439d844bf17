//! Tag keys (at most [`TAG_SLOTS`] names, one per record slot) and interned
//! tag values (strings -> nonzero `u32` ids).
//!
//! Writer and exporter side only: everything here locks and allocates and
//! must never be reached from a signal handler. The handler only copies ids.
//! [`value_bytes`] is the writer's lock-free way from an id to its string
//! (the OTEP attributes carry the strings).
//!
//! Invariants:
//! - A key name keeps its slot for the life of the process (slots are never
//!   reassigned), so a slot in an old sample still names the same key.
//! - A value id is never reused or changed; id 0 is never handed out (it means
//!   "unset"). Ids run `1..=MAX_TAG_VALUES`, then every new string maps to
//!   [`OVERFLOW_VALUE_ID`].

use super::TAG_SLOTS;
use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};

/// Distinct tag values kept; later new values share [`OVERFLOW_VALUE_ID`].
pub const MAX_TAG_VALUES: usize = 1 << 16;

/// Id standing for "a value past [`MAX_TAG_VALUES`]"; exported as [`OVERFLOW_VALUE`].
pub const OVERFLOW_VALUE_ID: u32 = u32::MAX;

/// The string exported for [`OVERFLOW_VALUE_ID`].
pub const OVERFLOW_VALUE: &str = "osprey:overflow";

/// Longest key name accepted, in bytes.
pub const MAX_KEY_LEN: usize = 128;

struct Tables {
    ids: HashMap<&'static str, u32>,
    /// `values[id - 1]` is the string of `id` (leaked: ids live forever).
    values: Vec<&'static str>,
}

/// Ids per chunk of the lock-free id -> string table.
const CHUNK: usize = 256;

/// One chunk: (pointer, length) of each id's string; pointer null = not yet.
type Chunk = [(AtomicPtr<u8>, AtomicUsize); CHUNK];

/// The lock-free id -> string table, chunks allocated under the tables lock
/// and never freed. Entry `id - 1`.
static BYTES: [AtomicPtr<Chunk>; MAX_TAG_VALUES / CHUNK] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_TAG_VALUES / CHUNK];

static TABLES: LazyLock<Mutex<Tables>> =
    LazyLock::new(|| Mutex::new(Tables { ids: HashMap::new(), values: Vec::new() }));
/// Each slot's key name, slots taken in order, set under the tables lock
/// (which serialises registration) and read without it: the exporter never
/// waits on that lock, which a thread of the parent may have held at a `fork`
/// (it stays held in the child, where that thread does not exist).
static KEY_NAMES: [OnceLock<&'static str>; TAG_SLOTS] = [const { OnceLock::new() }; TAG_SLOTS];

static OVERFLOWED: AtomicU64 = AtomicU64::new(0);

fn tables() -> MutexGuard<'static, Tables> {
    // A panic while holding the lock cannot leave the tables inconsistent
    // (each update is a single push/insert), so poisoning is ignored.
    TABLES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Slot of tag key `name`, registering it if there is room. `None` for an
/// empty or over-long name, or when all [`TAG_SLOTS`] slots are taken.
pub fn tag_key(name: &str) -> Option<usize> {
    if name.is_empty() || name.len() > MAX_KEY_LEN {
        return None;
    }
    // Held to serialise registrations; the names are in `KEY_NAMES`.
    let t = tables();
    if let Some(i) = find_tag_key(name) {
        return Some(i);
    }
    let slot = registered_keys().count();
    KEY_NAMES.get(slot)?.set(Box::leak(name.into())).ok()?;
    drop(t);
    // The OTEP attribute key map names slots: readers learn the new one.
    super::process_ctx::keys_changed();
    Some(slot)
}

/// The registered key names, by slot.
fn registered_keys() -> impl Iterator<Item = &'static str> {
    KEY_NAMES.iter().map_while(|k| k.get().copied())
}

/// Every registered key name, by slot.
pub fn tag_keys() -> Vec<String> {
    registered_keys().map(str::to_string).collect()
}

/// Slot of an already registered key (never registers).
pub fn find_tag_key(name: &str) -> Option<usize> {
    registered_keys().position(|k| k == name)
}

/// Name of the key in `slot`, if registered. For the exporter: no lock.
pub fn tag_key_name(slot: usize) -> Option<String> {
    KEY_NAMES.get(slot)?.get().map(|k| k.to_string())
}

/// Id of `value`, interning it on first use. Never 0.
pub fn intern_value(value: &str) -> u32 {
    let mut t = tables();
    if let Some(&id) = t.ids.get(value) {
        return id;
    }
    if t.values.len() >= MAX_TAG_VALUES {
        OVERFLOWED.fetch_add(1, Relaxed);
        return OVERFLOW_VALUE_ID;
    }
    let s: &'static str = Box::leak(value.into());
    t.values.push(s);
    let id = t.values.len() as u32;
    t.ids.insert(s, id);
    publish_bytes(id, s);
    id
}

/// Makes `s` the lock-free string of `id`. Called with the tables lock held
/// (the only writer).
fn publish_bytes(id: u32, s: &'static str) {
    let i = id as usize - 1;
    let slot = &BYTES[i / CHUNK];
    let mut chunk = slot.load(Acquire);
    if chunk.is_null() {
        let fresh: Box<Chunk> =
            Box::new([const { (AtomicPtr::new(core::ptr::null_mut()), AtomicUsize::new(0)) }; CHUNK]);
        chunk = Box::into_raw(fresh);
        slot.store(chunk, Release);
    }
    // SAFETY: chunks are never freed.
    let (p, n) = unsafe { &(*chunk)[i % CHUNK] };
    n.store(s.len(), Relaxed);
    // Release: a reader that sees the pointer sees the length.
    p.store(s.as_ptr() as *mut u8, Release);
}

/// UTF-8 bytes of value `id`, without locking (`None` for 0 or an id never
/// handed out). Not signal-safe only in name: loads only, no allocation.
#[inline]
pub fn value_bytes(id: u32) -> Option<&'static [u8]> {
    if id == OVERFLOW_VALUE_ID {
        return Some(OVERFLOW_VALUE.as_bytes());
    }
    let i = (id as usize).checked_sub(1)?;
    let chunk = BYTES.get(i / CHUNK)?.load(Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: chunks are never freed.
    let (p, n) = unsafe { &(*chunk)[i % CHUNK] };
    let p = p.load(Acquire);
    // SAFETY: a published pointer is a leaked `&'static str` of length `n`.
    (!p.is_null()).then(|| unsafe { core::slice::from_raw_parts(p, n.load(Relaxed)) })
}

/// String of value `id` (`None` for 0 or an id never handed out). For the
/// exporter: no lock (see [`value_bytes`]).
pub fn tag_value(id: u32) -> Option<String> {
    value_bytes(id).map(|b| String::from_utf8_lossy(b).into_owned())
}

/// How many times a new value was mapped to [`OVERFLOW_VALUE_ID`].
pub fn tag_values_overflowed() -> u64 {
    OVERFLOWED.load(Relaxed)
}
