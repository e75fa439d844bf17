//! The OTEP 4719 process context: a one-page mapping named `OTEL_CTX`
//! (memfd, else anonymous) whose 32-byte header points at a protobuf
//! `ProcessContext { resource = 1; extra_attributes = 2 }`. Osprey publishes
//! the OTEP 4947 thread-context reference data in it:
//! `threadlocal.schema_version = "tlsdesc_v1_dev"` and
//! `threadlocal.attribute_key_map` = the tag keys by slot (an attribute's key
//! index in a thread record is its tag slot), plus `service.name` from
//! `OTEL_SERVICE_NAME` when set.
//!
//! Header (native endian): `"OTEL_CTX"` at 0, version u32 at 8 (2), payload
//! size u32 at 12, `published_at_ns` u64 at 16 (0 while an update is in
//! progress), payload pointer at 24. Readers re-check `published_at_ns` after
//! copying the payload (a seqlock), so the writer fences between steps.
//!
//! Writer side only (locks, allocates, system calls); a payload once
//! published is never freed, as a reader may still be copying it.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

/// The schema of osprey's thread records (`crate::record::OtelRecord`).
pub const SCHEMA_VERSION: &str = "tlsdesc_v1_dev";

/// Header format version.
pub const VERSION: u32 = 2;

/// Name of the mapping (memfd name and anonymous VMA name).
pub const NAME: &str = "OTEL_CTX";

const PAGE: usize = 4096;

#[repr(C)]
struct Header {
    signature: AtomicU64,
    version: AtomicU32,
    payload_size: AtomicU32,
    published_at_ns: AtomicU64,
    payload: AtomicU64,
}

/// The published header (`None` until [`publish`] succeeded).
static HEADER: Mutex<Option<usize>> = Mutex::new(None);

/// How long after the agent's start the collector publishes (0: not left to it).
static LATER_MS: AtomicU64 = AtomicU64::new(0);

/// Leaves the first [`publish`] to the collector thread, `after` the
/// agent's start: a process that ends sooner (a build's compiler runs, a
/// shell's commands) publishes nothing and pays nothing for it.
pub fn publish_later(after: std::time::Duration) {
    LATER_MS.store((after.as_millis() as u64).max(1), Release);
}

/// Whether a publication is left to the collector: `Some(after)` once.
pub(crate) fn take_later() -> Option<std::time::Duration> {
    match LATER_MS.swap(0, AcqRel) {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    }
}

/// Publishes the process context (or updates it). `Err` names the failing
/// step; profiling does not depend on it.
pub fn publish() -> Result<(), &'static str> {
    let mut h = HEADER.lock().unwrap_or_else(|e| e.into_inner());
    let payload: &'static [u8] = Box::leak(encode(&resource(), &super::tag_keys()).into_boxed_slice());
    let header = match *h {
        Some(addr) => addr as *const Header,
        None => {
            let addr = map()?;
            *h = Some(addr as usize);
            addr
        }
    };
    // SAFETY: the mapping is a page, never unmapped, and only written here
    // under `HEADER`'s lock.
    let hd = unsafe { &*header };
    let previous = hd.published_at_ns.load(Relaxed);
    hd.published_at_ns.store(0, Relaxed);
    fence(SeqCst);
    hd.version.store(VERSION, Relaxed);
    hd.payload_size.store(payload.len() as u32, Relaxed);
    hd.payload.store(payload.as_ptr() as u64, Relaxed);
    fence(SeqCst);
    // A reader tells updates apart by this value: it must change.
    hd.published_at_ns.store(realtime_ns().max(previous + 1), Release);
    if hd.signature.load(Relaxed) == 0 {
        fence(SeqCst);
        hd.signature.store(u64::from_ne_bytes(*b"OTEL_CTX"), Release);
    }
    name_mapping(header.cast());
    Ok(())
}

/// Re-publishes after a tag key was registered, if published at all.
pub(super) fn keys_changed() {
    let published = HEADER.lock().unwrap_or_else(|e| e.into_inner()).is_some();
    if published {
        let _ = publish();
    }
}

/// Resource attributes: `service.name` from `OTEL_SERVICE_NAME`.
fn resource() -> Vec<(String, String)> {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| ("service.name".into(), s))
        .into_iter()
        .collect()
}

/// A page from a memfd named [`NAME`] (shown as `/memfd:OTEL_CTX` in maps),
/// else anonymous; not inherited by forks.
fn map() -> Result<*const Header, &'static str> {
    // SAFETY: plain system calls on a descriptor this function owns.
    unsafe {
        let name = c"OTEL_CTX";
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        let mut addr = libc::MAP_FAILED;
        if fd >= 0 {
            if libc::ftruncate(fd, PAGE as libc::off_t) == 0 {
                addr = libc::mmap(
                    core::ptr::null_mut(),
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                );
            }
            libc::close(fd);
        }
        if addr == libc::MAP_FAILED {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            addr = libc::mmap(core::ptr::null_mut(), PAGE, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        }
        if addr == libc::MAP_FAILED {
            return Err("mmap failed");
        }
        if libc::madvise(addr, PAGE, libc::MADV_DONTFORK) != 0 {
            libc::munmap(addr, PAGE);
            return Err("madvise(MADV_DONTFORK) failed");
        }
        Ok(addr as *const Header)
    }
}

/// Names an anonymous mapping `OTEL_CTX` (Linux 5.17+ with
/// CONFIG_ANON_VMA_NAME; fails harmlessly elsewhere and on memfd pages).
fn name_mapping(addr: *const u8) {
    const PR_SET_VMA: libc::c_int = 0x5356_4d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: names our own mapping; the name is a static C string.
    unsafe { libc::prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, addr as libc::c_ulong, PAGE, c"OTEL_CTX".as_ptr()) };
}

fn realtime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; the clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `ProcessContext { resource { attributes } extra_attributes }` as protobuf.
pub fn encode(resource: &[(String, String)], keys: &[String]) -> Vec<u8> {
    let mut attrs = Vec::new();
    for (k, v) in resource {
        field_bytes(&mut attrs, 1, &key_value(k, &string_value(v)));
    }
    let mut out = Vec::new();
    field_bytes(&mut out, 1, &attrs);
    field_bytes(&mut out, 2, &key_value("threadlocal.schema_version", &string_value(SCHEMA_VERSION)));
    let mut array = Vec::new();
    for k in keys {
        field_bytes(&mut array, 1, &string_value(k));
    }
    let mut any = Vec::new();
    field_bytes(&mut any, 5, &array); // AnyValue.array_value
    field_bytes(&mut out, 2, &key_value("threadlocal.attribute_key_map", &any));
    out
}

/// `KeyValue { key = 1; value = 2 }`.
fn key_value(key: &str, any_value: &[u8]) -> Vec<u8> {
    let mut kv = Vec::new();
    field_bytes(&mut kv, 1, key.as_bytes());
    field_bytes(&mut kv, 2, any_value);
    kv
}

/// `AnyValue { string_value = 1 }`.
fn string_value(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    field_bytes(&mut v, 1, s.as_bytes());
    v
}

/// A length-delimited field (wire type 2).
fn field_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, (field as u64) << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
