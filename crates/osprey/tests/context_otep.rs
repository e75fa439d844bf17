//! The OTEP 4947 part of the context record: W3C byte order, the `valid`
//! flag, and tags encoded as attributes `(key index = tag slot, length,
//! UTF-8 bytes)`, as an outside reader sees them.

use osprey::context;
use osprey::internals::record::{ContextRecord, ContextSnapshot, OTEL_ATTRS_CAPACITY, OTEL_MAX_VALUE, TAG_SLOTS};

/// The 640 bytes of the OTEP record of `r` (at offset 64).
fn otep_bytes(r: &ContextRecord) -> Vec<u8> {
    let p = r as *const ContextRecord as *const u8;
    // SAFETY: the record is 64 + 640 bytes (asserted in the crate); the
    // owner thread (this one) is not writing.
    unsafe { std::slice::from_raw_parts(p.add(64), 640).to_vec() }
}

#[test]
fn ids_in_w3c_byte_order_and_valid() {
    std::thread::spawn(|| {
        context::set_trace(0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, 1, 42);
        let rec = osprey::internals::threads::current_or_register().unwrap();
        let b = otep_bytes(&rec.context);
        assert_eq!(&b[..16], &0x4bf92f3577b34da6a3ce929d0e0e4736u128.to_be_bytes(), "trace id as W3C bytes");
        assert_eq!(&b[16..24], &[0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7], "span id as W3C bytes");
        assert_eq!((b[24], b[25]), (1, 1), "valid, trace flags");
        assert_eq!(u16::from_ne_bytes([b[26], b[27]]), 0, "no tags, no attributes");
        // A span without a trace id is osprey-only: the OTEP ids stay zero.
        context::set(5, 6);
        let b = otep_bytes(&rec.context);
        assert!(b[..24].iter().all(|&x| x == 0) && b[24] == 1, "{:?}", &b[..28]);
        assert_eq!(context::current().map(|c| (c.span_id, c.trace_id)), Some((5, 0)));
    })
    .join()
    .unwrap();
}

#[test]
fn tags_are_attributes() {
    std::thread::spawn(|| {
        context::set_tag("otep.route", "/checkout").unwrap();
        context::set_tag("otep.method", "GET").unwrap();
        let (route, method) =
            (context::find_tag_key("otep.route").unwrap(), context::find_tag_key("otep.method").unwrap());
        let rec = osprey::internals::threads::current_or_register().unwrap();
        let mut want = vec![route as u8, 9];
        want.extend(b"/checkout");
        want.extend([method as u8, 3]);
        want.extend(b"GET");
        assert!(route < method);
        assert_eq!(rec.context.otel_attrs(), want);
        // Changing ids alone keeps the attributes; a restore re-encodes them.
        let saved = context::current();
        context::set_trace(7, 8, 0, 9);
        assert_eq!(rec.context.otel_attrs(), want);
        context::clear_tag("otep.route").unwrap();
        assert_eq!(rec.context.otel_attrs(), [method as u8, 3, b'G', b'E', b'T']);
        context::replace(saved);
        assert_eq!(rec.context.otel_attrs(), want);
    })
    .join()
    .unwrap();
}

#[test]
fn long_values_are_cut_and_the_record_never_overflows() {
    let r = ContextRecord::new();
    // 'é' is two bytes: a cut at 255 would split one, so 254 bytes are kept.
    let long: &'static str = "é".repeat(200).leak();
    let value = |_id: u32| Some(long.as_bytes());
    let s = ContextSnapshot { tags: [1; TAG_SLOTS], ..Default::default() };
    r.store(&s, &value);
    let a = r.otel_attrs();
    assert!(a.len() <= OTEL_ATTRS_CAPACITY);
    assert_eq!((a[0], a[1] as usize), (0, OTEL_MAX_VALUE - 1));
    assert!(std::str::from_utf8(&a[2..2 + a[1] as usize]).is_ok());
    // Two 256-byte entries fit in 612 bytes, a third does not.
    assert_eq!(a.len(), 2 * (2 + OTEL_MAX_VALUE - 1));
    assert_eq!(a[2 + 254], 1, "the second entry is slot 1");
}
