//! Tag keys (at most [`TAG_SLOTS`] names, one per record slot) and interned
//! tag values (strings -> nonzero `u32` ids).
//!
//! Writer and exporter side only: everything here locks and allocates and
//! must never be reached from a signal handler. The handler only copies ids.
//!
//! Invariants:
//! - A key name keeps its slot for the life of the process (slots are never
//!   reassigned), so a slot in an old sample still names the same key.
//! - A value id is never reused or changed; id 0 is never handed out (it means
//!   "unset"). Ids run `1..=MAX_TAG_VALUES`, then every new string maps to
//!   [`OVERFLOW_VALUE_ID`].

use super::TAG_SLOTS;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Distinct tag values kept; later new values share [`OVERFLOW_VALUE_ID`].
pub const MAX_TAG_VALUES: usize = 1 << 16;

/// Id standing for "a value past [`MAX_TAG_VALUES`]"; exported as [`OVERFLOW_VALUE`].
pub const OVERFLOW_VALUE_ID: u32 = u32::MAX;

/// The string exported for [`OVERFLOW_VALUE_ID`].
pub const OVERFLOW_VALUE: &str = "osprey:overflow";

/// Longest key name accepted, in bytes.
pub const MAX_KEY_LEN: usize = 128;

struct Tables {
    keys: Vec<Box<str>>,
    ids: HashMap<Box<str>, u32>,
    /// `values[id - 1]` is the string of `id`.
    values: Vec<Box<str>>,
}

static TABLES: LazyLock<Mutex<Tables>> =
    LazyLock::new(|| Mutex::new(Tables { keys: Vec::new(), ids: HashMap::new(), values: Vec::new() }));
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
    let mut t = tables();
    if let Some(i) = t.keys.iter().position(|k| &**k == name) {
        return Some(i);
    }
    if t.keys.len() >= TAG_SLOTS {
        return None;
    }
    t.keys.push(name.into());
    Some(t.keys.len() - 1)
}

/// Slot of an already registered key (never registers).
pub fn find_tag_key(name: &str) -> Option<usize> {
    tables().keys.iter().position(|k| &**k == name)
}

/// Name of the key in `slot`, if registered. For the exporter.
pub fn tag_key_name(slot: usize) -> Option<String> {
    tables().keys.get(slot).map(|k| k.to_string())
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
    let s: Box<str> = value.into();
    t.values.push(s.clone());
    let id = t.values.len() as u32;
    t.ids.insert(s, id);
    id
}

/// String of value `id` (`None` for 0 or an id never handed out). For the exporter.
pub fn tag_value(id: u32) -> Option<String> {
    if id == OVERFLOW_VALUE_ID {
        return Some(OVERFLOW_VALUE.to_string());
    }
    let i = (id as usize).checked_sub(1)?;
    tables().values.get(i).map(|v| v.to_string())
}

/// How many times a new value was mapped to [`OVERFLOW_VALUE_ID`].
pub fn tag_values_overflowed() -> u64 {
    OVERFLOWED.load(Relaxed)
}
